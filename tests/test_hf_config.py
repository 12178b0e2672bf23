"""Hugging Face config.json -> canonical Architecture (estimator.hf_config)."""

from __future__ import annotations

import math
import signal
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from estimator.spec.architecture import parameter_counts
from estimator.spec.errors import ConfigError
from estimator.models.hf_common import _COMMON_KEYS
from estimator.models.hf_families import FAMILIES, _moe_pattern_qwen, _Reader
from estimator.models.hf_config import SUPPORTED_MODEL_TYPES, architecture_from_hf_config


def build(config: dict):
    arch, ignored = architecture_from_hf_config(config)
    return arch, ignored


LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "tie_word_embeddings": False, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}


def test_llama_3_1_8b_exact():
    arch, ignored = build(LLAMA_8B)
    # Hub safetensors total of meta-llama/Llama-3.1-8B (the project's reference count)
    assert parameter_counts(arch).total == 8_030_261_248
    assert ignored == [] and arch.head_dim == 128 and arch.num_kv_heads == 8


def test_gpt2_small_names_and_learned_positions():
    arch, _ = build({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                     "n_positions": 1024, "activation_function": "gelu_new"})
    assert (arch.hidden_size, arch.num_layers, arch.num_attention_heads) == (768, 12, 12)
    assert arch.position_embedding == "learned" and arch.max_position_embeddings == 1024
    assert arch.norm == "layernorm" and arch.linear_bias and not arch.gated_mlp and arch.tie_embeddings
    h, v, p, L = 768, 50257, 1024, 12
    block = (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
    assert parameter_counts(arch).total == v * h + p * h + L * block + 2 * h == 124_439_808  # GPT-2 "124M"


def test_falcon_7b_multi_query_parallel_attention():
    arch, _ = build({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                     "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True, "parallel_attn": True,
                     "bias": False, "new_decoder_architecture": False})
    assert arch.num_kv_heads == 1 and arch.norms_per_layer == 1 and arch.intermediate_size == 4 * 4544
    h, d = 4544, 64
    layer = (h + 2 * d) * h + h * h + 2 * 4 * h * h + 2 * h  # fused qkv (MQA), dense, 4h MLP, one LayerNorm
    assert parameter_counts(arch).total == 32 * layer + 65024 * h + 2 * h  # tied head


def test_falcon_new_decoder_architecture_has_two_norms():
    arch, _ = build({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
                     "num_kv_heads": 8, "num_hidden_layers": 60, "vocab_size": 65024,
                     "new_decoder_architecture": True, "parallel_attn": True})
    assert arch.num_kv_heads == 8 and arch.norms_per_layer == 2


def test_falcon_old_names():
    arch, _ = build({"model_type": "falcon", "n_embed": 4544, "n_head": 71, "n_layer": 32, "vocab_size": 65024})
    assert (arch.hidden_size, arch.num_attention_heads, arch.num_layers) == (4544, 71, 32)


def test_family_defaults():
    # tie_word_embeddings follows each config class: Gemma ties, Llama does not, GPT-2 ties
    gemma, _ = build({"model_type": "gemma"})
    assert gemma.tie_embeddings and gemma.head_dim == 256 and gemma.vocab_size == 256000
    llama, _ = build({**{k: v for k, v in LLAMA_8B.items() if k != "tie_word_embeddings"}})
    assert not llama.tie_embeddings
    star, _ = build({"model_type": "starcoder2"})
    assert star.tie_embeddings and star.linear_bias and star.norm == "layernorm" and not star.gated_mlp
    assert star.num_kv_heads == 2
    phi, _ = build({"model_type": "phi3"})
    assert phi.num_kv_heads == phi.num_attention_heads == 32
    neox, _ = build({"model_type": "gpt_neox"})
    assert neox.linear_bias and neox.norm == "layernorm" and not neox.tie_embeddings
    # head_dim = hidden / heads unless given
    mistral, _ = build({"model_type": "mistral", "hidden_size": 5120, "num_attention_heads": 32})
    assert mistral.head_dim == 160
    nemo, _ = build({"model_type": "mistral", "hidden_size": 5120, "num_attention_heads": 32, "head_dim": 128})
    assert nemo.head_dim == 128


def test_null_values_take_the_default():
    arch, _ = build({**LLAMA_8B, "num_key_value_heads": None, "head_dim": None})
    assert arch.num_kv_heads == 32 and arch.head_dim == 128


def test_qwen2_qkv_bias_and_sliding_window_off():
    arch, _ = build({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 131072})
    assert arch.qkv_bias and not arch.linear_bias and arch.sliding_window is None


def test_qwen3_and_gemma3_qk_norm_olmo2_full_width():
    assert build({"model_type": "qwen3"})[0].qk_norm
    olmo, _ = build({"model_type": "olmo2"})
    assert olmo.qk_norm and olmo.qk_norm_full_width


def test_gemma2_and_gemma3_norms_and_windows():
    g2, _ = build({"model_type": "gemma2"})
    assert g2.norms_per_layer == 4 and g2.sliding_window == 4096 and g2.sliding_window_pattern == 2
    g3, _ = build({"model_type": "gemma3_text", "sliding_window": 1024})
    assert g3.norms_per_layer == 4 and g3.qk_norm and g3.sliding_window_pattern == 6


def test_multimodal_config_uses_its_text_model():
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "boi_token_index": 255999,
              "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62,
                              "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                              "intermediate_size": 21504, "sliding_window": 1024},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "vision_use_head": False,
                                "image_size": 896, "patch_size": 14}}
    arch, ignored = build(config)
    assert arch.hidden_size == 5376 and arch.vocab_size == 262208 and arch.tie_embeddings
    assert ignored == []
    # the vision tower is read too (issue 28), SiglipVisionConfig's defaults where the file is silent
    assert (arch.vision_tower, arch.vision_hidden_size, arch.vision_num_layers, arch.vision_tokens_per_image) == \
        ("siglip", 1152, 12, 256)
    # SiglipVisionConfig's default vision_use_head is true: a pooling head Gemma 3's checkpoints do not have
    with pytest.raises(ConfigError) as err:
        build(dict(config, vision_config={"model_type": "siglip_vision_model", "hidden_size": 1152}))
    assert err.value.field == "model.vision_config.vision_use_head"


