"""The sdpa-mask experiment (validation/gpu/sdpa_mask.py): its CPU stand-in through the same command line and
records step a session lent a GPU runs, that its call is transformers' own, and the estimator held to a GPU record
of it where one exists (tests/data/measured/gpu/experiments/sdpa-mask-<gpu>.json)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from validation.gpu import experiments  # noqa: E402
from validation.gpu.__main__ import main  # noqa: E402
from validation.gpu.sdpa_mask import (GPU_GROUPS, GROUPS, Case, _mirror, bool_mask, call, inputs,  # noqa: E402
                                      prediction, sdpa_seen)

# the philox seed and offset SDPA's fused kernels save beside their tensors: two int64 scalars, on the host in
# torch 2.11 when dropout is 0, on the device otherwise
PHILOX = 16


def test_the_gpu_grid():
    """Gemma 3 4B, 12B and 27B's attention shapes (heads, KV heads, head dim), each (seq, batch) as a sliding case
    and its unmasked control; Falcon-7B's 71 heads on one at s 2048 and 4096. The largest masked case, 12B at
    s 8192 b 2: q 128 MiB, k and v repeated 128 MiB each, the bf16 bias 256 MiB."""
    cases = [c for g in GPU_GROUPS for c in GROUPS[g]]
    assert len(cases) == 20 and len({c.id for c in cases}) == 20
    assert {(c.model, c.heads, c.kv_heads, c.head_dim) for c in cases} == {
        ("gemma-3-4b", 8, 4, 256), ("gemma-3-12b", 16, 8, 256), ("gemma-3-27b", 32, 16, 128), ("falcon-7b", 71, 1, 64)}
    assert {c.window for c in cases if c.kind == "sliding"} == {1024}
    assert all(c.seq >= 2 * 1024 for c in cases)  # every sliding case past the window: transformers builds the mask
    big = max((c for c in cases if c.kind == "sliding"), key=lambda c: c.batch * c.seq ** 2 * c.heads)
    assert (big.model, big.seq, big.batch) == ("gemma-3-12b", 8192, 2)
    assert big.batch * big.seq * big.heads * big.head_dim * 2 == 128 * 2**20
    assert big.batch * big.seq ** 2 * 2 == 256 * 2**20


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
    (sliding,), (causal,), (falcon,) = rows["sliding"]["sdpa_calls"], rows["causal"]["sdpa_calls"], rows["falcon"]["sdpa_calls"]
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


# --- a GPU record, once a session lent a GPU has run the experiment ---------------------------------------------

GPU_RECORDS = sorted(p for p in experiments.EXPERIMENT_RECORDS.glob("sdpa-mask-*.json") if p.stem != "sdpa-mask-cpu")


def _cases(path) -> dict[str, dict]:
    record = json.loads(path.read_text())
    return {row["case"]: row for run in record["runs"] for row in run["measured"]["cases"]}


def _case(row: dict) -> Case:
    return Case(**{k: row[k] for k in ("model", "kind", "heads", "kv_heads", "head_dim", "seq", "batch", "window")})


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_gpu_ran_transformers_masked_path(path):
    """What the GPU ran is the path sdpa_mask.py describes: a sliding case reaches SDPA with k and v at every query
    head and a bool mask and runs the memory-efficient kernel (a mask rules flash out); its control runs with the
    grouped heads and enable_gqa; Falcon's call cannot run a fused kernel (the math backend: no SDPA backward node)."""
    for row in _cases(path).values():
        assert "error" not in row["measured"], (row["case"], row["measured"].get("error"))
        (seen,) = row["measured"]["sdpa_calls"]
        if row["kind"] == "sliding":
            assert (seen["k_heads"], seen["enable_gqa"], seen["mask"]["dtype"]) == (row["heads"], False, "bool")
            assert seen["grad_fn"] == "ScaledDotProductEfficientAttentionBackward0"
        elif row["kind"] == "causal":
            assert (seen["k_heads"], seen["enable_gqa"], seen["is_causal"]) == (row["kv_heads"], True, True)
        else:
            assert not seen["grad_fn"].startswith("ScaledDotProduct")


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_the_estimator_charges_what_the_gpu_saved(path):
    """Every modelled case: what autograd saved on the device (each storage once, the inputs included) is the
    estimator's core entries and attention output for that layer, to the philox scalars; a sliding case's excess
    over its control is sdpa_mask.py's two entries, the same way."""
    rows = _cases(path)
    for row in rows.values():
        if row["kind"] == "falcon":
            continue
        predicted = prediction(_case(row))
        assert abs(row["measured"]["saved_bytes"] - predicted["saved_bytes"]) <= PHILOX, row["case"]
        if row["kind"] == "sliding":
            control = rows[row["case"].replace("-sliding-", "-causal-")]["measured"]["saved_bytes"]
            extra = row["measured"]["saved_bytes"] - control
            assert abs(extra - predicted["masked_extra_bytes"]) <= PHILOX, row["case"]
