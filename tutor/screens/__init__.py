"""The tutor's screens: the lesson list, a lesson's step-by-step walk, the help overlay."""
