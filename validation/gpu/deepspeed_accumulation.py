"""What real DeepSpeed 0.19.5 ZeRO-1 and ZeRO-2 hold of gradients per rank over a step of more than one micro-batch
(gradient_accumulation_steps 2 and 3), on DeepSpeed's CPU accelerator over gloo (deepspeed_partitions' models,
groups and launch; the tiny Llama, bucket 5,000 elements).

Per rank and per micro-batch the record keeps the distinct storages (untyped_storage data_ptr -> nbytes) reachable
from DeepSpeedZeroOptimizer's gradient attributes (runtime/zero/stage_1_and_2.py: `grads_in_partition`,
`all_grad_tensors`, `averaged_gradients`, the ipg buckets' buffers, `previous_reduced_grads`) and the parameters'
`.grad` / `.grad_accum`, sampled at every reduction point of backward (reduce_ipg_grads before and after,
copy_grads_in_partition after, and at its torch.empty: what lived before the call and the new buffer;
_release_ipg_buffers before: the epilogue's moment), after backward and after the step: `peak` the most bytes at once in that micro-batch's backward, `after_backward` what lives on to the next,
`grads_in_partition` the numel of each buffer made (torch.empty in copy_grads_in_partition).

    .venv/deepspeed/bin/python -m validation.gpu.deepspeed_accumulation [--out FILE] [--worlds 2]

writes tests/data/measured/deepspeed_partitions/zero12-accumulation-cpu-gloo.json (RECORD).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from . import deepspeed_partitions as dp

RECORD = dp.RECORD.parent / "zero12-accumulation-cpu-gloo.json"


@dataclass(frozen=True)
class AccumulationRun:
    zero_stage: int
    overlap_comm: bool
    contiguous: bool
    steps: int  # gradient_accumulation_steps
    model: str = "llama"
    lora: bool = False

    @property
    def id(self) -> str:
        return (f"{self.model}-zero{self.zero_stage}-overlap{'on' if self.overlap_comm else 'off'}"
                f"-contiguous{'on' if self.contiguous else 'off'}-ga{self.steps}")


RUNS = tuple(AccumulationRun(2, o, c, s) for o in (False, True) for c in (True, False) for s in (2, 3)) + tuple(
    AccumulationRun(1, o, True, 2) for o in (False, True))


def ds_config(run: AccumulationRun) -> dict:
    config = dp.ds_config(dp.PartitionRun(run.model, run.zero_stage, run.overlap_comm))
    config["gradient_accumulation_steps"] = run.steps
    config["zero_optimization"]["contiguous_gradients"] = run.contiguous
    return config


def _tensors(zero, model):
    yield "grads_in_partition", getattr(zero, "grads_in_partition", None)
    for i, grads in (getattr(zero, "all_grad_tensors", None) or {}).items():
        for g in grads or ():
            yield "all_grad_tensors", g
    for i, grads in (getattr(zero, "averaged_gradients", None) or {}).items():
        for g in grads or ():
            yield "averaged_gradients", g
    for bucket in zero.ipg_buckets.values():
        for b in bucket.buffer:
            yield "ipg_buffer", b
        for g in bucket.grads:
            yield "ipg_grads", g
    for grads in (getattr(zero, "previous_reduced_grads", None) or {}).values():
        for p in grads:
            yield "previous_reduced_grads", p.grad
    for p in model.parameters():
        yield "param.grad", p.grad
        yield "param.grad_accum", getattr(p, "grad_accum", None)


def live(zero, model) -> dict:
    """{data_ptr: [nbytes, sorted names that reach it]} of the gradient storages alive now."""
    out: dict = {}
    for name, t in _tensors(zero, model):
        if t is None or not isinstance(t, torch.Tensor):
            continue
        s = t.untyped_storage()
        entry = out.setdefault(s.data_ptr(), [s.nbytes(), set()])
        entry[1].add(name)
    return out


def measure_rank(run: AccumulationRun) -> dict:
    import deepspeed

    model = dp.build_model(dp.PartitionRun(run.model, run.zero_stage, run.overlap_comm, run.lora))
    optimizer = torch.optim.AdamW(dp.trainer_groups(model), lr=1e-4, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(run))
    zero = engine.optimizer
    state = {"peak": 0, "peak_at": "", "peak_storages": {}, "made": []}

    def sample(where: str, now: dict | None = None) -> None:
        now = live(zero, model) if now is None else now
        total = sum(n for n, _ in now.values())
        if total > state["peak"]:
            state.update(peak=total, peak_at=where,
                         peak_storages={str(k): [n, sorted(names)] for k, (n, names) in now.items()})

    def wrap(name: str, before: bool, after: bool) -> None:
        inner = getattr(zero, name)

        def wrapped(*args, **kwargs):
            if before:
                sample(name + " before")
            had = getattr(zero, "grads_in_partition", None)
            then = live(zero, model) if name == "copy_grads_in_partition" and had is None else None
            out = inner(*args, **kwargs)
            if name == "copy_grads_in_partition" and had is None and zero.grads_in_partition is not None:
                made = zero.grads_in_partition
                state["made"].append(made.numel())
                # the moment of its torch.empty: what lived before the call and the new buffer, before any copy
                then[made.untyped_storage().data_ptr()] = [made.untyped_storage().nbytes(), {"grads_in_partition"}]
                sample(name + " torch.empty", then)
            if after:
                sample(name + " after")
            return out

        setattr(zero, name, wrapped)

    wrap("reduce_ipg_grads", True, True)
    wrap("copy_grads_in_partition", False, True)
    wrap("_release_ipg_buffers", True, False)
    torch.manual_seed(1)
    micro = []
    for k in range(run.steps):
        state.update(peak=0, peak_at="", peak_storages={}, made=[])
        ids = torch.randint(0, dp.MODELS[run.model]["vocab_size"], (1, 8))
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        sample("after backward")
        after = live(zero, model)
        record = {"micro_batch": k + 1, "peak_bytes": state["peak"], "peak_at": state["peak_at"],
                  "peak_storages": sorted(state["peak_storages"].values(), key=lambda e: (-e[0], e[1])),
                  "after_backward_bytes": sum(n for n, _ in after.values()),
                  "after_backward_storages": sorted(([n, sorted(s)] for n, s in after.values()),
                                                    key=lambda e: (-e[0], e[1])),
                  "grads_in_partition_made": list(state["made"])}
        engine.step()  # a no-op before the boundary (engine.step checks is_gradient_accumulation_boundary)
        now = live(zero, model)
        record["after_step_bytes"] = sum(n for n, _ in now.values())
        micro.append(record)
    partition = sum(p.numel() for group in zero.params_in_partition for p in group)
    return {"rank": deepspeed.comm.get_rank(), "params_in_partition_numel": partition,
            "element_bytes": 2, "micro_batches": micro}


def measure_world(world: int, runs: tuple = RUNS) -> dict:
    return dp.measure_world(world, runs, measure_rank)  # deepspeed_partitions' launch, this measurement


def measure(worlds=(2,), runs: tuple = RUNS) -> dict:
    return dp.world_record(__doc__, "validation.gpu.deepspeed_accumulation", worlds, runs, measure_world)


def main(argv=None) -> int:
    return dp.write_main(argv, __doc__, RECORD, [2], measure)


if __name__ == "__main__":
    sys.exit(main())
