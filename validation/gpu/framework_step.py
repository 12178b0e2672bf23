"""The measuring loop of the framework-step cases (megatron_step.py, deepspeed_step.py): a framework's own
engine runs two training steps in this process; step 1 creates the optimizer states, step 2 is measured
phase by phase as validation/gpu/measure.py measures the HF and PEFT steps (the same record fields:
allocated peak per phase, reserved peaks, mem_get_info at the start and the end, nvidia-smi, the allocator's
statistics and segments, the cuBLAS workspaces).

A framework step is an object with `step(phase)` (one training step; `phase(name)` is a context manager
around each of its phases) and `states() -> dict` (the bytes of its parameters, gradients and optimizer
states as the framework holds them). With `trace=True` the allocator's history is recorded
(torch.cuda.memory._record_memory_history, Python stacks) from the build on, and the record keeps what
was live at step 2's allocated peak, grouped by the frame that allocated it (`peak_blocks`).
On the CPU (the CI self-test) the same build and two steps run; only the states are counted.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager

import torch

TRACE_ENTRIES = 400_000  # allocator events kept (a 1.8B-parameter ZeRO-3 step makes tens of thousands)
TRACE_GROUPS = 40  # the largest groups of live blocks kept in the record
# step 2's start in the allocator's history: one block of this size, made and freed (7 MiB + 512 B: a size no
# framework asks for; the events' own time stamps are not compared with the host's clock). Where no cached
# block holds it, it costs one 20 MiB segment of reserved memory (CUDACachingAllocator: 1-10 MiB requests)
MARKER_BYTES = 7 * 2**20 + 512
OWN_FRAMES = ("/torch/cuda/", "/torch/utils/_contextlib", "framework_step.py")


def free_port() -> int:
    """A local port no process listens on now, for a world of one rank's rendezvous (a fixed port collides
    with other processes on a shared machine)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def environment(values: dict[str, str]):
    """`values` set in the environment, each name's earlier value (or its absence) restored on exit."""
    import os

    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def one_rank_environment(launcher: bool = False):
    """The rendezvous of a world of one rank in the environment (with `launcher`, also the RANK, LOCAL_RANK and
    WORLD_SIZE a launcher sets), restored on exit: a later run in the same process (the CPU self-tests; e.g.
    Accelerate, which reads LOCAL_RANK as a distributed launch) sees the environment it had."""
    values = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if launcher:
        values |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    with environment(values):
        yield


def measure_framework(build, device: str, trace: bool = False) -> dict:
    """`build(device)` returns the framework step; the record's `measured` object."""
    from .measure import (after_step1, cuda_used_bytes, freed_cublas_workspaces, nullphase, phase_recorder,
                          step2_readings)

    cuda = device == "cuda"
    out: dict = {}
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)
        out["context_used_bytes"] = cuda_used_bytes()
        out["context_reserved_bytes"] = torch.cuda.memory_reserved()
        if trace:
            torch.cuda.memory._record_memory_history("all", context="all", stacks="python",
                                                     max_entries=TRACE_ENTRIES)
    torch.manual_seed(0)
    framework = build(device)
    if cuda:  # what the build put outside the allocator (issue 22: 1.72 GiB more than an HF step, undecomposed)
        out["outside_after_build_bytes"] = outside_allocator_bytes()
    start = time.perf_counter()
    out["step1_loss"] = framework.step(lambda name: nullphase())
    gc.collect()
    out |= framework.states()
    if not cuda:
        return out
    out["outside_after_step1_bytes"] = outside_allocator_bytes()  # step 1's communicators and kernels
    out |= after_step1()
    phases: dict = {}
    if trace:
        torch.empty(MARKER_BYTES, dtype=torch.uint8, device=device)  # made and freed at once
    out["step2_loss"] = framework.step(phase_recorder(phases))
    torch.cuda.synchronize()
    out["step2_seconds"] = time.perf_counter() - start
    out |= step2_readings(phases)
    if trace:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        out["peak_blocks"] = peak_blocks(snapshot["device_traces"][0])
    out["cublas_workspace_bytes"] = freed_cublas_workspaces()
    return out


def outside_allocator_bytes() -> int:
    """The device's used memory less what the caching allocator holds: the CUDA context, loaded kernels and
    what libraries allocate themselves (NCCL's buffers)."""
    from .measure import cuda_used_bytes

    torch.cuda.synchronize()
    return cuda_used_bytes() - torch.cuda.memory_reserved()


NCCL_LOG_LINES = 200  # NCCL's INIT/ALLOC lines kept in a record


def nccl_log_summary(text: str) -> dict:
    """NCCL's own log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ALLOC, NCCL_DEBUG_FILE): the communicators it
    initialised (its "Init COMPLETE" lines, NCCL 2.28.9 src/init.cc), the device memory it allocated itself
    (its "Cuda Alloc Size N" lines, src/include/alloc.h; host allocations say "Cuda Host Alloc"), and its
    lines that name an allocation or a communicator, the process's prefix cut, at most NCCL_LOG_LINES."""
    import re

    lines = [line.split(" NCCL INFO ", 1)[-1].strip() for line in text.splitlines() if "NCCL INFO" in line]
    kept = [line[:200] for line in lines if "Init COMPLETE" in line or "lloc" in line or "ncclCommInit" in line]
    device = [int(m.group(1)) for line in lines for m in [re.search(r"Cuda Alloc Size (\d+)", line)] if m]
    return {"communicators": sum("Init COMPLETE" in line for line in lines), "device_alloc_bytes": sum(device),
            "device_allocs": len(device), "lines": kept[:NCCL_LOG_LINES],
            "lines_left_out": max(0, len(kept) - NCCL_LOG_LINES)}


def _where(frames: list[dict], depth: int = 4) -> list[str]:
    """The innermost frames outside torch's allocator plumbing and this module: who asked for the block."""
    kept = [f"{f['filename'].rsplit('site-packages/', 1)[-1]}:{f['line']} {f['name']}" for f in frames
            if not any(own in f["filename"] for own in OWN_FRAMES)]
    return kept[:depth]


def peak_blocks(events: list[dict], marker: int = MARKER_BYTES) -> dict:
    """Replay the allocator's events: the allocated bytes reach their highest after the last block of
    `marker` bytes (step 2's start) at one event; the blocks live then (those allocated while the history was recorded), grouped by where they
    were allocated, the largest first. The history starts before the build, so every block but the first
    one-element tensor is in the events (sizes are the allocator's rounded block sizes)."""
    starts = [i for i, e in enumerate(events) if e["action"] == "alloc" and e["size"] == marker]
    since = starts[-1] if starts else 0
    live: dict[int, dict] = {}
    total, best, best_at, best_live = 0, -1, None, {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        else:
            continue
        if i > since and total > best:
            best, best_at, best_live = total, i, dict(live)
    groups: dict[tuple, list] = {}
    for e in best_live.values():
        key = tuple(_where(e.get("frames", [])))
        entry = groups.setdefault(key, [0, 0, set()])
        entry[0] += e["size"]
        entry[1] += 1
        entry[2].add(e["size"])
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {"replayed_peak_bytes": best, "peak_event": best_at, "events": len(events), "step2_event": since,
            "truncated": len(events) >= TRACE_ENTRIES, "marker_found": bool(starts),
            "live_blocks": len(best_live),
            "groups": [{"bytes": b, "blocks": n, "sizes": sorted(sizes, reverse=True)[:6], "where": list(key)}
                       for key, (b, n, sizes) in ranked[:TRACE_GROUPS]],
            "other_groups_bytes": sum(v[0] for _, v in ranked[TRACE_GROUPS:])}
