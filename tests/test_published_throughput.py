"""Step time against published runs: Megatron-LM's README, Megatron-Bridge's performance summary,
torchtitan's benchmarks and the Llama 3 paper (tests/data/measured/published/throughput, one JSON per
run, each citing its source file and commit or URL).

Each record says what the run did in the source's own terms (layout, batch, precision, compile,
activation checkpointing, async TP, the GPU); `configuration` turns it into our configuration and
`replay` compares our expected step time with the run's. The run's step time is the tokens of a step
over its measured tokens/s (or, where the source gives TFLOP/s, over TFLOP/s / FLOPs per token, with
the source's own FLOP count). error = ours / measured - 1: negative = we are too fast.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from estimator.spec.architecture import Architecture
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture
from estimator.speed.layer_operations import model_flops_per_token
from estimator.speed.roofline import roofline
from estimator.spec.training import Training

RECORDS = Path(__file__).resolve().parent / "data" / "measured" / "published" / "throughput"


def records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]


# --- the record as our configuration ----------------------------------------------------------------

def architecture(record: dict) -> Architecture:
    model = record["model"]
    if "preset" in model:  # a preset, with the record's changes (a run without DeepSeek-V3's MTP layer)
        return dataclasses.replace(get_architecture(model["preset"]), **model.get("overrides", {}))
    return Architecture(**model["architecture"])


def recompute(ac: str) -> dict:
    """The record's activation checkpointing as our fields: 'none', 'full', 'selective-op' (torchtitan's
    operator-level policy, our 'selective' under fsdp2) or 'selective:<Megatron --recompute-modules>'."""
    if ac in ("none", "full"):
        return {"recompute": ac}
    if ac == "selective-op":
        return {"recompute": "selective"}
    kind, _, modules = ac.partition(":")
    assert kind == "selective" and modules, ac
    return {"recompute": "selective", "recompute_modules": tuple(modules.split(","))}


def configuration(record: dict) -> tuple[Architecture, Training, Parallel, Hardware]:
    stack, lay, batch, prec = record["stack"], record["layout"], record["batch"], record["precision"]
    other = record.get("other_settings", {})
    torchtitan = stack["framework"] == "torchtitan"
    training = dict(framework="fsdp2" if torchtitan else "megatron", seq_len=batch["seq_len"],
                    micro_batch_size=batch["micro_batch_size"], global_batch_size=batch["global_batch_size"],
                    **recompute(record["activation_checkpointing"]))
    if torchtitan and "9dec370" in stack["version"]:  # the December 2024 benchmarks' release (spec/versions.py)
        training["framework_version"] = "2024-12"
    if prec["fp8"]:
        training.update(fp8=True, fp8_recipe=prec["fp8"])
        if prec.get("fp8_all_gather"):  # torchao enable_fsdp_float8_all_gather
            training["fp8_all_gather"] = True
    if record["compile"]:
        training["compile"] = True
    if record["async_tp"]:  # Megatron --tp-comm-overlap, torchtitan async TP
        training["async_tp"] = True
    if other.get("cross_entropy_fusion"):  # Megatron --cross-entropy-loss-fusion --cross-entropy-fusion-impl
        training.update(loss="fused", cross_entropy_impl=other["cross_entropy_fusion"])
    if other.get("moe_grouped_gemm"):
        training["moe_grouped_gemm"] = True
    if other.get("moe_dispatcher"):  # Megatron's flex dispatcher with HybridEP or DeepEP: our "deepep"
        training["moe_dispatcher"] = "deepep" if other["moe_dispatcher"] == "hybridep" else other["moe_dispatcher"]
    if other.get("grad_reduce_dtype"):  # Megatron-Bridge ddp.grad_reduce_in_fp32
        training["grad_dtype"] = other["grad_reduce_dtype"]
    zero = 3 if lay["fsdp"] else other.get("zero_stage", 1)
    parallel = dict(tp=lay["tp"], pp=lay["pp"], vpp=lay["vpp"], cp=lay["cp"], dp=lay["dp"], ep=lay["ep"],
                    zero_stage=zero)
    if lay.get("etp") is not None:
        parallel["etp"] = lay["etp"]
    for key in ("pp_first_stage_layers", "pp_last_stage_layers", "pp_account_for_embedding", "pp_account_for_loss",
                "pp_layout"):
        if key in lay:
            parallel[key] = lay[key]
    if lay["tp"] > 1:
        parallel["sequence_parallel"] = True
    return architecture(record), Training(**training), Parallel(**parallel), Hardware(record["hardware"]["catalog_id"])


# --- the measured step ---------------------------------------------------------------------------------

def megatron_flops_per_token(arch: Architecture, seq_len: int) -> float:
    """Megatron-LM megatron/training/training.py num_floating_point_operations (commit f2e5db40, the
    README's table) for one token of a dense GPT with MHA: 12*L*h^2*((1 + g/a + s/h)*(q/h) + f/h + V/(2*L*h)),
    i.e. 6N + 12*L*s*q (full attention) with an untied output layer."""
    h, L = arch.hidden_size, arch.num_layers
    q = arch.num_attention_heads * arch.head_dim
    g_over_a = arch.num_kv_heads / arch.num_attention_heads
    gated = 1.5 if arch.gated_mlp else 1.0
    return 12 * L * h * h * ((1 + g_over_a + seq_len / h) * q / h + arch.intermediate_size / h * gated
                             + arch.vocab_size / (2 * L * h))


def measured_tokens_per_s(record: dict, arch: Architecture) -> float:
    measured, seq = record["measured"], record["batch"]["seq_len"]
    if "tokens_per_s_per_gpu" in measured:
        return measured["tokens_per_s_per_gpu"]
    flops = measured["model_tflops_per_gpu"] * 1e12
    if record["source"].get("repo") == "NVIDIA/Megatron-LM":
        return flops / megatron_flops_per_token(arch, seq)
    return flops / model_flops_per_token(arch, seq)  # Llama 3: formula not stated (see the record)


@dataclass(frozen=True)
class Replay:
    id: str
    measured_s: float
    ours_s: float

    @property
    def error(self) -> float:
        return self.ours_s / self.measured_s - 1


def replay(record: dict) -> Replay:
    arch, training, parallel, hardware = configuration(record)
    step = roofline(arch, training, parallel, hardware).step
    tokens = record["batch"]["global_batch_size"] * record["batch"]["seq_len"]
    gpus = record["hardware"]["gpus"]
    assert parallel.gpus == gpus, (record["id"], parallel.gpus, gpus)
    return Replay(record["id"], tokens / (measured_tokens_per_s(record, arch) * gpus), step.time_s)


def report(replays: list[Replay]) -> str:
    lines = [f"{r.id:<72}{r.measured_s:>10.3f} s{r.ours_s:>10.3f} s{r.error:>+9.1%}" for r in replays]
    errors = [abs(r.error) for r in replays]
    lines.append(f"median |error| {statistics.median(errors):.1%}, worst {max(replays, key=lambda r: abs(r.error)).id}"
                 f" {max(errors):.1%}, {len(replays)} runs")
    return "\n".join(lines)


# --- tests ----------------------------------------------------------------------------------------------

def test_every_record_cites_its_source_and_states_the_run():
    for record in records():
        source = record["source"]
        cited = ("commit" in source and len(source["commit"]) == 40 and "path" in source) or "url" in source
        assert cited, record["id"]
        assert source["where"], record["id"]
        assert record["hardware"]["gpus"] > 0 and record["batch"]["seq_len"] > 0
        measured = record["measured"]
        assert measured.get("tokens_per_s_per_gpu") or measured.get("model_tflops_per_gpu"), record["id"]


def test_megatron_readme_flops_formula_by_hand():
    """GPT 177B of the README table (h 12288, 96 layers, 96 heads, V 131072, s 4096): 6N + 12*L*s*h with
    N = 12*L*h^2 + V*h (the untied output layer) = 175.5e9: 1.111e12 FLOPs a token, so 432.8 TFLOP/s is 389
    tokens/s per GPU."""
    arch = Architecture(hidden_size=12288, num_layers=96, num_attention_heads=96, intermediate_size=4 * 12288,
                        vocab_size=131072, gated_mlp=False, norm="layernorm")
    n = 12 * 96 * 12288**2 + 131072 * 12288
    assert megatron_flops_per_token(arch, 4096) == pytest.approx(6 * n + 12 * 96 * 4096 * 12288)
    assert 432.8e12 / megatron_flops_per_token(arch, 4096) == pytest.approx(389.4, abs=0.1)


def test_step_time_on_published_runs():
    """Issue 22's goal: median |error| <= 12% over every published run, and no run beyond 25% but the
    ones OUTLIERS names (strict: a run that comes within 25% must leave the list)."""
    replays = [replay(r) for r in records()]
    text = report(replays)
    print(text)
    assert statistics.median(abs(r.error) for r in replays) <= 0.12, text
    beyond = {r.id for r in replays if abs(r.error) > 0.25}
    assert beyond == set(OUTLIERS), text
    assert set(OUTLIERS) <= {r["id"] for r in records()}


_ROWWISE = ("torchao rowwise float8 under TP: torchtitan's own note on this table, 'the low baseline performance of "
            "the vanilla TP float8 rowwise training is being addressed' (pytorch/torchtitan issue #1207); its scaled "
            "GEMMs and casts run far below the tensorwise ones, which the casts' bytes alone do not show")
_GPT_OSS = ("gpt-oss-120b: its clamped SwiGLU with biases and learnable attention-sink softmax (Megatron-Bridge "
            "gpt_oss_bridge.py: activation_func_clamp_value, softmax_type 'learnable') are not the fused kernels "
            "modelled, its 2,880-wide GEMMs are not multiples of the 128-wide tiles and each of its 128 experts gets a "
            "small grouped GEMM: slower on every system (H100, B200, B300, GB200), not modelled")
# run id -> why it is more than 25% off
OUTLIERS = {
    "torchtitan-2506-70b-256gpu-tp8-rowwise-asynctp": _ROWWISE,
    "torchtitan-2506-8b-64gpu-tp8-rowwise-tp": _ROWWISE,
    "torchtitan-2506-8b-64gpu-tp8-rowwise-asynctp": _ROWWISE,
    "megatron-bridge-26.04.01-gpt-oss-120b-dgx-h100-64gpu-bf16": _GPT_OSS,
    "megatron-bridge-26.04.01-gpt-oss-120b-dgx-b200-64gpu-bf16": _GPT_OSS,
    "megatron-bridge-26.06-gpt-oss-120b-dgx-b300-64gpu-mxfp8": _GPT_OSS,
    "megatron-bridge-26.06-gpt-oss-120b-dgx-gb200-64gpu-mxfp8": _GPT_OSS,
    "megatron-bridge-26.06-qwen3-30b-a3b-dgx-h100-16gpu-fp8": (
        "HybridEP across two H100 nodes: DeepEP's design sends a token once per node (here 1 copy through the NIC "
        "where a plain all-to-all sends 4), and the run is as slow as the plain all-to-all (+2% with it); what "
        "HybridEP's inter-node path achieves on H100 is not measured here"),
    "megatron-bridge-26.04.01-qwen3-30b-a3b-dgx-b200-8gpu-mxfp8": (
        "software of the 26.04.01 container: the same workload on one node runs 1.5x faster on GB200 and B300 in "
        "26.06 (40,706 and 40,769 tokens/s against 27,136), both within 12% here"),
    "megatron-bridge-26.04.01-qwen3-235b-a22b-dgx-b200-256gpu-mxfp8": (
        "the 26.04.01 B200 run (EP 8 x PP 8, alltoall dispatcher) reaches half of the 26.06 GB200 run's tokens/s "
        "(3,776 against 7,376; within 5% here); no recipe difference that explains it was found"),
}
