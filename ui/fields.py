"""The configuration's fields as the app shows them, and their URL form. No Streamlit here.

Every field of `Training`, `Parallel` and `Hardware` has a `Field`: its widget, label and help in
users' terms, and how a widget value maps to the contract's value (``../shared/CONTRACT.md``).
The widget key is the field's name, which is also its URL parameter (the contract's field name
without its section). A field whose default is ``None`` ("decided by the framework") is a select
with an ``auto`` option, or a number input that may be left empty.

The model is kept apart (`ModelChoice`): a bundled preset, a Hugging Face id, or a custom
architecture; in the URL ``model=<preset id>``, ``model=<org/name>`` or ``model=custom`` followed
by the architecture's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field as dc_field
from typing import Any

from estimator.spec import fields as registry, field as registry_field, values as registry_values
from estimator.spec.architecture import ARCHITECTURE_FIELDS, Architecture
from estimator.spec.config import SECTIONS as CONFIG_SECTIONS, architecture_to_dict, build_section, build_serving
from estimator.spec.errors import ConfigError, shown_value

AUTO = "auto"
# training.adapter and training.rl are objects: each exists when its first field (the switch) is
# chosen; the switch's extra option leaves it out
NO_ADAPTER = "none (full fine-tuning)"
NO_RL = "none (no RL)"
NO_SPECULATIVE = "none (no speculative decoding)"
SWITCHES = {"adapter_method": ("adapter", NO_ADAPTER), "rl_algorithm": ("rl", NO_RL),
            "speculative_method": ("speculative", NO_SPECULATIVE)}
# the config's sections the widgets fill: the estimate's, then the top-level serving object
SECTIONS = (*CONFIG_SECTIONS, "serving")


def build_any_section(section: str, given: dict):
    """A section's dataclass from its fields (the estimator's own checks)."""
    return build_serving(given) if section == "serving" else build_section(section, given)
OFF = {off for _, off in SWITCHES.values()}
TRISTATE = (AUTO, "true", "false")
DEFAULT_MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class Field:
    """A registry field (`estimator.fields.Field`) as a widget: `kind` is select, multi, int,
    float, bool or text; `options` are the select's texts (with ``auto`` for an optional one)."""

    name: str
    section: str  # training, parallel, hardware (or model for the architecture editor)
    kind: str
    label: str
    help: str
    group: str
    options: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    step: float | None = None
    optional: bool = False  # an int/float that may be left empty (None)

    @property
    def spec(self) -> registry_field.Field:
        if self.section == "model":
            return registry.BY_PATH[f"model.{self.name}"]
        return registry.SETTING_BY_NAME[self.name]  # settings by their flat name (adapter_rank)

    @property
    def default(self) -> Any:
        """The widget's default: the dataclass default in the widget's terms."""
        if self.name in SWITCHES:
            return SWITCHES[self.name][1]
        return from_contract(self, self.spec.default)


def _widget_field(spec: registry_field.Field) -> Field:
    kind, options = spec.kind, ()
    if spec.kind == "choice" or (spec.kind == "bool" and spec.optional):
        kind = "select"
        options = TRISTATE[1:] if spec.kind == "bool" else tuple(str(o) for o in spec.options)
        options = ((AUTO,) if spec.optional else ()) + options
    elif spec.kind == "choices":
        kind, options = "multi", spec.options
    high = spec.max
    if high is not None and spec.below_max:  # a number input has no open bound: stop one step short
        high = round(high - (spec.step or 0.01), 6)
    if spec.key in SWITCHES:
        options = (SWITCHES[spec.key][1],) + options
    return Field(spec.key, spec.section, kind, spec.label, spec.help, spec.group, options=options,
                 min=spec.min, max=high, step=spec.step, optional=spec.optional and kind in ("int", "float"))


_GROUPS = ("Run", "Precision", "Optimizer and memory savers", "Fine-tuning (adapters)", "RL (colocated rollout engine)",
           "Inference", "Serving (inference engine)", "Parallel layout", "GPU")

