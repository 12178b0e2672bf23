"""The TP group's NCCL communicator in vLLM 0.19-0.26's non-torch memory (estimator/serving/nccl_comm.py), computed by
hand from NCCL 2.27.5's buffer sizes and allocations, and the measured non-torch constants per release
(estimator/serving/vllm_versions.py, estimator/serving/overheads.py)."""

from __future__ import annotations

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import nccl_comm
from estimator.serving.overheads import non_torch_base
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.vllm_versions import rules_for
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
GiB = 2**30


def test_protocol_buffers_are_nccls_defaults():
    """LL 8 lines x 512 threads x 8 steps x 16 B; LL128 120 x 640 x 8 x 8 B; SIMPLE 4 MiB (init.cc DEFAULT_*)."""
    assert nccl_comm.LL_BUFFER == 512 * 1024
    assert nccl_comm.LL128_BUFFER == 4_915_200
    assert nccl_comm.SIMPLE_BUFFER == 4 * MiB


def test_a_ring_channel_costs_12_mib_a_rank():
    """Receive: 4 KiB + 0.5 + 4.6875 + 4 MiB = 9.19 MiB -> 10 MiB; send: 4 KiB -> 2 MiB (no P2P read on sm90)."""
    assert nccl_comm.ring_connection_bytes() == 12 * MiB


def test_tp2_communicator_on_h100():
    """2 + 2 MiB dev comm + 32 p2p channels x 3 x 2 MiB + 24 ring channels x 12 MiB = 484 MiB; no NVLS at 2."""
    comm = nccl_comm.communicator_bytes(2, "h100-80")
    assert comm.bytes == (4 + 192 + 288) * MiB == 484 * MiB
    assert "NVLS" not in comm.formula


def test_tp4_adds_nvls_channel_peers_and_credits():
    """Above 2 ranks ncclNvlsSetup allocates 24 nvlsDevPeers + 1 credit buffer, each 2 MiB: 534 MiB."""
    assert nccl_comm.communicator_bytes(4, "h100-80").bytes == 534 * MiB
    assert nccl_comm.communicator_bytes(8, "h200").bytes == 534 * MiB


def test_not_modelled_where_the_channel_count_was_not_derived():
    assert nccl_comm.communicator_bytes(1, "h100-80") is None
    assert nccl_comm.communicator_bytes(2, "a100-80") is None


def _non_torch_parts(version: str, tp: int, pp: int = 1, gpu: str = "h100-80"):
    e = estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version=version, max_model_len=8192),
                      Parallel(tp=tp, pp=pp), Hardware(gpu), get_hf_config("llama-3.1-8b"))
    c = next(c for c in e.stages[0].components if c.key == "non_torch")
    return [p.bytes for p in c.parts] or [c.bytes]


def test_019_tp_non_torch_is_measured_base_plus_workspace_plus_communicator():
    """0.19 at TP 2: 0.07 GiB (PP logs) + 3 x 512 MiB + 484 MiB = 2.043 GiB (the logs print 2.06-2.11)."""
    parts = _non_torch_parts("0.19.0", 2)
    assert parts == [round(0.07 * GiB), 1536 * MiB, 484 * MiB]
    assert round(sum(parts) / GiB, 3) == 2.043


def test_communicator_only_where_the_release_was_read():
    """0.17/0.18 keep the workspace without the communicator (not read); from 0.27 the fusion pass exchanges its
    handles over the gloo cpu_group (allreduce_rms_fusion.py, 0.27.0 and 0.33.0), so no NCCL communicator."""
    assert len(_non_torch_parts("0.17.0", 2)) == 2 and len(_non_torch_parts("0.27.0", 2)) == 2
    assert len(_non_torch_parts("0.26.0", 2)) == 3


