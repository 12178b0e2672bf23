"""The backward moment of a Mamba-2 mixer on transformers 5.17's torch fallback (training.ssm_kernels "torch_5.17",
memory/activations/mamba_torch.py): its scan's broadcast products, whose operand gradients autograd makes at the
product's full size. Read by recompute_moment.py: beside the last layer's kept tensors without recompute, beside
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
