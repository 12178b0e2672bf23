"""Inference: weights, the KV cache and the working set of one forward pass.

Serving keeps no gradients, optimizer states or saved activations. It holds the weights (in
their storage format, block scales included), the KV cache of every sequence in the batch, and
the largest layer's temporaries while a prefill of ``seq_len`` tokens runs, plus the logits of
the tokens it samples from.

KV cache per token and layer: 2 (K and V) x g x d_head elements (GQA/MQA share KV heads,
Ainslie et al. 2023); with MLA, DeepSeek-V2 caches the compressed latent and the rope key,
kv_lora_rank + d_rope elements, shared by all heads (arXiv 2405.04434 section 2.1.3). TP splits
KV heads; MLA's latent is replicated on every TP rank. Layers with a sliding window keep at most
the window (Beltagy et al. 2020; Mistral's rolling cache).
"""

from __future__ import annotations

from .activations.entries import tokens_per_gpu
from .components import built_stage, component, fold, fragmentation, phase
from ..spec import hybrid
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .sharding import StageParameters
from ..spec.training import Training
from .workspaces import library_workspaces

KV_SOURCE = "KV cache = 2 x g x d_head per token and layer (GQA: Ainslie et al. 2023; MLA: DeepSeek-V2 section 2.1.3)"


def kv_cache_bytes(arch: Architecture, training: Training, par: Parallel,
                   chunks: tuple[range, ...]) -> tuple[float, str]:
    """The KV cache of the layers in `chunks` (a stage's layer ranges): full-attention layers keep
    every token, sliding-window layers at most the window, and Llama 4's chunked layers at most the chunk
    (transformers 5.23 cache_utils.py DynamicCache: a "chunked_attention" layer is a DynamicSlidingWindowLayer
    of attention_chunk_size)."""
    tokens = training.kv_cache_tokens or training.seq_len
    dtype = training.kv_cache_dtype or (training.param_dtype if training.param_dtype in ("fp32", "bf16", "fp16", "fp8")
                                        else "bf16")
    B = bytes_per_element(dtype)
    b = training.micro_batch_size

    def per_layer(kept: int) -> float:
        if arch.uses_mla:
            return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kept * b * B
        # vLLM replicates KV heads when TP exceeds them: each rank keeps at least one
        return 2 * max(arch.num_kv_heads / par.tp, 1) * arch.head_dim * kept * b * B

    if arch.is_hybrid:  # only the attention layers keep keys and values (the others: recurrent_state_bytes)
        full = sum(n for r in chunks for kind, n in arch.kind_counts(r.start, r.stop) if hybrid.attends(kind))
        windowed = 0
    else:
        full = sum(arch.global_attention_layers_in(r.start, r.stop) for r in chunks)
        windowed = sum(len(r) for r in chunks) - full
    total = per_layer(tokens) * full
    if windowed:
        total += per_layer(min(tokens, arch.local_attention)) * windowed
    formula = (f"(kv_lora_rank + d_rope) x tokens x batch x layers x {B:g} B" if arch.uses_mla
               else f"2 x max(g/t, 1) x d_head x tokens x batch x {'attention ' if arch.is_hybrid else ''}layers x {B:g} B")
    if windowed:
        local = "chunked-attention" if arch.attention_chunk_size else "sliding-window"
        formula += f" ({windowed:,} {local} layers keep at most {arch.local_attention:,} tokens)"
    return total, formula


def recurrent_state_component(arch: Architecture, training: Training, par: Parallel, kind_counts):
    """A hybrid model's recurrent layers keep one state per sequence, whatever the context length
    (spec/hybrid.py state_bytes); None for a model without them."""
    if not arch.is_hybrid:
        return None
    P = bytes_per_element(training.param_dtype if training.param_dtype in ("fp32", "bf16", "fp16") else "bf16")
    per_sequence = sum(n * hybrid.state_bytes(arch, kind, par.tp, int(P)) for kind, n in kind_counts)
    if not per_sequence:
        return None
    return component("recurrent_state", "Recurrent and conv state (constant in the context length)",
                     per_sequence * training.micro_batch_size,
                     "batch x recurrent layers x (conv window + recurrent matrix) per sequence",
                     "vLLM mamba_utils.py MambaStateShapeCalculator shapes (estimator/spec/hybrid.py state_bytes)")