def test_nccl_of_each_releases_torch():
    """vLLM wheel METADATA torch pin -> torch wheel METADATA nvidia-nccl pin: 0.19 torch 2.10.0 (NCCL 2.27.5),
    0.20-0.26 torch 2.11.0 (2.28.9); 0.27-0.32 torch 2.13.0 and 0.33 torch 2.14.0 build none for the TP group."""
    assert nccl_comm.tp_group_nccl((0, 19)) == "2.27.5"
    assert nccl_comm.tp_group_nccl((0, 20)) == nccl_comm.tp_group_nccl((0, 26)) == "2.28.9"
    assert nccl_comm.tp_group_nccl((0, 27)) is nccl_comm.tp_group_nccl((0, 33)) is None
    assert nccl_comm.tp_group_nccl((0, 18)) is None
    assert [row[3] for row in nccl_comm.TORCH_NCCL] == ["2.27.5", "2.28.9", "2.29.7", "2.30.7"]


def test_nccl_2_28_builds_nvls_at_two_gpus_over_its_16_nvls_channels():
    """From 2.28.7 ncclNvlsInit returns only below 2 GPUs, and from 2.28 ncclNvlsSetup allocates per NVLS channel
    (16 on sm90), not per ring channel (24): at TP 2 and 4, 484 + (16 + 1) x 2 MiB = 518 MiB."""
    assert nccl_comm.communicator_bytes(2, "h100-80", "2.28.9").bytes == 518 * MiB
    assert nccl_comm.communicator_bytes(4, "h100-80", "2.28.9").bytes == 518 * MiB
    assert "NVLS 17 x 2 MiB" in nccl_comm.communicator_bytes(2, "h100-80", "2.28.9").formula


def test_020_tp_non_torch_carries_the_019_worker_constant():
    """0.20 at TP 2: 0.07 GiB (0.19's PP worker) + 3 x 512 MiB fusion workspace + NCCL 2.28.9's 518 MiB: 2.08 GiB,
    where the 0.20 GiB constant of vLLM PR #14447 gave 1.70 GiB."""
    parts = _non_torch_parts("0.20.0", 2)
    assert parts == [round(0.07 * GiB), 1536 * MiB, 518 * MiB]
    assert round(sum(parts) / GiB, 2) == 2.08


def test_measured_constants_by_release_and_layout():
    """0.13 GiB at TP 1 for 0.15-0.17, 0.25 GiB from 0.18 (the CUDA-graph profile inside memory_profiling) to
    0.25, 0.13 GiB again in 0.33 (the profile moved out); 0.07 GiB a worker of a multi-GPU 0.19 run."""
    single = {v: non_torch_base(rules_for(v), 1, 1)[0] for v in ("0.11.0", "0.15.0", "0.17.0", "0.18.0", "0.19.0",
                                                                  "0.21.0", "0.33.0")}
    assert single == {"0.11.0": 164 * MiB, "0.15.0": round(0.13 * GiB), "0.17.0": round(0.13 * GiB),
                      "0.18.0": round(0.25 * GiB), "0.19.0": round(0.25 * GiB), "0.21.0": round(0.25 * GiB),
                      "0.33.0": round(0.13 * GiB)}
    assert non_torch_base(rules_for("0.19.0"), 1, 2)[0] == round(0.07 * GiB)
    assert non_torch_base(rules_for("0.17.0"), 1, 2)[0] == 205 * MiB
    assert _non_torch_parts("0.19.0", 1, 2) == [round(0.07 * GiB)]


def test_other_gpus_say_the_communicator_is_not_modelled():
    """H800 builds the fusion workspace (multicast NVSwitch) but its 8 NVLinks give another channel count."""
    e = estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version="0.19.0", max_model_len=8192),
                      Parallel(tp=2), Hardware("h800"), get_hf_config("llama-3.1-8b"))
    c = next(c for c in e.stages[0].components if c.key == "non_torch")
    assert [p.bytes for p in c.parts] == [round(0.07 * GiB), 1536 * MiB]
    assert "not modelled on h800" in c.formula


def test_every_release_record_cites_its_non_torch_logs():
    from estimator.serving.vllm_versions import RULES
    for rules in RULES:
        value, source = non_torch_base(rules, 2, 1)
        assert value > 0 and f"vLLM {rules.label} start-up logs" in source
