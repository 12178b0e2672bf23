"""The sdpa-mask experiment (validation/gpu/sdpa_mask.py): its CPU stand-in through the same command line and
records step a session lent a GPU runs, that its call is transformers' own, and the estimator held to a GPU record
of it where one exists (tests/data/measured/gpu/experiments/sdpa-mask-<gpu>.json)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from estimator.memory.activations.sdpa_mask import (backward_kernel, backward_workspace,  # noqa: E402
                                                    cudnn_backward_workspace, cudnn_first, forward_accumulator,
                                                    sdpa_backend)
from estimator.memory.allocator import CachingAllocator  # noqa: E402
from validation.gpu import experiments  # noqa: E402
from validation.gpu.__main__ import main  # noqa: E402
from validation.gpu.sdpa_mask import (GPU_GROUPS, GROUPS, NO_CUDNN, Case, _mirror, bool_mask, call,  # noqa: E402
                                      inputs, prediction, sdpa_seen)

# the RNG state SDPA's fused kernels save beside their tensors, made even when dropout is 0: the device bytes of it,
# which the estimator's ledger leaves out. cuDNN: the philox seed and offset, two int64 scalars on the device
# (aten/src/ATen/native/cudnn/MHA.cpp run_cudnn_SDP_fprop), 16 B; FlashAttention-2: rng_state, two uint64 on the
# device, and an unused uint64 scalar there too (transformers/cuda/flash_attn/flash_api.cpp mha_fwd, "BC breaking
# change to flash seed/offset"), 24 B; the memory-efficient kernel: its seed and offset on the host outside graph
# capture (transformers/cuda/attention.cu _efficient_attention_forward, "Seed and Offset Device"), 0 B; math: none.
# All as autograd recorded them on the H200 (torch 2.11.0+cu130)
RNG_STATE = {"cudnn": 16, "flash": 24, "efficient": 0, "math": 0}


def test_the_gpu_grid():
    """Gemma 3 4B, 12B and 27B's attention shapes (heads, KV heads, head dim), each (seq, batch) as a sliding case
    and its unmasked control; Falcon-7B's 71 heads on one at s 2048 and 4096; five of the Gemma shapes again without
    cuDNN (the memory-efficient kernel at d 256 and 128, FlashAttention-2). The largest masked case, 12B at s 8192
    b 2: q 128 MiB, k and v repeated 128 MiB each, the bf16 bias 256 MiB."""
    cases = [c for g in GPU_GROUPS for c in GROUPS[g]]
    assert len(cases) == 30 and len({c.id for c in cases}) == 30
    assert {(c.model, c.heads, c.kv_heads, c.head_dim) for c in cases} == {
        ("gemma-3-4b", 8, 4, 256), ("gemma-3-12b", 16, 8, 256), ("gemma-3-27b", 32, 16, 128), ("falcon-7b", 71, 1, 64)}
    assert {c.window for c in cases if c.kind == "sliding"} == {1024}
    assert all(c.seq >= 2 * 1024 for c in cases)  # every sliding case past the window: transformers builds the mask
    without = [c for c in cases if c.backends == NO_CUDNN]
    assert len(without) == 10 and {c.id[:-len("-nocudnn")] for c in without} <= {c.id for c in GROUPS["gemma-3"]}
    big = max((c for c in cases if c.kind == "sliding"), key=lambda c: c.batch * c.seq ** 2 * c.heads)
    assert (big.model, big.seq, big.batch) == ("gemma-3-12b", 8192, 2)
    assert big.batch * big.seq * big.heads * big.head_dim * 2 == 128 * 2**20
    assert big.batch * big.seq ** 2 * 2 == 256 * 2**20


def test_without_cudnn_the_call_is_the_same():
    """backends_of(NO_CUDNN) restricts SDPA to flash, efficient and math (sdpa_kernel); on the CPU, which has no
    cuDNN, the sliding case's output is the default's, to the bit."""
    sliding = GROUPS["tiny"][0]
    outputs = []
    for case in (sliding, replace(sliding, backends=NO_CUDNN)):
        generator = torch.Generator().manual_seed(0)
        outputs.append(call(case, inputs(case, "cpu", generator), _mirror))
    assert torch.equal(*outputs)


def test_the_mask_is_transformers_sdpa_mask():
    """bool_mask is masking_utils.sdpa_mask's (transformers 5.23, no padding mask): the same values, shape and
    strides (a 1 x 1 x s x s comparison expanded to the batch), for the sliding and the causal mask."""
    masking = pytest.importorskip("transformers.masking_utils")
    for window, function in ((5, masking.sliding_window_causal_mask_function(5)), (None, masking.causal_mask_function)):
        theirs = masking.sdpa_mask(batch_size=3, q_length=12, kv_length=12, mask_function=function,
                                   allow_is_causal_skip=False)
        ours = bool_mask(12, 3, window, "cpu")
        assert theirs.dtype == ours.dtype == torch.bool
        assert theirs.shape == ours.shape == (3, 1, 12, 12) and theirs.stride() == ours.stride() == (0, 144, 12, 1)
        assert torch.equal(theirs, ours)
    assert bool_mask(12, 1, 5, "cpu")[0, 0, 11].tolist() == [False] * 7 + [True] * 5


@pytest.mark.parametrize("case", GROUPS["tiny"], ids=lambda c: c.id)
def test_the_mirror_calls_sdpa_as_transformers_does(case):
    """Where transformers' sdpa_attention_forward does not import, `_mirror` makes the same SDPA call (the heads of
    k and v, the mask, is_causal, enable_gqa) and returns the same output."""
    sdpa_attention = pytest.importorskip("transformers.integrations.sdpa_attention")
    seen, outputs = {}, {}
    for name, forward in (("transformers", sdpa_attention.sdpa_attention_forward), ("mirror", _mirror)):
        generator = torch.Generator().manual_seed(0)
        seen[name] = []
        with sdpa_seen(seen[name]):
            outputs[name] = call(case, inputs(case, "cpu", generator), forward)
    assert seen["transformers"] == seen["mirror"] and len(seen["mirror"]) == 1
    assert torch.equal(outputs["transformers"], outputs["mirror"])


def test_the_stand_in_memory_has_every_method_the_cuda_one_has():
    """The CPU run calls what the GPU run calls, and the torch.cuda functions CudaMemory uses exist in this torch (a
    CPU build defines them too): a misspelt name fails here rather than on the GPU."""
    from validation.gpu.sdpa_mask import CpuMemory, CudaMemory

    def public(cls):
        return {name for name in dir(cls) if not name.startswith("_")}

    assert public(CudaMemory) == public(CpuMemory)
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated",
                 "max_memory_reserved"):
        assert hasattr(torch.cuda, name), name
    for name in ("_record_memory_history", "_snapshot"):
        assert hasattr(torch.cuda.memory, name), name
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"):
        assert hasattr(torch.backends.cuda, name), name


def _lines(out) -> list[dict]:
    return [json.loads(t) for t in (out / "runs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cpu_record(tmp_path_factory):
    """`run --device cpu --case sdpa-mask` with the tiny group, then `records`' writer."""
    mp = pytest.MonkeyPatch()
    mp.setitem(experiments.EXPERIMENTS, "sdpa-mask", experiments.sdpa_mask_experiment(("tiny",)))
    try:
        out = tmp_path_factory.mktemp("sdpa") / "out"
        assert main(["run", "--out", str(out), "--budget", "300", "--device", "cpu", "--case", "sdpa-mask"]) == 0
        lines = _lines(out)
        paths = experiments.write_experiment_records(lines, out.parent / "records")
    finally:
        mp.undo()
    assert [p.name for p in paths] == ["sdpa-mask-cpu.json"]
    return lines, json.loads(paths[0].read_text())


