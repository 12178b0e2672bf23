"""serving.prefix_caching unset = the engine's own default for its release and model (estimator/serving/
prefix_default.py); true / false keep their meaning. The defaults are read in vLLM's and SGLang's source and, where
the CPU venvs can run it, held to what the engine itself resolves (tests/data/serving/prefix-vllm-0.33.0.json,
sglang-0.5.23-radix.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from estimator.cli import main
from estimator.importers import import_config
from estimator.importers.emit_serve import emit_serve
from estimator.models.loading import architecture_from_model
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import prefix_default
from estimator.serving.sglang_engine import estimate_sglang
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

DATA = Path(__file__).parent / "data" / "serving"


def vllm(model, gpu="h100-80", tp=1, **serving):
    return estimate_vllm(get_architecture(model), Serving(**serving), Parallel(tp=tp), Hardware(gpu),
                         get_hf_config(model))


def sglang(model, tp=1, **serving):
    return estimate_sglang(get_architecture(model), Serving(engine="sglang", **serving), Parallel(tp=tp),
                           Hardware("h100-80"), get_hf_config(model))


def note(estimate) -> str:
    return next(n for n in estimate.notes if n.startswith("Prefix caching"))


def test_vllm_0_33_qwen3_next_default_is_align_mode():
    """Qwen3-Next at TP 2 on an H200, 131,072 tokens, vLLM 0.33 (config/model.py: a hybrid's default is on): a Gated
    DeltaNet state is 548,864 B, a token's attention page 1,024 B. On (the default): align mode on FlashInfer's GDN
    prefill, block 64 x cdiv(548,864, 65,536) = 576, a request cdiv(131,072, 576) = 228 attention blocks + 3 GDN groups
    x 3 state pages = 237. Off: block 16 x cdiv(548,864, 16,384) = 544, 241 + 3 x 1 = 244. A block is 12 pages."""
    run = lambda pc: vllm("qwen3-next-80b-a3b", "h200", tp=2, max_model_len=131072, engine_version="0.33",  # noqa
                          prefix_caching=pc)
    default, on, off = run(None), run(True), run(False)
    assert default.capacity == on.capacity and default.resolved.block_size == on.resolved.block_size == 576
    available = default.stages[0].available
    assert off.stages[0].available == available  # the budget does not depend on it: only the pages do
    assert default.capacity.num_blocks == available // (12 * 576 * 1024)
    assert off.capacity.num_blocks == available // (12 * 544 * 1024)
    assert (default.capacity.blocks_per_request, off.capacity.blocks_per_request) == (237, 244)
    assert default.capacity.max_concurrency == default.capacity.num_blocks / 237
    assert off.capacity.max_concurrency == off.capacity.num_blocks / 244
    assert default.resolved.prefix_caching and default.resolved.prefix_caching_default
    assert not on.resolved.prefix_caching_default and not off.resolved.prefix_caching
    assert note(default).startswith("Prefix caching on: the engine's default, not set in the config (a hybrid model; "
                                    "vLLM 0.33.0 config/model.py is_prefix_caching_supported")


def test_vllm_0_33_nemotron_h_default_holds_two_state_pages():
    """Nemotron-H 8B on an H100: block 1,040 either way (recurrent_state.py); 8,192 tokens take cdiv(8,192, 1,040) = 8
    attention blocks, and each of the 6 Mamba groups 3 state pages in align mode (two, and Mamba-2's prefill
    checkpoint page: 0.33.0 mamba_mixer2.py get_kv_cache_spec), 1 without: 26 vs 14 blocks."""
    default = vllm("nemotron-h-8b", engine_version="0.33")
    off = vllm("nemotron-h-8b", engine_version="0.33", prefix_caching=False)
    assert default.capacity == vllm("nemotron-h-8b", engine_version="0.33", prefix_caching=True).capacity
    assert default.capacity.num_blocks == off.capacity.num_blocks
    assert (default.capacity.blocks_per_request, off.capacity.blocks_per_request) == (8 + 18, 8 + 6)
    assert default.capacity.max_concurrency == default.capacity.num_blocks / 26
    assert off.capacity.max_concurrency == off.capacity.num_blocks / 14


@pytest.mark.parametrize("version, record", [("0.11", "0.11"), ("0.12", "0.11"), ("0.15", "0.15"), ("0.20", "0.15"),
                                             ("0.25", "0.15"), ("0.30", "0.15"), ("0.33", "0.33"), (None, "0.33")])
def test_each_release_follows_the_newest_record_at_or_below_it(version, record):
    assert ".".join(map(str, prefix_default.vllm_rule(version).version)) == record


@pytest.mark.parametrize("version", ["0.11", "0.15", "0.25"])
def test_vllm_before_0_33_leaves_a_hybrids_prefix_caching_off(version):
    """0.15-0.25 config/model.py is_prefix_caching_supported: 'Hybrid models do not support prefix caching since the
    feature is still experimental' (off by default); 0.11 MambaModelConfig turns it off. The default is the explicit
    off, state pages and all."""
    default = vllm("nemotron-h-8b", engine_version=version)
    assert default.capacity == vllm("nemotron-h-8b", engine_version=version, prefix_caching=False).capacity
    assert not default.resolved.prefix_caching and default.resolved.prefix_caching_default
    source = "vLLM 0.11.0 engine/arg_utils.py" if version == "0.11" else "vLLM 0.15.0 (same in 0.19.0"
    assert source in note(default)


def test_vllm_decoders_default_on_and_0_11_hybrids_off_whatever_is_asked():
    llama = vllm("llama-3.1-8b", max_model_len=8192, engine_version="0.11")
    assert llama.resolved.prefix_caching and "a decoder; vLLM 0.11.0 engine/arg_utils.py _set_default_args" in \
        note(llama)
    asked = vllm("nemotron-h-8b", engine_version="0.11", prefix_caching=True)
    assert not asked.resolved.prefix_caching and note(asked).startswith("Prefix caching off although the config sets "
                                                                         "it on (vLLM 0.11.0")
    # 0.15 on honours an explicit on for a hybrid: a Mamba-based one keeps a state a block ('all' mode)
    on = vllm("nemotron-h-8b", engine_version="0.25", prefix_caching=True)
    assert on.resolved.prefix_caching and any("mamba_cache_mode 'all'" in n for n in on.notes)


def test_attention_free_models_default_off():
    """config/model.py is_prefix_caching_supported (0.15-0.33): 'Attention free models do not support prefix
    caching'."""
    arch = get_architecture("nemotron-h-8b")
    mamba_only = dataclasses.replace(arch, hybrid_override_pattern=arch.hybrid_override_pattern.replace("*", "M"))
    resolved = prefix_default.resolve(mamba_only, Serving(engine_version="0.33"), None)
    assert (resolved.on, resolved.engine_default) == (False, True) and "attention-free" in resolved.reason


def test_vllm_default_is_what_vllm_0_33_own_model_config_says():
    """ModelConfig.is_prefix_caching_supported run on CPU by validation/vllm/prefix_defaults.py."""
    data = json.loads((DATA / "prefix-vllm-0.33.0.json").read_text())
    assert "-m validation.vllm.prefix_defaults" in data["command"] and data["vllm_version"] == "0.33.0"
    ran = [r for r in data["records"] if "error" not in r]
    assert {r["preset"] for r in ran} == {"llama-3.1-8b", "nemotron-h-8b", "falcon-h1-7b", "jamba-mini-1.5"}
    for r in ran:
        ours = prefix_default.resolve(get_architecture(r["preset"]), Serving(engine_version="0.33"), None)
        assert ours.on == r["is_prefix_caching_supported"], r["preset"]
        assert get_architecture(r["preset"]).is_hybrid == (r["attn_type"] == "hybrid")


def _embedding_gemma() -> dict:
    """Gemma 3's text model with bidirectional attention, as EmbeddingGemma's config.json declares it (the shapes of
    the 27B preset's text model: what the hook reads is model_type and use_bidirectional_attention)."""
    return dict(get_hf_config("gemma-3-27b")["text_config"], model_type="gemma3_text",
                architectures=["Gemma3TextModel"], use_bidirectional_attention=True, vocab_size=262208, max_position_embeddings=131072,
                torch_dtype="bfloat16")


def test_sglang_default_is_what_sglang_resolves():
    """SGLang 0.5.23's ServerArgs resolved without --disable-radix-cache (validation/sglang/radix_defaults.py): on for
    the presets, off for the EmbeddingGemma-shaped checkpoint (model_hook.py, configs/embedding_model_spec.py)."""
    data = json.loads((DATA / "sglang-0.5.23-radix.json").read_text())
    assert "-m validation.sglang.radix_defaults" in data["command"] and data["sglang_version"] == "0.5.23"
    assert len(data["records"]) == 5 and all("error" not in r for r in data["records"])
    for r in data["records"]:
        checkpoint = _embedding_gemma() if r["name"] == "embeddinggemma-shaped" else get_hf_config(r["preset"])
        ours = prefix_default.resolve(get_architecture(r["preset"]), Serving(engine="sglang"), checkpoint)
        assert ours.on is not r["disable_radix_cache"], r["name"]
    assert [r["name"] for r in data["records"] if r["disable_radix_cache"]] == ["embeddinggemma-shaped"]


def test_sglang_hook_turns_the_radix_cache_off_in_the_estimate():
    checkpoint = _embedding_gemma()
    e = estimate_sglang(architecture_from_model(checkpoint), Serving(engine="sglang"), Parallel(tp=1),
                        Hardware("h100-80"), checkpoint)
    assert not e.resolved.prefix_caching and e.resolved.prefix_caching_default
    assert "EmbeddingGemma" in note(e) and "configs/embedding_model_spec.py" in note(e)
    with pytest.raises(ConfigError) as err:  # a shared prefix needs the cache the hook turned off
        estimate_sglang(architecture_from_model(checkpoint), Serving(engine="sglang", shared_prefix_tokens=1024),
                        Parallel(tp=1), Hardware("h100-80"), checkpoint)
    assert err.value.field == "serving.shared_prefix_tokens"


def test_sglang_hybrid_default_is_the_radix_caches_running_requests():
    """Nemotron-H 8B on an H100: 249 state slots of 24 x 4,255,744 B (+ 1 padding). With the radix cache (unset:
    SGLang's default) a running request holds 3 slots + 2 of the extra buffer: 249 // 5 = 49 requests, what SGLang
    itself resolved for this run (tests/data/serving/sglang-0.5.23.json, prefix_caching true); without it one slot
    each, so the 1,744,307-token pool limits instead: 1,744,307 / 8,192 sequences."""
    default, off = sglang("nemotron-h-8b"), sglang("nemotron-h-8b", prefix_caching=False)
    on = sglang("nemotron-h-8b", prefix_caching=True)
    assert default.capacity == on.capacity and default.limiting.components == on.limiting.components
    state = next(c for c in default.limiting.components if c.key == "recurrent_state")
    assert state.bytes == (249 + 1) * 24 * 4_255_744
    record = next(r for r in json.loads((DATA / "sglang-0.5.23.json").read_text())["records"]
                  if r["case"]["model"] == "nemotron-h-8b" and r["case"]["serving"] == {"engine": "sglang",
                                                                                         "prefix_caching": True})
    assert record["sglang"]["ranks"][0]["max_running_requests"] == 49 == 249 // 5
    assert default.capacity.tokens == off.capacity.tokens == record["sglang"]["ranks"][0]["max_total_num_tokens"]
    assert default.capacity.max_concurrency == 49
    assert off.capacity.max_concurrency == 1_744_307 / 8192


def test_the_cli_flag_takes_auto(capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "nemotron-h-8b",
                                "serving": {"engine_version": "0.33", "prefix_caching": False}}))
    out = {}
    for value in ("auto", "true", "false"):
        assert main(["serve", "--config", str(path), "--prefix-caching", value, "--json"]) == 0
        out[value] = json.loads(capsys.readouterr().out)["serving"]
    assert out["auto"]["max_concurrency"] == out["true"]["max_concurrency"] != out["false"]["max_concurrency"]
    assert (out["auto"]["prefix_caching"], out["auto"]["prefix_caching_engine_default"]) == (True, True)
    assert out["auto"]["prefix_caching_note"].startswith("Prefix caching on: the engine's default, not set in the "
                                                         "config (a hybrid model; vLLM 0.33.0 config/model.py")
    assert out["false"]["prefix_caching_note"] == "Prefix caching off: set in the config (--no-enable-prefix-caching)."
    assert main(["serve", "--config", str(path), "--prefix-caching", "maybe"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Prefix caching" in err and "'maybe'" in err and "auto" in err


@pytest.mark.parametrize("model, asked, flag", [("nemotron-h-8b", None, "--enable-prefix-caching"),
                                                 ("nemotron-h-8b", False, "--no-enable-prefix-caching"),
                                                 ("llama-3.1-8b", None, "--enable-prefix-caching")])
def test_vllm_emit_states_the_assumed_prefix_caching(model, asked, flag):
    """A serve line carries no release, so it states the mode the estimate assumed (0.33's default when unset)."""
    serving = {"engine": "vllm", "max_model_len": 8192} | ({} if asked is None else {"prefix_caching": asked})
    config = {"model": model, "training": {"mode": "inference", "seq_len": 8192, "kv_cache_tokens": 8192},
              "serving": serving}
    line = emit_serve("vllm", config)
    assert line.split()[-1] == flag
    assert import_config(line).config["serving"]["prefix_caching"] is (flag == "--enable-prefix-caching")


def test_sglang_emit_writes_the_flag_only_when_off():
    config = {"model": "qwen3-8b", "training": {"mode": "inference", "seq_len": 8192, "kv_cache_tokens": 8192},
              "serving": {"engine": "sglang", "max_model_len": 8192}}
    assert "--disable-radix-cache" not in emit_serve("sglang", config)  # on: SGLang's default, it has no flag for on
    off = dict(config, serving={**config["serving"], "prefix_caching": False})
    assert emit_serve("sglang", off).rstrip().endswith("--disable-radix-cache")
