"""The caching allocator's history of an HF case on the GPU (build, step 1, step 2), to set beside the fake-tensor
harness's recorded sequence of the same case (validation/allocator_trace.py, tests/data/measured/allocator).

`validation/gpu/measure.py` keeps a run's segments at the step's end, not the order of requests, so a reserved miss
whose recorded (CPU) sequence replays short of the GPU (StarCoder2-3B bf16 at s4096 b2: -12.6%,
tests/test_allocator.py KNOWN_REPLAY_GAPS) cannot say which requests the GPU made that the CPU run did not. Here the
same build and two steps as `measure` run with torch.cuda.memory._record_memory_history from before the build, and
the trace is written as the harness's sequences are, (key, +bytes) / (key, -bytes) with the block's address as its
key (an address freed and taken again is a new request), beside the segments mapped (`segment_alloc`, in order) and,
for each request of 1 MiB or more, its innermost Python frame in transformers, torch or validation (what made it).

    python -m validation.gpu.hf_history --out DIR CASE...      # on the GPU: DIR/<case>.history.json.gz each
    python -m validation.gpu.hf_history --compare FILE         # here: the GPU's sequence beside the CPU run's

One case takes about 20 s (two steps with Python stacks). `--compare` replays the GPU's sequence through
estimator/memory/allocator.py (it should give the GPU's reserved peak, the rules being the allocator's) and prints
where the GPU's and the recorded CPU sequence differ (requests and frees of 1 MiB or more, by difflib, each GPU
request with the frame that made it).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import subprocess
import sys
from pathlib import Path

TRACE_ENTRIES = 400_000
FRAME_BYTES = 1 << 20  # requests from this size keep the frame that made them
FRAME_FILES = ("transformers/", "torch/", "validation/")


def _frame(frames: list[dict]) -> str:
    """The innermost frame in transformers', torch's or the harness's Python ('file:line name'), else ''."""
    for f in frames or []:
        name = f.get("filename", "")
        if any(part in name for part in FRAME_FILES):
            return f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return ""


def events_of(trace: list[dict]) -> dict:
    """A device trace (torch.cuda.memory._snapshot()['device_traces'][0]) as the harness's sequence: `events`,
    (address, +size) at each alloc and (address, -size) at each free_completed; `segments`, each segment_alloc's
    size in order; `frames`, [event index, size, frame] of the requests of FRAME_BYTES or more; `streams`, the
    streams requests were made on (more than one: record_stream or a side stream)."""
    events, segments, frames, streams = [], [], [], set()
    for entry in trace:
        action, addr, size = entry["action"], entry["addr"], entry["size"]
        if action == "alloc":
            streams.add(entry.get("stream", 0))
            if size >= FRAME_BYTES:
                frames.append([len(events), size, _frame(entry.get("frames", []))])
            events.append((addr, size))
        elif action == "free_completed":
            events.append((addr, -size))
        elif action == "segment_alloc":
            segments.append(size)
    return {"events": events, "segments": segments, "frames": frames, "streams": sorted(streams)}


def record(case_id: str) -> dict:
    """Build and two steps of the HF case on the GPU, its allocator history from before the build."""
    import gc

    import torch

    from .cases import CASES
    from .measure import BUILDERS, step_function, step_inputs, nullphase

    case = CASES[case_id]
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=TRACE_ENTRIES)
    torch.manual_seed(0)
    model, opt = BUILDERS[case.harness](case.run, "cuda")
    ids, inputs = step_inputs(case.harness, case.run, model, "cuda")
    step = step_function(case.harness, case.run, inputs)
    marks = {"built": len(torch.cuda.memory._snapshot()["device_traces"][0])}
    step(model, opt, ids, lambda name: nullphase())
    gc.collect()
    torch.cuda.synchronize()
    marks["step1"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
    step(model, opt, ids, lambda name: nullphase())
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    trace = snapshot["device_traces"][0]
    out = {"id": case_id, "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
           "allocated_peak_bytes": torch.cuda.max_memory_allocated(), "trace_entries": len(trace),
           "marks": marks, "torch": torch.__version__}
    return out | events_of(trace)


def compare(path: Path) -> None:
    """The GPU's sequence replayed, and beside the recorded CPU sequence of the same case: where their requests and
    frees of 1 MiB or more (sizes in order) differ."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from estimator.memory.allocator import replay

    with gzip.open(path, "rt") as f:
        gpu = json.load(f)
    replayed = replay(gpu["events"])
    print(f"{gpu['id']}: GPU reserved {gpu['reserved_peak_bytes']:,}, its sequence replayed {replayed.reserved_peak:,}"
          f" ({replayed.reserved_peak / gpu['reserved_peak_bytes'] - 1:+.2%}); streams {gpu['streams']}")
    cpu_path = Path(__file__).resolve().parents[2] / "tests/data/measured/allocator" / f"{gpu['id']}.json.gz"
    if not cpu_path.exists():
        return
    with gzip.open(cpu_path, "rt") as f:
        cpu = json.load(f)["events"]
    big = lambda evs: [d for _, d in evs if abs(d) >= FRAME_BYTES]  # noqa: E731
    a, b = big(gpu["events"]), big(cpu)
    print(f"requests and frees of 1 MiB or more: GPU {len(a)}, CPU {len(b)}; where they differ (difflib):")
    made = {i: f for i, _, f in gpu["frames"]}
    index = [i for i, (_, d) in enumerate(gpu["events"]) if abs(d) >= FRAME_BYTES]
    shown = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        gpu_part = ", ".join(f"{d / 2**20:+.2f} {made.get(index[k], '')}".strip() for k, d in enumerate(a[i1:i2], i1))
        cpu_part = ", ".join(f"{d / 2**20:+.2f}" for d in b[j1:j2])
        print(f"  {tag} GPU[{i1}:{i2}] {gpu_part or '-'}  |  CPU[{j1}:{j2}] {cpu_part or '-'}")
        shown += 1
        if shown == 40:
            break


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--compare")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one case, in its own process
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args(argv)
    if args.compare:
        compare(Path(args.compare))
        return 0
    if args.one:
        with gzip.open(Path(args.out) / f"{args.one}.history.json.gz", "wt") as f:
            json.dump(record(args.one), f, separators=(",", ":"))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for case_id in args.cases:  # each in a fresh process: one CUDA context, the allocator empty
        done = subprocess.run([sys.executable, "-m", "validation.gpu.hf_history", "--out", args.out, "--one",
                               case_id], capture_output=True, text=True, timeout=240)
        print(case_id, "exit", done.returncode, done.stderr[-2000:] if done.returncode else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
