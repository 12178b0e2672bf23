"""Issue 22's terms of the step time, each by hand: torch.compile's fused kernels, FP8's casts and its
GEMM efficiency, TP overlap (Megatron's backward, async TP), ring collectives across nodes through
every rank's NIC, and MoE all-to-alls inside and across nodes. The published runs they are held to
are in tests/test_published_throughput.py."""

from __future__ import annotations

import pytest

from estimator.models.presets import get_architecture
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training
from estimator.speed import kernels
from estimator.speed.roofline import roofline

H100 = Hardware("h100-80")


def llama_8b():
    return get_architecture("llama-3.1-8b")


def op(result, name, phase="forward"):
    return next(o for o in result.operations if o.name == name and o.phase == phase)


# --- torch.compile ------------------------------------------------------------------------------------

def test_compile_runs_each_norm_rotary_and_activation_as_one_kernel():
    """Eager torchtitan (torch 2.13) runs nn.RMSNorm as torch's one fused CUDA kernel (1.0x the fused bytes), its
    complex rotary as six kernels over 5.05x, SwiGLU as two over 5/3x (measured, kernels.EAGER_TRAFFIC);
    compiled (Inductor fuses each chain into one kernel) they move what TransformerEngine's fused kernels move:
    read the input once, write the output once."""
    tr = Training(framework="fsdp2", seq_len=4096, global_batch_size=8)
    eager = roofline(llama_8b(), tr, Parallel(dp=8), H100)
    compiled = roofline(llama_8b(), Training(framework="fsdp2", seq_len=4096, global_batch_size=8, compile=True),
                        Parallel(dp=8), H100)
    megatron = roofline(llama_8b(), Training(seq_len=4096, global_batch_size=8), Parallel(dp=8), H100)
    for name, passes, launches in (("attention norm", 1.0, 1), ("rotary embedding", 5.05, 6),
                                   ("SwiGLU activation", 1.667, 2)):
        assert (op(eager, name).passes, op(eager, name).kernels) == (passes, launches)
        assert (op(compiled, name).passes, op(compiled, name).kernels) == (1.0, 1)
        assert op(compiled, name).expected_time_s == pytest.approx(op(megatron, name).expected_time_s)
    # the norm: 4096 tokens x 4096 in and out, bf16, at 90% of 3.35 TB/s
    assert op(compiled, "attention norm").expected_time_s == pytest.approx(2 * 4096 * 4096 * 2 / (0.9 * 3.35e12))
    assert op(eager, "rotary embedding").expected_time_s == pytest.approx(
        5.05 * 2 * 4096 * (4096 + 1024) * 2 / (0.9 * 3.35e12))
    # torchtitan's December 2024 release ran torch before the fused CUDA RMSNorm: the composite chain, 10.002x
    old = roofline(llama_8b(), Training(framework="fsdp2", framework_version="2024-12", seq_len=4096,
                                        global_batch_size=8), Parallel(dp=8), H100)
    assert (op(old, "attention norm").passes, op(old, "attention norm").kernels) == (10.002, 8)
    # only the memory-bound kernels change: the matmuls and the attention core keep their time
    assert op(compiled, "QKV projection").expected_time_s == op(eager, "QKV projection").expected_time_s
    assert compiled.step.compute_s < eager.step.compute_s


# --- FP8 ----------------------------------------------------------------------------------------------

def fp8_run(framework="fsdp2", recipe="tensorwise", **kw):
    tr = Training(framework=framework, seq_len=4096, global_batch_size=8, fp8=True, fp8_recipe=recipe, **kw)
    return roofline(llama_8b(), tr, Parallel(dp=8, zero_stage=3 if framework == "fsdp2" else 1), H100)