def test_the_cpu_stand_in_runs_through_the_command_line(cpu_record):
    """One sub-run (the group), one line; the record made again from its runs is the same."""
    lines, record = cpu_record
    assert [line["experiment"] for line in lines] == ["sdpa-mask"] and lines[0]["run"] == {"group": "tiny"}
    measured = lines[0]["measured"]
    assert measured["stopped"] == "done" and measured["call"].startswith("transformers ")
    assert [row["case"] for row in measured["cases"]] == [c.id for c in GROUPS["tiny"]]
    assert record["id"] == "sdpa-mask-cpu" and record["command"].startswith(
        "python -m validation.gpu run --out DIR --case sdpa-mask")
    again = [{"experiment": record["experiment"], "versions": record["versions"], **run} for run in record["runs"]]
    assert experiments.experiment_record("sdpa-mask", again) == record
    row = measured["cases"][0]
    assert set(row["measured"]) >= {"allocated_before_bytes", "inputs_bytes", "forward_peak_bytes", "forward_end_bytes",
                                    "grad_output_bytes", "backward_peak_bytes", "backward_end_bytes", "sdpa_calls",
                                    "saved_bytes", "saved_new_bytes", "saved_tensors", "kernels", "seconds"}
    assert set(row["estimator"]) == {"core_entries", "core_bytes", "attention_output_bytes", "saved_bytes",
                                     "masked_extra_bytes", "sliding_share", "modelled"}


def test_what_reaches_sdpa_on_the_cpu(cpu_record):
    """The sliding case: k and v repeated to the 4 query heads, the b x 1 x s x s bool mask (expanded over the
    batch), no is_causal, no enable_gqa; the control: 2 grouped heads, is_causal, enable_gqa; Falcon's: one head
    against 5, a mask, neither flag."""
    rows = {row["kind"]: row["measured"] for row in cpu_record[0][0]["measured"]["cases"]}
    (sliding,), (causal,), (falcon,) = (rows[kind]["sdpa_calls"] for kind in ("sliding", "causal", "falcon"))
    assert (sliding["k_heads"], sliding["v_heads"], sliding["is_causal"], sliding["enable_gqa"]) == (4, 4, False, False)
    assert sliding["mask"] == {"shape": [2, 1, 64, 64], "dtype": "bool", "stride": [0, 4096, 64, 1]}
    assert (causal["k_heads"], causal["mask"], causal["is_causal"], causal["enable_gqa"]) == (2, None, True, True)
    assert (falcon["q_heads"], falcon["k_heads"], falcon["is_causal"], falcon["enable_gqa"]) == (5, 1, False, False)
    assert falcon["mask"]["dtype"] == "bool"


def test_the_cpu_kernel_saves_the_estimators_set(cpu_record):
    """torch's CPU flash kernel (the stand-in's backend) saves what the estimator charges a masked layer: q, k and v
    repeated to 4 heads, the output, the fp32 log-sum-exp and the bf16 bias (2 x 64^2 x 2 B = 16 KiB); the control
    q, the grouped k and v, the output and the log-sum-exp. Their difference is sdpa_mask.py's two entries."""
    rows = {row["kind"]: row for row in cpu_record[0][0]["measured"]["cases"]}
    for kind in ("sliding", "causal"):
        assert rows[kind]["measured"]["saved_bytes"] == rows[kind]["estimator"]["saved_bytes"]
    b, s, a, g, d = 2, 64, 4, 2, 16
    q, out, lse, bias = b * s * a * d * 2, b * s * a * d * 2, b * a * s * 4, b * s * s * 2
    assert rows["sliding"]["measured"]["saved_bytes"] == q + 2 * q + out + lse + bias == 83_968
    assert rows["causal"]["measured"]["saved_bytes"] == q + 2 * b * s * g * d * 2 + out + lse == 51_200
    extra = rows["sliding"]["measured"]["saved_bytes"] - rows["causal"]["measured"]["saved_bytes"]
    assert extra == rows["sliding"]["estimator"]["masked_extra_bytes"] == 2 * b * s * (a - g) * d * 2 + bias