def test_layer_types_give_the_sliding_pattern():
    types = ["sliding_attention"] * 5 + ["full_attention"]
    arch, _ = build({"model_type": "gemma3_text", "num_hidden_layers": 12, "layer_types": types * 2})
    assert arch.sliding_window_pattern == 6
    arch, _ = build({"model_type": "mistral", "layer_types": ["full_attention"] * 32})
    assert arch.sliding_window is None


def test_mixtral_moe():
    arch, _ = build({"model_type": "mixtral"})
    assert arch.num_experts == 8 and arch.num_experts_per_token == 2 and arch.moe_intermediate_size == 14336
    assert arch.intermediate_size is None and arch.sliding_window is None


def test_qwen2_moe_shared_expert_gate_and_sparse_step():
    arch, _ = build({"model_type": "qwen2_moe"})
    assert arch.num_experts == 60 and arch.num_shared_experts == 1 and arch.shared_expert_gate
    assert arch.shared_expert_intermediate_size == 5632 and arch.qkv_bias
    arch, _ = build({"model_type": "qwen2_moe", "num_hidden_layers": 8, "decoder_sparse_step": 2})
    # transformers: layer i is sparse when (i + 1) % step == 0 -> layers 1, 3, 5, 7
    assert arch.layer_kinds() == ("dense", "moe") * 4
    arch, _ = build({"model_type": "qwen3_moe", "num_hidden_layers": 6, "mlp_only_layers": [0, 1]})
    assert arch.layer_kinds() == ("dense", "dense", "moe", "moe", "moe", "moe")
    with pytest.raises(ConfigError) as caught:
        build({"model_type": "qwen3_moe", "num_hidden_layers": 6, "mlp_only_layers": [3]})
    assert caught.value.field == "model.mlp_only_layers"