def indexer_keys_component(arch: Architecture, training: Training, chunks: tuple[range, ...]):
    """DeepSeek Sparse Attention: every attention layer also caches the lightning indexer's key per token,
    fp8 with an fp32 scale per 128 elements (spec/sparse.py index_key_bytes); None without it."""
    if not arch.uses_sparse_attention:
        return None
    from ..spec.sparse import index_key_bytes
    tokens = training.kv_cache_tokens or training.seq_len
    layers = sum(len(r) for r in chunks)
    per_token = index_key_bytes(arch)
    return component("indexer_keys", "Lightning indexer keys (DeepSeek Sparse Attention)",
                     per_token * tokens * training.micro_batch_size * layers,
                     f"(d_index + d_index/128 x 4 = {per_token} B) x tokens x batch x layers",
                     "vLLM 0.11.0 models/deepseek_v2.py DeepseekV32IndexerCache; SGLang 0.5.23 "
                     "pool_configurator.py _compute_dsa_indexer_cell_size")


def inference_stage(arch: Architecture, training: Training, par: Parallel, hardware: Hardware,
                    sp: StageParameters, vocab: int, shared):
    P = bytes_per_element(training.param_dtype)
    weights = component("parameters", "Weights", sp.local * P, f"{P:g} B ({training.param_dtype}) x parameters on this GPU",
                         "dtype sizes in estimator/spec/dtypes.py (block scales included)")
    kv, kv_formula = kv_cache_bytes(arch, training, par, sp.chunks)
    kv_cache = component("kv_cache", "KV cache", kv, kv_formula, KV_SOURCE)
    recurrent = recurrent_state_component(arch, training, par, sp.kind_counts)
    working, working_formula = forward_working_set(arch, training, par, {kind for kind, _ in sp.kind_counts},
                                                   tokens_per_gpu(training, par))
    t = par.tp
    by_t = "/t" if t > 1 else ""
    activations = component("activations", "Working activations (one layer, prefill)", working, working_formula,
                             "one layer's forward temporaries; nothing is kept for backward")
    moe_stage = any(kind == "moe" for kind, n in sp.kind_counts if n)
    kept = [weights, component("gradients", "Gradients", 0, "none in inference", ""),
            component("optimizer_states", "Optimizer states", 0, "none in inference", ""),
            kv_cache, activations, library_workspaces(training, hardware, moe_stage)]
    if recurrent is not None:
        kept.insert(4, recurrent)
    indexer_keys = indexer_keys_component(arch, training, sp.chunks)
    if indexer_keys is not None:
        kept.insert(4, indexer_keys)
    if sp.stage == par.pp - 1:
        # Logits of the last position of each sequence, upcast to fp32 for sampling.
        kept.append(component("logits", "Logits of the sampled positions (fp32)",
                               training.micro_batch_size * vocab * 4 / t, f"4 x b x V{by_t}", "vLLM/HF generate: last position only"))
    forward = phase("forward", tuple(kept), fold([]))
    outside = (shared.communication, shared.runtime,
               fragmentation(forward.allocated_bytes, hardware, "inference (the replay builds a training step)"))
    return built_stage(sp.stage, sp.num_layers, int(round(sp.local)), (forward,), outside)


def forward_working_set(arch: Architecture, training: Training, par: Parallel, kinds: set[str],
                        T: float) -> tuple[float, str]:
    """The widest temporaries of one layer's forward over `T` tokens when nothing is kept for
    backward (a prefill, a scoring pass): q, k, v and the attention output, or the MLP's fc1 output
    and the gated product (routed tokens x top-k for MoE), plus the residual stream in and out."""
    C = bytes_per_element(training.compute_dtype)
    h, t = arch.hidden_size, par.tp
    attn = T * (arch.q_width + 2 * arch.kv_width + arch.attention_output_width) * C / t
    mlp = 0.0
    if "dense" in kinds:
        mlp = T * arch.intermediate_size * (3 if arch.gated_mlp else 2) * C / t
    if "moe" in kinds:
        mlp = max(mlp, T * arch.num_experts_per_token * training.moe_capacity_factor
                  * arch.moe_intermediate_size * (3 if arch.gated_mlp else 2) * C / t)
    working = max(attn, mlp) + 2 * T * h * C
    by_t, by_cp = ("/t" if t > 1 else ""), ("/cp" if par.cp > 1 else "")
    return working, (f"max(q, k, v, attention output{by_t} ; MLP fc1 output and product{by_t}) + residual in and "
                     f"out, for s*b{by_cp} tokens")