def test_fp8_casts_move_torchaos_and_tes_bytes():
    """QKV projection of Llama-3.1-8B, 4096 tokens: input 4096 x 4096, weight 4096 x 6144, output
    4096 x 6144. torchao tensorwise (torchao roofline_utils.py): the input's amax (read 2 bytes) and its
    cast writing both layouts (read 2, write 1 + 1) = 6 bytes per element, 4 when compile fuses the amax
    into the norm; the weight's amax + two casts = 2 + 3 + 3 = 8. TransformerEngine: 6 (amax + cast-
    transpose) for tensorwise current scaling, 4 for MXFP8 (one pass writing both layouts); its
    weights are cast once a step, with the optimizer's pass."""
    M, K, N = 4096, 4096, 6144
    eager, compiled = fp8_run(), fp8_run(compile=True)
    assert op(eager, "QKV projection: fp8 cast of the input").bytes == M * K * 6
    assert op(compiled, "QKV projection: fp8 cast of the input").bytes == M * K * 4
    assert op(compiled, "QKV projection: fp8 cast of the output gradient", "backward").bytes == M * N * 4
    assert op(compiled, "QKV projection: fp8 cast of the weight").bytes == K * N * 8
    gathered = fp8_run(compile=True, fp8_all_gather=True)  # torchao casts the local shard, 1/8, before gathering
    assert op(gathered, "QKV projection: fp8 cast of the weight").bytes == pytest.approx(K * N * 8 / 8)
    te = fp8_run("megatron")
    assert op(te, "QKV projection: fp8 cast of the input").bytes == M * K * 6
    assert not [o for o in te.operations if o.name.endswith("fp8 cast of the weight")]
    blackwell = roofline(llama_8b(), Training(seq_len=4096, global_batch_size=8, fp8=True, fp8_recipe="mxfp8"),
                         Parallel(dp=8), Hardware("b200"))
    assert op(blackwell, "QKV projection: fp8 cast of the input").bytes == M * K * 4
    # memory-bound: at 90% of the H100's 3.35 TB/s
    assert op(compiled, "QKV projection: fp8 cast of the input").expected_time_s == pytest.approx(
        M * K * 4 / (0.9 * 3.35e12))


def test_fp8_gemms_run_at_the_measured_fp8_share_and_the_head_stays_bf16():
    """MAMF (Bekman, ml-engineering 744d01e1): an H100 SXM reaches 1,402.6 of 1,979 FP8 TFLOP/s (70.9%)
    against 794.5 of 989 bf16 (80.3%, the catalog keeps the older 80.1%). The LM head and the router
    stay bf16 under both stacks (torchtitan skips the `output` linear; Megatron's output layer is not a
    TE module)."""
    bf16 = roofline(llama_8b(), Training(framework="fsdp2", seq_len=4096, global_batch_size=8, compile=True),
                    Parallel(dp=8), H100)
    fp8 = fp8_run(compile=True)
    qkv, qkv16 = op(fp8, "QKV projection"), op(bf16, "QKV projection")
    assert (qkv.peak_flops, qkv16.peak_flops) == (1979e12, 989e12)
    assert qkv.compute_efficiency / qkv16.compute_efficiency == pytest.approx(0.709 / 0.801)
    assert qkv.compute_efficiency == pytest.approx(kernels.gemm_efficiency(H100.device, 4096, 4096, 6144, fp8=True))
    head = op(fp8, "LM head")
    assert head.peak_flops == 989e12 and head.compute_efficiency == op(bf16, "LM head").compute_efficiency
    assert not [o for o in fp8.operations if o.name.startswith("LM head: fp8 cast")]
    # what FP8 buys, compiled, on one 8B step: the GEMMs' 2x peak less their lower share and the casts
    assert 1.15 < bf16.step.time_s / fp8.step.time_s < 1.45


