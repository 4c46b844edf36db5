"""The distai tutor: the Textual app, its screens, the CLI and the progress store."""
