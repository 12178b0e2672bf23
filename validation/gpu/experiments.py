"""Experiments the real-GPU script runs besides its cases: measurements of the device itself that no
framework's source gives (graphs.py: CUDA-graph executables; context.py: the CUDA context under lazy and
eager module loading; nccl_world.py: a one-rank NCCL world; sdpa_mask.py: SDPA with a mask, the kernel torch
picks and the memory-efficient one).

An experiment is a list of sub-runs, each a process of its own (`python -m validation.gpu.<module> ARGS
DEVICE [DEADLINE_S]`, with its environment), run by `python -m validation.gpu run --case <experiment id>`
within the run's budget: a sub-run is started only with MIN_START_S of the budget left, is told to stop
capturing at the budget's end (graphs.py checks its deadline after each graph), and is killed 30 s after
it. Each sub-run appends one JSON line to runs.jsonl as it ends; `records` turns an experiment's lines
into tests/data/measured/gpu/experiments/<experiment>-<gpu>.json. On the CPU (`device="cpu"`, the CI
self-test) the same processes run against the CPU stand-in of devices.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .context import MODES
from .graphs import GRID, NODE_GRID, GraphRun, fit

MIN_START_S = 20  # a sub-run needs its process start and CUDA context (about 5-10 s) and some work
SUBRUN_DEADLINE_S = 100  # no one graph sub-run takes more
KILL_GRACE_S = 30
EXPERIMENT_RECORDS = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "gpu" / "experiments"


@dataclass(frozen=True)
class SubRun:
    args: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...] = ()  # set, or unset where None

    def environment(self) -> dict:
        env = dict(os.environ)
        for name, value in self.env:
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env


@dataclass(frozen=True)
class Experiment:
    id: str
    module: str  # validation.gpu.<module>
    runs: tuple[SubRun, ...]
    takes_deadline: bool  # the sub-run's last argument is the seconds it may take
    description: str


def graph_experiment(grid: tuple[GraphRun, ...] = GRID) -> Experiment:
    return Experiment("cuda-graphs", "graphs", tuple(SubRun(r.args()) for r in grid), True,
                      "graph executables' driver memory: graphs of K kernel nodes captured into one shared pool, "
                      "mem_get_info against the pool's reserved bytes at 1, 2, 4, ... graphs "
                      "(validation/gpu/graphs.py)")


def node_experiment(grid: tuple[GraphRun, ...] = NODE_GRID) -> Experiment:
    return Experiment("cuda-graph-nodes", "graphs", tuple(SubRun(r.args()) for r in grid), True,
                      "graph executables' driver memory for vLLM-shaped kernel nodes: bf16 [256, 4096] x [4096, 4096] "
                      "GEMMs, SDPA's flash forward on [1, 32, 256, 128], an Inductor-compiled Triton RMSNorm; 16 and 64 "
                      "nodes a graph, as cuda-graphs (validation/gpu/graphs.py NODE_KINDS)")


def context_experiment(repeats: int = 2) -> Experiment:
    runs = tuple(SubRun((), (("CUDA_MODULE_LOADING", mode),)) for _ in range(repeats) for mode in MODES)
    return Experiment("cuda-context", "context", runs, False,
                      "the CUDA context and module loading stage by stage (context, allocations, elementwise, bf16 "
                      "GEMM, flash SDPA forward and backward, foreach AdamW) under CUDA_MODULE_LOADING=LAZY, "
                      "=EAGER and unset, each in a fresh process (validation/gpu/context.py)")


def nccl_world_experiment() -> Experiment:
    return Experiment("nccl-world", "nccl_world", (SubRun(()),), False,
                      "what a one-rank DeepSpeed run holds outside the caching allocator, stage by stage: "
                      "deepspeed.init_distributed('nccl'), the first all_reduce (NCCL's communicator), a 64 MiB "
                      "all_reduce, a tiny ZeRO-3 engine's first and second steps (validation/gpu/nccl_world.py)")


def sdpa_mask_experiment(groups: tuple[str, ...] | None = None) -> Experiment:
    from .sdpa_mask import GPU_GROUPS

    return Experiment("sdpa-mask", "sdpa_mask", tuple(SubRun((g,)) for g in groups or GPU_GROUPS), True,
                      "transformers' SDPA call with a 4-D mask (Gemma 3's sliding layers: the bool mask, k and v "
                      "repeated to the query heads), its unmasked control and Falcon-7B's 71-on-1-head call (the "
                      "math backend), bf16 forward and backward, with torch's default backends (cuDNN's attention "
                      "where torch puts it first) and, for five Gemma shapes, without cuDNN (the memory-efficient "
                      "kernel for the masked call, FlashAttention-2 for the control): max_memory_allocated over the "
                      "inputs, every request of the allocator, the tensors autograd saved, the backend and kernels "
                      "that ran, beside the estimator's ledger for the layer (validation/gpu/sdpa_mask.py)")


def nccl_mechanism_experiment() -> Experiment:
    runs = tuple(SubRun((which,), (("NCCL_CUMEM_ENABLE", cumem),))
                 for which, cumem in (("deepspeed", None), ("deepspeed", "0"), ("megatron", None)))
    return Experiment("nccl-mechanism", "nccl_mechanism", runs, False,
                      "what holds a one-rank run's bytes outside the allocator: nccl-world's stages with NCCL's "
                      "INIT/ALLOC log cut at each, NCCL as it defaults (cuMem) and with NCCL_CUMEM_ENABLE=0, and a "
                      "tiny Megatron-Core step's collectives by group beside NCCL's log "
                      "(validation/gpu/nccl_mechanism.py)")


def nccl_runtime_connect_experiment() -> Experiment:
    return Experiment("nccl-runtime-connect", "nccl_mechanism",
                      (SubRun(("deepspeed",), (("NCCL_CUMEM_ENABLE", None), ("NCCL_RUNTIME_CONNECT", "0"))),), False,
                      "nccl-mechanism's DeepSpeed stages with cuMem on (NCCL's default) and NCCL_RUNTIME_CONNECT=0: "
                      "initialisation connects what NCCL 2.19-2.21 (torch 2.2-2.6, before runtime connect) connect, "
                      "at one rank the net proxy's shared buffer, through cuMem (estimator/spec/nccl.py, "
                      "validation/gpu/nccl_mechanism.py)")


EXPERIMENTS = {e.id: e for e in (context_experiment(), graph_experiment(), node_experiment(),
                                 nccl_world_experiment(), sdpa_mask_experiment(), nccl_mechanism_experiment(),
                                 nccl_runtime_connect_experiment())}


def run_experiment(experiment: Experiment, device: str, deadline: float, runs, log) -> int:
    """Its sub-runs, in order, while the budget (`deadline`, a perf_counter time) allows; the lines written."""
    written = 0
    for i, sub in enumerate(experiment.runs):
        label = f"{experiment.id}[{i}] {' '.join(sub.args)} {dict(sub.env)}"
        left = deadline - time.perf_counter()
        if left < MIN_START_S:
            log.write(f"{label}: not run ({left:.0f}s of the budget left)\n")
            continue
        deadline_arg = [f"{min(SUBRUN_DEADLINE_S, left - 10):.0f}"] if experiment.takes_deadline else []
        args = [*sub.args, device, *deadline_arg]
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", f"validation.gpu.{experiment.module}", *args],
                                  capture_output=True, text=True, env=sub.environment(), timeout=left + KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            log.write(f"{label}: killed after {time.perf_counter() - start:.0f}s\n")
            continue
        log.write(f"{label}: exit {done.returncode} in {time.perf_counter() - start:.1f}s\n")
        if done.returncode != 0:
            log.write(done.stderr[-3000:] + "\n")
            continue
        # the sub-run's module may serve several experiments (graphs.py: cuda-graphs and cuda-graph-nodes)
        line = json.loads(done.stdout.strip().splitlines()[-1]) | {"experiment": experiment.id}
        runs.write(json.dumps(line) + "\n")
        runs.flush()
        written += 1
        print(f"{label}: ok at {time.perf_counter() - start:.0f}s", flush=True)
    log.flush()
    return written


def gpu_slug(versions: dict) -> str:
    from .records import GPU_IDS

    name = versions.get("gpu") or "cpu"
    return GPU_IDS.get(name) or re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


COMMAND = "python -m validation.gpu run --out DIR --case {id}; python -m validation.gpu records --from DIR/runs.jsonl"


def graph_points(lines: list[dict]) -> list[dict]:
    """Every sub-run's points as one table: what a fit of per-graph and per-node bytes reads."""
    return [{"kind": line["run"]["kind"], "kernels": line["run"]["kernels"],
             "kernel_nodes_per_graph": line["measured"]["kernel_nodes_per_graph"], **point}
            for line in lines for point in line["measured"]["points"]]