def test_the_estimators_ledger_by_hand():
    """prediction() for Gemma 3 4B's sliding layer at s 2048 b 2 (a x d = 8 x 256 = 2,048): q 2 x 2048 x 2048 x 2 B
    = 16 MiB, the grouped k and v 8 MiB each, the fp32 log-sum-exp 2 x 8 x 2048 x 4 B, the output 16 MiB; the masked
    path's k and v 4 heads more each (16 MiB) and the bf16 bias (2 x 2048^2 x 2 B = 16 MiB)."""
    MiB = 2**20
    p = prediction(Case("gemma-3-4b", "sliding", 8, 4, 256, 2048, 2, 1024))
    assert p["masked_extra_bytes"] == 32 * MiB and p["attention_output_bytes"] == 16 * MiB
    assert p["saved_bytes"] == (16 + 2 * 8) * MiB + 2 * 8 * 2048 * 4 + 16 * MiB + 32 * MiB
    control = prediction(Case("gemma-3-4b", "causal", 8, 4, 256, 2048, 2))
    assert p["saved_bytes"] - control["saved_bytes"] == 32 * MiB and control["masked_extra_bytes"] == 0


def test_the_efficient_kernels_buffers_by_hand():
    """cutlassB.h's bf16 sm80 dispatch and kernel_backward.h's workspace, by hand.
    Gemma 3 4B, s 2048, b 1, d 256: the 128 x 64 k65536 kernel (kMaxK > kBlockSizeI: dK and dV staged in fp32), key
    splits min(2048 / 64, 200 // 8) = 25; per head gK = gV = 25 x 64 x 256 floats, gQ = 16 query blocks x 4 column
    blocks x (4 + 128 x 64) floats; x 8 heads x 4 B. Gemma 3 27B, s 4096, d 128: the 128 x 128 k128 seq-aligned
    kernel keeps dK and dV in registers (no staging, no cap: 32 splits), gQ = 32 x 1 x (4 + 128 x 128) floats a head.
    The forward's fp32 accumulator only above d 128 (the 'gmem' kernel): b x s x heads x d x 4."""
    k4 = backward_kernel(2048, 256)
    assert k4.name == "fmha_cutlassB_bf16_aligned_128x64_k65536_sm80" and not k4.output_in_registers
    per_head = 2 * 25 * 64 * 256 + 16 * 4 * (4 + 128 * 64)
    assert backward_workspace(k4, 1, 8, 2048, 256) == 8 * per_head * 4 == 42_999_808
    assert backward_workspace(k4, 2, 16, 8192, 256) == 32 * (2 * 6 * 64 * 256 + 64 * 4 * 8196) * 4  # 200 // 32 = 6
    k27 = backward_kernel(4096, 128)
    assert k27.name == "fmha_cutlassB_bf16_aligned_128x128_k128_seqaligned_sm80" and k27.output_in_registers
    assert backward_workspace(k27, 1, 32, 4096, 128) == 32 * 32 * (4 + 128 * 128) * 4 == 67_125_248
    assert backward_kernel(4000, 128).name == "fmha_cutlassB_bf16_aligned_128x128_k128_sm80"  # 4000 % 128 != 0
    assert backward_kernel(2048, 64).name == "fmha_cutlassB_bf16_aligned_64x64_k64_seqaligned_sm80"
    # 256 heads x batches already fill the device and the keys are two blocks: one split
    assert backward_workspace(k27, 1, 256, 256, 128) == 256 * 2 * (4 + 128 * 128) * 4
    assert forward_accumulator(2, 16, 8192, 256) == 2 * 8192 * 16 * 256 * 4
    assert forward_accumulator(1, 32, 4096, 128) == 0


# --- the GPU record: what torch 2.11 on the H200 ran ----------------------------------------------------------------

GPU_RECORDS = sorted(p for p in experiments.EXPERIMENT_RECORDS.glob("sdpa-mask-*.json") if p.stem != "sdpa-mask-cpu")
# cuDNN's generated Hopper kernels: fprop and bprop, the tile, the head dim
CUDNN_KERNEL = re.compile(r"cudnn_generated_fort_native_sdpa_sm90_flash_(fprop|bprop)_wgmma_f16_knob_\d+_(\d+)x(\d+)x(\d+)_")
GQA_REDUCE = "cudnn::fusion::fmha_reduce_head"  # the full-head dK, dV summed over each group
CUTLASS_BACKWARD = re.compile(r"fmha_cutlassB_bf16_aligned_\d+x\d+_k\d+(_seqaligned)?_sm80")
GRAD_FNS = {"cudnn": "ScaledDotProductCudnnAttentionBackward0", "efficient": "ScaledDotProductEfficientAttentionBackward0",
            "flash": "ScaledDotProductFlashAttentionBackward0", "math": "ToCopyBackward0"}


def _record(path) -> dict:
    return json.loads(path.read_text())


def _cases(path) -> dict[str, dict]:
    return {row["case"]: row for run in _record(path)["runs"] for row in run["measured"]["cases"]}


def _case(row: dict) -> Case:
    return Case(**{k: row[k] for k in ("model", "kind", "heads", "kv_heads", "head_dim", "seq", "batch", "window")},
                backends=row.get("backends"))


def _backend(path, row: dict) -> str:
    """The backend sdpa_backend() names for a row's call on the record's stack (cuDNN disabled for NO_CUDNN)."""
    (seen,) = row["measured"]["sdpa_calls"]
    return sdpa_backend(*_stack(path), masked=seen["mask"] is not None, head_dim=row["head_dim"],
                        q_heads=seen["q_heads"], kv_heads=seen["k_heads"], enable_gqa=seen["enable_gqa"],
                        cudnn=row.get("backends") != NO_CUDNN)


