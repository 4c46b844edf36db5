"""The lessons: content per language, models (pure formulas and simulators), quizzes, wiring."""
