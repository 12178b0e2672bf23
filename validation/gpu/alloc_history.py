"""The caching allocator's whole history of one HF or PEFT case on the GPU (model build, step 1, step 2), to set
beside the fake harness's recorded sequence (validation/allocator_trace.py) request by request.

A GPU record keeps the segments at the step's end, not the order of requests or the segments' addresses. The
recorded fake sequence of LoRA on Llama-3.2-1B with recompute and eager attention replays to that run's reserved
peak to the byte only with each new segment below the last (estimator/memory/allocator.py `descending`,
tests/test_segment_order.py); this history shows the GPU's own order of addresses (`summary`) and its requests,
replayed both ways. Each case runs in a process of its own, as validation/gpu/__main__.py runs them (a fresh
allocator):

    for c in CASE...; do python3 -m validation.gpu.alloc_history $c $OUT; done

writes $OUT/<case>.history.json.gz: the allocator's events (torch.cuda.memory._record_memory_history, Python
stacks: action, address, block size, stream, the innermost frames outside torch) and the segments at the end.
"""

from __future__ import annotations

import gc
import gzip
import json
import sys
from pathlib import Path

import torch

HISTORY_ENTRIES = 200_000  # a 16-layer recomputed LoRA step makes about 15,000 requests over two steps
SKIPPED = ("/torch/cuda/", "/torch/utils/_contextlib", "/torch/_tensor.py", "alloc_history.py")
FRAMES = 3  # the innermost frames kept per event, outside SKIPPED


def _where(frames: list[dict], names: dict) -> list[int]:
    """The innermost FRAMES frames outside SKIPPED, as indices into `names` (file:line:function, interned)."""
    out = []
    for f in frames:
        if any(s in f["filename"] for s in SKIPPED):
            continue
        text = f"{'/'.join(f['filename'].split('/')[-2:])}:{f['line']}:{f['name']}"
        out.append(names.setdefault(text, len(names)))
        if len(out) == FRAMES:
            break
    return out


def history(case_id: str) -> dict:
    from .cases import CASES
    from .measure import BUILDERS, segments, step_function, step_inputs

    case = CASES[case_id]
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # as measure.measure: the first block, before the history
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=HISTORY_ENTRIES)
    torch.manual_seed(0)
    model, opt = BUILDERS[case.harness](case.run, "cuda")
    ids, inputs = step_inputs(case.harness, case.run, model, "cuda")
    step = step_function(case.harness, case.run, inputs)
    from contextlib import nullcontext
    step(model, opt, ids, lambda name: nullcontext())
    gc.collect()
    step(model, opt, ids, lambda name: nullcontext())
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    names: dict[str, int] = {}
    events = [[e["action"], e["addr"], e["size"], e.get("stream", 0), _where(e.get("frames", []), names)]
              for e in snapshot["device_traces"][0]]
    return {"id": case_id, "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
            "allocated_peak_bytes": torch.cuda.max_memory_allocated(), "segments": segments(),
            "versions": {"torch": torch.__version__}, "events": events,
            "frames": [k for k, _ in sorted(names.items(), key=lambda kv: kv[1])]}


def requests(record: dict) -> list[tuple[int, int]]:
    """The history as (key, +/- bytes) events, the fake harness's form (validation/allocator_trace.py): one key per
    block made (an address reused is a new key), freed at `free_completed`."""
    out, live, keys = [], {}, iter(range(1 << 62))
    for action, addr, size, _stream, _where_ in record["events"]:
        if action == "alloc":
            live[addr] = next(keys)
            out.append((live[addr], size))
        elif action == "free_completed" and addr in live:
            out.append((live.pop(addr), -size))
    return out


def summary(record: dict) -> dict:
    """What the history says of the allocator model (estimator/memory/allocator.py): the GPU's own requests
    replayed with ascending and with descending segment addresses against its reserved peak, and the segments in
    the order cudaMalloc made them, with their addresses (does each new one lie below the last?)."""
    from estimator.memory.allocator import replay

    made = [(addr, size) for action, addr, size, _s, _w in record["events"] if action == "segment_alloc"]
    events = requests(record)
    return {"reserved_peak_bytes": record["reserved_peak_bytes"],
            "replayed_ascending": replay(events).reserved_peak,
            "replayed_descending": replay(events, descending=True).reserved_peak,
            "segments_made": len(made), "each_below_the_last": sum(b[0] < a[0] for a, b in zip(made, made[1:])),
            "large_segments_made_mib": [(hex(a), s >> 20) for a, s in made if s >= 1 << 30]}


def main(argv: list[str]) -> int:
    case_id, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    record = history(case_id)
    with gzip.open(out / f"{case_id}.history.json.gz", "wt") as f:
        json.dump(record, f, separators=(",", ":"))
    print(json.dumps({"id": case_id, "events": len(record["events"]), **summary(record)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