def _rows(path, backend: str, kind: str | None = None) -> list[dict]:
    """The record's rows that ran `backend` (and are of `kind`); a skip where it has none (a record without the
    no-cuDNN group, as the H200's first run was: `python3 -m validation.gpu run --out $OUT --budget 150 --case
    sdpa-mask` makes all three)."""
    rows = [row for row in _cases(path).values() if _backend(path, row) == backend and kind in (None, row["kind"])]
    if not rows:
        pytest.skip(f"{path.stem} has no {kind or ''} case on {backend} yet")
    return rows


def _stack(path) -> tuple[str, tuple[int, int], int]:
    """(torch major.minor, compute capability, runtime cuDNN) of the record's device."""
    v = _record(path)["versions"]
    major, minor = v["capability"].split(".")
    return ".".join(v["torch"].split(".")[:2]), (int(major), int(minor)), v["cudnn"]


def test_the_dispatch_by_hand():
    """sdp_utils.cpp's order and constraints (estimator/memory/activations/sdpa_mask.py DISPATCH_SOURCE). torch 2.11
    on an H200 (sm90) with the cu130 wheel's cuDNN 9.19: cuDNN first; it takes the masked call (a mask is an additive
    bias to it) and the grouped one with enable_gqa, head dim 256 from cuDNN 9.5.1; Falcon's 71 heads on one without
    enable_gqa suit no fused kernel: math. With a cuDNN up to 9.15.0 (the CUDA 12 wheels), on an A100, or torch 2.8:
    the default order, so flash for the unmasked call and the memory-efficient kernel for the masked one; torch 2.9
    put cuDNN first on sm90 and sm100 whatever the cuDNN. On sm100 a head dim of 256 has no cuDNN backward."""
    def run(torch_version, capability, cudnn_version, **call):
        return sdpa_backend(torch_version, capability, cudnn_version, **call)

    masked = dict(masked=True, head_dim=256, q_heads=8, kv_heads=8, enable_gqa=False)
    grouped = dict(masked=False, head_dim=256, q_heads=8, kv_heads=4, enable_gqa=True)
    falcon = dict(masked=True, head_dim=64, q_heads=71, kv_heads=1, enable_gqa=False)
    assert [run("2.11", (9, 0), 91900, **c) for c in (masked, grouped, falcon)] == ["cudnn", "cudnn", "math"]
    assert [run("2.11", (9, 0), 91500, **c) for c in (masked, grouped)] == ["efficient", "flash"]
    assert [run("2.11", (8, 0), 91900, **c) for c in (masked, grouped)] == ["efficient", "flash"]
    assert [run("2.8", (9, 0), 91900, **c) for c in (masked, grouped)] == ["efficient", "flash"]
    assert [run("2.9", (9, 0), 91002, **c) for c in (masked, grouped)] == ["cudnn", "cudnn"]
    assert run("2.11", (9, 0), 90500, **masked) == "efficient"  # d 256 needs cuDNN 9.5.1
    assert run("2.11", (10, 0), 91900, **masked) == "efficient"  # sm100: d <= 128 with a backward
    assert run("2.11", (10, 0), 91900, **dict(masked, head_dim=128)) == "cudnn"
    assert run("2.11", (9, 0), 91900, **dict(grouped, enable_gqa=False)) == "math"  # unequal heads, no enable_gqa
    # cuDNN disabled (the experiment's no-cuDNN group): the default order's kernels on the H200
    assert [run("2.11", (9, 0), 91900, cudnn=False, **c) for c in (masked, grouped)] == ["efficient", "flash"]
    assert cudnn_first("2.11", (10, 3), 91900) and not cudnn_first("2.9", (10, 3), 91900)
    assert not cudnn_first("2.11", (8, 9), 91900) and not cudnn_first("2.11", (12, 0), 91900)


