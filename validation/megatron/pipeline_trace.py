"""Megatron-Core's own pipeline schedules on one fake pipeline rank: which activation gradients they hold between
micro-batches (estimator/memory/megatron_pp_grad.py, megatron_vpp_grad.py).

The measuring harness (harness.py) runs one micro-batch and its backward by hand; this runs Megatron-Core 0.16.1's
`forward_backward_pipelining_without_interleaving` (1F1B) or `forward_backward_pipelining_with_interleaving`
(pipeline_parallel/schedules.py) itself for m micro-batches of a tiny dense model on the harness's fake world, its
p2p receives allocating as on a GPU (p2p_communication.py `_communicate`: torch.empty; the fake process group moves
no data), and logs at the end of each forward_step and at the start and end of each backward_step how many of the
tensors the schedule received as output gradients (`tensor_recv_next`) and how many of the input gradients
backward_step returned are alive, each row with the schedule's phase (`phased`). `record` traces GRID (PP 2 to 8,
2 to 4 chunks, micro-batch groups, the three p2p modes of the interleaved schedule) on the first, middle and last
rank into tests/data/measured/megatron_pipeline/interleaved.json (estimator/memory/megatron_vpp_grad.py; about
20 minutes on two busy cores).

    python -m validation.megatron.pipeline_trace [first|middle|last] [m] [pp] [vpp] [overlap 0|1]
    python -m validation.megatron.pipeline_trace record
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core.emulation import cuda_softmax_backward
from ..core.tracker import StorageTracker
from ..core.world import end_world, fake_world
from . import harness, kernels
from .shims import STORAGE_RESIZED, gloo_as_fake, megatron_shims

VOCAB = 1000


def setup(stage: str, pp: int = 3, vpp: int = 1, overlap: bool = False, group: int | None = None,
          flush: bool = False) -> harness.Setup:
    """One layer per model chunk, hidden 64, 64 tokens, micro-batch 2, TP 2 with sequence parallelism, DP 2;
    `overlap`: --overlap-p2p-communication (the interleaved schedule's asynchronous sends and receives), `group`:
    --microbatch-group-size-per-virtual-pipeline-stage (pp when None), `flush`:
    --overlap-p2p-communication-warmup-flush."""
    arch = harness.Arch(hidden_size=64, num_layers=pp * vpp, num_attention_heads=4, num_query_groups=2,
                        kv_channels=16, ffn_hidden_size=160, vocab_size=VOCAB)
    extra = dict(virtual_pipeline_model_parallel_size=vpp, overlap_p2p_comm=overlap,
                 batch_p2p_comm=not overlap, microbatch_group_size_per_vp_stage=group or pp,
                 overlap_p2p_comm_warmup_flush=flush) if vpp > 1 else {}
    return harness.Setup(arch, seq_len=64, micro_batch_size=2, tp=2, pp=pp, dp=2, stage=stage, layers=vpp,
                         extra=extra)


def held(stage: str, microbatches: int, pp: int = 3, vpp: int = 1,
         overlap: bool = False) -> list[tuple[str, int, int]]:
    """(operation, output gradients received and alive, input gradients returned and alive) at the end of each
    forward ("F"), the start ("B") and the end ("B end") of each backward of the second of two steps."""
    return [row[1:] for row in phased(stage, microbatches, pp, vpp, overlap)]


def phased(stage: str, microbatches: int, pp: int = 3, vpp: int = 1, overlap: bool = False,
           group: int | None = None, flush: bool = False, steps: int = 2,
           shapes: set | None = None) -> list[tuple[str, str, int, int]]:
    """`held`'s rows with the schedule's phase first ("warmup", "steady", "cooldown": its nvtx ranges), of the
    last of `steps` steps (a step before it makes the optimizer's states); `shapes` collects ("received" or
    "returned", shape, dtype) of the gradients logged."""
    shapes = set() if shapes is None else shapes
    s = setup(stage, pp, vpp, overlap, group, flush)
    tracker = StorageTracker()
    tracker.recording = False
    kernels.HIDDEN["context"] = tracker.hidden
    STORAGE_RESIZED["adopt"] = tracker.adopt
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.cache_enabled = False  # as harness.traced_step: a freed storage must be freed for the tracker
    received: list[int] = []
    returned: list[int] = []
    marks: list[tuple[str, str, int]] = []
    try:
        with megatron_shims(), gloo_as_fake(), _world(s, vpp), mode, tracker, cuda_softmax_backward(tracker), \
                _watched(tracker, received, returned, marks, shapes):
            from megatron.core.pipeline_parallel import schedules

            ddps, optimizer = _chunks(s, vpp)
            run = schedules.forward_backward_pipelining_with_interleaving if vpp > 1 else \
                schedules.forward_backward_pipelining_without_interleaving
            for step in range(steps):  # the steps before the last make the optimizer's states
                if step == steps - 1:
                    tracker.start()
                run(forward_step_func=_forward_step, data_iterator=[iter(int, 1)] * vpp, model=ddps,
                    num_microbatches=microbatches, seq_length=s.seq_len, micro_batch_size=s.micro_batch_size,
                    forward_only=False)
                tracker.stop()
                for ddp in ddps:
                    ddp.finish_grad_sync()
                optimizer.step()
                for ddp in ddps:
                    ddp.zero_grad_buffer()
                optimizer.zero_grad()
    finally:
        kernels.HIDDEN["context"] = contextlib.nullcontext
        STORAGE_RESIZED["adopt"] = None
    out = []
    for phase, name, index in marks:
        live = tracker.live_at(index)
        out.append((phase, name, sum(k in live for k in received), sum(k in live for k in returned)))
    return out


@contextlib.contextmanager
def _world(s: harness.Setup, vpp: int):
    """The fake world and Megatron's parallel state of the rank, with its virtual pipeline size."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom

    fake_world(s.world_size, rank=s.stage_index * s.tp * s.cp * s.dp)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp,
                                     virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
        mrandom.model_parallel_cuda_manual_seed(1234)
        yield
    finally:
        ps.destroy_model_parallel()
        end_world()


def _chunks(s: harness.Setup, vpp: int):
    """The rank's model chunks (harness.build_stage's GPTModel, one per virtual stage: chunk c of rank r is
    pipeline stage r + c x pp), each in Megatron's DDP, and the distributed optimizer over them."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    import megatron.core.transformer.transformer_block as block

    config, r = harness.transformer_config(s), s.stage_index
    saved, block.LayerNormImpl = block.LayerNormImpl, kernels.FusedNorm  # as harness.build_stage
    try:
        models = [GPTModel(config, harness.layer_spec(s), vocab_size=VOCAB, max_sequence_length=s.seq_len,
                           pre_process=r == 0 and c == 0, post_process=r == s.pp - 1 and c == vpp - 1,
                           share_embeddings_and_output_weights=False, position_embedding_type="rope",
                           vp_stage=c if vpp > 1 else None) for c in range(vpp)]
    finally:
        block.LayerNormImpl = saved
    for model in models:
        harness._as_float16_module(model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    ddps = [DistributedDataParallel(config, ddp_config, model) for model in models]
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True,
                                                       params_dtype=torch.bfloat16, clip_grad=0.0,
                                                       use_distributed_optimizer=True), ddps)
    return ddps, optimizer


def _forward_step(data_iterator, module):
    """Megatron-LM's forward_step_func shape: token ids on the first stage (the schedule hands a later stage its
    received input, set_input_tensor), the model, and on the last stage pretrain_gpt's loss_func (losses x loss
    mask summed, the token count)."""
    inner, b, n = module.module, 2, 64
    ids = torch.randint(0, VOCAB, (b, n)) if inner.pre_process else None
    positions = torch.arange(n).unsqueeze(0).expand(b, n).contiguous() if inner.pre_process else None
    labels = torch.randint(0, VOCAB, (b, n)) if inner.post_process else None
    mask = torch.ones(b, n) if inner.post_process else None
    out = module(input_ids=ids, position_ids=positions, attention_mask=None, labels=labels)

    def loss_func(output):
        return torch.sum(output.float().view(-1) * mask.view(-1)), torch.tensor(mask.numel(), dtype=torch.int), {}
    return out, loss_func


@contextlib.contextmanager
def _watched(tracker, received: list, returned: list, marks: list, shapes: set):
    """The schedule's receives, forward_step and backward_step wrapped to log what they make, while recording."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    communicate, forward_step, backward_step = (p2p_communication.P2PCommunicator._communicate,
                                                schedules.forward_step, schedules.backward_step)
    push, phase = schedules.nvtx_range_push, ["warmup"]

    def pushed(msg=None, suffix=None):
        if suffix in ("warmup", "steady", "cooldown"):
            phase[0] = suffix
        return push(msg, suffix)

    def comm(self, *args, **kwargs):
        prev, nxt, reqs = communicate(self, *args, **kwargs)
        if nxt is not None and tracker.recording:
            received.append(tracker.key(nxt))
            shapes.add(("received", tuple(nxt.shape), str(nxt.dtype)))
        return prev, nxt, reqs

    def forward(*args, **kwargs):
        out = forward_step(*args, **kwargs)
        if tracker.recording:
            marks.append((phase[0], "F", len(tracker.events)))
        return out

    def backward(*args, **kwargs):
        if tracker.recording:
            marks.append((phase[0], "B", len(tracker.events)))
        out = backward_step(*args, **kwargs)
        if tracker.recording:
            marks.append((phase[0], "B end", len(tracker.events)))
            grads = [t for t in (out if isinstance(out, list) else [out]) if torch.is_tensor(t)]
            returned.extend(tracker.key(t) for t in grads)
            shapes.update(("returned", tuple(t.shape), str(t.dtype)) for t in grads)
        return out

    p2p_communication.P2PCommunicator._communicate = comm
    schedules.forward_step, schedules.backward_step, schedules.nvtx_range_push = forward, backward, pushed
    try:
        yield
    finally:
        p2p_communication.P2PCommunicator._communicate = communicate
        schedules.forward_step, schedules.backward_step, schedules.nvtx_range_push = forward_step, backward_step, push


