"""The output gradient a Megatron-Core pipeline stage receives from the next stage, under 1F1B.

Megatron-Core 0.16.1's 1F1B (pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving)
runs, on pipeline rank r of p with m micro-batches, W = min(p - r - 1, m) warm-up forwards, then m - W steady
iterations (a forward, then `output_tensor_grad = send_forward_recv_backward(...)` and the oldest micro-batch's
`backward_step`), then W cool-down iterations (`output_tensor_grad = recv_backward(...)`, `backward_step`). On
every stage but the last the receive makes a new tensor (p2p_communication.py `_communicate`,
`create_tensor_recv_next`: torch.empty of the send shape [s/cp (/tp with sequence parallelism), b, h] in
`config.pipeline_dtype`, get_tensor_shapes). The schedule's variable holds it through `backward_step` (which
hands it to the engine as the output's gradient) and on until the next receive replaces it, so:

- every backward of the stage holds one (the record of the Megatron harness holds it through its backward:
  validation/megatron/harness.py `backward`);
- a steady iteration's forward holds the previous iteration's from the second iteration on, with W + 1
  micro-batches in flight, as many as any forward of the rank: the forward's peak holds one when m - W >= 2.

The last stage receives none (its backward starts from the loss). The interleaved schedule receives each
chunk's output gradient an iteration ahead into per-chunk queues (output_tensor_grads), and the other schedules
are not Megatron-Core's 1F1B: not modelled here.
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from .components import Component, component
from .pp_buffers import stage_input
from .sharding import StageParameters

SOURCE = ("Megatron-Core 0.16.1 pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving "
          "(output_tensor_grad = send_forward_recv_backward / recv_backward, held through backward_step until the "
          "next receive), get_tensor_shapes; p2p_communication.py _communicate (create_tensor_recv_next: "
          "torch.empty(tensor_shape, dtype=config.pipeline_dtype)); measured: tests/data/measured/megatron "
          "(non-last stages)")
LABEL = "Output gradient received from the next pipeline stage (held by the 1F1B schedule)"


def received_gradient(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                      m: int) -> tuple[Component | None, Component | None]:
    """(at the forward's peak, at the backward's) the received output gradient of a Megatron 1F1B stage (the
    module's note); (None, None) elsewhere."""
    if training.framework != "megatron" or training.mode != "training" or par.pp == 1 or sp.last \
            or par.schedule != "1f1b" or m < 1:
        return None, None
    hidden, formula = stage_input(arch, training, par)
    warmup = min(par.pp - sp.stage - 1, m)
    backward = component("buffers", LABEL, hidden, f"1 x {formula} (the backward's)", SOURCE)
    if m - warmup < 2:
        return None, backward
    return component("buffers", LABEL, hidden, f"1 x {formula} (the previous backward's, kept to the next receive: "
                     f"m - W = {m - warmup} steady iterations)", SOURCE), backward


def received_bytes(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                   m: int) -> tuple[int, int]:
    """`received_gradient`'s bytes (forward, backward)."""
    forward, backward = received_gradient(arch, training, par, sp, m)
    return forward.bytes if forward else 0, backward.bytes if backward else 0
