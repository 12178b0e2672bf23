"""transformers' Falcon with ALiBi (config ``alibi: true``, e.g. falcon-rw-1b; `Architecture.position_embedding`
"alibi"): the one b x heads x s x s mask every layer reads.

transformers 5.23 models/falcon/modeling_falcon.py:
- FalconModel.forward builds the ALiBi tensor once a step (build_alibi_tensor, lines 149-177: the slopes times the
  positions, b x heads x 1 x s in the embeddings' dtype: bytes per token and head, left out) and, the 4-D mask being
  always made (lines 755-761), folds it into that mask: ``torch.masked_fill(alibi / sqrt(head_dim), causal_mask <
  -1, min_dtype)`` (lines 763-778; a bool SDPA mask first made an additive one, b x 1 x s x s), whose broadcast
  result is b x heads x s x s in the embeddings' dtype. That one tensor is every layer's ``attention_mask``
  (lines 784-798); no RoPE runs (lines 323-325).
- FalconAttention's SDPA path (lines 369-384) hands it to SDPA as a float mask: convert_boolean_attn_mask passes it
  through (no per-call bias, as a bool mask gets: sdpa_mask.py), and the fused kernel that takes it (equal head
  counts: falcon-rw's multi_query false) keeps it for backward, every layer the same storage: one tensor a micro-batch
  until the first layer's backward. Its dropout (attention_dropout in training) is the kernel's (no mask kept).
- Its eager path (lines 386-412) adds ``alibi`` (b x heads x 1 x s) to the fp32 upcast of the scores and the mask to
  that, transients of the forward; autograd keeps what the eager path without ALiBi keeps (q and k, softmax's
  output in the compute dtype, the dropout's mask and output, v), and not the mask (an add keeps no operand).
So the mask outlives the forward where a fused SDPA kernel keeps it, or where full recompute keeps it as each
checkpointed layer's input (transformers' gradient checkpointing saves the layer's tensor arguments); on the eager and
math paths without recompute it is freed when the model's forward returns (before the loss: not charged).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.choices import TRANSFORMERS_FRAMEWORKS
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, autocast

SOURCE = ("transformers 5.23 models/falcon/modeling_falcon.py build_alibi_tensor (lines 149-177), FalconModel.forward "
          "(lines 736-778: the mask folded with alibi, b x heads x s x s), FalconAttention.forward (lines 369-412); "
          "torch 2.13 attention.cpp convert_boolean_attn_mask (a float mask passed through)")
ALIBI_MASK = "Falcon's ALiBi mask (b x heads x s x s, every layer's; kept by SDPA's fused kernel or recompute)"


def falcon_alibi(arch: Architecture, training: Training) -> bool:
    """A Falcon with ALiBi under transformers' modelling code (the transformers frameworks)."""
    return (arch.sdpa_mask_always and arch.position_embedding == "alibi"
            and training.framework in TRANSFORMERS_FRAMEWORKS)


def alibi_mask_kept(arch: Architecture, training: Training) -> bool:
    """Whether the folded mask lives until backward (module docstring): a fused SDPA kernel keeps it (flash, equal
    head counts) or full recompute keeps it as the checkpointed layers' input."""
    # SDPA with equal head counts (sdpa_math.py: unequal ones run the math backend)
    fused = training.attention == "flash" and (arch.num_kv_heads == arch.num_attention_heads
                                               or arch.qkv_split_expands_kv)
    return (falcon_alibi(arch, training) and training.mode == "training"
            and (fused or training.recompute == "full"))


def alibi_mask_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The first stage's one mask per micro-batch in flight, where it is kept (`alibi_mask_kept`)."""
    if not alibi_mask_kept(arch, training):
        return []
    s = training.seq_len
    size = mask_bytes_per_element(training)
    return [Entry(ALIBI_MASK, training.micro_batch_size * arch.num_attention_heads * s * s, size, "none",
                  "B*b*a*s^2" if size == bytes_per_element(training.compute_dtype) else f"{size:g}*b*a*s^2",
                  split_by_cp=False)]


def mask_bytes_per_element(training: Training) -> float:
    """The embeddings' dtype, the mask's (build_alibi_tensor's ``.to(dtype)`` and min_dtype of inputs_embeds): the
    parameters' under autocast (fp32), else the compute dtype. (Under autocast SDPA casts it for each call, a copy
    a layer not counted here.)"""
    return bytes_per_element(training.param_dtype if autocast(training) else training.compute_dtype)