def test_deepseek_v3_details():
    arch, _ = build({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1})
    assert arch.uses_mla and arch.q_lora_rank == 1536 and arch.kv_lora_rank == 512
    assert arch.router_bias and arch.mtp_layers == 1 and arch.first_dense_layers == 3
    assert arch.num_shared_experts == 1 and arch.num_experts == 256
    counts = parameter_counts(arch, include_mtp=False)
    # the project's reference counts (CONTRACT/brief): 671,026,419,200 total, 37,552,297,472 active
    assert (counts.total, counts.active) == (671_026_419_200, 37_552_297_472)
    assert parameter_counts(arch).total == 684_489_845_504


def test_deepseek_v2_lite_without_q_lora_and_without_router_bias():
    arch, _ = build({"model_type": "deepseek_v2", "q_lora_rank": None, "n_routed_experts": 64,
                     "num_experts_per_tok": 6, "n_shared_experts": 2, "first_k_dense_replace": 1,
                     "num_hidden_layers": 27, "hidden_size": 2048, "num_attention_heads": 16,
                     "intermediate_size": 10944, "moe_intermediate_size": 1408, "topk_method": "greedy"})
    assert arch.q_lora_rank is None and not arch.router_bias and arch.num_shared_experts == 2


def test_gpt_oss_biases_sinks_and_alternating_window():
    types = ["sliding_attention", "full_attention"] * 12
    arch, _ = build({"model_type": "gpt_oss", "num_hidden_layers": 24, "num_local_experts": 32,
                     "layer_types": types, "sliding_window": 128})
    assert arch.linear_bias and arch.router_bias and arch.attention_sinks
    assert arch.sliding_window == 128 and arch.sliding_window_pattern == 2
    assert arch.num_experts == 32 and arch.num_experts_per_token == 4 and arch.head_dim == 64


def test_unknown_fields_are_reported():
    _, ignored = build({**LLAMA_8B, "my_new_field": 1, "architectures": ["LlamaForCausalLM"]})
    assert ignored == ["my_new_field"]


def test_a_dropout_the_architecture_does_not_carry_is_noted():
    # the attention dropout is training.dropout's; Phi3Config reads embd_pdrop, modeling_phi3.py applies it nowhere
    _, ignored = build({**LLAMA_8B, "attention_dropout": 0.1})
    assert ignored == ["attention_dropout 0.1 (set training.dropout to count it)"]
    arch, ignored = build({**LLAMA_8B, "model_type": "phi3", "attention_dropout": 0.0, "resid_pdrop": 0.1,
                           "embd_pdrop": 0.05})
    assert ignored == ["embd_pdrop 0.05 (phi3's modelling code applies it nowhere: no mask)"]
    assert (arch.attention_residual_dropout, arch.mlp_residual_dropout, arch.embedding_dropout) == (0.1, 0.1, 0.0)


@pytest.mark.parametrize("config, dropouts", [
    # GPT2Config's defaults: resid_pdrop = embd_pdrop = 0.1 (models/gpt2/configuration_gpt2.py)
    ({"model_type": "gpt2"}, (0.1, 0.1, 0.1)),
    ({"model_type": "gpt2", "resid_pdrop": 0.0, "embd_pdrop": 0.2}, (0.0, 0.0, 0.2)),
    # GPT-NeoX: hidden_dropout on the embeddings and both branches
    ({"model_type": "gpt_neox", "hidden_dropout": 0.1}, (0.1, 0.1, 0.1)),
    ({"model_type": "starcoder2", "residual_dropout": 0.1, "embedding_dropout": 0.05}, (0.1, 0.1, 0.05)),
    # Falcon: dropout_add(hidden_dropout) once per layer; without parallel attention the attention output goes
    # through dropout_add(attention_dropout) first; no embedding dropout
    ({"model_type": "falcon", "hidden_dropout": 0.1, "attention_dropout": 0.2}, (0.0, 0.1, 0.0)),
    ({"model_type": "falcon", "hidden_dropout": 0.1, "attention_dropout": 0.2, "parallel_attn": False},
     (0.2, 0.1, 0.0)),
    ({**LLAMA_8B, "hidden_dropout": 0.1}, (0.0, 0.0, 0.0)),  # Llama applies none (an unknown key to it)
])
def test_the_residual_and_embedding_dropouts_are_read(config, dropouts):
    arch, _ = build(config)
    assert (arch.attention_residual_dropout, arch.mlp_residual_dropout, arch.embedding_dropout) == dropouts


