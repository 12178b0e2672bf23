"""DeepEP's fixed buffers (training.moe_dispatcher = "deepep") in the communication component.

The expected bytes are recomputed here by hand from the quoted source, not from estimator/memory/deepep.py:

deepseek-ai/DeepEP csrc/config.hpp (Config::get_nvl_buffer_size_hint), num_channels = num_sms / 2:
    num_bytes  = C * nvl * (2 * rdma + 3) * sizeof(int)
    num_bytes += C * nvl * T * hidden_bytes
    num_bytes += C * nvl * T * sizeof(SourceMeta)             # 8
    num_bytes += C * nvl * T * kNumMaxTopK * sizeof(topk_idx_t)  # 128 x 8
    num_bytes += C * nvl * T * kNumMaxTopK * sizeof(float)       # 128 x 4
    num_bytes += C * nvl * T * kNumMaxScales * sizeof(float)     # 128 x 4
    num_bytes  = ((num_bytes + 127) / 128) * 128
Config::get_rdma_buffer_size_hint (0 when num_ranks <= 8), R = num_ranks / 8:
    C*R*(8*2+2)*2*4 + C*R*Tr*(hidden_bytes + 8 + 128*8 + 128*4 + 128*4 + sizeof(int4)) * 2, aligned to 128,
    Tr = align_up(rdma_recv_tokens, rdma_send_tokens) (the Config constructor).
deep_ep/buffer.py configs (num_sms = 20): dispatch 8 ranks (6, 256, 6, 128), 64 ranks (20, 288, 28, 128);
combine 8 ranks (4, 256, 6, 128), 64 ranks (1, 288, 20, 128).
Megatron fused_a2a.get_hidden_bytes: h * max(element_size, 2); Buffer cudaMallocs num_nvl_bytes + 8*4 + 8*8 + 8*8
and a 32 MiB workspace (csrc/deep_ep.cpp).
"""

import json
import subprocess
import sys

import pytest

from tests.test_validation import named

from estimator import estimate_config
from estimator.memory.deepep import deepep_buffers

H = 7168  # DeepSeek-V3 hidden size
DSV3_LIKE = {"hidden_size": H, "num_layers": 4, "num_attention_heads": 128, "num_kv_heads": 128,
             "intermediate_size": 18432, "vocab_size": 129280, "num_experts": 256, "num_experts_per_token": 8,
             "moe_intermediate_size": 2048, "num_shared_experts": 1, "first_dense_layers": 1}
DENSE = {"hidden_size": 1024, "num_layers": 2, "num_attention_heads": 16, "num_kv_heads": 4,
         "intermediate_size": 4096, "vocab_size": 32000}
GiB = 1024**3


def align128(n):
    return (n + 127) // 128 * 128


def nvl_hint(num_ranks, nvl_recv_tokens, hidden_bytes, num_sms=20):
    C, nvl, rdma = num_sms // 2, min(num_ranks, 8), max(num_ranks // 8, 1)
    T = nvl_recv_tokens
    n = C * nvl * (2 * rdma + 3) * 4
    n += C * nvl * T * (hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4)
    return align128(n)


