"""Helpers every importer shares: command-line flags split as argparse splits them, and the JSON
config filled field by field with each setting accounted for in the `Ledger`."""

from __future__ import annotations

import re
from typing import Callable

from ..spec.errors import ConfigError
from ..spec.fields import BY_PATH
from ..spec.values import set_in
from .result import Ledger

_INT = re.compile(r"[+-]?\d{1,18}")
_OBJECTS = ("training.adapter", "training.rl")


def split_flags(args: tuple[str, ...] | list[str], arity: Callable[[str], int | None],
                ledger: Ledger, framework: str) -> dict[str, object]:
    """``--flag value`` pairs as argparse reads them, given each known flag's arity (0 = a switch,
    1 = one value, -1 = one or more, n = exactly n; None = not a flag of the framework). Returns
    flag -> value (True for a switch, a list for several values), the last occurrence winning as in
    argparse. Unknown flags (with the words that follow them) and stray words go to the ledger."""
    out: dict[str, object] = {}
    i, n = 0, len(args)
    while i < n:
        word = args[i]
        i += 1
        if not word.startswith("-") or word in ("-", "--"):
            ledger.strange(word, "", f"a word without a flag before it; not read by {framework}")
            continue
        name, eq, inline = word.partition("=")
        count = arity(name)
        if count is None:
            values = [inline] if eq else []
            while not eq and i < n and not _is_flag(args[i]):
                values.append(args[i])
                i += 1
            ledger.strange(name, " ".join(values), f"not a flag of {framework}")
            continue
        if count == 0:
            if eq:
                raise ConfigError(name, inline, "no value: it is a switch")
            out[name] = True
            continue
        values = [inline] if eq else []
        if not eq:
            while i < n and not _is_flag(args[i]) and (count == -1 or len(values) < count):
                values.append(args[i])
                i += 1
        want = 1 if count == -1 else count
        if len(values) < want:
            raise ConfigError(name, None, f"{want} value{'s' if want > 1 else ''} after it", "missing its value")
        out[name] = values[0] if count == 1 else values
    return out


def _is_flag(word: str) -> bool:
    """A word that starts a new flag (a negative number does not)."""
    return word.startswith("--") or (word.startswith("-") and len(word) > 1 and not _looks_number(word))


def _looks_number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def to_int(name: str, value: object, low: int = 0) -> int:
    """A flag's integer value, or a ConfigError that names the flag (an unset shell variable shows)."""
    text = str(value).strip()
    if not _INT.fullmatch(text):
        reason = ("a command substitution (never run)" if "$(" in text or "`" in text else
                  "a shell variable not set in the text" if text.startswith("$") else "not an integer")
        raise ConfigError(name, text, f"an integer >= {low}", reason)
    number = int(text)
    if number < low:
        raise ConfigError(name, number, f"an integer >= {low}")
    return number


def to_float(name: str, value: object) -> float:
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        reason = "a shell variable the file does not set" if text.startswith("$") else "not a number"
        raise ConfigError(name, text, "a number", reason) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(name, text, "a finite number")
    return number


def trainer_batch(doc: "FlatDoc", build: "ConfigBuilder", gpus: int | None, micro_key: str, micro_default: int) -> None:
    """The Hugging Face Trainer's data-parallel batch as the fine-tuning front ends (axolotl,
    LLaMA-Factory) set it: DDP over --gpus (one GPU when not given, noted), `micro_key` samples per
    GPU (`micro_default` when the file leaves it out), and gradient_accumulation_steps of those per
    optimizer step (the global batch, over every GPU)."""
    world = gpus or 1
    if gpus is None:
        build.ledger.note("no --gpus: one GPU")
    build.put("parallel.dp", world)
    micro = to_int(micro_key, doc.get(micro_key, micro_default), 1)
    build.set("training.micro_batch_size", micro, micro_key)
    steps = to_int("gradient_accumulation_steps", doc.get("gradient_accumulation_steps", 1), 1)
    if steps > 1:
        build.set("training.global_batch_size", micro * steps * world, "gradient_accumulation_steps", steps)