def test_a_dropout_that_is_no_probability_is_refused():
    with pytest.raises(ConfigError) as caught:
        build({"model_type": "starcoder2", "residual_dropout": 1.5})
    assert caught.value.field == "model.residual_dropout" and caught.value.value == 1.5


def test_the_transformers_code_details_are_read():
    phi, _ = build({"model_type": "phi3"})
    neox, _ = build({"model_type": "gpt_neox"})
    neox_serial, _ = build({"model_type": "gpt_neox", "use_parallel_residual": False, "hidden_act": "gelu_new"})
    gpt2, _ = build({"model_type": "gpt2"})
    star, _ = build({"model_type": "starcoder2"})
    # one q, k, v linear: Phi-3 qkv_proj, GPT-NeoX query_key_value, GPT-2 c_attn (StarCoder2: q_proj, k_proj, v_proj)
    assert phi.fused_qkv and neox.fused_qkv and gpt2.fused_qkv and not star.fused_qkv
    assert neox.parallel_attention and not neox_serial.parallel_attention and not phi.parallel_attention
    assert gpt2.composite_gelu and neox_serial.composite_gelu and not neox.composite_gelu and not star.composite_gelu
    assert gpt2.eager_softmax_in_compute_dtype and not star.eager_softmax_in_compute_dtype
    # GPT-NeoX rotates rotary_pct of each head (GPTNeoXConfig: 0.25 by default; transformers 5.x saves it as
    # rope_parameters' partial_rotary_factor); the others the whole head
    assert (neox.partial_rotary_factor, phi.partial_rotary_factor, star.partial_rotary_factor) == (0.25, 1.0, 1.0)
    assert build({"model_type": "gpt_neox", "rotary_pct": 0.5})[0].partial_rotary_factor == 0.5
    assert build({"model_type": "gpt_neox", "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}}
                 )[0].partial_rotary_factor == 1.0
    with pytest.raises(ConfigError) as caught:
        build({"model_type": "gpt_neox", "rotary_pct": 1.5})
    assert caught.value.field == "model.rotary_pct" and caught.value.value == 1.5
    falcon, _ = build({"model_type": "falcon"})  # falcon-7b: multi-query, parallel attention, one norm
    falcon_mha, _ = build({"model_type": "falcon", "multi_query": False})
    assert falcon.eager_kv_broadcast and not falcon_mha.eager_kv_broadcast and not neox.eager_kv_broadcast
    assert falcon.parallel_attention and falcon.norms_per_layer == 1 and falcon.eager_softmax_in_compute_dtype
    # one query_key_value; modeling_falcon.py _split_heads takes k and v by index lists (copies) when multi-query or
    # with the new decoder architecture, views of the output only when both are off
    falcon_new, _ = build({"model_type": "falcon", "new_decoder_architecture": True, "num_attention_heads": 64,
                           "num_kv_heads": 8, "hidden_size": 4096})  # falcon-40b-like
    assert falcon.fused_qkv and falcon_mha.fused_qkv and falcon_new.fused_qkv
    assert falcon.qkv_split_copies and falcon_new.qkv_split_copies and not falcon_mha.qkv_split_copies
    assert not (phi.qkv_split_copies or neox.qkv_split_copies or gpt2.qkv_split_copies)


@pytest.mark.parametrize("model_type", ["mamba", "rwkv", "bert", "t5", "llama4", "unet"])
def test_unsupported_model_type_is_named(model_type):
    with pytest.raises(ConfigError) as caught:
        build({"model_type": model_type, "hidden_size": 64})
    error = caught.value
    assert error.field == "model.model_type" and error.value == model_type
    assert "llama" in error.allowed and "deepseek_v3" in error.allowed
    assert model_type in str(error) and "\n" not in str(error)


def test_a_diffusion_config_without_model_type():
    with pytest.raises(ConfigError) as caught:
        build({"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.6.0"})
    assert caught.value.field == "model.model_type" and caught.value.value is None


def test_bad_values_name_the_field():
    with pytest.raises(ConfigError) as caught:
        build({**LLAMA_8B, "hidden_size": "big"})
    assert caught.value.field == "model.hidden_size"
    with pytest.raises(ConfigError) as caught:
        build({**LLAMA_8B, "tie_word_embeddings": "yes"})
    assert caught.value.field == "model.tie_word_embeddings"
    with pytest.raises(ConfigError):
        build(["not", "a", "dict"])  # type: ignore[arg-type]


def test_supported_types_listed():
    for name in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                 "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "gpt_oss", "olmo2",
                 "granite", "gpt_neox", "gpt2", "starcoder2", "falcon"):
        assert name in SUPPORTED_MODEL_TYPES
        build({"model_type": name})  # the defaults alone make a valid architecture