def rdma_hint(num_ranks, rdma_send_tokens, rdma_recv_tokens, hidden_bytes, num_sms=20):
    if num_ranks <= 8:
        return 0
    C, R = num_sms // 2, num_ranks // 8
    Tr = -(-rdma_recv_tokens // rdma_send_tokens) * rdma_send_tokens
    n = C * R * (8 * 2 + 2) * 2 * 4
    n += C * R * Tr * (hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4 + 16) * 2
    return align128(n)


HB = H * max(2, 2)  # bf16 hidden states
# EP 8 inside a node: dispatch and combine both receive 256 NVL tokens; no RDMA buffer
NVL_EP8 = max(nvl_hint(8, 256, HB), nvl_hint(8, 256, HB))
# EP 64 over 8 nodes: NVL 288 tokens both ways; RDMA align_up(128, 28) = 140 (dispatch), align_up(128, 20) = 140
NVL_EP64 = max(nvl_hint(64, 288, HB), nvl_hint(64, 288, HB))
RDMA_EP64 = max(rdma_hint(64, 28, 128, HB), rdma_hint(64, 20, 128, HB))
META, WORKSPACE = 8 * 4 + 8 * 8 + 8 * 8, 32 * 1024 * 1024


def test_hand_computed_hints():
    # written out once, to pin the arithmetic: 10 channels x 8 peers x 256 tokens x 16,392 B + 1,600 B
    assert NVL_EP8 == align128(10 * 8 * 5 * 4 + 10 * 8 * 256 * (14336 + 2056)) == 335_709_824
    assert NVL_EP64 == 377_677_824
    assert RDMA_EP64 == align128(10 * 8 * 18 * 2 * 4 + 10 * 8 * 140 * (14336 + 2072) * 2) == 367_550_720
    ep8 = deepep_buffers(H, 2, 8, 8)
    assert (ep8.num_nvl_bytes, ep8.num_rdma_bytes, ep8.nvl_allocation, ep8.workspace) == \
        (NVL_EP8, 0, NVL_EP8 + META, WORKSPACE)
    ep64 = deepep_buffers(H, 2, 64, 8)
    assert (ep64.num_nvl_bytes, ep64.num_rdma_bytes, ep64.rdma_ranks) == (NVL_EP64, RDMA_EP64, 8)
    # fp8 hidden states still count 2 bytes (max(element_size, 2)); fp32 count 4
    assert deepep_buffers(H, 1, 8, 8).hidden_bytes == 2 * H
    assert deepep_buffers(H, 4, 8, 8).num_nvl_bytes == nvl_hint(8, 256, 4 * H)


def _config(dispatcher, ep, dp, **training):
    return {"model": DSV3_LIKE, "parallel": {"ep": ep, "dp": dp},
            "training": {"moe_dispatcher": dispatcher, "seq_len": 1024, **training}}


@pytest.mark.parametrize("ep, added", [(8, NVL_EP8 + META + WORKSPACE),
                                       (64, NVL_EP64 + META + RDMA_EP64 + WORKSPACE)])
def test_communication_grows_by_exactly_the_buffers(ep, added):
    base = estimate_config(_config("alltoall", ep, ep))
    deep = estimate_config(_config("deepep", ep, ep))
    for s0, s1 in zip(base.stages, deep.stages):
        c0, c1 = s0.component("communication"), s1.component("communication")
        # DeepEP's buffers, less the all-to-all's EP communicator: the flex dispatcher issues no all_to_all over EP,
        # only DeepEP's over TP x EP (Megatron-Core 0.16.1 token_dispatcher.py MoEFlexTokenDispatcher l. 1345-1358)
        ep_comm = GiB // 2
        assert c1.bytes - c0.bytes == added - ep_comm
        # the buffers are communication, outside the allocator's peak: backward (the same experts' backward) and
        # the step are unchanged; so is forward: the all-to-all dispatcher's combine moment (the sent tokens, the
        # experts' outputs, their unsorted copy and the all-to-all's output, 4 x 2 B x 1024 x 8 routed tokens x
        # 7168), which DeepEP's buffers replace, comes before the loss's saved tensors (Megatron-Core's order:
        # moe_moments.combine_before_the_loss; the final norm's and LM head's inputs, 2 x 2 B x 1024 x 7168, and
        # the fp32 softmax, 4 B x 1024 x 129280), which exceed it: forward's moment is the loss's own under both
        phases0, phases1 = ({p.name: p.allocated_bytes for p in s.phases} for s in (s0, s1))
        combine, saved = 4 * 2 * 1024 * 8 * H, 2 * 2 * 1024 * H + 4 * 1024 * 129280
        assert combine < saved
        assert phases1 == phases0 and s1.allocated_peak_bytes == s0.allocated_peak_bytes
        outside = [s.device_total_bytes - s.allocated_peak_bytes - s.component("fragmentation").bytes for s in (s0, s1)]
        assert outside[1] - outside[0] == added - ep_comm
        assert "DeepEP NVL buffer" in c1.formula and "RDMA buffer" in c1.formula
        assert c1.formula.startswith(c1.parts[0].formula) and ", EP)" in c0.formula
        assert ", EP)" not in c1.parts[0].formula
        assert sum(p.bytes for p in c1.parts) == c1.bytes and c1.parts[0].bytes == c0.bytes - ep_comm
        assert any("RDMA" in p.label for p in c1.parts) == (ep > 8)


def test_alltoall_keeps_the_old_numbers():
    explicit = estimate_config(_config("alltoall", 8, 8))
    cfg = _config("alltoall", 8, 8)
    del cfg["training"]["moe_dispatcher"]
    assert estimate_config(cfg).to_json() == explicit.to_json()
    comm = explicit.stages[0].component("communication")
    # the world's, DP x CP's, the dispatcher's TP x EP and EP communicators of 8 ranks, and four of one rank (EP 8 of
    # 8 GPUs leaves expert DP one rank): TP at TP 1, the gradient norm's model-parallel group and the experts' expert
    # TP x PP group (zero_stage 0), expert DP, each 2 + 3 x 64 allocations of 2 MiB (estimator/spec/nccl.py), and
    # NCCL's kernels, 85 x 2 MiB (nccl_groups.megatron_communicators): the NCCL-only component
    one_rank = (2 + 3 * 64) * 2 * 2**20
    assert comm.bytes == 85 * 2 * 2**20 + 4 * GiB // 2 + 4 * one_rank == 3770 * 2**20
    assert comm.label == "NCCL communicator buffers"
    assert comm.formula == ("NCCL kernels 170 MiB + 0.5 GiB x 4 communicators (world, DP x CP, expert TP x EP, EP) "
                            "+ 4 of one rank x 388.0 MiB (TP, model-parallel (the gradient norm's), expert DP, "
                            "expert TP x PP (the experts' gradient norm)) = 3,770.0 MiB")
    assert "DeepEP" not in comm.formula


@pytest.mark.parametrize("config, field, words", [
    ({"model": DENSE, "training": {"moe_dispatcher": "deepep"}}, "training.moe_dispatcher",
     "the model has none"),
    ({"model": DSV3_LIKE, "parallel": {"dp": 8}, "training": {"moe_dispatcher": "deepep"}},
     "training.moe_dispatcher", "it needs ep > 1"),
    ({"model": DSV3_LIKE, "parallel": {"dp": 8, "ep": 8}, "training": {"moe_dispatcher": "deepep",
                                                                        "framework": "fsdp2"}},
     "training.moe_dispatcher", "'alltoall' unless framework is 'megatron'"),
    ({"model": DSV3_LIKE, "training": {"moe_dispatcher": "nccl_ep"}}, "training.moe_dispatcher",
     "'alltoall', 'deepep'"),
    ({"model": {**DSV3_LIKE, "num_experts": 96}, "parallel": {"dp": 12, "ep": 12},
      "training": {"moe_dispatcher": "deepep"}}, "parallel.ep", "2, 4, 8, 16, 24, 32, 64, 128, 144, 160"),
    ({"model": DSV3_LIKE, "parallel": {"dp": 8, "ep": 8}, "training": {"moe_dispatcher": "deepep"},
      "hardware": {"gpu": "gh200"}}, "training.moe_dispatcher", "the catalog's node has 1"),
])
def test_validation_messages(config, field, words):
    with pytest.raises(Exception) as info:
        estimate_config(config)
    message = str(info.value)
    assert message.startswith(named(field) + " = "), message
    assert words in message and "allowed:" in message, message


def test_cli_accepts_the_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config("deepep", 64, 64)))
    run = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    base = estimate_config(_config("alltoall", 64, 64)).to_json()
    for stage, old in zip(out["stages"], base["stages"]):
        added = stage["components"]["communication"] - old["components"]["communication"]
        assert added == NVL_EP64 + META + RDMA_EP64 + WORKSPACE - GiB // 2  # less the all-to-all's EP communicator
        assert "DeepEP" in stage["formulas"]["communication"]