def test_cudnns_backward_workspace_by_hand():
    """The fp32 dQ accumulator and softmax sum, the 16-bit full-head dK and dV where the KV heads are grouped, and the
    engine's 256 B. Gemma 3 4B at s 2048, b 1 (8 x 256 per token): 8 x 2048 x 256 x 4 = 16 MiB, 8 x 2048 x 4 =
    64 KiB, grouped 2 x 8 x 2048 x 256 x 2 = 16 MiB more: 33,620,224 B with enable_gqa, 16,843,008 B with k and v
    repeated. It is the harness's FlashAttention-2 emulation's dq_accum, softmax_d and expanded dK, dV plus 256 B
    where s is a multiple of 128 and d of 32."""
    MiB = 2**20
    assert cudnn_backward_workspace(1, 8, 4, 2048, 256) == 32 * MiB + 64 * 1024 + 256 == 33_620_224
    assert cudnn_backward_workspace(1, 8, 8, 2048, 256) == 16 * MiB + 64 * 1024 + 256 == 16_843_008
    assert cudnn_backward_workspace(1, 32, 16, 4096, 128) == 128 * MiB + 512 * 1024 + 256
    control = Case("gemma-3-27b", "causal", 32, 16, 128, 4096, 1)
    assert sum(flash_backward_requests(control)[3:]) + 256 == cudnn_backward_workspace(1, 32, 16, 4096, 128)


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_gpu_ran_what_torch_dispatches(path):
    """Each call's grad_fn is the backend sdpa_backend() names for the record's stack (torch 2.11, sm90, cuDNN 9.19:
    cuDNN for the sliding calls, k and v at every query head with a bool mask, and for their controls, grouped heads
    with enable_gqa; math for Falcon's, the backward of its fp32 upcast; without cuDNN the memory-efficient kernel
    for the masked calls and flash for the controls); the profiler saw cuDNN's generated Hopper fprop and bprop
    kernels at the case's head dim, and the group reduction of the full-head dK, dV only where the heads are
    grouped; the memory-efficient backward is the CUTLASS variant cutlassB.h's dispatch gives."""
    for row in _cases(path).values():
        m = row["measured"]
        assert "error" not in m, (row["case"], m.get("error"))
        (seen,) = m["sdpa_calls"]
        backend = _backend(path, row)
        assert seen["grad_fn"] == GRAD_FNS[backend], row["case"]
        if row["kind"] == "sliding":
            assert (seen["k_heads"], seen["enable_gqa"], seen["mask"]["dtype"]) == (row["heads"], False, "bool")
        elif row["kind"] == "causal":
            assert (seen["k_heads"], seen["enable_gqa"], seen["is_causal"]) == (row["kv_heads"], True, True)
        if backend == "cudnn":
            found = {(m_.group(1), int(m_.group(4))) for n in m["kernels"] for m_ in [CUDNN_KERNEL.search(n)] if m_}
            assert found == {("fprop", row["head_dim"]), ("bprop", row["head_dim"])}, row["case"]
            assert any(GQA_REDUCE in n for n in m["kernels"]) == (seen["k_heads"] != seen["q_heads"]), row["case"]
        elif backend == "efficient":  # the first of cutlassB.h's dispatch order for the head dim and sequence
            found = {m_.group(0) for n in m["kernels"] for m_ in [CUTLASS_BACKWARD.search(n)] if m_}
            assert found == {backward_kernel(row["seq"], row["head_dim"]).name}, row["case"]
            # the forward: the 32 x 128 'gmem' kernel (an fp32 output accumulator) above d 128, a register one below
            (forward,) = [n for n in m["kernels"] if n.startswith("fmha_cutlassF_bf16_aligned_")]
            gmem = forward_accumulator(row["batch"], row["heads"], row["seq"], row["head_dim"]) > 0
            assert ("_32x128_gmem_sm80" in forward) == gmem and ("_rf_sm80" in forward) != gmem, row["case"]


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_estimator_charges_what_the_gpu_saved(path):
    """Every modelled case: what autograd saved on the device (each storage once, the inputs included) is the
    estimator's core entries and attention output for that layer, but the kernel's RNG state on the device (RNG_STATE:
    cuDNN's 16 B, FlashAttention-2's 24 B; the memory-efficient kernel keeps its seed and offset on the host); a
    sliding case's excess over its control is sdpa_mask.py's two entries (k, v repeated and the bf16 bias), to the
    byte, but the two kernels' RNG state: nothing under cuDNN, where both calls keep 16 B; without cuDNN 24 B less
    (the masked efficient call none, its flash control 24 B: 16,777,192 B for 4B at s 2048 b 1, not 16,777,216). The
    efficient kernel's log-sum-exp is padded to 32 queries (kAlignLSE), no byte at these sequences."""
    rows = _cases(path)
    for row in rows.values():
        if row["kind"] == "falcon":
            continue
        predicted, backend = prediction(_case(row)), _backend(path, row)
        assert row["measured"]["saved_bytes"] - predicted["saved_bytes"] == RNG_STATE[backend], row["case"]
        if row["kind"] == "sliding":
            control = rows[row["case"].replace("-sliding-", "-causal-")]
            rng = RNG_STATE[backend] - RNG_STATE[_backend(path, control)]
            assert row["measured"]["saved_bytes"] - control["measured"]["saved_bytes"] == (
                predicted["masked_extra_bytes"] + rng), row["case"]


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_rng_state_each_kernel_saved(path):
    """The saved tensors beyond the ledger, as autograd recorded them: cuDNN two int64 scalars on the device,
    FlashAttention-2 a two-element uint64 rng_state and a uint64 scalar on the device, the memory-efficient kernel
    two int64 scalars on the host (RNG_STATE's sources)."""
    expected = {"cudnn": [([], "int64", "cuda")] * 2, "flash": [([2], "uint64", "cuda"), ([], "uint64", "cuda")],
                "efficient": [([], "int64", "cpu")] * 2}
    for row in _cases(path).values():
        backend = _backend(path, row)
        if backend == "math":
            continue
        small = [(t["shape"], t["dtype"], t["device"]) for t in row["measured"]["saved_tensors"]
                 if t["dtype"] in ("int64", "uint64")]
        assert small == expected[backend], row["case"]
        assert sum(t["storage_bytes"] for t in row["measured"]["saved_tensors"]
                   if t["dtype"] in ("int64", "uint64") and t["device"] == "cuda") == RNG_STATE[backend], row["case"]


def replayed_peaks(allocations: dict, backward: list | None = None) -> tuple[int, int]:
    """(forward, backward) allocated peaks of a case's requests replayed through estimator/memory/allocator.py from
    an empty allocator, as the experiment reads them: each over what was allocated when its phase began (the peak
    reset there). `backward`: requests (bytes) to replay instead of the recorded backward, none freed."""
    allocator, live = CachingAllocator(), {}

    def run(events):
        for size, addr in events:
            if size > 0:
                live[addr] = allocator.malloc(size)
            elif addr in live:
                allocator.free(live.pop(addr))

    run(allocations["inputs"])
    base = allocator.allocated_peak = allocator.allocated
    run(allocations["forward"])
    forward = allocator.allocated_peak - base
    run(allocations["grad_output"])
    before = allocator.allocated_peak = allocator.allocated
    run(allocations["backward"] if backward is None else [(size, ("new", i)) for i, size in enumerate(backward)])
    return forward, allocator.allocated_peak - before


