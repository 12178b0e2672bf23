"""Megatron-Core's own 1F1B schedule on one fake pipeline rank: which activation gradients it holds between
micro-batches (estimator/memory/megatron_pp_grad.py).

The measuring harness (harness.py) runs one micro-batch and its backward by hand; this runs
`forward_backward_pipelining_without_interleaving` itself (Megatron-Core 0.16.1 pipeline_parallel/schedules.py)
for m micro-batches of a tiny model on the harness's fake world, its p2p receives allocating as on a GPU
(p2p_communication.py `_communicate`: torch.empty; the fake process group moves no data), and logs at the end of
each forward_step and at the start and end of each backward_step how many of the tensors the schedule received as
output gradients (`tensor_recv_next`) and how many of the input gradients backward_step returned are alive.

    python -m validation.megatron.pipeline_trace [first|middle|last] [m]
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core.emulation import cuda_softmax_backward
from ..core.tracker import StorageTracker
from . import harness, kernels
from .shims import STORAGE_RESIZED, gloo_as_fake, megatron_shims

# 6 layers on 3 stages, hidden 64, 64 tokens, micro-batch 2, TP 2 with sequence parallelism, DP 2
ARCH = harness.Arch(hidden_size=64, num_layers=6, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                    ffn_hidden_size=160, vocab_size=1000)


def setup(stage: str) -> harness.Setup:
    return harness.Setup(ARCH, seq_len=64, micro_batch_size=2, tp=2, pp=3, dp=2, stage=stage)


def held(stage: str, microbatches: int) -> list[tuple[str, int, int]]:
    """(operation, output gradients received and alive, input gradients returned and alive) at the end of each
    forward ("F"), the start ("B") and the end ("B end") of each backward of the second of two steps."""
    s = setup(stage)
    tracker = StorageTracker()
    tracker.recording = False
    kernels.HIDDEN["context"] = tracker.hidden
    STORAGE_RESIZED["adopt"] = tracker.adopt
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.cache_enabled = False  # as harness.traced_step: a freed storage must be freed for the tracker
    received: list[int] = []
    returned: list[int] = []
    marks: list[tuple[str, int]] = []
    try:
        with megatron_shims(), gloo_as_fake(), harness.megatron_world(s), mode, tracker, \
                cuda_softmax_backward(tracker), _watched(tracker, received, returned, marks):
            from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

            model, config = harness.build_stage(s)
            ddp, optimizer = harness.wrap(s, model, config)
            for step in range(2):  # step 1 makes the optimizer's states; step 2 is logged
                if step:
                    tracker.start()
                forward_backward_pipelining_without_interleaving(
                    forward_step_func=_forward_step(s, model), data_iterator=iter(int, 1), model=[ddp],
                    num_microbatches=microbatches, seq_length=s.seq_len, micro_batch_size=s.micro_batch_size,
                    forward_only=False)
                tracker.stop()
                harness.optimizer_step(ddp, optimizer)
    finally:
        kernels.HIDDEN["context"] = contextlib.nullcontext
        STORAGE_RESIZED["adopt"] = None
    out = []
    for name, index in marks:
        live = tracker.live_at(index)
        out.append((name, sum(k in live for k in received), sum(k in live for k in returned)))
    return out


def _forward_step(s: harness.Setup, model):
    """Megatron-LM's forward_step_func shape: the stage's inputs (harness.stage_inputs), the model, and on the last
    stage pretrain_gpt's loss_func (losses x loss mask summed, the token count)."""
    def forward_step(data_iterator, module):
        inputs = harness.stage_inputs(s, model)
        out = module(input_ids=inputs.get("input_ids"), position_ids=inputs.get("position_ids"),
                     attention_mask=None, labels=inputs.get("labels"))

        def loss_func(output):
            mask = inputs["loss_mask"]
            return (torch.sum(output.float().view(-1) * mask.view(-1)),
                    torch.tensor(mask.numel(), dtype=torch.int), {})
        return out, loss_func
    return forward_step


@contextlib.contextmanager
def _watched(tracker, received: list, returned: list, marks: list):
    """The schedule's receives, forward_step and backward_step wrapped to log what they make, while recording."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    communicate, forward_step, backward_step = (p2p_communication.P2PCommunicator._communicate,
                                                schedules.forward_step, schedules.backward_step)

    def comm(self, *args, **kwargs):
        prev, nxt, reqs = communicate(self, *args, **kwargs)
        if nxt is not None and tracker.recording:
            received.append(tracker.key(nxt))
        return prev, nxt, reqs

    def forward(*args, **kwargs):
        out = forward_step(*args, **kwargs)
        if tracker.recording:
            marks.append(("F", len(tracker.events)))
        return out

    def backward(*args, **kwargs):
        if tracker.recording:
            marks.append(("B", len(tracker.events)))
        out = backward_step(*args, **kwargs)
        if tracker.recording:
            marks.append(("B end", len(tracker.events)))
            returned.extend(tracker.key(t) for t in (out if isinstance(out, list) else [out]) if torch.is_tensor(t))
        return out

    p2p_communication.P2PCommunicator._communicate = comm
    schedules.forward_step, schedules.backward_step = forward, backward
    try:
        yield
    finally:
        p2p_communication.P2PCommunicator._communicate = communicate
        schedules.forward_step, schedules.backward_step = forward_step, backward_step


if __name__ == "__main__":
    stage, m = (sys.argv[1:] + ["middle"])[0], int((sys.argv[2:] + ["5"])[0])
    print(f"stage {stage} of 3, {m} micro-batches: operation, output gradients received and alive, input "
          "gradients returned and alive")
    for row in held(stage, m):
        print(*row, sep="\t")