ALL_FIELDS: tuple[Field, ...] = tuple(_widget_field(f) for f in registry.SETTINGS + registry.SERVING_FIELDS if f.widget)
# Fields of the dataclasses the app does not offer as widgets (checks, not settings).
NOT_WIDGETS = {f.name for f in registry.SETTINGS if not f.widget}
BY_NAME: dict[str, Field] = {f.name: f for f in ALL_FIELDS}
GROUPS: tuple[str, ...] = _GROUPS


# --- the custom architecture editor -----------------------------------------------------------

ARCH_FIELDS: tuple[Field, ...] = tuple(_widget_field(f) for f in registry.ARCHITECTURE_FIELDS if f.widget)
ARCH_BY_NAME = {f.name: f for f in ARCH_FIELDS}
ARCH_GROUPS = ("Shape", "Details", "Mixture of experts", "Latent attention (MLA)", "Hybrid layers", "Vision tower", "More")
ARCH_REQUIRED = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size")

# A field's label by its path (training.dropout is "Dropout", training.adapter.dropout "Adapter
# dropout"); by its bare name, a section's own field before an adapter's or an RL run's of that name
PATH_LABELS = {f.path: f.label for f in registry.ALL}
LABELS = ({f.name: f.label for f in registry.ALL if f.section in registry_field.NESTED}
          | {f.name: f.label for f in registry.ALL if f.section not in registry_field.NESTED}
          | {"model": "Model", "config": "Configuration"})


# --- widget value <-> contract value ----------------------------------------------------------

def to_contract(f: Field, ui: Any) -> Any:
    """The contract's value for a widget value (None: the field is left to its default)."""
    if ui is None:
        return None
    if f.kind == "multi":
        return list(ui)
    if f.kind == "select":
        if ui == AUTO or ui in OFF:
            return None
        if f.options == TRISTATE:
            return ui == "true"
        return registry_values.parse_text(f.spec, ui)  # the option's own type (zero_stage is an int)
    if f.kind == "int":
        return int(ui)
    if f.kind == "float":
        return float(ui)
    if f.kind == "bool":
        return bool(ui)
    if f.kind == "text" and f.spec.optional and not str(ui).strip():  # an empty optional text box: auto
        return None
    return ui


def from_contract(f: Field, value: Any) -> Any:
    """The widget value for a contract value (None: the widget's 'auto' or empty)."""
    if value is None:
        if f.name in SWITCHES:
            return SWITCHES[f.name][1]
        return AUTO if f.kind == "select" and AUTO in f.options else None
    if f.kind == "multi":  # the contract also takes one name as a string ("all-linear"): one option, not its letters
        return [value] if isinstance(value, str) else list(value)
    if f.kind == "select":
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    if f.kind == "float":
        return float(value)
    return value


