"""validation/gpu/hf_history.py without a GPU: a caching-allocator history (torch.cuda.memory._snapshot()'s device
trace, built by hand here) kept compact, turned into the fake harness's (key, +/- bytes) events so that both replay
through estimator/memory/allocator.py alike, summarised, set beside a CPU sequence, and the command line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from validation.gpu.hf_history import ROOT, compact, differences, requests, summary  # noqa: E402

MiB = 1 << 20
SITE = "/venv/lib/python3.12/site-packages/"
FRAMES = [{"filename": SITE + "torch/utils/_contextlib.py", "line": 116, "name": "decorate_context"},
          {"filename": SITE + "transformers/models/starcoder2/modeling_starcoder2.py", "line": 80, "name": "forward"},
          {"filename": SITE + "torch/nn/modules/module.py", "line": 1775, "name": "_call_impl"},
          {"filename": f"{ROOT}/validation/hf/step.py", "line": 50, "name": "step"},
          {"filename": "/usr/lib/python3.12/threading.py", "line": 1, "name": "run"}]


def test_the_trace_kept_compact_with_the_innermost_frames_outside_torch_cuda():
    """Each entry as [action, address, size, stream, frames]; a request's and a segment's three innermost frames
    outside SKIPPED (torch's _contextlib here), interned, the file from site-packages or the repository; a free's
    frames are not kept."""
    trace = [{"action": "segment_alloc", "addr": 0, "size": 20 * MiB, "stream": 0, "frames": FRAMES},
             {"action": "alloc", "addr": 0, "size": 2 * MiB, "stream": 0, "frames": FRAMES},
             {"action": "alloc", "addr": 2 * MiB, "size": 4096, "stream": 7, "frames": FRAMES[3:]},
             {"action": "free_requested", "addr": 0, "size": 2 * MiB, "stream": 0, "frames": FRAMES},
             {"action": "free_completed", "addr": 0, "size": 2 * MiB, "stream": 0, "frames": FRAMES}]
    assert compact(trace) == {
        "events": [["segment_alloc", 0, 20 * MiB, 0, [0, 1, 2]], ["alloc", 0, 2 * MiB, 0, [0, 1, 2]],
                   ["alloc", 2 * MiB, 4096, 7, [2, 3]], ["free_requested", 0, 2 * MiB, 0, []],
                   ["free_completed", 0, 2 * MiB, 0, []]],
        "frames": ["transformers/models/starcoder2/modeling_starcoder2.py:80 forward",
                   "torch/nn/modules/module.py:1775 _call_impl", "validation/hf/step.py:50 step",
                   "/usr/lib/python3.12/threading.py:1 run"]}


def test_a_reused_address_is_a_new_block_and_only_completed_frees_count():
    """Two blocks at one address one after the other are two keys; a free counts when completed (free_requested
    alone returns nothing to the pool); the free of a block made before the history (address 9) is left out."""
    record = {"events": [
        ["segment_alloc", 0, 2048 * MiB, 0, []],
        ["alloc", 0, 1024 * MiB, 0, []],
        ["alloc", 1024 * MiB, 32 * MiB, 0, []],
        ["free_requested", 0, 1024 * MiB, 0, []],
        ["free_completed", 0, 1024 * MiB, 0, []],
        ["alloc", 0, 512 * MiB, 0, []],  # the address again: a new block
        ["free_completed", 0, 512 * MiB, 0, []],
        ["free_completed", 9, 512, 0, []],
    ]}
    assert requests(record) == [(0, 1024 * MiB), (1, 32 * MiB), (0, -1024 * MiB), (2, 512 * MiB), (2, -512 * MiB)]


def test_the_summary_replays_the_history_both_ways_and_lists_the_segments_made():
    """A 1 MiB request (the small pool: a 2 MiB segment), freed; a 3 MiB request (the large pool: a 20 MiB segment,
    CUDACachingAllocator.cpp kLargeBuffer) made below the first, on a second stream; a 1 GiB segment below that:
    both address orders reserve 2 + 20 + 1,024 MiB; two segments of three lie below the one before."""
    record = {"reserved_peak_bytes": 1046 * MiB, "events": [
        ["segment_alloc", 0x7F0000000000, 2 * MiB, 0, []],
        ["alloc", 0x7F0000000000, 1 * MiB, 0, []],
        ["free_completed", 0x7F0000000000, 1 * MiB, 0, []],
        ["segment_alloc", 0x7E0000000000, 20 * MiB, 5, []],
        ["alloc", 0x7E0000000000, 3 * MiB, 5, []],
        ["segment_alloc", 0x7D0000000000, 1024 * MiB, 0, []],
        ["alloc", 0x7D0000000000, 1024 * MiB, 0, []],
    ]}
    assert summary(record) == {"reserved_peak_bytes": 1046 * MiB, "replayed_ascending": 1046 * MiB,
                               "replayed_descending": 1046 * MiB, "segments_made": 3, "each_below_the_last": 2,
                               "large_segments_made_mib": [["0x7d0000000000", 1024]], "streams": [0, 5]}


def test_where_the_gpu_sequence_parts_from_the_cpu_one_with_the_frame_that_made_each_request():
    """GPU: +2 MiB, +4 KiB, +8 MiB, -2 MiB, -8 MiB; CPU: +2 MiB, +4 KiB, -2 MiB. Of 1 MiB and more the GPU's 8 MiB
    request (made at the StarCoder2 forward) and its free are the GPU's alone; the 4 KiB request is not set beside."""
    record = {"frames": ["transformers/models/starcoder2/modeling_starcoder2.py:80 forward", "torch/x.py:1 f"],
              "events": [["alloc", 0, 2 * MiB, 0, [1]], ["alloc", 2 * MiB, 4096, 0, [1]],
                         ["alloc", 4 * MiB, 8 * MiB, 0, [0, 1]], ["free_completed", 0, 2 * MiB, 0, []],
                         ["free_completed", 4 * MiB, 8 * MiB, 0, []]]}
    cpu = [[1, 2 * MiB], [2, 4096], [1, -2 * MiB]]
    assert differences(record, cpu) == [
        "requests and frees of 1 MiB or more: GPU 4, CPU 2; where they differ (difflib):",
        "  delete GPU[1:2] +8.00 transformers/models/starcoder2/modeling_starcoder2.py:80 forward  |  CPU[1:1] -",
        "  delete GPU[3:4] -8.00  |  CPU[2:2] -"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "validation.gpu.hf_history", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_the_summary_command_on_a_written_history(tmp_path):
    """`--summary FILE` here: the record as `--out` writes it (gzip), replayed both ways."""
    path = tmp_path / "x.history.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"id": "x", "reserved_peak_bytes": 20 * MiB, "frames": [],
                   "events": [["segment_alloc", 0, 20 * MiB, 0, []], ["alloc", 0, 3 * MiB, 0, []]]}, f)
    done = _cli("--summary", str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"id": "x", "reserved_peak_bytes": 20 * MiB, "replayed_ascending": 20 * MiB,
                                       "replayed_descending": 20 * MiB, "segments_made": 1,
                                       "each_below_the_last": 0, "large_segments_made_mib": [], "streams": [0]}


@pytest.mark.parametrize("args, message", [
    ((), "one of the arguments --out --compare --summary is required"),
    (("--out", "d"), "--out DIR needs one case or more (python -m validation.gpu list)"),
    (("--out", "d", "no-such-case"), "no-such-case: not a case (python -m validation.gpu list)"),
    (("--out", "d", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1"),
     "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1: harness 'deepspeed', the history runs hf, peft, bnb"),
    (("--summary", "missing.json.gz"), "missing.json.gz: no such file"),
    (("--compare", "a", "--summary", "b"), "argument --summary: not allowed with argument --compare"),
    (("--compare", "a", "some-case"), "cases are given with --out DIR only"),
])
def test_bad_arguments_are_one_line_on_stderr_and_exit_2(args, message):
    done = _cli(*args)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"python -m validation.gpu.hf_history: error: {message}\n")