def test_te_casts_weights_once_a_step_with_the_optimizer():
    """Megatron FP8: the optimizer's pass gains 6 bytes per weight (TE tensorwise: amax + cast-transpose)."""
    arch, tr = llama_8b(), Training(seq_len=4096, global_batch_size=8)
    plain = roofline(arch, tr, Parallel(dp=8), H100).step.optimizer_s
    fp8 = roofline(arch, Training(seq_len=4096, global_batch_size=8, fp8=True), Parallel(dp=8), H100).step.optimizer_s
    assert fp8 - plain == pytest.approx(6 * 8_030_261_248 / (0.9 * 3.35e12), rel=0.01)


# --- TP overlap ---------------------------------------------------------------------------------------

def tp_comm(framework, **kw):
    arch = get_architecture("llama-3.1-70b")
    tr = Training(framework=framework, seq_len=8192, global_batch_size=16, **kw)
    step = roofline(arch, tr, Parallel(tp=8, dp=2, zero_stage=3 if framework == "fsdp2" else 1), H100).step
    return next(c for c in step.communication if c.group == "TP")


def test_async_tp_leaves_one_chunk_of_each_overlapped_collective():
    """Llama-3.1-70B, TP 8, 8192 tokens: each layer's GEMMs outlast its TP collectives many times over,
    so an overlapped collective shows one chunk of t = 8 (Wang et al. 2023's decomposition). Megatron's
    userbuffers overlap forward and backward: 1/8 of it all. torchtitan's async TP overlaps the forward
    only (micro_pipeline_tp.py matches the forward's patterns): half at 1/8, the backward's half in full.
    Without it Megatron hides half of the backward (the column-parallel reductions under the weight
    gradient), torchtitan nothing."""
    megatron, overlapped = tp_comm("megatron"), tp_comm("megatron", async_tp=True)
    torchtitan, async_titan = tp_comm("fsdp2", compile=True), tp_comm("fsdp2", compile=True, async_tp=True)
    assert megatron.time_s == pytest.approx(overlapped.time_s)
    assert megatron.exposed_s == pytest.approx(0.75 * megatron.time_s)
    assert overlapped.exposed_s == pytest.approx(megatron.time_s / 8)
    assert torchtitan.exposed_s == pytest.approx(torchtitan.time_s)
    assert async_titan.exposed_s == pytest.approx(torchtitan.time_s * (0.5 / 8 + 0.5))


def test_async_tp_under_fsdp2_needs_compile_and_a_stack_that_has_it():
    from estimator.spec.errors import ConfigError
    with pytest.raises(ConfigError, match="training.async_tp.*compile"):
        Training(framework="fsdp2", async_tp=True)
    with pytest.raises(ConfigError, match="training.async_tp.*'megatron' or 'fsdp2'"):
        Training(framework="deepspeed", async_tp=True)


# --- ring collectives across nodes ------------------------------------------------------------------------

def test_a_ring_crosses_nodes_through_every_ranks_nic():
    """NCCL runs one ring per channel and each leaves a node through the NIC of the GPU where it leaves:
    r ranks of a group in a node drive r NICs (NVIDIA/nccl issue #1168: busbw ~45 GB/s with 4 GPUs per
    node, ~90 with 8). H100 nodes: 8 x 400 Gb/s, 47 of 50 GB/s each (nccl-tests issue #290), capped at the
    NVLink ring (370 GB/s)."""
    from estimator.speed import collectives
    gpu = H100.device
    assert collectives.ranks_per_node(gpu, 32, 8) == 1  # DP under TP 8: one rank per node
    assert collectives.ranks_per_node(gpu, 32, 2) == 4
    assert collectives.bus_bandwidth(gpu, "inter-node", ring_size=32, stride=8) == pytest.approx(47e9)
    assert collectives.bus_bandwidth(gpu, "inter-node", ring_size=32, stride=2) == pytest.approx(4 * 47e9)
    assert collectives.bus_bandwidth(gpu, "inter-node", ring_size=32, stride=1) == pytest.approx(370e9)
    assert collectives.bus_bandwidth(gpu, "inter-node") == pytest.approx(47e9)  # point to point: one NIC
    assert collectives.ring_line_rate(gpu, "inter-node", 32, 2) == 4 * 50e9
    # in a step: the gradient reduce-scatter of DP 32 under TP 2 runs at 4 NICs' busbw
    arch = llama_8b()
    step = roofline(arch, Training(seq_len=4096, global_batch_size=64), Parallel(tp=2, dp=32, zero_stage=1), H100).step
    grad = next(c for c in step.communication if c.name == "gradient reduce-scatter")
    assert (grad.link, grad.bandwidth) == ("inter-node", pytest.approx(4 * 47e9))


