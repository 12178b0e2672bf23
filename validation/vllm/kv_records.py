"""Record what vLLM's own KV cache accounting computes, for a grid of models, layouts and releases.

Run inside a venv holding one vLLM release (installed with ``pip install --no-deps vllm==X`` over the
system's torch, plus the packages its imports need; the exact 0.33.0 commands: dsa_records.py):

    /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.kv_records --out tests/data/serving/vllm-0.11.0.json

For every case it takes the checkpoint's config.json through transformers' AutoConfig (as vLLM's
``get_config`` does), asks vLLM's ModelConfig methods for the KV heads per rank, the head size and MLA
(``get_num_kv_heads``, ``get_head_size``, ``use_mla``), splits the layers over pipeline stages with vLLM's
``get_pp_indices``, builds each layer's KV cache spec with vLLM's spec classes (sliding window from the
config's ``layer_types``, else its model-wide ``sliding_window``, as vLLM's Attention layer falls back to
the cache config's), and runs vLLM's ``get_kv_cache_configs`` over the stages with the KV memory our
estimate leaves each stage. It records the block count, the KV bytes, the "GPU KV cache size" tokens and
the maximum concurrency vLLM computes, and vLLM's ``estimate_max_model_len`` on each stage. The memory
given is ours (vLLM measures weights, activations and non-torch memory on a GPU); the record holds it
so a test can hold our KV cache accounting to vLLM's on exactly that memory.

The vLLM config is a stand-in object with the fields these functions read (model_config.max_model_len,
scheduler_config.max_num_batched_tokens, parallel_config sizes, cache_config), not a full VllmConfig,
whose construction needs a GPU platform and a model on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import sys
import types

from validation.core.record import write_json

CASES = [
    # (preset, gpu, tp, pp, serving overrides)
    ("llama-3.1-8b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("llama-3.1-8b", "h100-80", 2, 1, {"max_model_len": 32768, "kv_cache_dtype": "fp8"}),
    ("llama-3.1-70b", "h100-80", 4, 1, {}),
    ("llama-3.1-70b", "h100-80", 2, 2, {"max_model_len": 65536}),
    ("llama-3.1-70b", "h100-80", 8, 1, {"max_model_len": 32768, "weight_format": "fp8"}),
    ("qwen2.5-7b", "l40s", 1, 1, {"max_model_len": 32768, "weight_format": "awq_int4"}),
    ("qwen3-30b-a3b", "h100-80", 2, 1, {"max_model_len": 40960}),
    ("qwen3-235b-a22b", "h100-80", 4, 1, {"max_model_len": 40960, "weight_format": "fp8"}),
    ("mixtral-8x7b", "h100-80", 2, 1, {"max_model_len": 32768}),
    ("mistral-7b", "a100-80", 1, 1, {}),
    ("gemma-3-27b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("gemma-3-27b", "h100-80", 2, 2, {"max_model_len": 131072}),
    # 0.11 at its defaults (utilization 0.9, the full 131,072 context) leaves gpt-oss-120b no KV memory on one H100
    # (vLLM issue 23278 prints "Available KV cache memory: -2.14 GiB", as our estimate does: the 0.11 sampler's
    # 1,024 x 201,088-vocabulary logits); issue 27508 serves it at 0.95, where the 1.8 GiB left holds 32,768 tokens
    ("gpt-oss-120b", "h100-80", 1, 1, {"gpu_memory_utilization": 0.95, "max_model_len": 32768}),
    ("gpt-oss-20b", "h100-80", 2, 1, {"max_model_len": 65536}),
    ("deepseek-v3", "h200", 8, 1, {"max_model_len": 32768}),
    ("deepseek-v3", "h200", 8, 2, {"max_model_len": 163840, "kv_cache_dtype": "fp8"}),
    # Llama 4 Scout: ChunkedLocalAttentionSpec for its 36 RoPE layers (issue 28)
    ("llama-4-scout", "h100-80", 4, 1, {"max_model_len": 131072}),
    ("llama-4-scout", "h200", 2, 2, {"max_model_len": 262144}),
]

# Falcon-H1 (issue 28): an attention layer and a Mamba-2 layer per decoder layer. 0.11's HybridAttentionMambaModelConfig
# sizes the block and pads the state page (model_executor/models/config.py); 0.33 moved that alignment to
# platforms/interface.py _align_hybrid_block_size and keeps states in "align" mode under prefix caching (HYBRID_CASES_0_33)
HYBRID_CASES = [
    ("falcon-h1-7b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("falcon-h1-7b", "h100-80", 2, 1, {"max_model_len": 131072}),
]
# 0.33.0: the four hybrid presets (Mamba-2 parallel, Mamba-2 pattern, Gated DeltaNet, Mamba-1), TP 1 and 2, prefix
# caching off (mamba_cache_mode "none", the recorder's default: with_prefix_caching) and, for two, on (0.33's default
# for hybrid models: model_executor/models/config.py MambaModelConfig sets mamba_cache_mode "align"); Hopper GPUs,
# where FlashAttention 3 takes any multiple of 16 tokens (Blackwell's default backend is FlashInfer, whose smallest
# kernel block is 16 too: FA4's fixed hd256 page of 128, flash_attn.py, applies only where FLASH_ATTN is chosen
# there). Releases 0.15.0-0.25.0: validation/vllm/hybrid_releases.py
HYBRID_CASES_0_33 = [
    ("falcon-h1-7b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("falcon-h1-7b", "h100-80", 2, 1, {"max_model_len": 131072}),
    ("nemotron-h-8b", "h100-80", 1, 1, {}),
    ("nemotron-h-8b", "h100-80", 2, 1, {"prefix_caching": True}),
    ("qwen3-next-80b-a3b", "h200", 1, 1, {"max_model_len": 32768, "weight_format": "fp8"}),
    ("qwen3-next-80b-a3b", "h200", 2, 1, {"max_model_len": 65536}),
    ("qwen3-next-80b-a3b", "h200", 2, 1, {"max_model_len": 131072, "prefix_caching": True}),
    ("jamba-mini-1.5", "h200", 1, 1, {"max_model_len": 65536}),
    ("jamba-mini-1.5", "h100-80", 2, 1, {"max_model_len": 131072, "prefix_caching": True}),
]


class _Tokens(logging.Handler):
    """The "GPU KV cache size: N tokens" lines vLLM logs. 0.11 logs one per pipeline stage, from that
    stage's own block count, before every stage takes the smallest count: the smallest line is the
    limiting stage's."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        text = record.getMessage()
        if "KV cache size:" in text:
            self.lines.append(int(text.split("KV cache size:")[1].split("tokens")[0].replace(",", "").strip()))


