"""Which mechanism holds what a one-rank framework run keeps outside PyTorch's allocator (issues 22 and 23), checked
on the device: the model (estimator/spec/nccl.py) says NCCL's kernels once (85 x 2 MiB) and per communicator 2 + 3 x
64 allocations, each its own 2 MiB under cuMem (tests/test_nccl_one_rank.py). Two sub-runs, each a process:

- `deepspeed`: nccl-world's stages (nccl_world.py: context, init_distributed, a 1-element and a 64 MiB all_reduce, a
  tiny ZeRO-3 engine's two steps) with NCCL's own INIT/ALLOC log cut at every stage (`nccl`: communicators made,
  device allocations, their requested bytes; framework_step.nccl_log_summary), run once as NCCL defaults
  (cuMem on) and once with NCCL_CUMEM_ENABLE=0: without cuMem the 194 small allocations of a communicator are
  cudaMalloc's (the H200 run: they share one page, and each communicator adds the net proxy's 512 MiB shared
  buffer; the rule for torch before 2.2, spec/nccl.py);
- `megatron`: a tiny Megatron-Core model (megatron_step.tiny_arch) over a world of one rank, stages init (process
  group and parallel_state), build, step 1, step 2, with NCCL's log cut at each and every torch.distributed
  collective recorded by its group (`collectives`: stage, operation, group description, the calling frame): the
  H200 run of 2026-11-27 made 4 communicators where the CPU run of the same step calls collectives on 3 groups
  (the world, TP, DP x CP); the GPU run's fourth is the gradient norm's (INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP,
  optimizer/clip_grads.py l. 130, from ChainedOptimizer.step whatever clip_grad), which the CPU run's shims replace
  (validation/megatron/shims.py: get_grad_norm returns 0.0).

With NCCL_RUNTIME_CONNECT=0 in its environment (the `nccl-runtime-connect` experiment) the DeepSpeed sub-run is that
experiment's: cuMem on and nothing left to run time, as NCCL 2.19-2.21 (torch 2.2-2.6) initialise, so each
communicator should log 195 allocations, its 194 small ones and the net proxy's 512 MiB shared buffer, all cuMem
granules (spec/nccl.py: 194 + 256 granules a communicator where 2.19-2.21 take 97 + 32).

On the CPU (the self-test) the same stages run over gloo; NCCL writes no log there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
import traceback

import torch

DEEPSPEED_STAGES = ("context", "init_distributed", "all_reduce_1", "all_reduce_64mib", "deepspeed_zero3_tiny",
                    "deepspeed_zero3_tiny_step2")
MEGATRON_STAGES = ("context", "init", "build", "step1", "step2")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
               "_all_gather_base", "_reduce_scatter_base", "all_gather_object", "reduce", "reduce_scatter",
               "all_to_all_single", "broadcast_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv",
               "gather", "scatter", "all_gather_coalesced", "all_reduce_coalesced")
OWN = ("nccl_mechanism.py", "/torch/distributed/")
STARTS = ("ncclCommInit", "Init COMPLETE", "Split")  # NCCL's lines that start, finish or split a communicator


class NcclLog:
    """NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ALLOC into a file of this process's, set before NCCL starts (it reads
    them at its first communicator); `cut()` summarises what NCCL wrote since the last cut."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="nccl-mechanism-")
        os.environ.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ALLOC",
                           "NCCL_DEBUG_FILE": os.path.join(self.folder, "nccl.%p.log")})
        self.read = 0

    def cut(self) -> dict:
        from .framework_step import nccl_log_summary

        text = "".join(open(os.path.join(self.folder, name), errors="replace").read()
                       for name in sorted(os.listdir(self.folder)))
        new, self.read = text[self.read:], len(text)
        summary = nccl_log_summary(new)
        lines = [line.split(" NCCL INFO ", 1)[-1].strip()[:200] for line in new.splitlines() if "NCCL INFO" in line]
        return {k: summary[k] for k in ("communicators", "device_allocs", "device_alloc_bytes")} | {
            "init_lines": [line for line in lines if any(w in line for w in STARTS)]}