# --- hostile values -----------------------------------------------------------------------------------
# Every value the mapping reads goes through one of a few typed getters; a wrong type ends in a
# ConfigError naming the field as the file spells it, never in a bare ValueError or TypeError.

def field_of(config: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        build(config)
    return caught.value.field


def test_an_integer_field_takes_integers_only():
    for value in ("32", 32.5, True, -32, 0, [32], {"n": 32}, math.inf, math.nan):
        assert field_of({**LLAMA_8B, "num_hidden_layers": value}) == "model.num_hidden_layers", value
    assert build({**LLAMA_8B, "num_hidden_layers": None})[0].num_layers == 32  # null: LlamaConfig's default
    assert build({**LLAMA_8B, "num_hidden_layers": 32.0})[0].num_layers == 32  # an integral float is the int
    # an alias is named as the file spells it
    assert field_of({"model_type": "gpt2", "n_layer": -12}) == "model.n_layer"
    assert field_of({"model_type": "falcon", "n_head": 7.5}) == "model.n_head"


def test_zero_is_allowed_only_where_it_means_none():
    arch, _ = build({"model_type": "deepseek_v3", "n_shared_experts": 0, "num_nextn_predict_layers": 0})
    assert arch.num_shared_experts == 0 and arch.mtp_layers == 0
    assert field_of({"model_type": "deepseek_v3", "first_k_dense_replace": -1}) == "model.first_k_dense_replace"
    assert field_of({"model_type": "deepseek_v3", "num_nextn_predict_layers": -1}) == "model.num_nextn_predict_layers"


def test_a_flag_takes_true_or_false_only():
    for value in ("yes", 1, 0.0, [True]):
        assert field_of({**LLAMA_8B, "attention_bias": value}) == "model.attention_bias"
        assert field_of({"model_type": "qwen2", "use_sliding_window": value}) == "model.use_sliding_window"
        assert field_of({"model_type": "phi3", "lm_head_bias": value}) == "model.lm_head_bias"


def test_a_gemma2_softcap_takes_a_positive_finite_number_or_null():
    for value in ("abc", "50", True, math.nan, math.inf, -math.inf, 0, -30.0, 10**400, [50.0], {"cap": 50}):
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            assert field_of({"model_type": "gemma2", key: value}) == f"model.{key}", value
    arch, _ = build({"model_type": "gemma2", "attn_logit_softcapping": 20, "final_logit_softcapping": 12.5})
    assert arch.attention_logit_softcapping == 20.0 and arch.final_logit_softcapping == 12.5
    # Gemma2Config: 50 and 30 by default; null switches the cap off
    arch, _ = build({"model_type": "gemma2", "attn_logit_softcapping": None})
    assert arch.attention_logit_softcapping is None and arch.final_logit_softcapping == 30.0
    assert build({"model_type": "gemma2"})[0].attention_logit_softcapping == 50.0


def test_a_text_field_takes_a_string():
    assert field_of({"model_type": "deepseek_v3", "topk_method": 3}) == "model.topk_method"
    assert field_of({**LLAMA_8B, "_name_or_path": 7}) == "model._name_or_path"
    assert field_of({"model_type": ["llama"]}) == "model.model_type"
    assert field_of({"model_type": {"llama": 1}}) == "model.model_type"


def test_a_list_field_takes_a_list_of_its_items():
    for value in ("sliding_attention", [0, 1], [["sliding_attention"]], [None], {"0": "full_attention"}):
        assert field_of({"model_type": "gemma3_text", "layer_types": value}) == "model.layer_types", value
    for value in ("0,1", [False], [0.0], ["0"], {"0": 1}):
        assert field_of({"model_type": "qwen3_moe", "mlp_only_layers": value}) == "model.mlp_only_layers", value


def test_family_fields_are_typed_too():
    assert field_of({"model_type": "gemma3_text", "sliding_window_pattern": "abc"}) == "model.sliding_window_pattern"
    assert field_of({"model_type": "gemma3_text", "sliding_window_pattern": 0}) == "model.sliding_window_pattern"
    assert field_of({"model_type": "falcon", "new_decoder_architecture": True,
                     "num_ln_in_parallel_attn": 2.5}) == "model.num_ln_in_parallel_attn"
    assert field_of({"model_type": "mistral", "sliding_window": "4096"}) == "model.sliding_window"


def test_a_text_config_must_be_an_object():
    for text in ([], "gemma3_text", 5, True):
        assert field_of({"model_type": "gemma3", "text_config": text}) == "model.text_config", text


def test_a_text_config_field_is_named_inside_it():
    config = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": "5376"}}
    assert field_of(config) == "model.text_config.hidden_size"
    config = {"model_type": "gemma3", "text_config": {"model_type": ["gemma3_text"]}}
    assert field_of(config) == "model.text_config.model_type"
    config = {"model_type": "gemma3", "tie_word_embeddings": "yes", "text_config": {"model_type": "gemma3_text"}}
    assert field_of(config) == "model.tie_word_embeddings"


def qwen_sparse_layers_one_by_one(num_layers: int, step: int, only: list[int]) -> dict:
    """transformers' Qwen2/3-MoE rule, walked layer by layer, as the canonical fields."""
    moe = [i for i in range(num_layers) if i not in only and (i + 1) % step == 0]
    if not moe:
        return dict(num_experts=0)
    expected = [i for i in range(num_layers) if i >= moe[0] and (i - moe[0]) % step == 0]
    return dict(first_dense_layers=moe[0], moe_layer_frequency=step) if moe == expected else {}


@given(num_layers=st.integers(1, 60), step=st.integers(1, 8), only=st.lists(st.integers(-3, 70), max_size=8))
def test_the_qwen_moe_pattern_in_closed_form_equals_walking_the_layers(num_layers, step, only):
    reader = _Reader({"decoder_sparse_step": step, "mlp_only_layers": only}, "qwen3_moe")
    expected = qwen_sparse_layers_one_by_one(num_layers, step, only)
    if expected:
        assert _moe_pattern_qwen(reader, num_layers) == expected
    else:
        with pytest.raises(ConfigError) as caught:
            _moe_pattern_qwen(reader, num_layers)
        assert caught.value.field == "model.mlp_only_layers"


@contextmanager
def deadline(seconds: float):
    """Fail, instead of hanging, when the block runs past `seconds` (SIGALRM: the main thread)."""
    def expire(*_):
        raise TimeoutError(f"ran past {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_billion_qwen_layers_are_read_without_walking_them():
    with deadline(5), pytest.raises(ConfigError):  # the layer count's own bound answers
        build({"model_type": "qwen3_moe", "num_hidden_layers": 10**12, "mlp_only_layers": [0, 1]})
    with deadline(5):
        pattern = _moe_pattern_qwen(_Reader({"decoder_sparse_step": 2, "mlp_only_layers": [1, 3]}, "qwen3_moe"),
                                    10**12)
    # sparse candidates 1, 3, 5, ...: the first two made dense, so every 2nd layer from 5 on
    assert pattern == dict(first_dense_layers=5, moe_layer_frequency=2)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([0, -1, 2**63]) | st.integers(300, 5000).map(lambda digits: 10**digits)
    | st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 4096.5, 4096.0]) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


