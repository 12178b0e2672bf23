"""A field's value: checked against its type and range, read from text (a CLI flag, a URL
parameter), written back, and found at its place in a JSON config.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ConfigError
from .field import MAX_NAME, Field
from .fields import ALL, section_fields

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --- checking a value ---------------------------------------------------------------------------

def check(f: Field, value: Any) -> None:
    """Raise `ConfigError` unless `value` is of the field's type and in its range. Ints must be
    ints (not 1.0, not true); floats must be finite."""
    if value is None:
        if f.optional:
            return
        raise ConfigError(f.path, None, f.allowed(), "required")
    if f.kind == "bool":
        ok = isinstance(value, bool)
    elif f.kind == "choice":
        ok = not isinstance(value, bool) and isinstance(value, (str, int)) and value in f.options
    elif f.kind == "choices":
        ok = (isinstance(value, (list, tuple)) and len(value) > 0
              and all(isinstance(v, str) and v in f.options for v in value))
    elif f.kind == "text":
        ok = isinstance(value, str) and len(value) <= MAX_NAME and not _CONTROL.search(value) \
            and (not f.pattern or re.fullmatch(f.pattern, value) is not None)
    else:
        ok = _in_range(f, value)
    if not ok:
        raise ConfigError(f.path, value, f.allowed())


def _in_range(f: Field, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if f.kind == "int":
        if not isinstance(value, int):
            return False
    elif not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        return False
    if f.min is not None and value < f.min:
        return False
    if f.max is not None and (value >= f.max if f.below_max else value > f.max):
        return False
    return True


def check_section(section: str, obj: object) -> None:
    """Check every field of a dataclass instance (called from its ``__post_init__``)."""
    for f in _SECTION_FIELDS[section]:
        check(f, getattr(obj, f.name))


_SECTION_FIELDS = {s: section_fields(s) for s in dict.fromkeys(f.section for f in ALL)}


def get_in(config: dict, f: Field, default: Any = None) -> Any:
    """A field's value at its place in a JSON config (`default` where it is absent)."""
    node: Any = config
    for part in f.path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_in(config: dict, f: Field, value: Any) -> None:
    """Put a field's value at its place in a JSON config, creating the objects on its path."""
    *outer, name = f.path.split(".")
    node = config
    for i, part in enumerate(outer):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(outer[:i + 1]), child, "an object of fields")
        node = child
    node[name] = value


# --- reading a value from text (a CLI flag, a URL parameter) -------------------------------------

_INT_TEXT = re.compile(r"[+-]?\d{1,19}")
_AUTO_TEXT = ("", "auto", "null", "none")


def parse_text(f: Field, text: str | list[str]) -> Any:
    """The field's value from its text form; raises `ConfigError` naming the field. Lists come
    comma-separated or as repeated parameters; "auto" (or empty) is None for an optional field."""
    if isinstance(text, list):
        text = ",".join(text) if f.kind == "choices" else (text[-1] if text else "")
    raw = text
    text = text.strip()
    if len(text) > 4 * MAX_NAME:  # no valid value is this long: refuse before parsing it
        raise ConfigError(f.path, raw, f.allowed())
    if f.optional and text.lower() in _AUTO_TEXT:
        return None
    value = _from_text(f, text)
    if value is _BAD:
        raise ConfigError(f.path, raw, f.allowed())
    check(f, value)
    return value


_BAD = object()


def _from_text(f: Field, text: str) -> Any:
    if f.kind == "bool":
        return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower(), _BAD)
    if f.kind == "int":
        return int(text) if _INT_TEXT.fullmatch(text) else _BAD
    if f.kind == "float":
        try:
            return float(text)
        except ValueError:
            return _BAD
    if f.kind == "choice":
        return next((o for o in f.options if str(o) == text), _BAD)
    if f.kind == "choices":
        items = [t.strip() for t in text.split(",") if t.strip()]
        return items or _BAD
    return text


def to_text(value: Any) -> str | list[str]:
    """A value's text form, the inverse of `parse_text` (a list is a repeated URL parameter)."""
    if isinstance(value, (list, tuple)):
        return [to_text(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "auto" if value is None else str(value)