def test_the_replay_of_a_trace_by_hand():
    """Two 3 MiB inputs (a 20 MiB segment, split); a forward of 16 MiB kept (its own segment) and 1 MiB freed; a
    backward of 24 MiB: the phases' peaks over their starts are 17 MiB and 24 MiB. Requests are rounded to 512 B."""
    MiB = 2**20
    trace = {"inputs": [[3 * MiB, 1], [3 * MiB, 2]], "forward": [[16 * MiB, 3], [MiB, 4], [-MiB, 4]],
             "grad_output": [[100, 5]], "backward": [[24 * MiB, 6], [-24 * MiB, 6]]}
    assert replayed_peaks(trace) == (17 * MiB, 24 * MiB)
    assert replayed_peaks(trace, backward=[8 * MiB, 8 * MiB - 1]) == (17 * MiB, 16 * MiB)


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_allocator_replay_is_the_measured_peaks(path):
    """Each Gemma case's recorded requests, replayed through estimator/memory/allocator.py (the caching allocator's
    rounding, segments and splits) from an empty allocator, give max_memory_allocated's forward and backward peaks
    to the byte: the trace holds every request, and the allocator model is the device's. cuDNN's calls run no cuBLAS,
    so nothing is cached before a case. Falcon's math path does (its matmuls: the two 32 MiB cuBLAS workspaces are
    allocated before its inputs), and its q (71 x 2048 x 64 x 2 = 18,612,224 B, above 10 MiB) came from a block
    cached before the trace, split to the request: allocated before the call is the workspaces and the inputs'
    requests exactly, where a new 18 MiB segment (a 2 MiB multiple) keeps the 262,144 B rest unsplit (not above
    1 MiB), so a replay from empty is not the device's state there."""
    MiB = 2**20
    for row in _cases(path).values():
        m = row["measured"]
        inputs = sum(size for size, _ in m["allocations"]["inputs"])  # the frees of the mask's temporaries included
        if row["kind"] == "falcon":
            assert m["allocated_before_bytes"] == 2 * 32 * MiB + inputs, row["case"]
            continue
        assert m["allocated_before_bytes"] == inputs, row["case"]
        assert replayed_peaks(m["allocations"]) == (m["forward_peak_bytes"], m["backward_peak_bytes"]), row["case"]
    falcon_q = 71 * 2048 * 64 * 2
    allocator = CachingAllocator()
    allocator.malloc(falcon_q)
    assert allocator.allocated == 18 * MiB == falcon_q + 262_144