# --- MoE all-to-all inside and across nodes -------------------------------------------------------------

def moe_ep(gpu, ep, dispatcher="alltoall"):
    arch = get_architecture("qwen3-30b-a3b")
    tr = Training(seq_len=4096, global_batch_size=ep, moe_dispatcher=dispatcher, moe_grouped_gemm=True)
    step = roofline(arch, tr, Parallel(dp=ep, ep=ep, etp=1), Hardware(gpu)).step
    return arch, next(c for c in step.communication if c.group == "EP")


def test_an_all_to_all_wider_than_a_node_splits_over_nvlink_and_the_nic():
    """Qwen3-30B-A3B (48 MoE layers, top-8, h 2048), 4096 tokens a GPU, EP 16 on 8-GPU H100 nodes: of
    the copies a GPU sends, 7/16 go over NVLink to its node's peers and 8/16 through its NIC, at the same
    time: the NIC's share at 47 GB/s sets the time (plus 30 us a call), where all of it went at the
    NIC's rate before."""
    arch, ep = moe_ep("h100-80", 16)
    copies = 8 * 4096 * 48  # k x tokens x MoE layers, one micro-batch
    sent = copies * 2 * 2 * 2048 * 2  # dispatch + combine, forward + backward, h x 2 bytes
    assert ep.link == "inter-node" and ep.bytes == pytest.approx(sent * 15 / 16)
    assert ep.time_s == pytest.approx(sent * 8 / 16 / 47e9 + 4 * 48 * 30e-6)
    # within a GB200 NVL72 rack the same 16 GPUs are one NVLink domain: all of it at the NVLink ring's
    # 370/450 of 900 GB/s, 10 us a call
    _, rack = moe_ep("gb200", 16)
    assert rack.link == "intra-node"
    assert rack.time_s == pytest.approx(sent * 15 / 16 / (900e9 * 370 / 450) + 4 * 48 * 10e-6)


def test_deepep_sends_a_token_once_to_each_node_it_needs():
    """DeepSeek-V3 report section 3.2.2 / DeepEP / HybridEP: a token crosses to each other node its
    experts are on once, then fans out over NVLink there. EP 16 on two nodes, top-8: the other node
    holds at least one of a token's experts with probability 1 - (1/2)^8 = 0.996: one copy through the
    NIC where the plain all-to-all sends 8 x 8/16 = 4."""
    from estimator.speed import collectives
    assert collectives.remote_nodes_per_token(2, 8) == pytest.approx(1 - 0.5**8)
    assert collectives.remote_nodes_per_token(4, 8) == pytest.approx(3 * (1 - 0.75**8))
    _, plain = moe_ep("h100-80", 16)
    _, deepep = moe_ep("h100-80", 16, "deepep")
    tokens = 4096 * 48
    copy = 2 * 2 * 2048 * 2
    nic = tokens * (1 - 0.5**8) * copy
    nvlink = tokens * (8 * 7 / 16 + 8 * 8 / 16 * 7 / 8) * copy
    assert deepep.bytes == pytest.approx(nic + nvlink)
    assert deepep.time_s == pytest.approx(max(nic / 47e9, nvlink / 370e9) + 4 * 48 * 30e-6)
    assert deepep.time_s < plain.time_s / 3