def url_text(value: Any) -> str | list[str]:
    """A contract value as a URL parameter's text (the form a bound widget writes); a list is a
    repeated parameter."""
    if isinstance(value, (list, tuple)):
        return [url_text(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_text(f: Field, text: str | list[str]) -> Any:
    """A URL parameter's text as a widget value; ValueError saying what is allowed when it is not
    one (the registry's parser and range: a value out of range never reaches a widget)."""
    try:
        return from_contract(f, registry_values.parse_text(f.spec, text))
    except ConfigError as exc:
        raise ValueError(exc.allowed) from None


# --- the model ------------------------------------------------------------------------------------

@dataclass
class ModelChoice:
    """Which model the configuration uses: source is preset, hub or custom."""

    source: str = "preset"
    preset: str = DEFAULT_MODEL
    hub_id: str = ""
    arch: dict = dc_field(default_factory=dict)  # canonical architecture (custom, or the fetched hub model)

    def config_model(self) -> str | dict:
        """The contract's ``model`` for the estimator and the JSON export."""
        if self.source == "preset":
            return self.preset
        return dict(self.arch)

    def url_params(self) -> dict[str, str]:
        if self.source == "preset":
            return {"model": self.preset}
        if self.source == "hub":
            return {"model": self.hub_id}
        out = {"model": "custom"}
        for name, value in self.arch.items():
            out[name] = url_text(value)
        return out


def canonical_arch(values: dict) -> dict:
    """A canonical architecture dict (only the fields that matter); raises ConfigError."""
    for key in values:
        if key not in ARCHITECTURE_FIELDS:
            raise ConfigError(f"model.{key}", values[key], "fields of the canonical architecture", "unknown field")
    try:
        arch = Architecture(**values)
    except TypeError as exc:
        raise ConfigError("model", str(exc), "the canonical architecture's fields") from None
    return architecture_to_dict(arch)


def arch_editor_values(arch: dict) -> dict:
    """Values for every editor widget from a canonical architecture dict (defaults filled in)."""
    full = {}
    for f in ARCH_FIELDS:
        value = arch.get(f.name, f.spec.default)
        full[f.name] = value
    return full


# --- whole configurations -----------------------------------------------------------------------

def ui_values_from_config(config: dict) -> dict[str, Any]:
    """Widget values for every field from a contract config's sections (missing = default).

    Raises ConfigError for unknown fields or bad values (checked with the estimator's own
    dataclasses)."""
    values = {}
    for section in SECTIONS:
        given = config.get(section) or {}
        build_any_section(section, given)  # unknown keys and bad values raise here
        for name in given:
            if name not in BY_NAME and name not in NOT_WIDGETS and name not in registry_field.NESTED:
                raise ConfigError(f"{section}.{name}", given[name], "a field the app can show")
    for f in ALL_FIELDS:
        given = registry_values.get_in(config, f.spec, _ABSENT)
        values[f.name] = f.default if given is _ABSENT else from_contract(f, given)
    return values


_ABSENT = object()


def sections_from_ui(values: dict[str, Any]) -> dict[str, dict]:
    """The contract's sections from widget values: only fields that differ from their defaults."""
    out: dict[str, dict] = {}
    chosen = {section for key, (section, off) in SWITCHES.items() if values.get(key, off) != off}
    for f in ALL_FIELDS:
        if f.section in registry_field.NESTED and f.section not in chosen:
            continue  # no adapter (no RL): its other fields are not part of the configuration
        ui = values.get(f.name, f.default)
        if ui == f.default:
            continue
        value = to_contract(f, ui)
        if value is None:
            continue
        registry_values.set_in(out, f.spec, value)
    return {s: out[s] for s in SECTIONS if s in out}


def config_dict(model: ModelChoice, values: dict[str, Any]) -> dict:
    """The contract's JSON for the current configuration."""
    return {"model": model.config_model(), **sections_from_ui(values)}


def url_params(model: ModelChoice, values: dict[str, Any]) -> dict[str, str | list[str]]:
    """The shareable URL's parameters: model first, then every field that differs from its default."""
    params = model.url_params()
    sections = sections_from_ui(values)
    for f in ALL_FIELDS:
        value = registry_values.get_in(sections, f.spec, _ABSENT)
        if value is not _ABSENT:
            params[f.name] = url_text(value)
    return params


def config_key(config: dict) -> str:
    """A stable text form of a config, for caching."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass
class UrlState:
    model: ModelChoice | None  # None: take the default model
    values: dict[str, Any]  # widget values taken from the URL (only the valid ones)
    warnings: list[str]
    bad: list[str]  # parameters to drop from the URL
    hub_id: str | None = None  # a Hub id to fetch


def parse_url(params: dict[str, str | list[str]]) -> UrlState:
    """Read a shareable URL's parameters; every bad one becomes a warning and is dropped."""
    warnings: list[str] = []
    bad: list[str] = []
    values: dict[str, Any] = {}
    model: ModelChoice | None = None
    hub_id = None
    raw_model = params.get("model")
    arch_params = {k: v for k, v in params.items() if k in ARCH_BY_NAME}

    if raw_model is not None:
        raw_model = raw_model.strip()
        if raw_model == "custom":
            arch, arch_warnings, arch_bad = _parse_arch(arch_params)
            warnings += arch_warnings
            bad += arch_bad
            if arch is not None:
                model = ModelChoice(source="custom", arch=arch)
            else:
                bad.append("model")
        elif "/" in raw_model:
            hub_id = raw_model
        else:
            from estimator.models.presets import preset_ids
            if raw_model in preset_ids():
                model = ModelChoice(source="preset", preset=raw_model)
            else:
                warnings.append(f"Unknown model '{raw_model}' in the link: it is not a bundled preset, a Hugging "
                                f"Face id (org/name) or 'custom'. Showing the default model, {DEFAULT_MODEL}.")
                bad.append("model")
    if raw_model != "custom":
        for name in arch_params:
            warnings.append(f"Link parameter '{name}' is an architecture field; it applies only with model=custom "
                            "and was ignored.")
            bad.append(name)

    for name, text in params.items():
        if name == "model" or name in arch_params:
            continue
        f = BY_NAME.get(name)
        if f is None:
            warnings.append(f"Unknown link parameter '{name}' was ignored.")
            bad.append(name)
            continue
        try:
            values[name] = parse_text(f, text)
        except ValueError as exc:
            warnings.append(f"Link parameter {name}={text!r} is not valid for {f.label} (expected {exc}); "
                            f"using the default, {_shown(f.default)}.")
            bad.append(name)

    # the estimator's own checks, section by section; drop the named field and try again
    for section in SECTIONS:
        while True:
            given = {f.spec.name: to_contract(f, values[f.name]) for f in ALL_FIELDS
                     if f.section == section and f.name in values}
            given = {k: v for k, v in given.items() if v is not None}
            for key, (nested, _) in SWITCHES.items():
                inner = {f.spec.name: to_contract(f, values[f.name]) for f in ALL_FIELDS
                         if f.section == nested and f.name in values}
                if section == registry_field.NESTED[nested] and inner.get(key.split("_", 1)[1]):
                    given[nested] = {k: v for k, v in inner.items() if v is not None}
            try:
                build_any_section(section, given)
                break
            except ConfigError as exc:
                spec = registry.BY_PATH.get(exc.field)
                name = spec.key if spec else exc.field.split(".")[-1]
                if name not in values:  # an error not about one of the given fields
                    break
                f = BY_NAME[name]
                warnings.append(f"Link parameter {name}={params.get(name)!r} was ignored: {friendly_message(exc)} "
                                f"Using the default, {_shown(f.default)}.")
                bad.append(name)
                values.pop(name)
    return UrlState(model=model, values=values, warnings=warnings, bad=bad, hub_id=hub_id)


def _parse_arch(params: dict[str, str]) -> tuple[dict | None, list[str], list[str]]:
    warnings, bad, values = [], [], {}
    for name, text in params.items():
        f = ARCH_BY_NAME[name]
        try:
            values[name] = parse_text(f, text)
        except ValueError as exc:
            warnings.append(f"Link parameter {name}={text!r} is not valid for {f.label} (expected {exc}); ignored.")
            bad.append(name)
    while True:
        try:
            return canonical_arch(values), warnings, bad
        except ConfigError as exc:
            name = exc.field.split(".")[-1]
            if name in values and name not in ARCH_REQUIRED:
                warnings.append(f"Link parameter {name}={params.get(name)!r} was ignored: {friendly_message(exc)}")
                bad.append(name)
                values.pop(name)
                continue
            warnings.append(f"The custom architecture in the link is not usable ({friendly_message(exc)}). "
                            f"Showing the default model, {DEFAULT_MODEL}.")
            return None, warnings, bad + list(params)


def _shown(value: Any) -> str:
    return "empty" if value is None else str(value)


# --- messages -------------------------------------------------------------------------------------

def field_label(path: str) -> str:
    """The label of the field at `path` (``training.adapter.dropout``), or of a bare name."""
    if path in PATH_LABELS:
        return PATH_LABELS[path]
    name = path.split(".")[-1]
    return LABELS.get(name, name)


def friendly_message(exc: ConfigError) -> str:
    """A ConfigError in users' words: the field's label, the value, why, what is allowed."""
    label = field_label(exc.field or "")
    shown = "empty" if exc.value is None else shown_value(exc.value)  # cut and redacted as in the CLI
    reason = f" {exc.reason[0].upper()}{exc.reason[1:]}." if exc.reason else ""
    return f"{label} = {shown} is not possible.{reason} Allowed: {exc.allowed}."


def error_group(exc: ConfigError) -> str:
    """The sidebar group the offending field lives in ('Model' for the architecture and the model)."""
    path = exc.field or ""
    name = path.split(".")[-1]
    if path.startswith("model") or name in ARCH_BY_NAME:
        return "Model"
    f = BY_NAME.get(name)
    return f.group if f else "Model"