def peaks(rows: list[tuple[str, str, int, int]]) -> dict[str, tuple[int, int]]:
    """(received, input gradients) at the rank's peak moments: the steady iterations' forward ends ("forward") and
    backward starts ("backward"), where its stored activations are at their most, each the first moment holding the
    most; when every forward runs in the warm-up, its last forward and the cool-down's first backward."""
    steady = [r for r in rows if r[0] == "steady"]
    forwards = [r for r in steady if r[1] == "F"] or [r for r in rows if r[1] == "F"][-1:]
    backwards = [r for r in steady if r[1] == "B"] or [r for r in rows if r[1] == "B"][:1]
    return {name: max(((r[2], r[3]) for r in moments), key=sum)
            for name, moments in (("forward", forwards), ("backward", backwards))}


# (pp, vpp, micro-batches, group, every) traced on the first, middle (pp // 2) and last rank with
# --overlap-p2p-communication; where `every`, also without it and with its warm-up flush
GRID = [(2, 2, 2, 2, True), (2, 2, 4, 2, False), (2, 4, 6, 3, False), (2, 4, 5, 5, False), (2, 3, 4, 2, True),
        (4, 2, 4, 4, True), (4, 2, 8, 4, True), (4, 3, 4, 4, True), (4, 3, 10, 5, True), (4, 2, 9, 5, True),
        (4, 3, 12, 6, False), (8, 2, 8, 8, False), (8, 2, 16, 8, False), (8, 2, 12, 12, False), (8, 3, 8, 8, False)]
RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "megatron_pipeline" / "interleaved.json"


def record(path: Path = RECORD) -> None:
    """Trace GRID with Megatron-Core's schedule and write each run's rows and peaks to `path`."""
    import megatron.core

    runs = []
    for pp, vpp, m, group, every in GRID:
        modes = [(True, False)] + ([(False, False), (True, True)] if every else [])
        for overlap, flush in modes:
            for stage in ("first", "middle", "last") if pp > 2 else ("first", "last"):
                shapes: set = set()
                rows = phased(stage, m, pp, vpp, overlap, group, flush, steps=1, shapes=shapes)
                runs.append(dict(stage=stage, rank={"first": 0, "middle": pp // 2, "last": pp - 1}[stage], pp=pp,
                                 vpp=vpp, microbatches=m, group=group, overlap=overlap, flush=flush,
                                 peaks=peaks(rows), shapes=sorted(shapes), rows=rows))
                print(runs[-1]["rank"], pp, vpp, m, group, overlap, flush, runs[-1]["peaks"], flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    s = setup("first")
    path.write_text(json.dumps(dict(
        source=f"megatron-core {megatron.core.__version__} pipeline_parallel/schedules.py "
               "forward_backward_pipelining_with_interleaving on one fake rank (validation/megatron/pipeline_trace.py "
               "record): (phase, operation, output gradients received and alive, input gradients returned and "
               "alive) at each forward's end, each backward's start and end of one step",
        model=f"one layer per chunk, hidden {s.arch.hidden_size}, {s.seq_len} tokens, micro-batch "
              f"{s.micro_batch_size}, TP {s.tp} with sequence parallelism, bf16",
        runs=runs), indent=1) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["record"]:
    record()
elif __name__ == "__main__":
    args = sys.argv[1:] + ["middle", "5", "3", "1", "0"][len(sys.argv) - 1:]
    stage, m, pp, vpp, overlap = args[0], int(args[1]), int(args[2]), int(args[3]), args[4] == "1"
    print(f"stage {stage} of {pp}, {vpp} chunk(s), {m} micro-batches, overlap {overlap}: operation, output "
          "gradients received and alive, input gradients returned and alive")
    for row in held(stage, m, pp, vpp, overlap):
        print(*row, sep="\t")