@contextlib.contextmanager
def recorded_collectives(stage: list[str], out: list[dict]):
    """Every call of a torch.distributed collective while inside, as {stage, op, group, where}: the group by its
    description (parallel_state names its groups) or WORLD, where by the innermost frame outside torch.distributed."""
    import torch.distributed as dist

    saved = {}

    def wrap(name, original):
        @functools.wraps(original)
        def call(*args, **kwargs):
            group = kwargs.get("group")
            if group is None:
                group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            label = "WORLD" if group is None or group is dist.group.WORLD else \
                (getattr(group, "group_desc", "") or dist._get_process_group_name(group))
            frames = [f for f in traceback.extract_stack()[:-1] if not any(o in f.filename for o in OWN)]
            where = f"{frames[-1].filename.rsplit('site-packages/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
            out.append({"stage": stage[0], "op": name, "group": label, "where": where})
            return original(*args, **kwargs)
        return call

    for name in COLLECTIVES:
        if hasattr(dist, name):
            saved[name] = getattr(dist, name)
            setattr(dist, name, wrap(name, saved[name]))
    try:
        yield out
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def _marker(device: str, rows: list[dict], log: NcclLog | None):
    from .context import stage_marker
    from .devices import device_named

    mark = stage_marker(device_named(device), rows)

    def marked(stage: str) -> None:
        mark(stage)
        if log is not None:
            rows[-1]["nccl"] = log.cut()

    return marked


def measure_deepspeed_stages(device: str) -> dict:
    """nccl_world.py's stages, NCCL's log cut at each (on the GPU)."""
    from .context import stage_deltas
    from .nccl_world import run_stages

    log = NcclLog() if device == "cuda" else None
    rows: list[dict] = []
    run_stages(device, _marker(device, rows, log))
    return {"stages": rows, "deltas": stage_deltas(rows)}


def measure_megatron_stages(device: str) -> dict:
    """A tiny Megatron-Core step over one rank, stage by stage, its collectives recorded by group. The collectives
    are wrapped before Megatron-Core is imported: its modules bind some at import (param_and_grad_buffer.py
    `dist_reduce_scatter_func = torch.distributed.reduce_scatter_tensor`)."""
    stage, calls = ["init"], []
    with recorded_collectives(stage, calls):
        return _megatron_stages(device, stage, calls)


def _megatron_stages(device: str, stage: list[str], calls: list[dict]) -> dict:
    from .context import stage_deltas
    from .framework_step import one_rank_environment
    from .measure import nullphase
    from .megatron_step import MegatronRun, MegatronStep, megatron_one_rank

    log = NcclLog() if device == "cuda" else None
    rows: list[dict] = []
    mark = _marker(device, rows, log)
    shims = contextlib.nullcontext()
    if device != "cuda":
        from ..megatron.shims import megatron_shims

        shims = megatron_shims()
    if device == "cuda":
        torch.cuda.init()
    torch.zeros(1, device=device)
    mark("context")
    with shims, one_rank_environment(), megatron_one_rank(device):
        mark("init")
        stage[0] = "build"
        torch.manual_seed(0)
        step = MegatronStep(MegatronRun("tiny", 2, 64), device)
        mark("build")
        for name in ("step1", "step2"):
            stage[0] = name
            step.step(lambda _: nullphase())
            mark(name)
    groups = sorted({(c["stage"], c["group"]) for c in calls})
    return {"stages": rows, "deltas": stage_deltas(rows), "collectives": calls,
            "groups_by_stage": [{"stage": s, "group": g} for s, g in groups]}


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.nccl_mechanism deepspeed|megatron DEVICE`: one JSON line on stdout."""
    from .devices import driver_api_version
    from .measure import versions

    which, device = argv[0], argv[1]
    measured = measure_deepspeed_stages(device) if which == "deepspeed" else measure_megatron_stages(device)
    found = versions(device) | {"cuda_driver_api": driver_api_version() if device == "cuda" else None,
                                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None}
    if which == "deepspeed":
        import deepspeed

        found["deepspeed"] = deepspeed.__version__
    else:
        import megatron.core

        found["megatron_core"] = getattr(megatron.core, "__version__", None)
    run = {"framework": which, "nccl_cumem_enable": os.environ.get("NCCL_CUMEM_ENABLE")}
    experiment = "nccl-mechanism"
    if os.environ.get("NCCL_RUNTIME_CONNECT") is not None:  # the nccl-runtime-connect experiment (experiments.py)
        run["nccl_runtime_connect"] = os.environ["NCCL_RUNTIME_CONNECT"]
        experiment = "nccl-runtime-connect"
    print(json.dumps({"experiment": experiment, "run": run, "measured": measured, "versions": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