def known_fields(model_type: str) -> list[str]:
    return sorted(_COMMON_KEYS | FAMILIES[model_type].keys | set(FAMILIES[model_type].defaults) | {"text_config"})


@st.composite
def hostile_configs(draw) -> dict:
    model_type = draw(st.sampled_from(SUPPORTED_MODEL_TYPES))
    keys = draw(st.lists(st.sampled_from(known_fields(model_type)), min_size=1, max_size=4, unique=True))
    config = {"model_type": model_type, **{key: draw(JSON) for key in keys}}
    if draw(st.booleans()):  # or a multimodal wrapper around the same text model
        config = {"model_type": "gemma3", "text_config": config} if model_type == "gemma3_text" else config
    return config


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_configs())
def test_any_json_value_in_any_known_field_ends_in_a_config_error_or_an_architecture(config):
    with deadline(5):
        try:
            arch, _ = architecture_from_hf_config(config)
        except ConfigError as error:
            assert error.field.startswith("model") and str(error)
        else:
            assert arch.num_layers >= 1 and arch.hidden_size >= 1


def test_the_fused_qkv_flash_rule_follows_how_the_family_splits_its_output():
    """transformers 5.23 under SDPA (flash): Phi-3 slices qkv_proj and rotates q and k, so the whole output stays
    alive through v beside the rotated q and k, and the attention output, laid out as the cat-made q, is copied for
    o_proj (memory/activations/attention.py `_fused_qkv_flash_entries`). GPT-2 splits c_attn into views and has no
    rotary embedding: flash keeps the three views, the bytes of q, k and v. Falcon-7B (multi-query) takes k and v by
    index lists, copies (modeling_falcon.py _split_heads): the output is freed after the split, the rule does not
    apply (qkv_split_copies); only Falcon without multi_query and the new architecture splits into views."""
    from estimator.memory.activations.attention import attention_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    flash = Training(framework="hf", attention="flash", seq_len=1024, micro_batch_size=1)

    def names(config: dict) -> list[str]:
        arch, _ = build(config)
        return [e.name for e in attention_entries(arch, flash, Parallel())]

    fused = "QKV projection output (v is a view of it)"
    assert fused in names({"model_type": "phi3"})
    assert fused not in names({"model_type": "gpt2"}) and "q, k, v kept by flash attention" in names(
        {"model_type": "gpt2"})
    assert fused not in names({"model_type": "falcon"})
    assert fused in names({"model_type": "falcon", "multi_query": False})
    assert fused not in names({"model_type": "falcon", "new_decoder_architecture": True, "num_attention_heads": 64,
                               "num_kv_heads": 8, "hidden_size": 4096})