def test_only_stages_with_moe_layers_hold_the_deepep_buffers():
    # 8 layers, the first 4 dense, on 2 pipeline stages: stage 0 runs no MoE layer, so it never
    # dispatches and never creates DeepEP's buffer (Megatron-Core fused_a2a.get_buffer on first use)
    from estimator import Architecture, Parallel, Training, estimate
    arch = Architecture(hidden_size=1024, num_layers=8, num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                        intermediate_size=2048, num_experts=8, num_experts_per_token=2, moe_intermediate_size=512,
                        first_dense_layers=4)
    par = Parallel(pp=2, dp=8, ep=8, zero_stage=1)
    deepep = estimate(arch, Training(moe_dispatcher="deepep", global_batch_size=16), par)
    plain = estimate(arch, Training(global_batch_size=16), par)
    comm = [s.component("communication").bytes for s in deepep.stages]
    base = [s.component("communication").bytes for s in plain.stages]
    assert comm[0] == base[0]
    # stage 1 holds DeepEP's buffers in place of the all-to-all's EP communicator (test_communication_grows_...)
    labels = [[p.label for p in s.component("communication").parts] for s in deepep.stages]
    assert not any("DeepEP" in label for label in labels[0]) and any("DeepEP" in label for label in labels[1])
    assert comm[1] != base[1]
    # DeepEP sends from its own buffers: no all-to-all send buffer among the transients
    fwd = {c.key: c for c in next(p for p in deepep.stages[1].phases if p.name == "forward").components}
    assert not any("All-to-all" in part.label for part in fwd["transient"].parts)


def test_deepep_is_for_training():
    import pytest
    from estimator import estimate_config
    from estimator.spec.errors import ConfigError
    with pytest.raises(ConfigError, match="low-latency inference buffers are not modelled"):
        estimate_config({"model": "mixtral-8x7b", "training": {"mode": "inference", "moe_dispatcher": "deepep"},
                         "parallel": {"ep": 8, "dp": 8}})
