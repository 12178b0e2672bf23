"""`docs/config.md`: every field of the registry with its label, values, default and meaning."""

from __future__ import annotations

from .field import Field, MAX_NAME, _num
from .fields import section_fields
from .values import to_text


# --- the reference ------------------------------------------------------------------------------

_SECTION_TITLES = {"model": "Canonical architecture (`model` as an object)", "training": "`training`",
                   "adapter": "`training.adapter` (an object; absent = full fine-tuning; flags and URL parameters "
                              "`adapter_<field>`)",
                   "rl": "`training.rl` (an object; absent = no RL; flags and URL parameters `rl_<field>`)",
                   "parallel": "`parallel`", "hardware": "`hardware`",
                   "serving": "`serving` (a top-level object; absent = no serving estimate; flags and URL parameters "
                              "by field name, `serving_kv_cache_dtype` for its KV cache dtype)",
                   "speculative": "`serving.speculative` (an object; absent = no speculative decoding; flags and URL "
                                  "parameters `speculative_<field>`)"}


def _type_text(f: Field) -> str:
    if f.kind in ("int", "float"):
        lo, hi = _num(f.min), _num(f.max)
        return f"{'integer' if f.kind == 'int' else 'number'} {lo} to {hi}" + (" (exclusive)" if f.below_max else "")
    if f.kind == "bool":
        return "true / false"
    if f.kind == "choice":
        return " / ".join(f"`{o}`" for o in f.options)
    if f.kind == "choices":
        return "list of " + ", ".join(f"`{o}`" for o in f.options)
    return f.pattern_text or f"text, at most {MAX_NAME} characters"


def _default_text(f: Field) -> str:
    if f.default is None:
        return f.auto or "required"
    value = f.default
    if isinstance(value, tuple):
        value = list(value)
    return "`" + (to_text(value) if not isinstance(value, list) else ", ".join(value)) + "`"


def reference_markdown() -> str:
    """`docs/config.md`: every field with its label, values, default and meaning."""
    out = ["# Configuration reference", "",
           "Generated from `estimator/spec/fields.py` by `python -m estimator fields --markdown`; "
           "`tests/test_fields.py` keeps it in step with the code.", "",
           "A configuration is a JSON object: `model` (a preset id, a Hugging Face id `org/name[@revision]`, a "
           "`config.json` object, or the canonical architecture below) and the optional sections `training`, "
           "`parallel` and `hardware`. Every field below is also a CLI flag (`--seq-len 8192`) and a parameter "
           "of the app's shareable URL (`?seq_len=8192`); lists are comma-separated there. Empty, `auto` or "
           "`null` leaves an optional field to its default. An unknown field is an error.", ""]
    for section in ("training", "adapter", "rl", "parallel", "hardware", "serving", "speculative", "model"):
        out += [f"## {_SECTION_TITLES[section]}", "", "| field | label | values | default | meaning |",
                "|---|---|---|---|---|"]
        for f in section_fields(section):
            out.append(f"| `{f.name}` | {f.label} | {_type_text(f)} | {_default_text(f)} | {f.help} |")
        out.append("")
    return "\n".join(out)