def test_falcon_flash_keeps_k_and_v_as_its_split_leaves_them():
    """transformers 5.23 FalconFlashAttention2 (modeling_falcon.py): flash-attn gets the rotary q and k and v as
    _split_heads leaves them. Falcon-7B's multi-query split (lines 269-272) takes k and v one head wide by index
    lists; the new decoder architecture (lines 254-263) broadcasts each group's k and v to its 16 query heads and
    flattens them into copies, and forward reshapes them at num_heads (line 442): flash keeps q, k, v 128 heads wide,
    not 128 + 2 x 8. Its output reaches dense through a view (lines 506-507): one attention output, no copy.
    Measured: tests/data/measured/falcon-{7b,40b}-8layers-*-flash_attention_2-*, which run with sdpa_mask_always off
    (the reader sets it: transformers' default is SDPA). On SDPA Falcon-40B's equal head counts take a fused kernel
    that keeps the same set and the bf16 b x 1 x s x s bias SDPA makes of the mask (sdpa_mask.py)."""
    from dataclasses import replace

    from estimator.memory.activations.attention import attention_entries
    from estimator.memory.activations.sdpa_mask import FALCON_BIAS
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    s, b = 2048, 1
    flash = Training(framework="hf", attention="flash", seq_len=s, micro_batch_size=b)
    seven = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71}
    forty = {"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8,
             "new_decoder_architecture": True}
    kept, on_sdpa = {}, {}
    for name, config in (("7b", seven), ("40b", forty)):
        arch, _ = build(config)
        assert arch.sdpa_mask_always
        on_sdpa[name] = {e.name: e.elements * e.bytes_per_element for e in attention_entries(arch, flash, Parallel())}
        kept[name] = {e.name: e.elements * e.bytes_per_element
                      for e in attention_entries(replace(arch, sdpa_mask_always=False), flash, Parallel())}
    # bf16: 2 bytes; Falcon-7B's head dim 4544 / 71 = 64, one k and one v head
    assert kept["7b"]["q, k, v kept by flash attention"] == 2 * s * b * (4544 + 64 + 64) == 19_136_512
    # Falcon-40B: head dim 8192 / 128 = 64; q, k and v each 128 x 64 = 8192 wide (not 8192 + 2 x 8 x 64)
    assert kept["40b"]["q, k, v kept by flash attention"] == 2 * s * b * 3 * 8192 == 100_663_296
    assert kept["40b"]["flash log-sum-exp (fp32)"] == 4 * s * b * 128
    for name in kept:
        assert "attention output (kept by flash attention)" not in kept[name]
    assert on_sdpa["40b"] == {**kept["40b"], FALCON_BIAS: 2 * b * s * s}
    assert "q, k, v kept by flash attention" not in on_sdpa["7b"]  # the math backend (test_gpu_sdpa_mask.py)
    # eager: the new architecture's QK^T reads k at every head (no broadcast), Falcon-7B's one k head
    arch40, _ = build(forty)
    arch7, _ = build(seven)
    assert not arch40.eager_kv_broadcast and arch40.qkv_split_expands_kv
    assert arch7.eager_kv_broadcast and not arch7.qkv_split_expands_kv
    one_kv, _ = build(dict(forty, num_kv_heads=1))
    assert not one_kv.eager_kv_broadcast and one_kv.qkv_split_expands_kv


