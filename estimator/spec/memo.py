"""What the estimator remembers between estimates, bounded in bytes: least recently used first out.

An estimate of a layout shares most of its work with other layouts of the same architecture (the
parameter buckets, the activation ledger, the stages' static parts, the roofline's operation
tables), so each architecture remembers those values (`Architecture.cached`). An app server
lives for weeks and sees many models (every Hub model is an architecture of its own) and many
configurations of each, so what is remembered must be bounded in bytes, not only in entries: one
entry (a ledger of a 100-layer model, a stage's static part with its components) can weigh a
thousand times another (a flag). Every architecture's values live in one of two pools for the
whole process: the values layouts share, and each configuration's own (`per_layout`: a search
makes hundreds of thousands of those and must not push out the shared ones). Each pool drops its
least recently used values once its bytes pass its limit.

A value's bytes are those of the objects it holds (a deep walk, not counting the configuration
objects it refers to: an architecture, a training setup, a layout, the hardware, which their owners
hold; nor another remembered value, or the parts of a remembered dict, which count under their own
entry: a configuration's resolved values hold the stages that are a value of their own), with Python's
per-object sizes (`sys.getsizeof`). Walking every value would cost a search
more than the values save, so the first `EXACT` values of each kind (the key's name: "ledger",
"stage parts/static"...) are measured and every `RESAMPLE`-th after them; the others are counted at
the mean of their kind's measured ones (values of one kind differ in size by how many layers or
stages they describe, which these samples follow).
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from typing import Any, Callable

SHARED_BYTES = int(os.environ.get("ESTIMATOR_MEMO_MIB", "256")) * 2**20 * 3 // 4
LAYOUT_BYTES = int(os.environ.get("ESTIMATOR_MEMO_MIB", "256")) * 2**20 // 4
EXACT = 16  # values of a kind measured before the mean stands for the others
RESAMPLE = 64  # ... and then one in this many
ENTRY_BYTES = 330  # an entry: the dict slot, its key tuples and the (value, bytes) record (tracemalloc: 325 for a four-item key)
PART_BYTES = 130  # a part in a dict of parts: its slot and key tuple (tracemalloc: about 120 for a three-item key)
HELD_BYTES = 90  # an id counted in _HELD (tracemalloc: 84 a dict entry with its int key)
_WALK_LIMIT = 200_000  # objects one measurement visits at most


class Memo:
    """One pool: key -> value, at most `limit_bytes` of values, least recently used dropped first."""

    def __init__(self, limit_bytes: int, count_keys: bool = False):
        self.limit_bytes = limit_bytes
        self.count_keys = count_keys  # the key's configuration records are its entry's (`key_bytes`)
        self.bytes = 0
        self._entries: OrderedDict[Any, list] = OrderedDict()  # key -> [value, bytes, still held]
        self._sizes: dict[str, list[int]] = {}  # kind -> [values seen, values measured, bytes measured]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def get(self, key, compute: Callable[[], Any], kind: str = ""):
        return self.entry(key, compute, kind)[0]

    def entry(self, key, compute: Callable[[], Any], kind: str = "") -> list:
        """The record [value, bytes, held] of `key`, computed and stored if missing (`grow` takes it)."""
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            entries.move_to_end(key)
            return entry
        self.put(key, compute(), kind)
        return self._entries[key]

    def lookup(self, key, default=None):
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            return default
        entries.move_to_end(key)
        return entry[0]

    def put(self, key, value, kind: str = "") -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._forget(old)
        size = self.size_of(value, kind) + ENTRY_BYTES + HELD_BYTES * _hold(value, 1)
        if self.count_keys:
            size += key_bytes(key)
        self._entries[key] = [value, size, True]
        self.bytes += size
        self._shrink()

    def grow(self, entry: list, nbytes: int) -> None:
        """A remembered value that holds more now (a dict of parts, memory._StageMemo) by `nbytes`;
        nothing if it is no longer remembered."""
        if entry[2]:
            entry[1] += nbytes
            self.bytes += nbytes
            self._shrink()

    def size_of(self, value, kind: str = "") -> int:
        """The bytes `value` holds: measured (`deep_bytes`) for the first values of its kind and a
        sample after, else the mean of its kind's measured ones."""
        seen = self._sizes.get(kind)
        if seen is None:
            seen = self._sizes[kind] = [0, 0, 0]
        seen[0] += 1
        if seen[1] < EXACT or seen[0] % RESAMPLE == 0:
            seen[1] += 1
            seen[2] += deep_bytes(value)
        return seen[2] // seen[1]

    def _shrink(self) -> None:
        while self.bytes > self.limit_bytes and len(self._entries) > 1:
            self._forget(self._entries.popitem(last=False)[1])

    def _forget(self, entry: list) -> None:
        self.bytes -= entry[1]
        entry[2] = False
        _hold(entry[0], -1)

    def clear(self) -> None:
        for entry in self._entries.values():
            entry[2] = False
            _hold(entry[0], -1)
        self._entries.clear()
        self.bytes = 0


