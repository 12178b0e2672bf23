"""The caching allocator's whole history of an HF or PEFT case on the GPU (model build, step 1, step 2), to set
beside the fake-tensor harness's recorded sequence of the same case (validation/allocator_trace.py,
tests/data/measured/allocator) and to replay through estimator/memory/allocator.py.

A GPU record (validation/gpu/measure.py) keeps the segments at the step's end, not the order of requests nor the
segments' addresses in the order cudaMalloc made them. So a reserved miss whose recorded CPU sequence replays short
of the GPU (StarCoder2-3B bf16 at s4096 b2: -12.6%, tests/test_allocator.py KNOWN_REPLAY_GAPS) cannot say which
requests the GPU made that the CPU run did not; and the recorded sequence of LoRA on Llama-3.2-1B with recompute
and eager attention replays to that run's reserved peak to the byte only with each new segment below the last
(allocator.py `descending`, tests/test_segment_order.py), which the GPU's own addresses can confirm.

    python -m validation.gpu.hf_history --out DIR CASE...   # on the GPU: DIR/<case>.history.json.gz each
    python -m validation.gpu.hf_history --compare FILE      # here: the GPU's sequence beside the CPU run's
    python -m validation.gpu.hf_history --summary FILE      # here: replayed both address orders; segments made

`--out` runs each case in a process of its own, as validation/gpu/__main__.py runs them (one CUDA context, the
allocator empty, PYTORCH_CUDA_ALLOC_CONF set for a case with expandable segments), the same build, wrapper and two
steps as measure.py with torch.cuda.memory._record_memory_history from before the build, and writes under DIR only
the one file a case (gzip; a 16-layer step makes about 15,000 requests): every trace entry as [action, address,
size, stream, frames] (frames: indices into `frames`, the innermost FRAMES outside torch.cuda's own Python, for
requests and segments), the segments at the end with their addresses, the reserved peaks, and `marks`, the requests
made by the build's end and by step 1's end. One JSON line a case on stdout: its summary.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from estimator.memory.allocator import EMPTY_CACHE

ROOT = Path(__file__).resolve().parents[2]
CPU_TRACES = ROOT / "tests/data/measured/allocator"
TRACE_ENTRIES = 400_000  # torch's ring buffer; a 16-layer step's ~15,000 requests make ~45,000 entries
FRAMES = 3  # the innermost frames kept per request, outside SKIPPED
SKIPPED = ("/torch/cuda/", "/torch/utils/_contextlib", "/torch/_tensor.py", "hf_history.py")
FRAMED = ("alloc", "segment_alloc")  # the actions whose frames are kept
BIG = 1 << 20  # --compare sets requests and frees of this size and more side by side
CASE_TIMEOUT_S = 150  # as validation/gpu/__main__.py


def _where(frames: list[dict], names: dict) -> list[int]:
    """The innermost FRAMES frames outside SKIPPED, as indices into `names` ('file:line function', interned; the
    file from site-packages or the repository)."""
    out = []
    for f in frames or []:
        filename = f.get("filename", "")
        if any(s in filename for s in SKIPPED):
            continue
        filename = filename.split("site-packages/")[-1].removeprefix(f"{ROOT}/")
        out.append(names.setdefault(f"{filename}:{f.get('line')} {f.get('name')}", len(names)))
        if len(out) == FRAMES:
            break
    return out


def compact(trace: list[dict]) -> dict:
    """A device trace (torch.cuda.memory._snapshot()['device_traces'][0]) as the file keeps it: `events`, [action,
    address, size, stream, frame indices] each (frames for FRAMED actions only), and `frames`, their texts."""
    names: dict[str, int] = {}
    events = [[e["action"], e.get("addr", 0), e.get("size", 0), e.get("stream", 0),
               _where(e.get("frames", []), names) if e["action"] in FRAMED else []] for e in trace]
    return {"events": events, "frames": list(names)}


def requests(record: dict) -> list[tuple[int, int]]:
    """The history as (key, +/- bytes) events, the fake harness's form (validation/allocator_trace.py): one key per
    block made (an address taken again is a new key), freed at `free_completed` (free_requested alone returns
    nothing to the pool); a free of a block made before the history began is left out; a run of segment frees is
    an empty_cache (allocator.replay's EMPTY_CACHE event: the QLoRA build's, bitsandbytes' quantization)."""
    out, live, keys, last = [], {}, iter(range(1 << 62)), None
    for action, addr, size, _stream, _where_ in record["events"]:
        if action == "alloc":
            live[addr] = next(keys)
            out.append((live[addr], size))
        elif action == "free_completed" and addr in live:
            out.append((live.pop(addr), -size))
        elif action == "segment_free" and last != "segment_free":  # an empty_cache (one run of segment frees)
            out.append((EMPTY_CACHE, 0))
        last = action
    return out


def summary(record: dict) -> dict:
    """The GPU's own requests replayed through estimator/memory/allocator.py with ascending and with descending
    segment addresses against its reserved peak; the segments in the order cudaMalloc made them (how many lie below
    the one made before, those of 1 GiB and more with their addresses); the streams requests were made on."""
    from estimator.memory.allocator import replay

    made = [(addr, size) for action, addr, size, _s, _w in record["events"] if action == "segment_alloc"]
    events = requests(record)
    return {"reserved_peak_bytes": record["reserved_peak_bytes"],
            "replayed_ascending": replay(events).reserved_peak,
            "replayed_descending": replay(events, descending=True).reserved_peak,
            "segments_made": len(made), "each_below_the_last": sum(b[0] < a[0] for a, b in zip(made, made[1:])),
            "large_segments_made_mib": [[hex(a), s >> 20] for a, s in made if s >= 1 << 30],
            "streams": sorted({s for action, _a, _z, s, _w in record["events"] if action == "alloc"})}


def differences(record: dict, cpu: list, limit: int = 40) -> list[str]:
    """Where the GPU's requests and frees of BIG or more (sizes in order) part from the recorded CPU sequence's
    (difflib), each GPU request with the innermost frame that made it."""
    big, keyed = [], requests(record)
    made = iter([w for action, _a, _s, _st, w in record["events"] if action == "alloc"])
    for _key, delta in keyed:
        where = next(made) if delta > 0 else []
        if abs(delta) >= BIG:
            big.append((delta, record["frames"][where[0]] if where else ""))
    a, b = [d for d, _ in big], [d for _, d in cpu if abs(d) >= BIG]
    lines = [f"requests and frees of 1 MiB or more: GPU {len(a)}, CPU {len(b)}; where they differ (difflib):"]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if len(lines) > limit:
            lines.append("  ...")
            break
        gpu_part = ", ".join(f"{d / 2**20:+.2f} {f}".strip() for d, f in big[i1:i2])
        cpu_part = ", ".join(f"{d / 2**20:+.2f}" for d in b[j1:j2])
        lines.append(f"  {tag} GPU[{i1}:{i2}] {gpu_part or '-'}  |  CPU[{j1}:{j2}] {cpu_part or '-'}")
    return lines


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def compare(path: Path) -> list[str]:
    """The GPU's sequence replayed, and beside the recorded CPU sequence of the same case where there is one."""
    from estimator.memory.allocator import replay

    gpu = _load(path)
    replayed = replay(requests(gpu)).reserved_peak
    lines = [f"{gpu['id']}: GPU reserved {gpu['reserved_peak_bytes']:,}, its sequence replayed {replayed:,}"
             f" ({replayed / gpu['reserved_peak_bytes'] - 1:+.2%})"]
    cpu_path = CPU_TRACES / f"{gpu['id']}.json.gz"
    if not cpu_path.exists():
        return lines + [f"no recorded CPU sequence ({cpu_path.relative_to(ROOT)})"]
    return lines + differences(gpu, _load(cpu_path)["events"])


def record(case_id: str, frames: bool = True) -> dict:
    """Build and two steps of the case on the GPU as measure.measure runs them, the history from before the build.
    Without `frames` the history keeps no stacks: torch 2.11's Python stack capture loses the exception
    non-reentrant checkpointing raises to stop a recomputation early (pytorch/pytorch#179536, as for ZeRO-3 in
    deepspeed_step.py): Falcon-7B's and Phi-3's dropout under recompute failed on the H200 ("returned NULL without
    setting an exception")."""
    import gc

    import torch

    from .cases import CASES
    from .measure import BUILDERS, nullphase, step_function, step_inputs

    case = CASES[case_id]
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # as measure.measure: the first block, before the history
    made = lambda: torch.cuda.memory_stats()["allocation.all.allocated"]  # noqa: E731  requests so far
    before = made()
    torch.cuda.memory._record_memory_history("all", context="all" if frames else None, stacks="python",
                                             max_entries=TRACE_ENTRIES)
    torch.manual_seed(0)
    model, opt = BUILDERS[case.harness](case.run, "cuda")
    if case.wrapper:
        from .wrappers import WRAPPERS

        model = WRAPPERS[case.wrapper](model)
    ids, inputs = step_inputs(case.harness, case.run, model, "cuda")
    step = step_function(case.harness, case.run, inputs)
    marks = {"built": made() - before}
    step(model, opt, ids, lambda name: nullphase())
    gc.collect()
    torch.cuda.synchronize()
    marks["step1"] = made() - before
    step1_reserved = torch.cuda.max_memory_reserved()
    step(model, opt, ids, lambda name: nullphase())
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    trace = snapshot["device_traces"][0]
    return {"id": case_id, "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
            "reserved_peak_step1_bytes": step1_reserved, "allocated_peak_bytes": torch.cuda.max_memory_allocated(),
            "marks": marks, "trace_entries": len(trace), "trace_full": len(trace) >= TRACE_ENTRIES,
            "segments": [[s["address"], s["total_size"], s["allocated_size"], s["active_size"], s["segment_type"]]
                         for s in snapshot["segments"]],
            "versions": {"torch": torch.__version__}} | compact(trace)


def run_cases(out: Path, case_ids: list[str], budget_s: float) -> int:
    """Each case in a process of its own while the budget allows; its summary line, or why it failed."""
    from .cases import CASES

    out.mkdir(parents=True, exist_ok=True)
    start, failed = time.perf_counter(), 0
    for case_id in case_ids:
        if time.perf_counter() - start > budget_s:
            print(f"{case_id}: not run (budget of {budget_s:.0f}s spent)", flush=True)
            failed += 1
            continue
        env = dict(os.environ)
        if CASES[case_id].allocator == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        for extra in ([], ["--no-frames"]):  # without stacks only when the case failed with them
            done = _run_one(out, case_id, extra, env)
            if done is not None and not done.returncode:
                print(done.stdout.strip().splitlines()[-1], f"({time.perf_counter() - start:.0f}s)", flush=True)
                break
            print(f"{case_id}{' ' + extra[0] if extra else ''}: " + (f"timed out after {CASE_TIMEOUT_S}s" if done is None
                  else f"exit {done.returncode}\n{done.stderr[-1500:]}"), flush=True)
        else:
            failed += 1
    return 1 if failed else 0


def _run_one(out: Path, case_id: str, extra: list[str], env: dict) -> subprocess.CompletedProcess | None:
    """One case in a process of its own; None when it outran CASE_TIMEOUT_S."""
    try:
        return subprocess.run([sys.executable, "-m", "validation.gpu.hf_history", "--out", str(out), "--one",
                               case_id, *extra], capture_output=True, text=True, env=env, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="python -m validation.gpu.hf_history", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, metavar="DIR", help="on the GPU: DIR/<case>.history.json.gz for each CASE")
    what.add_argument("--compare", type=Path, metavar="FILE", help="a history beside the recorded CPU sequence")
    what.add_argument("--summary", type=Path, metavar="FILE", help="a history replayed both address orders")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds after which no case is started (--out)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one case, in this process (run_cases)
    parser.add_argument("--no-frames", action="store_true", help=argparse.SUPPRESS)  # run_cases' second try
    parser.add_argument("cases", nargs="*", metavar="CASE")
    args = parser.parse_args(argv)
    if args.out is None and (args.cases or args.one):
        parser.error("cases are given with --out DIR only")
    if args.out is not None:
        from .cases import CASES
        from .measure import BUILDERS

        cases = args.cases or ([args.one] if args.one else [])
        if not cases:
            parser.error("--out DIR needs one case or more (python -m validation.gpu list)")
        for case_id in cases:
            if case_id not in CASES:
                parser.error(f"{case_id}: not a case (python -m validation.gpu list)")
            if CASES[case_id].harness not in BUILDERS:
                parser.error(f"{case_id}: harness {CASES[case_id].harness!r}, the history runs {', '.join(BUILDERS)}")
    for path in (args.compare, args.summary):
        if path is not None and not path.is_file():
            parser.error(f"{path}: no such file")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.compare:
        print("\n".join(compare(args.compare)))
        return 0
    if args.summary:
        history = _load(args.summary)
        print(json.dumps({"id": history["id"], **summary(history)}, indent=1))
        return 0
    if args.one:
        history = record(args.one, frames=not args.no_frames)
        with gzip.open(args.out / f"{args.one}.history.json.gz", "wt") as f:
            json.dump(history, f, separators=(",", ":"))
        print(json.dumps({"id": args.one, "events": len(history["events"]), **summary(history)}))
        return 0
    return run_cases(args.out, args.cases, args.budget)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