def test_the_eager_softmax_without_upcast_is_fp32_under_autocast():
    """GPT-2's eager softmax(scores) runs on the scores' bf16 without autocast, but autocast runs softmax in fp32
    (its fp32 op list), and GPT-2 then casts it to v's dtype (.type(value.dtype)) for scores x V: the fp32 output
    (kept by softmax's backward) and its bf16 copy, as with transformers' fp32 upcast; Falcon's softmax(dtype=
    hidden_states.dtype) is fp32 under autocast, the residual stream being fp32. Measured:
    tests/data/measured/gpt2-medium-8layers-amp-adamw-norecompute-eager-s1024-b4,
    falcon-7b-8layers-amp-adamw-norecompute-eager-s2048-b1."""
    from estimator.memory.activations.attention import EAGER_SOFTMAX_FP32, SOFTMAX_CAST, attention_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    s, b = 1024, 4
    for model_type, heads in (("gpt2", 12), ("falcon", 71)):
        arch, _ = build({"model_type": model_type})
        kept = {}
        for recipe, dtype in (("bf16", "bf16"), ("amp", "fp32")):
            training = Training(framework="hf", attention="eager", seq_len=s, micro_batch_size=b, param_dtype=dtype)
            kept[recipe] = {e.name: e.elements * e.bytes_per_element
                            for e in attention_entries(arch, training, Parallel())}
        scores = b * heads * s * s
        assert kept["bf16"]["softmax output (compute dtype, no fp32 upcast)"] == 2 * scores
        assert EAGER_SOFTMAX_FP32 not in kept["bf16"] and SOFTMAX_CAST not in kept["bf16"]
        assert kept["amp"][EAGER_SOFTMAX_FP32] == 4 * scores and kept["amp"][SOFTMAX_CAST] == 2 * scores
