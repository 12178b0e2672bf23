"""The one error type for bad input: it names the field, the value and what is allowed."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot be estimated.

    `field` is the dotted path of the offending input (``parallel.tp``), `value` what was given and
    `allowed` what would have been accepted, in words. ``str(error)`` is the one-line message the
    CLI prints and the app shows.
    """

    def __init__(self, field: str, value: object, allowed: str, reason: str = ""):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.reason = reason
        shown = repr(value) if isinstance(value, str) else value
        message = f"{field} = {shown}: "
        if reason:
            message += f"{reason}; "
        message += f"allowed: {allowed}"
        super().__init__(message)
