"""The seven lessons: content per language, models (pure formulas and simulators), quizzes, wiring."""