class ConfigBuilder:
    """Our JSON config, filled one field at a time; each field set is a ``read`` line naming the
    setting it came from. A field this build of the estimator does not have (another branch adds
    it) makes the setting ``not modelled`` rather than vanishing."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.config: dict = {}
        self.model: dict = {}
        self.named_model: str | None = None  # a preset or Hub id, where the file names the model
        self.trl_chunked_nll = False  # loss "chunked" is TRL's chunked_nll (hf_trainer._sft_loss), not Liger's

    def set(self, path: str, value: object, name: str, given: object = None, why: str = "") -> bool:
        """Set `path` (``parallel.tp``, ``model.hidden_size``) from the setting `name`."""
        shown = value if given is None else given
        if path.startswith("model."):
            self.model[path[len("model."):]] = value
        elif path in _OBJECTS:  # training.adapter, training.rl: objects of their own in the JSON config
            self.config.setdefault("training", {})[path.split(".")[1]] = value
        elif path not in BY_PATH:
            self.ledger.not_modelled(name, shown, f"maps to {path}, which this version of the estimator does not "
                                                  "have yet")
            return False
        else:
            set_in(self.config, BY_PATH[path], value)
        self.ledger.mapped(name, shown, f"{path} = {_json(value)}" + (f"; {why}" if why else ""))
        return True

    def put(self, path: str, value: object) -> None:
        """Set a field that no one setting decides (a default of the framework, noted separately)."""
        if path.startswith("model."):
            self.model[path[len("model."):]] = value
        elif path in BY_PATH:
            set_in(self.config, BY_PATH[path], value)

    def get(self, path: str, default: object = None) -> object:
        if path.startswith("model."):
            return self.model.get(path[len("model."):], default)
        node: object = self.config
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def _json(value: object) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    return str(value)


class FlatDoc:
    """A nested config (YAML, JSON) as dotted keys; each key read is remembered, so that the rest
    can be accounted for. ``${a.b}`` interpolations (OmegaConf's, as torchtune and verl write them)
    of whole values are resolved from the same document, never evaluated."""

    def __init__(self, data: object, what: str):
        if not isinstance(data, dict):
            raise ConfigError("launch config", type(data).__name__, f"a {what} mapping of keys to values")
        self.flat: dict[str, object] = {}
        self._walk(data, "")
        self.used: set[str] = set()

    def _walk(self, node: dict, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                self._walk(value, path + ".")
            else:
                self.flat[path] = value

    def given(self, key: str) -> bool:
        return key in self.flat

    def get(self, key: str, default: object = None) -> object:
        self.used.add(key)
        return self._resolve(self.flat.get(key, default), 0)

    def section(self, prefix: str) -> dict[str, object]:
        """The keys under `prefix.` (marked read), without the prefix."""
        out = {}
        for key in list(self.flat):
            if key.startswith(prefix + "."):
                out[key[len(prefix) + 1:]] = self.get(key)
        return out

    def set(self, key: str, value: object) -> None:
        self.flat[key] = value

    def _resolve(self, value: object, depth: int) -> object:
        if isinstance(value, str) and depth < 10:
            m = re.fullmatch(r"\$\{([A-Za-z_][\w.]*)\}", value.strip())
            if m and m.group(1) in self.flat:
                return self._resolve(self.flat[m.group(1)], depth + 1)
        return value

    def rest(self) -> list[tuple[str, object]]:
        return [(k, v) for k, v in self.flat.items() if k not in self.used]


def key_value_overrides(words: tuple[str, ...], doc: FlatDoc, ledger: Ledger, what: str) -> None:
    """``key=value`` overrides (torchtune's ``tune run ... key=value``, Hydra's): YAML scalars,
    set into the document before it is read. A word of another shape is reported unknown."""
    import yaml
    for word in words:
        key, eq, text = word.partition("=")
        key = key.lstrip("+~")
        if not eq or not re.fullmatch(r"[A-Za-z_][\w.\-]*", key):
            ledger.strange(word, "", f"not a key=value override of {what}")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if isinstance(value, (dict, list)) and len(str(value)) > 10_000:
            raise ConfigError(key, "...", "a short value")
        doc.set(key, value)
