"""A whole layer's ledger (attention + MLP or MoE, adapters, FP8 copies, the recompute policy),
its input, and the embedding's.
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import (ATTENTION_OUTPUT, CORE, Entry, fp8_activation_bytes, config_dropout, tokens_per_gpu,
                      torchao_float8)
from .alibi import alibi_mask_entries
from .attention import attention_entries
from .mlp import mlp_entries
from .recompute import OP_LEVEL, dropped, op_level, op_level_saved_entries


TE_FLASH_OUTPUT_SOURCE = ("TransformerEngine 2.x pytorch/attention/dot_product_attention/backends.py FusedAttnFunc."
                          "forward: without FP8 attention (fp8_dpa) it saves (q, k, v, out) in the compute dtype for its "
                          "backward, while the output projection (an FP8 linear) saves its own quantized copy of `out`")
MLA_ORIGINAL_INPUT_SOURCE = ("Megatron-Core 0.16.1 transformer/multi_latent_attention.py MLASelfAttention.__init__: "
                             "with FP8 (a recipe other than delayed, TE >= 2.6) set_save_original_input(linear_proj), "
                             "so the output projection saves the attention output the fused attention already keeps")


def _proj_saves_original_input(arch: Architecture, training: Training) -> bool:
    """Megatron's MLA output projection keeps the attention output itself under FP8 (every recipe the
    estimator offers under megatron is a current-scaling one, not delayed), not a quantized copy."""
    return arch.uses_mla and training.framework == "megatron" and training.attention == "flash"


def _flash_output_beside_fp8_copy(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Under TransformerEngine's FP8 recipe the attention kernel still runs in the compute dtype and
    keeps its output for its own backward; the output projection keeps a quantized copy beside it
    (the FP8 ledger's "attention output" entry), so the compute-dtype output is a second tensor,
    except where the projection saves its original input (MLA under Megatron: one tensor, kept in
    the compute dtype). Recomputing the core attention (selective core_attn) drops it with the
    kernel's other tensors."""
    if training.attention != "flash" or training.mode != "training" or _proj_saves_original_input(arch, training):
        return []
    T = tokens_per_gpu(training, par)
    return [Entry("attention output kept by flash attention (compute dtype, beside the FP8 copy)",
                  T * arch.attention_output_width,
                  bytes_per_element(training.compute_dtype), "tp", "B*s*b*a*d_v", recompute=CORE)]


def layer_entries(arch: Architecture, training: Training, par: Parallel, kind: str, first: bool = False) -> list[Entry]:
    """One layer's saved tensors; `first`: the first layer of an adapter run whose input needs no
    gradient (`adapter_activations.first_layer_input_frozen`)."""
    if arch.is_hybrid:  # the HF Trainer's stack alone (memory/validation.py)
        from .hybrid import hybrid_layer_entries
        entries = hybrid_layer_entries(arch, training, par, kind)
    else:
        entries = attention_entries(arch, training, par) + mlp_entries(arch, training, par, kind)
    if training.adapter:
        from ..adapter_activations import adapted_layer_entries
        entries = adapted_layer_entries(entries, arch, training, par, kind, first)
    if training.fp8 and not torchao_float8(training):
        # TransformerEngine saves each FP8 GEMM's quantized input for backward
        q = fp8_activation_bytes(training)
        original = ATTENTION_OUTPUT if _proj_saves_original_input(arch, training) else None
        entries = [e._replace(bytes_per_element=q, formula=e.formula.replace("B*", "B_fp8*", 1))
                   if e.gemm_input and e.name != original else e
                   for e in entries] + _flash_output_beside_fp8_copy(arch, training, par)
    if op_level(training):
        # every tensor the eager layer keeps is recomputed; the policy's saves are entries of their own
        entries = [e._replace(recompute=e.recompute + OP_LEVEL) for e in entries] + op_level_saved_entries(
            arch, training, par)
    return entries


def layer_bytes(arch: Architecture, training: Training, par: Parallel, kind: str, selective: bool = False) -> float:
    modules = frozenset(training.recompute_modules) if selective else frozenset()
    return sum(e.bytes(par) for e in layer_entries(arch, training, par, kind) if not dropped(e, modules))


def layer_input_entry(arch: Architecture, training: Training, par: Parallel) -> Entry:
    """What full recompute keeps per layer: its input, 2sbh (divided by t with sequence
    parallelism), Korthikanti section 5."""
    return Entry("layer input", tokens_per_gpu(training, par) * arch.hidden_size,
                 bytes_per_element(training.compute_dtype), "sp", "B*s*b*h")


def layer_input_bytes(arch: Architecture, training: Training, par: Parallel) -> float:
    return layer_input_entry(arch, training, par).bytes(par)


# --- first and last stage ------------------------------------------------------------------------

def embedding_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """First stage, per micro-batch: the int64 token ids the embedding keeps for its backward, and
    the embedding dropout mask (Korthikanti section 4.3: 8sbp + sbhp over p micro-batches; the transformers
    decoders', CONFIG_DROPOUT_SOURCE). A frozen embedding's output needs no gradient, so its dropout keeps no
    mask (autograd records nothing), as it keeps no token ids."""
    T = tokens_per_gpu(training, par)
    out = [Entry("token ids (int64)", T, 8, "none", "8*s*b", for_weights=("embedding",))]
    if config_dropout(arch.embedding_dropout, training):
        out.append(Entry("embedding dropout mask", T * arch.hidden_size, 1, "sp", "s*b*h", for_weights=("embedding",)))
    from ..adapter_activations import kept  # a frozen embedding keeps no token ids
    # Falcon's ALiBi mask, made once a step before the first layer (alibi.py)
    return kept(out, training, arch) + alibi_mask_entries(arch, training, par)


def moe_recomputed_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Selective recompute of "moe" (Megatron's MoELayer.forward under tensor_parallel.checkpoint,
    moe_layer.py): in backward the block's forward runs again, so every tensor of the MoE block that the
    recompute dropped (the router's, the dispatched tokens, the experts', the shared experts') exists again,
    with the norm's output it starts from when "layernorm" is recomputed too, beside the block's own moments."""
    if training.recompute != "selective" or "moe" not in training.recompute_modules:
        return []
    modules = frozenset(training.recompute_modules)
    block = {e.name for e in mlp_entries(arch, training, par, "moe")}
    return [e for e in layer_entries(arch, training, par, "moe") if e.name in block and dropped(e, modules)]
