"""Errors that the command line turns into one clear line and exit status 2."""


class UsageError(ValueError):
    """Bad input from the user: a wrong argument, file, config value or puzzle."""
