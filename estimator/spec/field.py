"""One input field of the registry: its name, type, range, label, help, and where the app shows it.

The upper bounds every number is held to, and the records each section describes (bound by the
`record` decorator as each record's module loads, so that this module imports none of them).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any


# Upper bounds (why each is safe): the longest offered context is 10M tokens (Llama 4 Scout); the
# largest reported clusters have ~100k GPUs; the widest published models have h = 18,432 (PaLM)
# and the deepest ~130 layers; the largest vocabularies ~262k (Gemma 3).
MAX_TOKENS = 2**24  # 16,777,216 tokens per sequence
MAX_GPUS = 2**20  # 1,048,576 GPUs in one dimension of the layout
MAX_WIDTH = 2**20  # hidden, MLP, expert and latent widths
MAX_HEADS = 2**16
MAX_LAYERS = 2**14  # 16,384 layers
MAX_PIPELINE = 1024  # pipeline stages; interleaving chunks per rank up to MAX_CHUNKS
MAX_CHUNKS = 128
MAX_EXPERTS = 2**16
MAX_VOCAB = 2**24
MAX_SAMPLES = 2**30  # samples in a global batch
MAX_NAME = 200  # characters of a name

# section -> the record (dataclass) whose fields and defaults it describes: `Training`, `Parallel`,
# `Hardware`, `Architecture` ("model"), `Adapter`, `Rl`, `Serving`, `Speculative`. Each record names
# its section with the `record` decorator as its module loads; the registry imports none of them.
SECTION_CLASSES: dict[str, type] = {}


def record(section: str):
    """Class decorator: the dataclass the registry's `section` describes (its defaults are the fields')."""
    def bind(cls: type) -> type:
        SECTION_CLASSES[section] = cls
        _dataclass_fields.cache_clear()
        return cls
    return bind


# sections that are objects inside another section of the JSON config (``training.adapter``): their
# fields' flags and URL parameters carry the object's name (``--adapter-rank``, ``adapter_rank=``)
NESTED = {"adapter": "training", "rl": "training", "speculative": "serving"}
# flat names (flag, URL parameter) of fields whose own name another section already uses
FLAT_NAMES = {("serving", "kv_cache_dtype"): "serving_kv_cache_dtype"}


@dataclass(frozen=True)
class Field:
    """One input field. `kind` is int, float, bool, choice (one of `options`), choices (a
    non-empty list of `options`) or text. `optional`: ``None`` is allowed and means `auto`."""

    name: str
    section: str  # training, parallel, hardware, model
    kind: str
    label: str
    help: str
    group: str  # where the app shows it
    options: tuple = ()
    min: float | None = None
    max: float | None = None
    below_max: bool = False  # the range is [min, max) rather than [min, max]
    optional: bool = False
    auto: str = ""  # what None means, in words
    step: float | None = None  # the widget's increment
    widget: bool = True  # False: a check or a detail the app does not offer as a widget
    pattern: str = ""  # text: a regular expression the whole value must match, and `pattern_text` says it
    pattern_text: str = ""

    @property
    def path(self) -> str:
        """The field's place in the JSON config (``parallel.tp``, ``training.adapter.rank``)."""
        outer = NESTED.get(self.section)
        return f"{outer}.{self.section}.{self.name}" if outer else f"{self.section}.{self.name}"

    @property
    def key(self) -> str:
        """The field's flat name: its CLI flag, URL parameter and widget key (unique over sections)."""
        if (self.section, self.name) in FLAT_NAMES:
            return FLAT_NAMES[(self.section, self.name)]
        return f"{self.section}_{self.name}" if self.section in NESTED else self.name

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def default(self) -> Any:
        """The dataclass's default (None for a required architecture field)."""
        f = _dataclass_fields(self.section)[self.name]
        return None if f.default is dataclasses.MISSING else f.default

    def allowed(self) -> str:
        """What the field accepts, in words (the end of every message about it)."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = "one of " + ", ".join(_quoted(o) for o in self.options)
        elif self.kind == "choices":
            text = "a non-empty list of " + ", ".join(_quoted(o) for o in self.options)
        elif self.kind == "text":
            text = self.pattern_text or f"text of at most {MAX_NAME} characters without control characters"
        else:
            noun = "an integer" if self.kind == "int" else "a number"
            high = f"below {_num(self.max)}" if self.below_max else f"at most {_num(self.max)}"
            text = f"{noun} from {_num(self.min)} to {_num(self.max)}" if not self.below_max \
                else f"{noun} >= {_num(self.min)} and {high}"
        if self.optional:
            text += f", or empty/null for auto ({self.auto})" if self.auto else ", or empty/null"
        return text


def _quoted(option: Any) -> str:
    return repr(option) if isinstance(option, str) else str(option)


def _num(x: float | None) -> str:
    if x is None:
        return "any"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


@functools.cache
def _dataclass_fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(SECTION_CLASSES[section])}


def _int(name, section, label, help, group, lo=1, hi=None, **kw) -> Field:
    return Field(name, section, "int", label, help, group, min=lo, max=hi, step=kw.pop("step", 1), **kw)


def _choice(name, section, label, help, group, options, **kw) -> Field:
    return Field(name, section, "choice", label, help, group, options=tuple(options), **kw)


def _bool(name, section, label, help, group, **kw) -> Field:
    return Field(name, section, "bool", label, help, group, **kw)
