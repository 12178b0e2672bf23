"""The field registry: one definition of every field, read by the dataclasses' checks, the CLI, the
app and docs/config.md; and the hostile configurations it turns away."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from estimator import Architecture, ConfigError, Hardware, Parallel, Training, estimate_config
from estimator.spec import fields, field as registry_field, reference as registry_reference, values as registry_values
from estimator.cli import main

ROOT = Path(__file__).resolve().parent.parent
LLAMA = {"hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "num_kv_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256}


def test_every_dataclass_field_is_in_the_registry_and_no_other():
    for section, cls in registry_field.SECTION_CLASSES.items():
        # an object inside a section (training.adapter) is a section of its own
        declared = sorted(f.name for f in dataclasses.fields(cls) if f.name not in registry_field.NESTED)
        assert sorted(f.name for f in fields.section_fields(section)) == declared, section


def test_docs_config_md_is_generated_from_the_registry():
    assert (ROOT / "docs" / "config.md").read_text() == registry_reference.reference_markdown() + "\n"


def test_docs_list_every_field_with_label_and_default():
    text = (ROOT / "docs" / "config.md").read_text()
    for f in fields.ALL:
        assert f"| `{f.name}` | {f.label} |" in text
    assert "| `seq_len` | Sequence length (tokens) | integer 1 to 16,777,216 | `4096` |" in text
    assert "| `zero_stage` | ZeRO / sharding stage | `0` / `1` / `2` / `3` | the framework's default" in text


def test_readme_links_the_reference():
    readme = (ROOT / "README.md").read_text()
    assert "docs/config.md" in readme and "../shared/CONTRACT.md" not in readme


@pytest.mark.parametrize("make, value, words", [
    (lambda v: Parallel(zero_stage=v), 1.0, "one of 0, 1, 2, 3"),  # ints must be ints
    (lambda v: Parallel(tp=v), True, "an integer from 1 to 65,536"),
    (lambda v: Architecture(**{**LLAMA, "norms_per_layer": v}), True, "an integer from 1 to 16"),
    (lambda v: Training(moe_capacity_factor=v), math.nan, "a number from 1 to 256"),
    (lambda v: Training(moe_capacity_factor=v), math.inf, "a number from 1 to 256"),
    (lambda v: Training(moe_capacity_factor=v), 1e308, "a number from 1 to 256"),
    (lambda v: Architecture(**{**LLAMA, "attention_logit_softcapping": v}), math.nan, "a number from 0 to 1,000,000"),
    (lambda v: Architecture(**{**LLAMA, "num_layers": v}), 100_000_000, "an integer from 1 to 16,384"),
    (lambda v: Training(seq_len=v), 10**30, "an integer from 1 to 16,777,216"),
    (lambda v: Training(dropout=v), 1.0, "a number >= 0 and below 1"),
    (lambda v: Training(recompute="selective", recompute_modules=v), ["core_attn", "flash"], "a non-empty list of"),
    (lambda v: Training(recompute="selective", recompute_modules=v), "core_attn", "a non-empty list of"),
    (lambda v: Architecture(**{**LLAMA, "name": v}), "x" * 10_000, "text of at most 200 characters"),
    (lambda v: Architecture(**{**LLAMA, "name": v}), "a\x1b[31mb", "without control characters"),
    (lambda v: Hardware(gpu=v), "<script>", "one of 'a100-40'"),
])
def test_type_and_range_are_checked_by_name(make, value, words):
    with pytest.raises(ConfigError) as info:
        make(value)
    message = str(info.value)
    assert words in message
    assert len(message) < 1000  # the offending value is cut, never repeated whole


def test_messages_name_the_label_and_the_path():
    with pytest.raises(ConfigError) as info:
        Parallel(vpp=0)
    assert str(info.value) == ("Virtual stages per rank (VPP) [parallel.vpp] = 0: allowed: an integer from 1 to 128")


@pytest.mark.parametrize("path, text, value", [
    ("parallel.tp", "8", 8),
    ("parallel.zero_stage", "1", 1),
    ("parallel.etp", "auto", None),
    ("parallel.sequence_parallel", "false", False),
    ("training.dropout", "0.1", 0.1),
    ("training.recompute_modules", "core_attn, mlp", ["core_attn", "mlp"]),
    ("training.recompute_modules", ["core_attn", "moe"], ["core_attn", "moe"]),
    ("hardware.gpu", "b200", "b200"),
])
def test_text_is_parsed_by_the_fields_type(path, text, value):
    assert registry_values.parse_text(fields.BY_PATH[path], text) == value


@pytest.mark.parametrize("path, text", [
    ("parallel.tp", "9" * 100_000), ("parallel.tp", "1e3"), ("parallel.tp", "four"), ("training.seq_len", "1e30"),
    ("training.dropout", "nan"), ("training.moe_capacity_factor", "inf"), ("parallel.zero_stage", "7"),
    ("parallel.zero_stage", "auto "), ("training.recompute_modules", ""), ("hardware.gpu", "../../etc/passwd"),
])
def test_bad_text_is_refused_by_name(path, text):
    f = fields.BY_PATH[path]
    if f.optional and text.strip() == "auto":
        assert registry_values.parse_text(f, text) is None
        return
    with pytest.raises(ConfigError) as info:
        registry_values.parse_text(f, text)
    assert info.value.field == path and f.label in str(info.value) and len(str(info.value)) < 1000


@pytest.fixture
def parsed(monkeypatch) -> list[int]:
    """The lengths of the texts `values.parse_text` goes on to parse (its `_from_text`: the regex, int(),
    float()), recorded as it runs them."""
    seen: list[int] = []
    real = registry_values._from_text
    monkeypatch.setattr(registry_values, "_from_text", lambda f, text: seen.append(len(text)) or real(f, text))
    return seen


def test_text_longer_than_any_value_is_refused_before_it_is_parsed(parsed):
    """What keeps a 100,000-digit flag cheap (its time: bench/bench_refusals.py): no valid value is
    longer than 4 x MAX_NAME characters, so longer text is refused unparsed, and text at the bound is parsed."""
    bound = 4 * registry_field.MAX_NAME
    for path in ("parallel.tp", "training.dropout", "hardware.gpu", "training.recompute_modules"):
        for text in ("9" * 100_000, "9" * (bound + 1)):
            with pytest.raises(ConfigError) as info:
                registry_values.parse_text(fields.BY_PATH[path], text)
            assert info.value.field == path and len(str(info.value)) < 1000
    assert parsed == []
    with pytest.raises(ConfigError, match="allowed: an integer from 1"):  # read, then out of range
        registry_values.parse_text(fields.BY_PATH["parallel.tp"], "9" * bound)
    assert parsed == [bound]


def test_cli_flag_for_a_list_field(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "llama-3.1-8b", "training": {"recompute": "selective"}}))
    assert main(["estimate", "--config", str(path), "--json", "--recompute-modules", "core_attn,mlp"]) == 0
    with_mlp = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--config", str(path), "--json"]) == 0
    attn_only = json.loads(capsys.readouterr().out)
    # recomputing the MLP too drops its saved tensors: less activation memory on the same layout
    assert with_mlp["stages"][0]["components"]["activations"] < attn_only["stages"][0]["components"]["activations"]


HOSTILE = [  # (config, the field whose check refuses it)
    ({"model": {**LLAMA, "num_layers": 100_000_000}}, "model.num_layers"),
    ({"model": {**LLAMA, "num_attention_heads": 65_521, "num_kv_heads": 65_521, "head_dim": 64},
      "parallel": {"tp": 7}}, "parallel.tp"),
    ({"model": {**LLAMA, "hidden_size": 2**40}}, "model.hidden_size"),
    ({"model": {**LLAMA, "vocab_size": 10**12}}, "model.vocab_size"),
    ({"model": {**LLAMA, "name": "=" * 2_000_000}}, "model.name"),
    ({"model": "llama-3.1-8b", "training": {"moe_capacity_factor": math.nan}}, "training.moe_capacity_factor"),
    ({"model": "llama-3.1-8b", "training": {"seq_len": 1e30}}, "training.seq_len"),
    ({"model": "llama-3.1-8b", "training": {"global_batch_size": 2**62}}, "training.global_batch_size"),
    ({"model": "llama-3.1-8b", "parallel": {"zero_stage": 1.0}}, "parallel.zero_stage"),
    ({"model": "llama-3.1-8b", "parallel": {"dp": 2**62}}, "parallel.dp"),
    ({"model": "llama-3.1-8b", "parallel": {"pp": 1000, "vpp": 1000}}, "parallel.vpp"),
    ({"model": {**LLAMA, "norms_per_layer": True}}, "model.norms_per_layer"),
    ({"model": "org/model@/tmp/escape"}, "model"),
    ({"model": {"model_type": "gemma2", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 32, "attn_logit_softcapping": "abc"}},
     "model.attn_logit_softcapping"),
]


@pytest.mark.parametrize("config, field", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_configs_exit_2_at_their_fields_check_before_any_estimate(tmp_path, capsys, monkeypatch, config,
                                                                           field):
    """Each is refused by the check of the field that bounds it, before the estimate's work (what kept
    these fast, a size never reaching the estimate; their time: bench/bench_refusals.py)."""
    from estimator.memory import memory
    estimated = []
    real = memory.estimate_resolved
    monkeypatch.setattr(memory, "estimate_resolved", lambda *a, **k: estimated.append(a) or real(*a, **k))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    status = main(["estimate", "--config", str(path), "--json"])
    out, err = capsys.readouterr()
    assert estimated == [], err  # no estimate began
    assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    assert len(err) < 1000 and "Traceback" not in err
    assert f"[{field}] = " in err or err.startswith(f"error: {field} = "), err


def test_every_preset_and_default_passes_its_own_checks():
    from estimator.models.presets import list_presets
    for p in list_presets():
        estimate_config({"model": p.id})
    for f in fields.SETTINGS:
        if f.default is not None:
            registry_values.check(f, f.default)


def test_an_optimizer_is_one_record():
    from estimator.spec.optimizers import OPTIMIZERS
    from estimator.memory.states import optimizer_state_bytes
    from estimator.memory.sharding import Bucket
    assert fields.BY_PATH["training.optimizer"].options == tuple(OPTIMIZERS)
    # AdamW: 2 states x 4 B over 1,000 parameters; 8-bit Adam: 100 small parameters at 2 x 4 B and
    # 900 at 2 x (1 + 4/256) B = 800 + 1,828.125
    b = Bucket(dense=1000.0, dense_small=100.0, dense_hidden_matrices=600.0, dense_factored=50.0)
    assert optimizer_state_bytes(b, "adamw", "fp32", experts=False) == 8000.0
    assert optimizer_state_bytes(b, "adam8bit", "fp32", experts=False) == 800 + 2 * (1 + 4 / 256) * 900
    assert optimizer_state_bytes(b, "muon", "fp32", experts=False) == 4 * 600 + 8 * 400
    assert optimizer_state_bytes(b, "adafactor", "fp32", experts=False) == 4 * 50
    with pytest.raises(ConfigError) as info:
        estimate_config({"model": "llama-3.1-8b", "training": {"optimizer": "adam8bit"}})
    assert info.value.field == "training.optimizer" and "megatron does not offer adam8bit" in str(info.value)
    assert "training.framework" in info.value.related