def _stand_in_config(max_model_len: int, batched: int, pp: int, tp: int, block_size: int):
    ns = types.SimpleNamespace
    try:  # 0.33: one KV cache layout for the model; FlashAttention's NHD (= LBNHC), the engine core's usual pick
        from vllm.config.cache import _layout_from_name
        layout = lambda: _layout_from_name("NHD")  # noqa: E731
    except ImportError:
        layout = None
    sched = ns(max_num_batched_tokens=batched, disable_hybrid_kv_cache_manager=False, async_scheduling=True,
               max_num_seqs=256)
    parallel = ns(decode_context_parallel_size=1, prefill_context_parallel_size=1, pipeline_parallel_size=pp,
                  tensor_parallel_size=tp, data_parallel_size=1)
    cache = ns(num_gpu_blocks_override=None, block_size=block_size, prefix_cache_retention_interval=None,
               kv_cache_size_tokens=None, kv_cache_max_concurrency=None, enable_prefix_caching=False,
               get_resolved_kv_cache_layout=layout)
    model = ns(max_model_len=max_model_len, supports_kv_cache_grouping=False, original_max_model_len=max_model_len)
    cfg = ns(model_config=model, scheduler_config=sched, parallel_config=parallel,
             cache_config=cache, device_config=ns(device_type="cuda"), speculative_config=None,
             kv_transfer_config=None, attention_config=ns(hisparse_config=None), use_v2_model_runner=False)
    cfg.num_prefill_lookahead_tokens = 0  # no speculative decoding
    cfg.num_speculative_tokens = 0
    cfg.max_concurrent_batches = 2 if pp == 1 else pp
    cfg.max_in_flight_tokens = cfg.max_concurrent_batches * batched
    return cfg


