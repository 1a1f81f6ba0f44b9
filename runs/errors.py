"""The one error `python -m runs` reports as a single line and a non-zero exit."""


class RunsError(Exception):
    """What went wrong and what to do, in one line."""