_HELD: dict[int, int] = {}  # id -> how many remembered values are it or hold it directly


_SCALARS = (int, float, bool, str, type(None))


def hold(value) -> int:
    """Count `value`, just added to a remembered dict, as remembered (released with the dict's entry, whose
    release releases its values); how many objects. Other values' walks (`deep_bytes`) skip it."""
    return _hold(value, 1)


def _hold(value, step: int) -> int:
    """Count `value` (and a dict's values: a ledger's parts are read out one by one) as remembered
    (step 1) or no longer (-1); how many objects."""
    if isinstance(value, _SCALARS):
        return 0
    held = _HELD
    if type(value) is not dict:
        n = held.get(id(value), 0) + step
        if n > 0:
            held[id(value)] = n
        else:
            held.pop(id(value), None)
        return 1
    objects = [value] + [v for v in value.values() if not isinstance(v, _SCALARS)]
    for obj in objects:
        n = held.get(id(obj), 0) + step
        if n > 0:
            held[id(obj)] = n
        else:
            held.pop(id(obj), None)
    return len(objects)


# The configuration records values refer to but do not own (their owners hold them): each record
# class names itself with `not_owned` as its module loads (Architecture, Training, Recipe, Parallel,
# Hardware, GPU), so this module imports none of them.
_NOT_OWNED: tuple[type, ...] = (type, type(sys))


def not_owned(cls: type) -> type:
    """Class decorator: `deep_bytes` does not count instances of `cls` (their owners hold them)."""
    global _NOT_OWNED
    _NOT_OWNED = (cls,) + _NOT_OWNED
    return cls


def hash_once(cls: type) -> type:
    """Class decorator for a frozen dataclass that keys memos (a training setup, a layout): its hash, the
    dataclass's own over every field, worked out on the object's first use as a key and kept on it. A
    search looks up each layout's resolved values and stage parts under keys holding these objects, about
    four hashes of each per estimate, each over some hundred fields. Pickling leaves the kept hash out:
    another process hashes strings with another seed."""
    field_hash = cls.__hash__

    def __hash__(self) -> int:
        known = self.__dict__.get("_hash")
        if known is None:
            known = field_hash(self)
            object.__setattr__(self, "_hash", known)
        return known

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__, cls.__getstate__ = __hash__, __getstate__
    return cls


def _not_owned() -> tuple[type, ...]:
    """The configuration objects values refer to but do not own (their owners hold them)."""
    return _NOT_OWNED


def deep_bytes(value) -> int:
    """The bytes of `value` and of every object it holds, each counted once, configuration objects
    (`_not_owned`), other remembered values and a remembered dict's parts (`_HELD`), and functions' code
    not counted; functions' bound arguments and closures are."""
    skip = _not_owned()
    seen: set[int] = set()
    stack, total = [value], 0
    while stack and len(seen) < _WALK_LIMIT:
        obj = stack.pop()
        # a configuration record is its owner's, unless it is the remembered value itself (a training setup
        # made for a memo's key: `resolved.training_with`, `step_setup.step_setup`), which the memo alone holds
        if id(obj) in seen or (obj is not value and (isinstance(obj, skip) or id(obj) in _HELD)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (tuple, list, set, frozenset)):
            stack.extend(obj)
        elif callable(obj) and hasattr(obj, "__code__"):  # a function: what it closes over and its defaults
            stack.extend(c.cell_contents for c in (obj.__closure__ or ()) if _filled(c))
            stack.extend(obj.__defaults__ or ())
        elif hasattr(obj, "func") and hasattr(obj, "args"):  # functools.partial
            stack.extend((obj.func, obj.args, obj.keywords))
        else:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    stack.append(getattr(obj, name))
    return total


def key_bytes(key) -> int:
    """The configuration records (a training setup, a layout, the hardware) a key holds, each with its field
    dict. A configuration's own values are looked up under the records an estimate was made with, and once
    its caller is done the key is all that holds them: every app rerun and every estimate of another model
    makes new ones, about 1.6 KB a training setup, several times the value's count (tests/test_bounded.py)."""
    items = [item for part in key for item in (part if isinstance(part, tuple) else (part,))]
    return sum(sys.getsizeof(item) + sys.getsizeof(getattr(item, "__dict__", None) or ())
               for item in items if isinstance(item, _not_owned()) and not isinstance(item, (type, type(sys))))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


SHARED = Memo(SHARED_BYTES)  # values layouts share
PER_LAYOUT = Memo(LAYOUT_BYTES, count_keys=True)  # one configuration's own values
