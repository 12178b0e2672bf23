"""Read the terms a vLLM start-up log prints into a record (tests/data/serving/published_vllm_logs.json).

The logs are public: a sweep of vLLM 0.19.0 on H100 80GB run with ``VLLM_LOGGING_LEVEL=DEBUG`` and
published in llm-d-planner (llm-d-incubation/llm-d-planner PR #205, the files at jgchn/llm-d-planner
commit d3121e05, accuracy/results/v0.19.0/logs/). At DEBUG vLLM 0.19's gpu_worker.py prints every term of
its accounting per rank: the CUDA total memory, the weights, the torch peak increase of the profiling
run, the non-torch increase, the available KV memory, the CUDA graphs' estimate and their actual pool, and
per rank the graph profiler's two samples of each mode (first capture, per further graph).

    python3 -m validation.vllm.published_logs LOG_DIR [LOG_DIR ...] > terms.json

prints, per log, the values as printed (GiB to two decimals, tokens, concurrency); the test data file
holds them with the flags and the URL of each log. Logs from issue threads were copied by hand.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

_PATTERNS = {
    "version": r"Initializing a V1 LLM engine \(v([\d.]+)\)",
    "total_gib": r"total_memory=([\d.]+)GiB",
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "kv_cache_gib": r"Available KV cache memory: ([-\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "cuda_graphs_estimated_gib": r"Estimated CUDA graph memory: ([\d.]+) GiB",
    "cuda_graphs_gib": r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB",
    "max_num_batched_tokens": r"Defaulting max_num_batched_tokens to (\d+)",
    "max_num_seqs": r"Defaulting max_num_seqs to (\d+)",
}
_PROFILE = re.compile(r"\((?:Worker_(?:TP|PP)(\d+)|EngineCore) pid=\d+\).*torch peak memory increase: ([\d.]+)GiB; "
                      r"non-torch forward increase memory: ([\d.]+)GiB; weights memory: ([\d.]+)GiB")
_ARGS = re.compile(r"non-default args: (\{.*\})")
# profile_cudagraph_memory's samples per mode (v1/worker/gpu_model_runner.py, 0.19.0): the largest size's capture
# and the second-largest's (mem_get_info before and after a warm-up and capture, in the driver's 2 MiB chunks)
_GRAPH_PROFILE = re.compile(r"\((?:Worker_(?:TP|PP)(\d+)|EngineCore) pid=\d+\).*Estimated (PIECEWISE|FULL) CUDA graph "
                            r"memory: ([\d.]+) MiB first-capture \+ \((\d+)-1\) × ([\d.]+) MiB per-graph")


def _number(text: str) -> float | int:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


def read_log(text: str) -> dict:
    """The first value of each pattern (rank 0 prints first), and every rank's profiling terms."""
    terms: dict = {}
    for key, pattern in _PATTERNS.items():
        found = re.search(pattern, text)
        if found:
            terms[key] = found.group(1) if key == "version" else _number(found.group(1))
    ranks = {}
    for match in _PROFILE.finditer(text):
        rank = int(match.group(1) or 0)
        ranks.setdefault(rank, {"activation_peak_gib": float(match.group(2)), "non_torch_gib": float(match.group(3)),
                                "weights_gib": float(match.group(4))})
    terms["ranks"] = [ranks[r] for r in sorted(ranks)]
    profiles: dict = {}
    for match in _GRAPH_PROFILE.finditer(text):
        rank = profiles.setdefault(int(match.group(1) or 0), {})
        rank.setdefault(match.group(2), {"first_capture_mib": float(match.group(3)), "captures": int(match.group(4)),
                                         "per_graph_mib": float(match.group(5))})
    if profiles:
        terms["cuda_graphs_profile"] = [profiles[r] for r in sorted(profiles)]
    args = _ARGS.search(text)
    if args:
        try:
            terms["args"] = {k: v for k, v in ast.literal_eval(args.group(1)).items() if k not in ("model_tag",)}
        except (ValueError, SyntaxError):
            terms["args"] = args.group(1)
    return terms


def main(argv: list[str]) -> None:
    out = {}
    for folder in argv:
        for path in sorted(Path(folder).glob("*.log")):
            if ".FAILED." not in path.name:
                out[path.name] = read_log(path.read_text(errors="replace"))
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
