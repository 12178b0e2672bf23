"""The backward moments of a Mamba mixer on transformers' torch fallback (training.ssm_kernels,
memory/activations/mamba_torch.py): a Mamba-2 scan's broadcast products under transformers 5.17 ("torch_5.17"), whose
operand gradients autograd makes at the product's full size, and a Mamba-1 recurrent loop's select gradients (Jamba).
Read by recompute_moment.py: beside the last layer's kept tensors without recompute, beside
the recomputed layer's with it."""

from __future__ import annotations

from .activations.mamba_torch import BROADCAST, BROADCAST_SOURCE, broadcast_products, mamba2_mixers
from .components import Component, component
from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training


def broadcast_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Component]:
    """A Mamba-2 mixer's backward under transformers 5.17's torch fallback: the largest product's two full-size
    operand gradients (`broadcast_products`), beside the layer's saved tensors; the tensors its backward has freed
    by then and the gradients alive (each tokens x H p or smaller, under 1% of it on the measured cases) are left
    out. Measured: the fake-tensor step of 5.17.0 (tests/test_accuracy.py MAMBA_FALLBACK_FAKE_PEAKS) and the H200's
    two runs of it (tests/data/measured/gpu/falcon-h1-0.5b-*)."""
    if training.ssm_kernels != BROADCAST or not mamba2_mixers(arch):
        return []
    name, size = max(broadcast_products(arch, training, par).items(), key=lambda item: item[1])
    return [component("transient", "Mamba-2 torch fallback (transformers 5.17): a product's two operand gradients",
                      2 * size, f"2 x 4 B x {name}", BROADCAST_SOURCE + "; torch/csrc/autograd/engine.cpp "
                      "validate_outputs (sum_to after the node)")]


SELECT_BACKWARD_SOURCE = ("PyTorch tools/autograd/derivatives.yaml select.int: select_backward (a zero tensor of the "
                          "input's size, the step's gradient copied into it); torch/csrc/autograd/input_buffer.cpp "
                          "accumulate (the gradients summed into the node's input buffer)")


def mamba1_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Component]:
    """A Mamba-1 mixer's backward on transformers' torch fallback (memory/activations/mamba_torch.py
    torch_mamba1_entries): its recurrent loop reads discrete_A[:, :, i] and deltaB_u[:, :, i] at every token, and
    each select's backward makes a zero tensor of the whole (b, d, s, n) in fp32 (SELECT_BACKWARD_SOURCE), summed
    into the gradient accumulated so far out of place: the two accumulated gradients, one step's zero tensor and
    its sum, four (b, d, s, n) fp32 tensors beside the layer's saved ones. Measured on a real CPU mixer under the
    harness's storage tracker (validation/core/tracker.py: 3.95 of them over its saved tensors at its first steps'
    backward, tests/test_ssm_torch.py)."""
    from .activations.mamba_torch import JAMBA_SOURCE, mixers
    from .activations.entries import tokens_per_gpu

    if training.ssm_kernels == "fused" or not mixers(arch, ("mamba1",)):
        return []
    d, n = arch.mamba_expand * arch.hidden_size, arch.mamba_state_size
    size = 4 * tokens_per_gpu(training, par) * d * n / par.tp
    return [component("transient", "Mamba-1 torch fallback: the loop's select gradients (b x d x s x n, fp32)",
                      4 * size, "4 x 4 B x s*b*d*n (discrete_A's and deltaB_u's accumulated, one step's zeros, "
                      "their sum)", JAMBA_SOURCE + "; " + SELECT_BACKWARD_SOURCE)]


def ssm_torch_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Component]:
    """The torch fallback's backward moment of a Mamba mixer (both functions above; none on the fused kernels)."""
    return broadcast_backward_moment(arch, training, par) + mamba1_backward_moment(arch, training, par)
