"""Reading a launch configuration's text safely: bounded size, data-only parsers.

A launch configuration is a few kilobytes. Anything larger than `MAX_BYTES` is refused before it is
parsed, so no input makes a parser run long (a TOML with a million keys, a 10 MiB file). YAML is
read with the safe loader only (no ``!!python/...`` tag constructs an object) after its event
stream is checked for alias expansion (a "billion laughs" document names a few anchors and
references them exponentially often). Every failure is a `ConfigError` naming the input.
"""

from __future__ import annotations

import json
import os
import sys

from ..spec.errors import ConfigError

MAX_BYTES = 256 * 1024  # the largest launch configuration read (published ones are under 20 KiB)
MAX_NODES = 200_000  # YAML values once aliases are expanded (a recipe has a few hundred)
FIELD = "launch config"


def read_text(path: str) -> str:
    """The text of `path` ("-" = standard input), refused unread when larger than `MAX_BYTES`."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size > MAX_BYTES:  # refused unread
                    raise ConfigError(FIELD, path, f"a file of at most {MAX_BYTES // 1024} KiB", "too large")
                raw = fh.read(MAX_BYTES + 1)  # bounded: a pipe or a device reports size 0
    except OSError as exc:
        raise ConfigError(FIELD, path, "a readable file", exc.strerror or "cannot read") from None
    return decode(raw, path)


def decode(raw: bytes, name: str) -> str:
    if len(raw) > MAX_BYTES:
        raise ConfigError(FIELD, name, f"a file of at most {MAX_BYTES // 1024} KiB", "too large")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(FIELD, name, "UTF-8 text", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None


def check_size(text: str, name: str) -> None:
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise ConfigError(FIELD, name, f"text of at most {MAX_BYTES // 1024} KiB", "too large")


def parse_toml(text: str, name: str) -> dict:
    import tomllib
    check_size(text, name)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(FIELD, name, "valid TOML", f"invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(FIELD, name, "TOML nested a few hundred levels deep at most", "nested too deeply") from None


def parse_json(text: str, name: str) -> object:
    check_size(text, name)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(FIELD, name, "valid JSON", f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}") from None
    except (ValueError, RecursionError):
        raise ConfigError(FIELD, name, "JSON with short integers, nested a few hundred levels at most",
                          "not readable") from None


def parse_yaml(text: str, name: str) -> object:
    """One YAML document with the safe loader, after counting its aliases (no expansion bomb)."""
    import yaml
    check_size(text, name)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        if _expanded_nodes(yaml.parse(text, Loader=loader), yaml) > MAX_NODES:
            raise ConfigError(FIELD, name, f"YAML of at most {MAX_NODES:,} values once its aliases (*name) are "
                              "expanded", "an alias expansion bomb is refused")
        return yaml.load(text, Loader=loader)  # the safe loader: plain data, no tags that build objects
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ConfigError(FIELD, name, "plain YAML data (no !!python tags)", f"not readable: {reason}") from None
    except RecursionError:
        raise ConfigError(FIELD, name, "YAML nested a few hundred levels deep at most", "nested too deeply") from None


def _expanded_nodes(events, yaml) -> int:
    """How many values the document holds with every alias expanded, counted from the event stream
    (each anchored value's size remembered), so a billion-laughs document is measured, not built."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[0, None]]  # [size so far, anchor] per open collection
    for event in events:
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([1, event.anchor])
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop()
            if anchor:
                sizes[anchor] = size
            stack[-1][0] += size
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor:
                sizes[event.anchor] = 1
            stack[-1][0] += 1
        elif isinstance(event, yaml.AliasEvent):
            stack[-1][0] += sizes.get(event.anchor, 1)
        if stack[-1][0] > MAX_NODES:
            return stack[-1][0]
    return stack[0][0]
