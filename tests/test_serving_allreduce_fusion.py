"""FlashInfer's all-reduce fusion workspace in vLLM's non-torch memory (estimator/serving/allreduce_fusion.py),
computed by hand from vLLM's AllReduceFusionPass and FlashInfer's TRT-LLM workspace for each version rule."""

from __future__ import annotations

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import allreduce_fusion
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.vllm_versions import rules_for
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20


def workspace(model: str, gpu: str, tp: int, version: str, pp: int = 1, tokens: int = 8192):
    return allreduce_fusion.fusion_workspace(rules_for(version), gpu, get_architecture(model), tp, pp, tokens)


def test_hopper_tp2_rounds_three_buffers_to_512_mib():
    """Llama-3.1-8B (h 4096), TP 2, 0.19 on an H100: T = min(64 MiB // (4096 x 2), 8192) = 8192; buffers of
    2 x 8192 x 4096 x 2 = 128 MiB, 2 x 256 x 4 = 2 KiB and 3 x 128 MiB = 384 MiB, each + 2 KiB pad, then up to
    the 512 MiB multicast granularity (FlashInfer 0.6.6)."""
    w = workspace("llama-3.1-8b", "h100-80", 2, "0.19.0")
    assert 2 * 8192 * 4096 * 2 == 128 * MiB and 3 * 128 * MiB + 2048 < 512 * MiB
    assert w.bytes == 3 * 512 * MiB


def test_hopper_tp4_caps_the_tokens_at_2_mib_yet_keeps_1_5_gib():
    """TP 4 on sm90 allows 2 MiB: T = 2 MiB // 8192 = 256; buffers of 8 MiB, 4 KiB, 24 MiB, still 3 x 512 MiB,
    which is why the published TP 4 logs grow as much as TP 2."""
    assert 2 * MiB // (4096 * 2) == 256
    assert workspace("llama-3.1-8b", "h100-80", 4, "0.19.0").bytes == 3 * 512 * MiB


def test_sm103_lamport_buffer_spans_two_granules():
    """B300 (sm103), TP 4, 0.19 allows 64 MiB: Llama-3.1-70B (h 8192) T = 64 MiB // 16384 = 4096; the Lamport
    buffer 3 x 4 x 4096 x 8192 x 2 = 768 MiB rounds to 1024 MiB, the others to 512 MiB each."""
    assert 3 * 4 * 4096 * 8192 * 2 == 768 * MiB
    assert workspace("llama-3.1-70b", "b300", 4, "0.19.0").bytes == (1024 + 512 + 512) * MiB
    assert workspace("llama-3.1-70b", "b300", 4, "0.17.0") is None  # 0.17 asks is_device_capability(100)


def test_0_33_rounds_to_the_allocation_granularity():
    """FlashInfer 0.7.2 (vLLM 0.33): round to 16 B, + 2 KiB pad, up to 2 MiB: 128 MiB -> 130 MiB,
    2 KiB -> 2 MiB, 384 MiB -> 386 MiB."""
    assert workspace("llama-3.1-8b", "h100-80", 2, "0.33.0").bytes == (130 + 2 + 386) * MiB


def test_no_workspace_where_vllm_builds_no_pass():
    """TP 1; PP > 1 (enable_allreduce_rms_fusion requires pipeline_parallel_size == 1); no multicast (A100,
    H100 PCIe); 0.11 and 0.15 (fuse_allreduce_rms off by default)."""
    assert workspace("llama-3.1-8b", "h100-80", 1, "0.19.0") is None
    assert workspace("llama-3.1-8b", "h100-80", 2, "0.19.0", pp=2) is None
    assert workspace("llama-3.1-8b", "a100-80", 2, "0.19.0") is None
    assert workspace("llama-3.1-8b", "h100-pcie", 2, "0.19.0") is None
    assert workspace("llama-3.1-8b", "h100-80", 2, "0.11.0") is None
    assert workspace("llama-3.1-8b", "h100-80", 2, "0.15.0") is None


def test_non_torch_term_adds_the_workspace_as_a_part():
    """The stage's non-torch component = the distributed constant + the workspace (+ in 0.19 the TP group's NCCL
    communicator, tests/test_serving_nccl_comm.py), each shown as a part."""
    for version, parts in (("0.17.0", [205 * MiB, 3 * 512 * MiB]),
                           ("0.19.0", [round(0.07 * 2**30), 3 * 512 * MiB, 484 * MiB])):
        e = estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version=version, max_model_len=8192),
                          Parallel(tp=2), Hardware("h100-80"), get_hf_config("llama-3.1-8b"))
        stage = e.stages[0]
        non_torch = next(c for c in stage.components if c.key == "non_torch")
        assert stage.non_torch == non_torch.bytes == sum(parts)
        assert [p.bytes for p in non_torch.parts] == parts