def graph_fits(points: list[dict]) -> dict:
    """The least-squares fit over all points and over each kind's (None where it cannot separate the two)."""
    kinds = sorted({p["kind"] for p in points})
    return {"all": fit(points), **{k: fit([p for p in points if p["kind"] == k]) for k in kinds}}


def experiment_record(experiment_id: str, lines: list[dict]) -> dict:
    versions = lines[0]["versions"]
    differing = [k for line in lines for k in ("torch", "cuda", "driver", "gpu")
                 if line["versions"].get(k) != versions.get(k)]
    if differing:
        raise ValueError(f"{experiment_id}: the lines ran with different {sorted(set(differing))}")
    record = {"id": f"{experiment_id}-{gpu_slug(versions)}", "experiment": experiment_id,
              "description": EXPERIMENTS[experiment_id].description,
              "runs": [{"run": line["run"], "measured": line["measured"]} for line in lines]}
    if experiment_id in ("cuda-graphs", "cuda-graph-nodes"):
        points = graph_points(lines)
        record |= {"points": points, "fit": graph_fits(points)}
    return record | {"versions": versions, "command": COMMAND.format(id=experiment_id)}


def write_experiment_records(lines: list[dict], directory: Path) -> list[Path]:
    """One record per experiment and GPU: <directory>/<experiment>-<gpu>.json."""
    from ..core.record import write_record

    groups: dict[tuple[str, str], list[dict]] = {}
    for line in lines:
        groups.setdefault((line["experiment"], gpu_slug(line["versions"])), []).append(line)
    return [write_record(experiment_record(exp, group), directory) for (exp, _), group in groups.items()]