def _model_config_proxy(hf_config):
    """vLLM's ModelConfig methods over a transformers config, without the rest of ModelConfig."""
    from vllm.config import ModelConfig
    proxy_cls = type("ModelConfigProxy", (), {name: ModelConfig.__dict__[name] for name in (
        "is_deepseek_mla", "use_mla", "get_head_size", "get_total_num_kv_heads", "get_num_kv_heads",
        "get_model_arch_config") if name in ModelConfig.__dict__})
    proxy = proxy_cls()
    proxy.is_attention_free = False  # decoder-only transformers (ModelConfig reads the architecture)
    proxy.hf_config = hf_config
    proxy.hf_text_config = getattr(hf_config, "text_config", None) or hf_config
    if hasattr(proxy.hf_text_config, "get_text_config"):
        proxy.hf_text_config = hf_config.get_text_config()
    proxy.using_transformers_backend = lambda: False  # vLLM's own model implementations
    proxy._supports_multimodal_for_mm_prefix = lambda: False
    if hasattr(proxy, "get_model_arch_config"):  # 0.33: the architecture summary the methods read
        proxy.model_arch_config = proxy.get_model_arch_config()
    return proxy


def _specs(vllm, hf_config, proxy, tp, pp, block_size, kv_dtype, ranges, state=None):
    import torch
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    text = proxy.hf_text_config
    par = types.SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                decode_context_parallel_size=1)
    heads, head_size = proxy.get_num_kv_heads(par), proxy.get_head_size()
    dtype = torch.uint8 if kv_dtype.startswith("fp8") else torch.bfloat16
    layer_types = getattr(text, "layer_types", None)
    window = getattr(text, "sliding_window", None)
    # Llama 4 (models/llama4.py): ChunkedLocalAttention in the RoPE layers (no_rope_layers[i] == 1)
    chunk, rope = getattr(text, "attention_chunk_size", None), getattr(text, "no_rope_layers", None)
    common = dict(block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    stages = []
    recurrent = getattr(text, "model_type", "") in PATTERN_HYBRIDS
    for layers in ranges:
        specs = {}
        for i in layers:
            name = f"model.layers.{i}.self_attn.attn"
            if recurrent and layer_types[i] != "full_attention":
                continue  # a recurrent layer (state_specs_0_33) or an MLP block: no attention cache
            if recurrent:
                specs[name] = interface.FullAttentionSpec(**common)
            elif proxy.use_mla:
                specs[name] = interface.MLAAttentionSpec(**common, cache_dtype_str=kv_dtype if kv_dtype != "auto" else None)
            elif chunk and rope and rope[i]:
                specs[name] = interface.ChunkedLocalAttentionSpec(**common, attention_chunk_size=chunk)
            elif window and (layer_types is None or layer_types[i] == "sliding_attention"):
                specs[name] = interface.SlidingWindowSpec(**common, sliding_window=window)
            else:
                specs[name] = interface.FullAttentionSpec(**common)
        if state is not None:
            specs.update(state(layers, specs))
        elif getattr(text, "model_type", "") == "falcon_h1":
            specs.update(_falcon_h1_state_specs(text, tp, layers, specs, block_size))
        stages.append(specs)
    return stages, heads, head_size


def _falcon_h1_state_specs(text, tp: int, layers: range, attention: dict, block_size: int) -> dict:
    """Falcon-H1's Mamba-2 layers, one per decoder layer (vLLM 0.11 falcon_h1.py FalconH1ParallelHybrid: the
    mixer's prefix takes index num_hidden_layers + i): the state's shapes and dtypes from vLLM's calculators
    with the arguments FalconH1ForCausalLM.get_mamba_state_shape_from_config / _dtype_from_config pass (the model
    module itself needs packages the CPU venv lacks), block_size max_model_len as gpu_model_runner sets it (here
    the given block: only the page counts), the page padded to the attention page
    (HybridAttentionMambaModelConfig: cache_config.mamba_page_size_padded)."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
    from vllm.v1.kv_cache_interface import MambaSpec

    width = text.mamba_d_ssm if text.mamba_d_ssm is not None else int(text.mamba_expand * text.hidden_size)
    shapes = MambaStateShapeCalculator.mamba2_state_shape(
        tp_world_size=tp, intermediate_size=width, n_groups=text.mamba_n_groups, num_heads=text.mamba_n_heads,
        head_dim=text.mamba_d_head, state_size=text.mamba_d_state, conv_kernel=text.mamba_d_conv)
    dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(torch.bfloat16, "auto", "auto")
    padded = next(iter(attention.values())).page_size_bytes
    n = text.num_hidden_layers
    return {f"model.layers.{n + i}.mixer": MambaSpec(shapes=shapes, dtypes=dtypes, block_size=block_size,
                                                      page_size_padded=padded) for i in layers}


# 0.33.0: hybrids whose decoder layers are either attention or recurrent (transformers' layer_types names them
# "full_attention" / "linear_attention"; Nemotron-H's MLP blocks keep nothing), and the model classes whose
# get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config the recorder calls (qwen3_next's module
# imports compressed_tensors, absent from the CPU venv: its classmethods' calculator calls are made here instead)
PATTERN_HYBRIDS = ("nemotron_h", "jamba", "qwen3_next")
MODEL_CLASSES = {"nemotron_h": ("nemotron_h", "NemotronHForCausalLM"), "jamba": ("jamba", "JambaForCausalLM"),
                 "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM")}
MAMBA_TYPES = {"nemotron_h": "MAMBA2", "falcon_h1": "MAMBA2", "jamba": "MAMBA1", "qwen3_next": "GDN_ATTN"}
# Gated DeltaNet's FlashInfer prefill (qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend: sm90, or sm100/sm120
# with head_k_dim 128 under the cu13 wheel) exports prefill checkpoints every 64 tokens (gdn_attn.py
# FLASHINFER_GDN_CHECKPOINT_ALIGNMENT) in align mode
FLASHINFER_GDN_GPUS = ("h100-80", "h100-nvl", "h100-pcie", "h800", "h200", "gh200", "b200", "gb200", "b300")


def _state_0_33(text, tp: int, gpu: str, mode: str):
    """(shapes, dtypes, prefill checkpoint alignment or None) of one recurrent layer's state, vLLM 0.33.0."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    ns = types.SimpleNamespace
    cache = ns(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", use_replayssm=False)
    if text.model_type == "nemotron_h":  # its config hook: the HF config's mamba_ssm_cache_dtype (float32)
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig
        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache, hf_config=text)
    if text.model_type == "qwen3_next":
        shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp, text.linear_num_key_heads, text.linear_num_value_heads, text.linear_key_head_dim,
            text.linear_value_head_dim, text.linear_conv_kernel_dim, 0)
        dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto", "auto")
    else:
        module, name = MODEL_CLASSES[text.model_type]
        cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
        cfg = ns(model_config=ns(dtype=torch.bfloat16, hf_config=text, hf_text_config=text),
                 parallel_config=ns(tensor_parallel_size=tp), cache_config=cache, speculative_config=None,
                 num_speculative_tokens=0)
        shapes, dtypes = cls.get_mamba_state_shape_from_config(cfg), cls.get_mamba_state_dtype_from_config(cfg)
    gdn_checkpoints = text.model_type == "qwen3_next" and mode == "align" and gpu in FLASHINFER_GDN_GPUS
    return tuple(shapes), tuple(dtypes), 64 if gdn_checkpoints else None


