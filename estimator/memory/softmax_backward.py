"""CUDA's softmax-backward temporary, and the moment it joins where attention runs torch's softmax on the scores.

PyTorch's CUDA kernel for the softmax's backward (SOFTMAX_BACKWARD_SOURCE) first makes `tmp = grad * output`, a
copy of the output gradient's size and dtype, alive until the kernel has written the input's gradient; the CPU
and meta kernels make none. Where a layer's attention runs torch's softmax over its b x a x s x s scores
(transformers' eager attention; Megatron-Core's FusedScaleMaskSoftmax when its fused kernel is off or does not
apply), its backward holds one score tensor more than the ledger of a CPU run says:
- beside a recomputed layer (full recompute): the layer's backward runs inside that moment
  (`softmax_backward_temporary`; the HF harness's records of Llama-3.1-8B, Gemma-2-9B and Mixtral with
  recompute and eager attention grew by exactly this when it counted the temporary);
- in Megatron's unfused path, the whole softmax backward: without recompute the last layer's beside every kept
  activation, with full recompute the recomputed layer's (`softmax_backward_moment`; the harness records
  gpt3-175b-tp8-pp8-first-s2048-b1-unfused and llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused peak
  there).
Not here: DSA (sparse.py, sparse_hf.py count it in their moments) and SDPA's math backend (kbit.py, from its GPU
record); HF's eager attention without recompute, whose records peak at the loss (the softmax's moment, beside
the last layer's MLP tensors not yet freed, is not modelled).
"""

from __future__ import annotations

from .activations.entries import Entry, compiled, fused_kernels
from .activations.attention import megatron_fused_softmax
from .activations.llama4 import TRANSFORMERS_FRAMEWORKS
from .components import Component, component
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.hybrid import attends
from ..spec.parallel import Parallel
from ..spec.training import Training

SOFTMAX_BACKWARD_SOURCE = (
    "PyTorch aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out (torch 2.x, read at pytorch/pytorch "
    "000cace5): `Tensor tmp = grad * output` before the kernel, freed when it returns (the CPU and meta kernels "
    "make none); H200 runs on torch 2.11 (tests/data/measured/gpu/*-eager-*) allocated it: 4*b*a*s^2 over the fake "
    "peak before the harness counted it (validation/core/emulation.py)")
MEGATRON_SOFTMAX_SOURCE = (
    "Megatron-Core 0.16.1 fusions/fused_softmax.py FusedScaleMaskSoftmax.forward_torch_softmax (fp32 softmax, cast "
    "back for scores x V); measured: tests/data/measured/megatron/gpt3-175b-tp8-pp8-first-s2048-b1-unfused (the "
    "backward peak in the last layer's softmax backward: 446.7 MB over the kept activations, 503.3 MB modelled, the "
    "layer's MLP tensors freed by then and the small gradients beside it left out)")


def _softmax_bytes(arch: Architecture, training: Training, par: Parallel) -> float | None:
    """The bytes per score element of the softmax's output gradient where the layer's attention runs torch's
    softmax over the scores: transformers' eager attention softmaxes in fp32 (`softmax(..., dtype=float32)
    .to(dtype)`: the cast's backward hands it an fp32 gradient), Llama 4's in the compute dtype; Megatron's
    unfused path in fp32 (attention_softmax_in_fp32, as its ledger: activations/attention.py). None where none
    runs, where the path counts it itself (module docstring), and under torchtitan and torchtune, whose models
    attend through SDPA (their eager ledger is transformers'; no run of theirs measured it)."""
    from .kbit import math_attention
    if training.attention == "flash" or arch.uses_sparse_attention or compiled(training) \
            or math_attention(arch, training) or training.mode != "training":
        return None
    if fused_kernels(training):
        return None if megatron_fused_softmax(arch, training, par) else 4
    if training.framework not in TRANSFORMERS_FRAMEWORKS:  # torchtitan and torchtune attend through SDPA
        return None
    return bytes_per_element(training.compute_dtype) if arch.eager_softmax_in_compute_dtype else 4


def _scores(arch: Architecture, training: Training) -> float:
    """b*a*s^2 before TP: one layer's attention scores (context parallelism needs flash, so s is whole)."""
    return training.micro_batch_size * arch.num_attention_heads * training.seq_len ** 2


def temporary_entry(arch: Architecture, training: Training, par: Parallel) -> Entry | None:
    """CUDA's `tmp = grad * output` of the layer's softmax backward, or None (see `_softmax_bytes`)."""
    size = _softmax_bytes(arch, training, par)
    if size is None:
        return None
    return Entry("CUDA softmax backward's temporary (tmp = grad * output)",
                 _scores(arch, training), size, "tp",
                 "4*a*s^2*b" if size == 4 else "B*a*s^2*b")


def softmax_backward_temporary(arch: Architecture, training: Training, par: Parallel,
                               kinds: list[str]) -> list[Component]:
    """The temporary beside a recomputed layer of one of `kinds` that attends (module docstring)."""
    entry = temporary_entry(arch, training, par) if any(map(attends, kinds)) else None
    return [component("transient", entry.name, entry.bytes(par), entry.shown_formula(par), SOFTMAX_BACKWARD_SOURCE)] \
        if entry else []


def softmax_backward_moment(arch: Architecture, training: Training, par: Parallel,
                            recomputed: bool = False) -> list[Component]:
    """Megatron's unfused softmax: a layer's softmax backward holds the fp32 gradient of the probabilities (the
    cast's backward), CUDA's tmp and the fp32 gradient of the scores, 3 x 4*a*s^2*b, less the 16-bit tensor
    scores x V kept (the probabilities' copy, or the dropout's output), freed by its backward: B*a*s^2*b (with
    fp32 compute and no dropout the fp32 probabilities themselves, which the softmax keeps: none freed). Without
    recompute the last layer's, beside every kept activation; with full recompute (`recomputed`) the recomputed
    layer's, beside its own kept tensors (the harness record llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-
    unfused peaks there: 8.85 GB over the layers' inputs, 9.27 GB modelled, its MLP's tensors freed by then
    left in)."""
    if training.framework != "megatron" or training.offload_activations \
            or (training.recompute != "none") != recomputed:
        return []
    entry = temporary_entry(arch, training, par)
    if entry is None:
        return []
    B = bytes_per_element(training.compute_dtype)
    freed = B if B < 4 or training.dropout else 0
    t = "/t" if par.tp > 1 else ""
    parts = (component("transient", "fp32 gradient of the probabilities (the cast's backward)", entry.bytes(par),
                       f"4*a*s^2*b{t}", MEGATRON_SOFTMAX_SOURCE),
             component("transient", entry.name, entry.bytes(par), entry.shown_formula(par), SOFTMAX_BACKWARD_SOURCE),
             component("transient", "fp32 gradient of the scores (the softmax's backward output)", entry.bytes(par),
                       f"4*a*s^2*b{t}", MEGATRON_SOFTMAX_SOURCE))
    if freed:
        parts += (component("transient", "The 16-bit tensor scores x V kept, freed by its backward",
                            -entry.elements * freed / par.tp, f"-{freed:g}*a*s^2*b{t}", MEGATRON_SOFTMAX_SOURCE),)
    label = "The recomputed layer's" if recomputed else "The last layer's"
    return [Component("transient", f"{label} softmax backward (unfused softmax)",
                      sum(p.bytes for p in parts), " + ".join(p.formula for p in parts),
                      MEGATRON_SOFTMAX_SOURCE + "; " + SOFTMAX_BACKWARD_SOURCE, parts)]
