"""Context parallelism by torch's ring attention (torchtitan of December 2024): what a layer's
attention backward holds.

torchtitan 9dec370 runs context parallelism through torch's ``context_parallel`` (train.py
create_context_parallel_ctx; rotate method "allgather", config_manager.py), which sends
F.scaled_dot_product_attention to ``_templated_ring_attention`` (torch 2.6.0, the release branch of
the benchmarks' torch 1963fc83: distributed/tensor/experimental/_attention.py). Its forward keeps
nothing for backward beyond the SDPA op's own saved tensors (the rank's q, k, v, merged output and
log-sum-exp; the all-gathered K/V and the merger's fp32 copies die with the call), so the layer's
saved tensors are plain flash attention's. Its backward (``_templated_ring_attention_backward``)
holds, while it loops over the CP ranks' chunks:
- the keys and values of every CP rank, all-gathered once (``_AllGatherRotater``): cp x (k + v);
- fp32 accumulators of dQ, dK and dV (``torch.zeros_like(..., dtype=accum_dtype)``, convert_to_f32);
- dK and dV passed around the ring in fp32: their ``torch.cat`` and the all-to-all's output
  (``_AllToAllRotater`` over ``permute_tensor``), one each in flight;
- on every rank but the first, the dK and dV it received (fp32) while ``_partial_update`` adds the step's
  half into new copies of them (steps 1 <= i <= rank, line 724): the rotater's ``_buffer`` holds the
  received tensor until ``exchange_buffers`` (line 747) has allocated the next all-to-all's output;
- K and V concatenated for the rotater at every step but the last (``next_kv = torch.cat``, line 653; the
  all-gather rotater uses only the first, the local name keeps the latest);
- the step's dQ, dK, dV from the flash backward (at those steps dK and dV of the first half of the
  received K/V chunk: ``key.chunk(2)[0]``), and the gradient of the attention's output.
The moment is the exchange of a step 1 <= i <= rank (line 747), the largest of the loop's: step 0 holds
the local K/V's contiguous copies and whole-length step outputs but no received dK/dV (one s*b*a*d_head/t
in bf16 less); steps past the rank (q's second half) update the received dK/dV in place.
k and v have every query head there: 9dec370's Attention.forward repeats them (repeat_kv) before SDPA.
By then the layer's MLP has run its backward and freed its saved tensors: the moment holds the
attention's saved tensors beside those buffers. It is charged where a layer is recomputed (full
activation checkpointing, the published runs' setting), as the larger of it and the recomputed layer.
"""

from __future__ import annotations

from .activations.attention import attention_entries
from .activations.entries import tokens_per_gpu
from ..spec.architecture import Architecture
from .components import Component, component
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from .titan_releases import titan_rules
from ..spec.training import Training

RING_SOURCE = ("torch 2.6.0 distributed/tensor/experimental/_attention.py _templated_ring_attention_backward "
               "(_AllGatherRotater for K/V, _AllToAllRotater for dK/dV, fp32 accumulators, _partial_update's "
               "copies beside the received dK/dV on ranks past 0, the per-step K/V cat), under torchtitan 9dec370 "
               "train.py create_context_parallel_ctx (rotate method allgather) and models/llama/model.py "
               "(repeat_kv before scaled_dot_product_attention)")


def ring_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Component]:
    """A recomputed layer's attention backward under torch's ring attention (the module's note), or []
    where torchtitan's release does not run it or CP is off."""
    rules = titan_rules(training)
    if rules is None or rules.cp_attention != "sdpa ring" or par.cp == 1 or training.mode != "training" \
            or arch.uses_mla:
        return []
    B, T, t = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par), par.tp
    n = T * arch.q_width / t  # one of q, k, v (k and v repeated to every query head) on this GPU
    tf = "/t" if t > 1 else ""
    saved = sum(e.bytes(par) for e in attention_entries(arch, training, par))
    parts = (("The attention's saved tensors (the MLP's freed by its backward)", saved,
              "the attention's entries of the per-layer ledger"),
             ("K and V of every CP rank, all-gathered", B * par.cp * 2 * n, f"B*cp*2*s*b*a*d_head{tf}"),
             ("fp32 accumulators of dQ, dK and dV", 4 * 3 * n, f"4*3*s*b*a*d_head{tf}"),
             ("dK and dV around the ring in fp32 (their cat and the all-to-all's output)", 2 * 4 * 2 * n,
              f"2*4*2*s*b*a*d_head{tf}"),
             ("the received dK and dV (fp32) beside _partial_update's new copies", 4 * 2 * n,
              f"4*2*s*b*a*d_head{tf}"),
             ("K and V concatenated for the rotater", B * 2 * n, f"B*2*s*b*a*d_head{tf}"),
             ("the step's dQ, half-length dK and dV and the attention output's gradient", 3 * B * n,
              f"3*B*s*b*a*d_head{tf}"))
    return [component("transient", f"Ring attention's backward (CP {par.cp}): {label}", nbytes, formula, RING_SOURCE)
            for label, nbytes, formula in parts]
