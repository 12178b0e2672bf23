"""The activation gradients Megatron-Core's 1F1B schedule holds between a stage's micro-batches.

Megatron-Core 0.16.1's 1F1B (pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving)
runs, on pipeline rank r of p with m micro-batches, W = min(p - r - 1, m) warm-up forwards, then m - W steady
iterations (a forward, then `output_tensor_grad = send_forward_recv_backward(...)` and the oldest micro-batch's
`input_tensor_grad = backward_step(...)`), then W cool-down iterations (`output_tensor_grad = recv_backward(...)`,
`backward_step`). Two variables of the schedule hold a tensor of the stage input's shape [s/cp (/tp with sequence
parallelism), b, h] in the pipeline dtype (get_tensor_shapes, config.pipeline_dtype) beyond the micro-batches in
flight:

- on every stage but the last, the output gradient received from the next stage (p2p_communication.py
  `_communicate`, `create_tensor_recv_next`: torch.empty), held through `backward_step` (which hands it to the engine
  as the output's gradient) and on until the next receive replaces it: through every backward of the stage, and
  through the forward of the next steady iteration;
- on every stage but the first, the input gradient the previous `backward_step` returned (the received input's
  `.grad`, `retain_grad`), sent to the previous stage and held until the next `backward_step` returns: through
  the next forward and the next backward.

A steady iteration's forward and backward hold W + 1 micro-batches in flight, as many as any of the rank's; from
the second steady iteration on (m - W >= 2) both tensors are alive at them, the received output gradient at every
backward. Megatron-Core's own schedule run on one fake rank shows both (validation/megatron/pipeline_trace.py);
the Megatron harness's records, one micro-batch each, hold the received output gradient through their backward
(validation/megatron/harness.py `backward`). The interleaved schedule, which queues each chunk's output gradient
ahead and keeps more input gradients, is megatron_vpp_grad.py's.
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from .components import Component, component
from .pp_buffers import stage_input
from .sharding import StageParameters

SOURCE = ("Megatron-Core 0.16.1 pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving "
          "(output_tensor_grad = send_forward_recv_backward / recv_backward, held through backward_step until the "
          "next receive; input_tensor_grad = backward_step(...), held until the next backward_step returns), "
          "backward_step (input_tensor_grad: the input's .grad, retain_grad), get_tensor_shapes; p2p_communication.py "
          "_communicate (create_tensor_recv_next: torch.empty(tensor_shape, dtype=config.pipeline_dtype)); measured: "
          "validation/megatron/pipeline_trace.py (the schedule on one fake rank), tests/data/measured/megatron "
          "(non-last stages)")
LABEL = "Output gradient received from the next pipeline stage (held by the 1F1B schedule)"
INPUT_LABEL = "Input gradient of the previous backward (held by the 1F1B schedule)"


class Held(NamedTuple):
    """The schedule's gradients at a stage's forward peak and at its backward peak (`received_gradients`)."""

    forward: tuple[Component, ...] = ()
    backward: tuple[Component, ...] = ()


def received_gradients(arch: Architecture, training: Training, par: Parallel, sp: StageParameters, m: int) -> Held:
    """The gradients Megatron's 1F1B holds at a stage's forward and backward peaks (the module's note); none
    elsewhere."""
    if training.framework != "megatron" or training.mode != "training" or par.pp == 1 \
            or par.schedule != "1f1b" or m < 1:
        return Held()
    hidden, formula = stage_input(arch, training, par)
    steady = m - min(par.pp - sp.stage - 1, m)  # m - W
    output = () if sp.last else (
        component("buffers", LABEL, hidden, f"1 x {formula} (the backward's)", SOURCE),)
    if steady < 2:
        return Held((), output)
    kept = f"m - W = {steady} steady iterations: from the second on"
    ahead = () if sp.last else (component("buffers", LABEL, hidden, f"1 x {formula} (the previous backward's, "
                                          f"kept to the next receive; {kept})", SOURCE),)
    inputs = () if sp.first else (component("buffers", INPUT_LABEL, hidden, f"1 x {formula} (kept to the next "
                                            f"backward's end; {kept})", SOURCE),)
    return Held(ahead + inputs, output + inputs)


def received_bytes(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                   m: int) -> tuple[int, int]:
    """`received_gradients`' bytes (forward, backward)."""
    held = received_gradients(arch, training, par, sp, m)
    return sum(c.bytes for c in held.forward), sum(c.bytes for c in held.backward)