def cudnn_requests(case: Case) -> dict[str, list[int]]:
    """What a Gemma case requests through cuDNN, by the sources (sdpa_mask.py CUDNN_SOURCE). The forward: for a
    sliding case repeat_kv's k and v at every head and the bf16 bias (b x 1 x s x s, after at::where's two 2-byte
    scalars), then the philox seed and offset (8 B each, on the device), the output, the fp32 statistics (b x heads x
    s) and the engine's 256 B workspace; the backward: dQ, dK, dV (at the heads SDPA was given) and the one
    workspace."""
    b, a, s, d = case.batch, case.heads, case.seq, case.head_dim
    kv = a if case.kind == "sliding" else case.kv_heads
    q = b * s * a * d * 2
    mask = [q, q, 2, 2, b * s * s * 2] if case.kind == "sliding" else []
    return {"forward": mask + [8, 8, q, b * a * s * 4, 256],
            "backward": [q, q * kv // a, q * kv // a, cudnn_backward_workspace(b, a, kv, s, d)]}


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_cudnns_requests_are_their_sources(path):
    """Every Gemma case's forward requests, in order and to the byte, are cudnn_requests'; its backward's first four
    are dQ, dK, dV and the workspace cudnn_backward_workspace() gives, and the backward's peak is that moment: the
    state before the backward plus those four, replayed through the allocator model, is the measured peak."""
    for row in _rows(path, "cudnn"):
        case, m = _case(row), row["measured"]
        expected = cudnn_requests(case)
        assert [size for size, _ in m["allocations"]["forward"] if size > 0] == expected["forward"], row["case"]
        backward = [size for size, _ in m["allocations"]["backward"] if size > 0]
        assert backward[:4] == expected["backward"], (row["case"], backward[:6])
        assert replayed_peaks(m["allocations"], expected["backward"])[1] == m["backward_peak_bytes"], row["case"]


def flash_backward_requests(case: Case) -> list[int]:
    """The unmasked call's FlashAttention-2 backward as the harness emulates it (validation/core/emulation.py
    FlashAttention.backward, mha_bwd in allocation order): dQ, dK, dV, softmax_d, the fp32 dq_accum, and for grouped
    heads dK and dV at every query head."""
    b, a, g, s, d = case.batch, case.heads, case.kv_heads, case.seq, case.head_dim
    s128 = -(-s // 128) * 128
    d_rounded = -(-d // 32) * 32 if d <= 192 else 256
    out = [b * s * a * d * 2, b * s * g * d * 2, b * s * g * d * 2, b * a * s128 * 4, b * s128 * a * d_rounded * 4]
    return out + ([b * s * a * d * 2] * 2 if g != a else [])


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_harness_flash_emulation_is_cudnns_backward(path):
    """The unmasked control ran cuDNN, not the FlashAttention-2 the fake-tensor harness emulates for every flash
    record; the emulation's backward requests the same bytes but cuDNN's engine's 256 B, in five pieces where cuDNN
    asks one. Replayed in its place, the backward's peak is the measured one less the workspace block's excess over
    the pieces: 512 B (the 256 B, rounded to a block), and where the workspace's 2 MiB-rounded segment leaves a rest
    of at most 1 MiB, that rest, which the allocator does not split off (12B at s 8192, b 2: 537,920,000 B in a
    514 MiB segment, 1,048,064 B left)."""
    for row in _rows(path, "cudnn", "causal"):
        m, emulated = row["measured"], flash_backward_requests(_case(row))
        workspace = cudnn_requests(_case(row))["backward"][3]
        assert sum(emulated[3:]) + 256 == workspace, row["case"]
        alone = CachingAllocator()
        alone.malloc(workspace)
        excess = alone.allocated - sum(emulated[3:])
        assert excess == (512 + 1_048_064 if row["case"] == "gemma-3-12b-causal-s8192-b2" else 512), row["case"]
        assert replayed_peaks(m["allocations"], emulated)[1] == m["backward_peak_bytes"] - excess, row["case"]


def efficient_requests(case: Case) -> dict[str, list[int]]:
    """What a sliding case requests through the memory-efficient kernel, by its sources (sdpa_mask.py
    KERNEL_SOURCE): in the forward repeat_kv's k and v, the bf16 bias (after at::where's two 2-byte scalars), then
    _efficient_attention_forward's output, fp32 log-sum-exp (queries padded to 32, kAlignLSE) and, above a head dim
    of 128, the fp32 output accumulator (its seed and offset on the host: no request); in the backward dQ, dK, dV at
    every head, the fp32 delta (b x heads x s) and the workspace of the CUTLASS variant cutlassB.h's dispatch gives."""
    b, a, s, d = case.batch, case.heads, case.seq, case.head_dim
    q = b * s * a * d * 2
    accumulator = [forward_accumulator(b, a, s, d)] if d > 128 else []
    return {"forward": [q, q, 2, 2, b * s * s * 2, q, b * a * -(-s // 32) * 32 * 4] + accumulator,
            "backward": [q, q, q, b * a * s * 4, backward_workspace(backward_kernel(s, d), b, a, s, d)]}


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_efficient_kernels_requests_are_their_sources(path):
    """Without cuDNN a sliding case's forward requests k and v repeated, the bias, the output, the log-sum-exp and
    (d > 128) the fp32 accumulator, nothing else; its backward dQ, dK, dV, delta and backward_workspace(), in that
    order and to the byte (42,999,808 B for 4B at s 2048 b 1, 67,125,248 B for 27B at s 4096 b 1); the backward's peak
    is that moment (the state before it plus those five, replayed, is the measured peak)."""
    for row in _rows(path, "efficient", "sliding"):
        m, expected = row["measured"], efficient_requests(_case(row))
        forward = [size for size, _ in m["allocations"]["forward"] if size > 0]
        assert forward == expected["forward"], (row["case"], forward)
        backward = [size for size, _ in m["allocations"]["backward"] if size > 0]
        assert backward[:5] == expected["backward"], (row["case"], backward[:8])
        assert replayed_peaks(m["allocations"], expected["backward"])[1] == m["backward_peak_bytes"], row["case"]


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_flash_control_is_the_harness_emulation(path):
    """Without cuDNN the unmasked control runs SDPA's FlashAttention-2 with enable_gqa, which the fake-tensor harness
    emulates for every flash record: its forward requests mha_fwd's output, fp32 log-sum-exp (b x heads x s,
    unpadded), rng_state (16 B) and the unused 8 B scalar, nothing else; its backward what validation/core/
    emulation.py allocates, and its peak is that moment."""
    for row in _rows(path, "flash", "causal"):
        m, expected = row["measured"], flash_backward_requests(_case(row))
        b, a, s, d = row["batch"], row["heads"], row["seq"], row["head_dim"]
        forward = [size for size, _ in m["allocations"]["forward"] if size > 0]
        assert forward == [b * s * a * d * 2, b * a * s * 4, 16, 8], (row["case"], forward)
        backward = [size for size, _ in m["allocations"]["backward"] if size > 0]
        assert backward[:len(expected)] == expected, (row["case"], backward[:10])
        assert replayed_peaks(m["allocations"], expected)[1] == m["backward_peak_bytes"], row["case"]


def math_saved_bytes(case: Case) -> int:
    """What torch 2.11's math SDPA keeps (attention.cpp _scaled_dot_product_attention_math with 16-bit inputs and
    allowFP16BF16ReductionMathSDP off: q, k, v upcast to fp32, q scaled, then the fp32 softmax of the scores, kept by
    the matmul with v): fp32 q at every head, k and v at theirs, and the b x heads x s^2 fp32 softmax."""
    b, a, g, s, d = case.batch, case.heads, case.kv_heads, case.seq, case.head_dim
    return b * s * a * d * 4 + 2 * b * s * g * d * 4 + b * a * s * s * 4


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_falcon_on_sdpa_keeps_the_math_backends_fp32_set(path):
    """Falcon-7B's SDPA call (71 heads on 1, a mask, no enable_gqa) ran the math backend: what it saved is
    math_saved_bytes to the byte, 1,229,455,360 B at s 2048 (the softmax 1,191,182,336 of it) and 4,841,275,392 B at
    s 4096, 32x and 63x the flash set the estimator charges."""
    rows = [row for row in _cases(path).values() if row["kind"] == "falcon"]
    assert [row["seq"] for row in rows] == [2048, 4096]
    assert [row["measured"]["saved_bytes"] for row in rows] == [math_saved_bytes(_case(r)) for r in rows] == [
        1_229_455_360, 4_841_275_392]


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_falcon_on_sdpa(path):
    """The estimator's core entries for Falcon-7B's layer on SDPA (estimator/memory/activations/sdpa_math.py) are
    what the math backend saved on the H200, to the byte, at s 2048 and 4096: 1,229,455,360 and 4,841,275,392 B
    (the flash set it charged before: 38,330,368 and 76,660,736 B). SDPA's output is a cast that keeps nothing."""
    rows = [row for row in _cases(path).values() if row["kind"] == "falcon"]
    assert [row["seq"] for row in rows] == [2048, 4096]
    for row in rows:
        predicted = prediction(_case(row))
        assert predicted["attention_output_bytes"] == 0
        assert row["measured"]["saved_bytes"] == predicted["saved_bytes"] == math_saved_bytes(_case(row)), row["case"]


def test_falcon_7b_on_sdpa_by_hand():
    """Falcon-7B (71 heads of 64 on one key/value head, hidden 4544) at s 2048, b 1 under hf with attention "flash"
    (transformers' SDPA): a layer keeps the math backend's fp32 q scaled, 2,048 x 4,544 x 4 = 37,224,448 B; k scaled
    and v, one head each, 2 x 2,048 x 64 x 4 = 1,048,576 B; the fp32 softmax 71 x 2,048^2 x 4 = 1,191,182,336 B; no
    flash log-sum-exp, no kernel-kept output. The forward's moment adds beside the kept set the scores (one more
    softmax's bytes), _safe_softmax's bool mask (71 x 2,048^2 = 297,795,584 B) and row mask (71 x 2,048 = 145,408
    B), SDPA's bf16 bias (2,048^2 x 2 = 8,388,608 B) and the fp32 upcasts of q and k not kept (37,224,448 + 524,288
    B): 1,535,260,672 B, the H200's forward requests (sdpa-mask-h200.json) less the kept set and the 4-byte scalars.
    Under flash_attention_2 (the flag off) the flash set is kept: 19,136,512 + 2,048 x 71 x 4 = 19,718,144 B.
    At b 2 k and v are kept at every query head."""
    from estimator.memory.activations.attention import attention_entries
    from estimator.memory.activations.sdpa_math import falcon_math_forward_extra
    from estimator.models.hf_config import architecture_from_hf_config
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    s, b = 2048, 1
    arch, _ = architecture_from_hf_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                                           "num_hidden_layers": 32, "vocab_size": 65024})
    assert arch.sdpa_mask_always and arch.num_kv_heads == 1 and arch.head_dim == 64
    training = Training(framework="hf", attention="flash", seq_len=s, micro_batch_size=b, param_dtype="bf16")
    par = Parallel()
    kept = {e.name: e.bytes(par) for e in attention_entries(arch, training, par)}
    assert kept["q scaled (fp32, SDPA math backend)"] == s * 4544 * 4 == 37_224_448
    assert kept["k scaled and v (fp32, SDPA math backend)"] == 2 * s * 64 * 4 == 1_048_576
    assert kept["softmax output (fp32, SDPA math backend)"] == 71 * s * s * 4 == 1_191_182_336
    core = sum(kept[n] for n in ("q scaled (fp32, SDPA math backend)", "k scaled and v (fp32, SDPA math backend)",
                                 "softmax output (fp32, SDPA math backend)"))
    assert core == 1_229_455_360
    assert not any("flash" in n for n in kept)
    extra, _ = falcon_math_forward_extra(arch, training, par)
    forward = 1.25 * 71 * s * s * 4 + extra
    assert forward == 1_191_182_336 + 297_795_584 + 145_408 + 8_388_608 + 37_224_448 + 524_288 == 1_535_260_672
    record = json.loads((experiments.EXPERIMENT_RECORDS / "sdpa-mask-h200.json").read_text())
    (row,) = [r for run in record["runs"] for r in run["measured"]["cases"] if r["case"] == "falcon-7b-falcon-s2048-b1"]
    requested = sum(size for size, _ in row["measured"]["allocations"]["forward"][:15] if size > 4)
    assert requested - core == forward
    fa2 = {e.name: e.bytes(par) for e in attention_entries(replace(arch, sdpa_mask_always=False), training, par)}
    assert fa2["q, k, v kept by flash attention"] + fa2["flash log-sum-exp (fp32)"] == 19_718_144
    # the run's own choice, training.attn_implementation flash_attention_2 (transformers' FalconFlashAttention2):
    # the same flash set, the model's mask never reaching SDPA
    run_fa2 = replace(training, attn_implementation="flash_attention_2")
    assert {e.name: e.bytes(par) for e in attention_entries(arch, run_fa2, par)} == fa2
    # at two sequences a batch matmul's reshape copies the expanded k and v out to all 71 heads (torch
    # LinearAlgebra.cpp _matmul_impl; the CPU math backend's saved set shows it): 2 x 2 x 2,048 x 71 x 64 x 4 B
    two = {e.name: e.bytes(par) for e in attention_entries(arch, replace(training, micro_batch_size=2), par)}
    assert two["k scaled and v (fp32, SDPA math backend)"] == 2 * 2 * s * 71 * 64 * 4 == 148_897_792


def test_the_harness_emulates_falcons_math_call_as_the_h200_ran_it():
    """validation/core/emulation.py `_masked_math_sdpa` on Falcon-7B's call at s 2048 (fake tensors, the harness's
    tracker) requests and frees what the H200's forward did, each rounded to the allocator's 512-byte block: the
    same requests and frees and the same peak over the call's start (the bias, the three upcasts, the scaled q and
    k, the scores, the softmax and _safe_softmax's masks: 2,764,716,544 B to the block), and the same tensors alive
    at its end (the kept set and the bf16 output). One order differs: _safe_softmax is one op to the tracker, which
    registers its output as it returns, after the temporaries the emulation makes for it beforehand."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from validation.core.emulation import _masked_math_sdpa
    from validation.core.tracker import StorageTracker, cuda_block_bytes

    with FakeTensorMode():
        q = torch.empty(1, 71, 2048, 64, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.empty(1, 1, 2048, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        mask = torch.ones(1, 1, 2048, 2048, dtype=torch.bool)
        tracker = StorageTracker()
        with tracker:
            tracker.start()
            out = _masked_math_sdpa(q, k, v, mask, None)
    emulated = [delta for _, delta in tracker.events]
    record = json.loads((experiments.EXPERIMENT_RECORDS / "sdpa-mask-h200.json").read_text())
    (row,) = [r for run in record["runs"] for r in run["measured"]["cases"] if r["case"] == "falcon-7b-falcon-s2048-b1"]
    measured = [(1 if size > 0 else -1) * cuda_block_bytes(abs(size))
                for size, _ in row["measured"]["allocations"]["forward"]]

    def peak(events):
        running, best = 0, 0
        for delta in events:
            running += delta
            best = max(best, running)
        return best

    assert sorted(emulated) == sorted(measured) and len(emulated) == 27
    assert peak(emulated) == peak(measured) == 2_764_716_544
    assert sum(emulated) == 1_229_455_360 + 18_612_224 == out.untyped_storage().nbytes() + 1_229_455_360