def vllm_hybrid_block_size_0_33(one_token_page: int, state_page: int, checkpoint: int | None, mode: str) -> int:
    """platforms/interface.py _align_hybrid_block_size (0.33.0) on FlashAttention (MultipleOf(16)) at the default block
    of 16: the alignment max(16, block) (lcm with the checkpoint alignment in align mode), the smallest aligned block
    whose attention page holds a state page, rounded to the backends' 16."""
    import math
    align = 16
    if mode == "align":
        align = math.lcm(align, checkpoint or 1)
    block = align * -(-state_page // (align * one_token_page))
    return max(16, 16 * -(-block // 16))


def _mixer_spec_0_33(text, shapes, dtypes, mamba_block: int, padded, mode: str):
    """A Mamba-1 or Mamba-2 layer's MambaSpec from the layer class's own get_kv_cache_spec (0.33.0 mamba_mixer.py,
    mamba_mixer2.py: MambaMixer2 adds one prefill checkpoint block), over an instance made without __init__ (which
    needs a GPU) holding the state's shapes and dtypes; None for Gated DeltaNet."""
    if text.model_type == "qwen3_next":
        return None
    from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    cls = MambaMixer if text.model_type == "jamba" else MambaMixer2
    layer = cls.__new__(cls)
    object.__setattr__(layer, "get_state_shape", lambda: shapes)
    object.__setattr__(layer, "get_state_dtype", lambda: dtypes)
    ns = types.SimpleNamespace
    cache = ns(mamba_block_size=mamba_block, mamba_page_size_padded=padded, mamba_cache_mode=mode, use_replayssm=False)
    return layer.get_kv_cache_spec(ns(cache_config=cache, num_speculative_tokens=0))


def state_specs_0_33(text, tp: int, gpu: str, mode: str, heads: int, head_size: int, max_model_len: int):
    """(vLLM's block size, a function of (layers, attention specs) giving the stage's MambaSpecs) for 0.33.0: the page
    padded to the attention page (cache_config.mamba_page_size_padded), mamba_block_size max_model_len without prefix
    caching and the block size with it (MambaModelConfig / _align_hybrid_block_size), one prefill checkpoint block
    for Gated DeltaNet's FlashInfer prefill (qwen_gdn_linear_attn.py get_kv_cache_spec) and for Mamba-2 (the layer's
    own get_kv_cache_spec: _mixer_spec_0_33)."""
    import torch
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    shapes, dtypes, checkpoint = _state_0_33(text, tp, gpu, mode)
    one = FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=head_size, dtype=torch.bfloat16).page_size_bytes
    state_page = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    block = vllm_hybrid_block_size_0_33(one, state_page, checkpoint, mode)
    padded = block * one if block * one != state_page else None
    mamba_block = block if mode == "align" else max_model_len
    spec = _mixer_spec_0_33(text, shapes, dtypes, mamba_block, padded, mode)
    if spec is None:  # Gated DeltaNet: its checkpoint export needs the built model (qwen_gdn_linear_attn.py)
        spec = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=mamba_block, page_size_padded=padded,
                         mamba_type=getattr(MambaAttentionBackendEnum, MAMBA_TYPES[text.model_type]),
                         mamba_cache_mode=mode, num_prefill_checkpoint_blocks=1 if checkpoint else 0,
                         prefill_checkpoint_alignment=block if checkpoint else None)
    # Falcon-H1's mixer takes index num_hidden_layers + i (falcon_h1.py FalconH1ParallelHybrid); the others' index i
    offset = text.num_hidden_layers if text.model_type == "falcon_h1" else 0
    kinds = getattr(text, "layer_types", None)

    def stage(layers: range, attention: dict) -> dict:
        return {f"model.layers.{offset + i}.mixer": spec for i in layers
                if text.model_type == "falcon_h1" or kinds[i] == "linear_attention"}
    return block, stage


def vllm_hybrid_block_size(text, tp: int, heads: int, head_size: int) -> int:
    """HybridAttentionMambaModelConfig.verify_and_update_config's block (vLLM 0.11 model_executor/models/config.py):
    16 x cdiv(the state page, 16 x one token's attention page), over vLLM's own spec objects."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    one = FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=head_size, dtype=torch.bfloat16).page_size_bytes
    state = next(iter(_falcon_h1_state_specs(text, tp, range(1), {"a": types.SimpleNamespace(page_size_bytes=None)},
                                              1).values()))
    state = dataclasses.replace(state, page_size_padded=None).page_size_bytes
    return 16 * -(-state // (16 * one))


def with_prefix_caching(overrides: dict) -> dict:
    """A case runs with prefix caching off unless it turns it on (the stand-in config's mamba_cache_mode "none"),
    and its record says so: unset, the estimate would take vLLM's default for the release and model."""
    return {"prefix_caching": False, **overrides}


def our_estimate(case, vllm_version: str):
    """(the release key, the preset's config.json, our vLLM estimate) for a case (preset, gpu, tp, pp, overrides)."""
    from estimator.spec.hardware import Hardware
    from estimator.spec.parallel import Parallel
    from estimator.models.presets import get_architecture, get_hf_config
    from estimator.spec.serving import Serving
    from estimator.serving.vllm_engine import estimate_vllm

    preset, gpu, tp, pp, overrides = case
    overrides = with_prefix_caching(overrides)
    release = ".".join(vllm_version.split(".")[:2])
    raw = get_hf_config(preset)
    ours = estimate_vllm(get_architecture(preset), Serving(engine_version=release, **overrides),
                         Parallel(tp=tp, pp=pp), Hardware(gpu), raw)
    return release, raw, ours


def run_case(case, vllm_version: str) -> dict:
    from transformers import AutoConfig
    from vllm.distributed.utils import get_pp_indices

    preset, gpu, tp, pp, overrides = case
    overrides = with_prefix_caching(overrides)
    release, raw, ours = our_estimate(case, vllm_version)
    r = ours.resolved
    config = dict(raw)
    if "attn_temperature_tuning" in config.get("text_config", {}):  # an int in Llama 4's file, a bool to transformers
        config["text_config"] = dict(config["text_config"], attn_temperature_tuning=True)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    proxy = _model_config_proxy(hf_config)
    text = proxy.hf_text_config
    ranges = [range(*get_pp_indices(text.num_hidden_layers, rank, pp)) for rank in range(pp)]
    kv_dtype = overrides.get("kv_cache_dtype", "auto")
    block, state, hybrid = r.block_size, None, {}
    mode = "align" if overrides["prefix_caching"] else "none"
    if release >= "0.33" and getattr(text, "model_type", "") in PATTERN_HYBRIDS + ("falcon_h1",):
        heads, head_size = proxy.get_num_kv_heads(types.SimpleNamespace(
            tensor_parallel_size=tp, pipeline_parallel_size=pp, decode_context_parallel_size=1)), proxy.get_head_size()
        block, state = state_specs_0_33(text, tp, gpu, mode, heads, head_size, r.max_model_len)
        hybrid = {"block_size": block, "mamba_cache_mode": mode}
    specs, heads, head_size = _specs(None, hf_config, proxy, tp, pp, block, kv_dtype, ranges, state)
    available = [s.available for s in ours.stages]
    ceiling = r.context_length
    cfg = _stand_in_config(r.max_model_len, r.max_num_batched_tokens, pp, tp, block)
    cfg.cache_config.enable_prefix_caching = overrides["prefix_caching"]
    cfg.cache_config.mamba_cache_mode = mode
    if getattr(text, "attention_chunk_size", None):
        # VllmConfig.__post_init__ turns the hybrid manager off for chunked local attention unless
        # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE (this release's default)
        envs = importlib.import_module("vllm.envs")
        cfg.scheduler_config.disable_hybrid_kv_cache_manager = not envs.VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
    handler = _Tokens()
    logging.getLogger("vllm").addHandler(handler)
    if release >= "0.33":
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        builder_mod = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
        groups = planning.get_global_kv_cache_groups(cfg, specs)
        configs = planning.get_kv_cache_configs(cfg, specs, available, groups)
        scheduler_cfg = utils.generate_scheduler_kv_cache_config(configs)
        tokens, concurrency = utils.get_kv_cache_capacity(cfg, scheduler_cfg)
        builder = builder_mod.get_kv_cache_config_builder(cfg)
        cfg.model_config.max_model_len = ceiling
        fits = []
        for config_one, avail in zip(configs, available):
            projected = config_one.kv_cache_groups
            block = planning._pool_bytes_per_block_from_builder(builder, cfg, projected)
            fits.append(planning._estimate_max_model_len_from_groups(builder, cfg, projected, avail - block))
    else:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        configs = utils.get_kv_cache_configs(cfg, specs, available)
        tokens = min(handler.lines)
        concurrency = utils.get_max_concurrency_for_kv_cache_config(cfg, configs[0])
        fits = []
        for spec_one, avail in zip(specs, available):
            cfg.model_config.max_model_len = ceiling
            fits.append(utils.estimate_max_model_len(cfg, spec_one, avail))
    # 0.11: one tensor per layer position, each shared by a layer of every group; 0.33: every tensor is a
    # view of one backing allocation of bytes_per_block x num_blocks ("Groups alias from byte 0")
    kv_bytes = [sum(t.size for t in c.kv_cache_tensors) if release < "0.33" else max(t.size for t in c.kv_cache_tensors)
                for c in configs]
    if release < "0.33" and getattr(text, "model_type", "") == "falcon_h1":
        hybrid = {"block_size": vllm_hybrid_block_size(text, tp, heads, head_size)}
    return {
        "case": {"model": preset, "gpu": gpu, "tp": tp, "pp": pp, "serving": {"engine_version": release, **overrides}},
        "vllm_version": vllm_version,
        "given": {"available_kv_bytes": available, "block_size": r.block_size,
                  "max_model_len": r.max_model_len, "max_num_batched_tokens": r.max_num_batched_tokens,
                  "model_len_ceiling": ceiling},
        "vllm": {"num_kv_heads_per_rank": heads, "head_size": head_size, "use_mla": bool(proxy.use_mla),
                 "stage_layers": [[x.start, x.stop] for x in ranges], "num_groups": len(configs[0].kv_cache_groups),
                 "num_blocks": configs[0].num_blocks, "kv_cache_bytes_per_stage": kv_bytes,
                 "kv_cache_tokens": tokens, "max_concurrency": concurrency, "max_model_len_that_fits": min(fits),
                 **hybrid},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--append-hybrid", action="store_true",
                        help="run HYBRID_CASES only and append their records to the --out file (0.11)")
    parser.add_argument("--models", nargs="*", help="record only these presets' cases, replacing theirs in --out "
                                                    "and keeping the other records as they are")
    args = parser.parse_args(argv)
    import vllm
    version = vllm.__version__
    if args.append_hybrid:
        return _append_hybrid(args.out, version)
    hybrid = HYBRID_CASES if version.startswith("0.11.") else HYBRID_CASES_0_33 if version.startswith("0.33.") else []
    records = [run_case(case, version) for case in CASES + hybrid if not args.models or case[0] in args.models]
    command = (f"{sys.executable} -m validation.vllm.kv_records --out {args.out}  "
               f"(vllm=={version}, torch, transformers as installed; CPU only)")
    data = {}
    if args.models:
        with open(args.out) as fh:
            data = json.load(fh)
        records = [r for r in data["records"] if r["case"]["model"] not in args.models] + records
        command = data["command"] + f"; then --models {' '.join(args.models)}"
    write_json(args.out, {**data, "command": command, "vllm_version": version, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


def _append_hybrid(out: str, version: str) -> int:
    """Add the hybrid cases' records to a release's file without re-running its others (their given memory is
    the estimate of the day they were recorded); the file says which command added them."""
    with open(out) as fh:
        data = json.load(fh)
    assert data["vllm_version"] == version
    done = {json.dumps(r["case"], sort_keys=True) for r in data["records"]}
    new = [r for r in (run_case(case, version) for case in HYBRID_CASES)
           if json.dumps(r["case"], sort_keys=True) not in done]
    data["records"] += new
    data["hybrid_command"] = f"{sys.executable} -m validation.vllm.kv_records --out {out} --append-hybrid"
    write_json(out, data)
    print(f"{len(new)} records appended -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
