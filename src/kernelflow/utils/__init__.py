"""Internal utilities: input validation and progress reporting."""
