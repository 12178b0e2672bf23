"""training.attn_implementation: which kernel transformers' modelling code runs as flash attention under hf,
deepspeed and fsdp1 (sdpa, its default, or flash_attention_2), what it changes, what is refused, and the
importers and emitters that carry it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from estimator import estimate_config
from estimator.importers import axolotl, llama_factory
from estimator.memory.activations.sdpa_mask import masked_sdpa_entries
from estimator.models.hf_config import architecture_from_hf_config
from estimator.spec.errors import ConfigError
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

# Falcon-7B's config.json keys (multi-query: 71 query heads on one key/value head)
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
             "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True, "vocab_size": 65024,
             "alibi": False, "bias": False}
S = 2048


def _falcon(**training):
    return {"model": copy.deepcopy(FALCON_7B), "training": {"framework": "hf", "seq_len": S, "micro_batch_size": 1,
                                                            **training}, "hardware": {"gpu": "h100-80"}}


def test_the_default_is_transformers_sdpa():
    assert (estimate_config(_falcon()).allocated_peak_bytes
            == estimate_config(_falcon(attn_implementation="sdpa")).allocated_peak_bytes)


def test_flash_attention_2_takes_falcons_flash_set_not_sdpas_math_backend():
    """Each of the 32 layers keeps, under SDPA's math backend, fp32 q (2,048 x 4,544 x 4 = 37,224,448 B), fp32 k and v
    at one head (2 x 2,048 x 64 x 4 = 1,048,576 B) and the fp32 softmax (71 x 2,048^2 x 4 = 1,191,182,336 B), where
    flash_attention_2 keeps the bf16 q, k, v it is handed (2,048 x (4,544 + 2 x 64) x 2 = 19,136,512 B) and the fp32
    log-sum-exp (71 x 2,048 x 4 = 581,632 B): 32 x (1,229,455,360 - 19,718,144) B less kept at the end of the
    forward."""
    sdpa, fa2 = (estimate_config(_falcon(attn_implementation=k)) for k in ("sdpa", "flash_attention_2"))
    kept = {name: next(c.bytes for p in e.stages[0].phases if p.name == "forward" for c in p.components
                       if c.key == "activations") for name, e in (("sdpa", sdpa), ("fa2", fa2))}
    assert kept["sdpa"] - kept["fa2"] == 32 * (1_229_455_360 - 19_718_144)


def test_sliding_windows_take_no_mask_under_flash_attention_2():
    """Mistral-style sliding windows (every layer, window 2,048) at s 4,096: SDPA gets a 4-D mask from the window on,
    a layer keeping the s x s bf16 bias (4,096^2 x 2 = 33,554,432 B) and k, v repeated to every query head beyond the
    grouped ones (4,096 x 2 x (32 - 8) x 128 x 2 = 50,331,648 B); flash-attn takes the window itself, no mask."""
    arch, _ = architecture_from_hf_config({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                                           "num_attention_heads": 32, "num_key_value_heads": 8,
                                           "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": 2048})
    sdpa = Training(framework="hf", attention="flash", seq_len=4096, micro_batch_size=1, param_dtype="bf16")
    par = Parallel()
    assert [e.bytes(par) for e in masked_sdpa_entries(arch, sdpa, par)] == [50_331_648, 33_554_432]
    assert masked_sdpa_entries(arch, replace(sdpa, attn_implementation="flash_attention_2"), par) == []


@pytest.mark.parametrize("training, allowed", [
    ({"attention": "eager", "attn_implementation": "sdpa"}, "empty unless attention is 'flash'"),
    ({"framework": "fsdp2", "attn_implementation": "flash_attention_2"}, "empty unless attention is 'flash'"),
    ({"attn_implementation": "flash_attention_3"}, "sdpa"),
])
def test_refused_where_it_names_nothing(training, allowed):
    with pytest.raises(ConfigError) as err:
        estimate_config(_falcon(**training))
    assert err.value.field == "training.attn_implementation" and allowed in str(err.value)


def test_alibi_falcon_refuses_flash_attention_2_as_transformers_does():
    config = _falcon(attn_implementation="flash_attention_2")
    config["model"].update(alibi=True, multi_query=False)
    with pytest.raises(ConfigError, match="alibi` is not supported") as err:
        estimate_config(config)
    assert err.value.field == "training.attn_implementation"


AXOLOTL = "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 4096\nmicro_batch_size: 1\nbf16: true\n"
FACTORY = ("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: full\ncutoff_len: 4096\n"
           "per_device_train_batch_size: 1\nbf16: true\n")


@pytest.mark.parametrize("extra, expected", [("flash_attention: true\n", "flash_attention_2"),
                                             ("sdp_attention: true\n", "sdpa"),
                                             ("attn_implementation: flash_attention_2\n", "flash_attention_2"),
                                             ("", None)])
def test_axolotl_switches(extra, expected):
    config = axolotl.read(AXOLOTL + extra).config
    assert config["training"].get("attn_implementation") == expected
    assert config["training"].get("attention", "flash") == "flash"


@pytest.mark.parametrize("value, expected", [("fa2", "flash_attention_2"), ("sdpa", "sdpa"), ("auto", None)])
def test_llama_factory_flash_attn(value, expected):
    config = llama_factory.read(FACTORY + f"flash_attn: {value}\n").config
    assert config["training"].get("attn_implementation") == expected
