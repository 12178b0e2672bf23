"""Speculative decoding's memory: the draft's weights and the KV cache layers it adds (vLLM V1).

vLLM loads the drafter beside the target (v1/spec_decode/eagle.py, the MTP and draft-model proposers) and
its attention layers join the KV cache specs (gpu_model_runner.get_kv_cache_spec walks every attention
layer, the drafter's included), so each draft layer takes a page in every block:

- eagle: one decoder layer of the target's widths and an fc of 2h -> h (models/llama_eagle.py), sharing
  the target's embedding and LM head; one KV layer like the target's attention layers (a hybrid's head too).
- eagle3: one decoder layer whose q, k, v read 2h (the embedding and the fused hidden states), an fc of
  3h -> h and its own LM head (models/llama_eagle3.py; a head trained on a smaller draft vocabulary is
  smaller: give its checkpoint as draft_model for the exact size); one KV layer.
- mtp: the checkpoint's multi-token-prediction modules (DeepSeek-V3 num_nextn_predict_layers): per module
  two norms, a 2h -> h projection, one decoder layer of the last layer's kind, its own embedding and head
  (models/deepseek_mtp.py); one MLA KV layer per module.
- draft_model: a whole smaller model, its KV layers with their own page size (one KV cache group of
  mixed pages: UniformTypeKVCacheSpecs).

The drafter runs on the last pipeline stage. Its part of the profiling run and its CUDA graphs are not
modelled (a one-layer head's are a few percent of the target's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..spec.architecture import REPLICATED, Architecture, ParameterTensor
from ..spec.errors import ConfigError
from .kv_cache import LayerSpec, layer_specs
from ..spec.serving import Speculative
from .weights import WeightFormat, tensor_bytes


@dataclass(frozen=True)
class Draft:
    weights_bytes: int
    kv_layers: tuple[LayerSpec, ...]
    formula: str


def _head_arch(arch: Architecture) -> Architecture:
    """The EAGLE head: one dense layer of the target's widths (an MoE target's head uses its dense width,
    else its active experts' width)."""
    width = arch.intermediate_size or arch.moe_intermediate_size * arch.num_experts_per_token
    return dataclasses.replace(arch, num_layers=1, num_experts=0, num_experts_per_token=None,
                               moe_intermediate_size=None, num_shared_experts=0, shared_expert_intermediate_size=None,
                               first_dense_layers=0, intermediate_size=width, mtp_layers=0, sliding_window=None,
                               sliding_window_pattern=0, attention_chunk_size=None,
                               # a hybrid's head is a softmax-attention layer too (llama_eagle.py's LlamaDecoderLayer)
                               hybrid_override_pattern=None, full_attention_interval=0, attention_layer_period=0,
                               parallel_mamba=False)


def draft_for(arch: Architecture, spec: Speculative, fmt: WeightFormat, tp: int, ep: int, block_size: int,
              kv_bytes: int, draft_arch: Architecture | None) -> Draft:
    size = lambda tensors, f=fmt: sum(tensor_bytes(t, arch_for, f, tp, ep) for t in tensors)  # noqa: E731
    h = arch.hidden_size
    bf16 = WeightFormat("bf16", dtype_bytes=fmt.dtype_bytes)
    if spec.method in ("eagle", "eagle3"):
        if arch.uses_mla:
            raise ConfigError("serving.speculative.method", spec.method, "'mtp' for a model with MLA",
                              "EAGLE heads for MLA models are not modelled", ("serving.speculative.method",))
        if draft_arch is not None and (draft_arch.num_layers != 1 or draft_arch.is_moe or draft_arch.is_hybrid):
            raise ConfigError("serving.speculative.draft_model", draft_arch.name or "the draft model",
                              "an EAGLE head's checkpoint: one dense decoder layer",
                              f"it has {draft_arch.num_layers} layers" + (", experts" if draft_arch.is_moe else "")
                              + ("; a whole smaller model drafts with method 'draft_model'"
                                 if draft_arch.num_layers > 1 else ""))
        head = draft_arch or _head_arch(arch)
        arch_for = head
        tensors = head.layer_tensors("dense") + head.norm_tensors(1, "final_")
        extra = [ParameterTensor("fc", (h, (2 if spec.method == "eagle" else 3) * h), REPLICATED, "hidden_matrix")]
        if spec.method == "eagle3":  # q, k, v read [embedding, hidden]: twice the input width
            extra += [ParameterTensor(n, (w, h), "column", "hidden_matrix")
                      for n, w in (("q_proj_extra", head.q_width), ("k_proj", head.kv_width), ("v_proj", head.kv_width))]
            extra += head.head_tensors(draft_arch.vocab_size if draft_arch else arch.vocab_size)[1:]
        total = size(tensors, bf16) + size(extra, bf16)
        return Draft(int(total), layer_specs(head, tp, block_size, kv_bytes)[:1],
                     f"{spec.method} head: one decoder layer + fc in {bf16.name}")
    if spec.method == "mtp":
        if not arch.mtp_layers:
            raise ConfigError("serving.speculative.method", "mtp", "eagle, eagle3 or draft_model for this model",
                              "the checkpoint has no multi-token-prediction module (mtp_layers = 0)")
        arch_for = arch
        per_module = size(arch.mtp_tensors()) + size(arch.embedding_tensors(arch.vocab_size), bf16) \
            + size([t for t in arch.head_tensors(arch.vocab_size) if t.name == "lm_head"], bf16)
        return Draft(int(per_module * arch.mtp_layers), layer_specs(arch, tp, block_size, kv_bytes)[:1] * arch.mtp_layers,
                     f"{arch.mtp_layers} MTP module(s): norms, 2h -> h, one layer, embedding and head")
    arch_for = draft_arch
    kinds = draft_arch.kind_counts()
    total = sum(size(draft_arch.layer_tensors(kind), bf16) * n for kind, n in kinds) \
        + size(draft_arch.embedding_tensors(draft_arch.vocab_size), bf16) + size(draft_arch.head_tensors(draft_arch.vocab_size), bf16)
    return Draft(int(total), layer_specs(draft_arch, tp, block_size, kv_bytes),
                 f"draft model {draft_arch.name}: {draft_arch.num_layers} layers in {bf16.name}")
