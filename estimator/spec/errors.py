"""The one error type for bad input: it names the field, the value and what is allowed."""

from __future__ import annotations

import re

from .fields import label

# What a credential looks like inside a string a user typed: a Hugging Face token, a URL's user
# info, a token query parameter. Such a value is never printed back (hub ids, revisions, names).
_SECRET = re.compile(r"hf_[A-Za-z0-9]{8,}|://[^/@\s]*@|[?&](?:token|access_token|api_key)=", re.IGNORECASE)
REDACTED = "<redacted: the value looks like it contains a credential>"
# A message shows at most this many characters of a value (a 2 MB key must not become a 2 MB line).
SHOWN_CHARS = 80


def looks_secret(text: str) -> bool:
    return bool(_SECRET.search(text))


def redact(text: str) -> str:
    """`text`, or a placeholder when it looks like it carries a credential."""
    return REDACTED if looks_secret(text) else text


def shown_value(value: object) -> str:
    """A value as a message shows it: repr of strings, redacted, cut to `SHOWN_CHARS` characters."""
    if isinstance(value, str):
        if looks_secret(value):
            return REDACTED
        text = repr(value)
    else:
        try:
            text = str(value)
        except ValueError:  # an int too long to print (sys.int_info.default_max_str_digits)
            text = f"an integer of about {value.bit_length() * 0.30103:.0f} digits" if isinstance(value, int) \
                else type(value).__name__
        if looks_secret(text):
            return REDACTED
    if len(text) > SHOWN_CHARS:  # the count is the value's own (a string's, not its quoted repr's)
        text = f"{text[:SHOWN_CHARS - 20]}... ({len(value) if isinstance(value, str) else len(text):,} characters)"
    return text


def _named(path: str) -> str:
    """A field as messages name it: its label in users' words, then its place in the JSON config."""
    text = label(path)
    return path if text == path else f"{text} [{path}]"


class ConfigError(ValueError):
    """A configuration value that cannot be estimated.

    `field` is the dotted path of the offending input (``parallel.tp``), `value` what was given and
    `allowed` what would have been accepted, in words. ``str(error)`` is the one-line message the
    CLI prints and the app shows. `related` names the other fields the broken rule ties together
    (``parallel.vpp`` for "layers divisible by pp x vpp"), so a user interface can blame the one the
    user just changed.
    """

    def __init__(self, field: str, value: object, allowed: str, reason: str = "",
                 related: tuple[str, ...] = ()):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.reason = reason
        self.related = tuple(related)
        message = f"{_named(field)} = {shown_value(value)}: "
        if reason:
            message += f"{reason}; "
        message += f"allowed: {allowed}"
        super().__init__(message)
