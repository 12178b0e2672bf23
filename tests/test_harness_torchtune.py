"""The torchtune measuring harness (validation/torchtune/): fake-tensor measurements of tiny
torchtune models equal real CPU runs byte for byte, and the states agree with hand computation.

torchtune 0.6.1 needs torchao 0.10.0, which other harnesses cannot share, so the runs happen in
the environment .venv/torchtune (created with --system-site-packages: torch comes from here), in a
subprocess; without it the tests skip and say how to create it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "torchtune" / "bin" / "python"
RECORDS = ROOT / "tests" / "data" / "measured" / "torchtune"

needs_venv = pytest.mark.skipif(
    not VENV_PYTHON.exists(),
    reason="no torchtune environment: python -m venv --system-site-packages .venv/torchtune && "
           ".venv/torchtune/bin/pip install torchtune==0.6.1 torchao==0.10.0 -c <file pinning torch>")


@pytest.fixture(scope="module")
def selftest():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([str(VENV_PYTHON), "-m", "validation.torchtune", "selftest"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def block(n: int) -> int:  # the CUDA caching allocator's 512-byte rounding (validation/core/tracker.py)
    return -(-n // 512) * 512


# The tiny Llama 3.1 (torchtune llama3_1 component builder: 2 layers, dim 64, 4 heads of 16 over 2
# KV heads, MLP 160, vocab 1000, untied): token embeddings, output, final norm; per layer q, k, v,
# o, w1, w2, w3 and two norms.
TINY_NUMELS = [1000 * 64, 1000 * 64, 64] + 2 * [64 * 64, 32 * 64, 32 * 64, 64 * 64,
                                               160 * 64, 64 * 160, 160 * 64, 64, 64]
BF16_WEIGHTS = sum(block(2 * n) for n in TINY_NUMELS)


@needs_venv
def test_fake_measurement_equals_real_cpu_run(selftest):
    assert len(selftest) == 13
    for name, result in selftest.items():
        assert result["fake"] == result["real"], name


@needs_venv
def test_parameters_and_fused_adamw_states_by_hand(selftest):
    m = selftest["plain"]["fake"]
    assert all(p["parameters"] == BF16_WEIGHTS for p in m["phases"].values())
    assert m["parameter_count"] == sum(TINY_NUMELS)
    assert m["phases"]["optimizer"]["gradients"] == BF16_WEIGHTS  # bf16 gradients, all alive
    # exp_avg and exp_avg_sq in bf16, and fused AdamW's fp32 step counter per parameter on the GPU
    assert m["optimizer_states"] == 2 * BF16_WEIGHTS + 512 * len(TINY_NUMELS)


@needs_venv
def test_rope_cache_stays_on_the_gpu(selftest):
    # torchtune's Llama 3.1 RoPE: theta (head_dim/2 fp32) and a cache of max_seq_len x head_dim/2
    # x 2 fp32 (cos, sin), one module shared by every layer
    assert selftest["plain"]["fake"]["buffer_bytes"] == block(8 * 4) + block(512 * 8 * 2 * 4)
    # Qwen2's cache is max_seq_len x 2 head_dim: cos and sin of the duplicated frequencies
    assert selftest["qwen2"]["fake"]["buffer_bytes"] == block(8 * 4) + block(512 * 32 * 4)
    # torchtune's lora_qwen2 builds one RoPE module per layer (lora_qwen2_self_attention): two caches
    # in the 2-layer model, in the real CPU run as in the fake one
    assert selftest["qwen2-lora"]["real"]["buffer_bytes"] == 2 * (block(8 * 4) + block(512 * 32 * 4))


@needs_venv
def test_optimizer_in_backward_never_holds_every_gradient(selftest):
    plain, inbwd = selftest["plain"]["fake"], selftest["inbwd"]["fake"]
    assert inbwd["phases"]["optimizer"]["gradients"] == 0  # each was freed by its own step
    assert max(p["gradients"] for p in inbwd["phases"].values()) < BF16_WEIGHTS
    assert inbwd["optimizer_states"] == plain["optimizer_states"]


@needs_venv
def test_adamw8bit_states_by_hand(selftest):
    """torchao AdamW8bit (torchao/optim/adam.py `_new_buffer`): a tensor of at least 4096 values
    divisible by the block of 256 gets uint8 codes, one fp32 scale per block and a 256-entry fp32
    code map, per state; smaller ones a plain zeros_like (bf16 here). Its step count is a CPU
    scalar."""
    def state(n):
        if n >= 4096 and n % 256 == 0:
            return block(n) + block(n // 256 * 4) + block(256 * 4)
        return block(2 * n)
    assert selftest["adamw8bit"]["fake"]["optimizer_states"] == sum(2 * state(n) for n in TINY_NUMELS)


@needs_venv
def test_savers_lower_the_peak(selftest):
    peak = {name: r["fake"]["peak_bytes"] for name, r in selftest.items()}
    assert peak["offload"] < peak["plain"]
    assert peak["ac-chunked"] < peak["plain"]
    assert peak["ac-offload-inbwd"] < peak["ac-chunked"]


def lora_bytes(shapes) -> tuple[int, int, int]:
    """bf16 adapters of rank 8 (torchtune LoRALinear keeps them in the model's dtype): elements,
    bytes and tensors for (in, out) pairs, per layer, 2 layers."""
    elements = 2 * sum(8 * (i + o) for i, o in shapes)
    nbytes = 2 * sum(block(8 * i * 2) + block(o * 8 * 2) for i, o in shapes)
    return elements, nbytes, 2 * 2 * len(shapes)


def nf4_bytes(n: int) -> int:
    """torchao NF4 of n weights: codes two per byte, an int8 scale per 64, a bf16 factor per 256
    scales, a bf16 mean, the 16-entry bf16 code book; one allocation each."""
    return block(n // 2) + block(n // 64) + block(n // 64 // 256 * 2) + block(2) + block(16 * 2)


@needs_venv
def test_lora_states_by_hand(selftest):
    # the 8B_lora_single_device targets: q, v, output_proj, w1, w2, w3 of the tiny Llama
    _, adapters, tensors = lora_bytes([(64, 64), (64, 32), (64, 64), (64, 160), (160, 64), (64, 160)])
    m = selftest["lora"]["fake"]
    assert m["parameters"] == BF16_WEIGHTS + adapters
    assert m["phases"]["optimizer"]["gradients"] == adapters  # the frozen base gets none
    assert m["optimizer_states"] == 2 * adapters + 512 * tensors


@needs_venv
def test_qlora_nf4_base_by_hand(selftest):
    h, kv, ffn, vocab = 256, 128, 512, 1000
    base = [h * h, kv * h, kv * h, h * h, ffn * h, h * ffn, ffn * h]  # q, k, v, output_proj, w1, w2, w3
    frozen = 2 * (sum(nf4_bytes(n) for n in base) + 2 * block(h * 2)) + 2 * block(vocab * h * 2) + block(h * 2)
    _, adapters, _ = lora_bytes([(h, h), (h, kv), (h, h), (h, ffn), (ffn, h), (h, ffn)])
    assert selftest["qlora-offload"]["fake"]["parameters"] == frozen + adapters


@needs_venv
def test_sharded_lora_keeps_gradients_of_the_adapters_shards_only(selftest):
    """lora_finetune_distributed on 2 fake ranks: every parameter is a dim-0 shard (FSDP2), and at the step
    the gradients are the adapters' shards alone; the frozen base (bf16 or NF4) gets none."""
    h, kv, ffn, r = 256, 128, 512, 8
    # lora_a (r x in) and lora_b (out x r) of q, v, output_proj, w1, w2, w3, each split in two along dim 0, bf16
    shapes = [(r, h), (h, r), (r, h), (kv, r), (r, h), (h, r), (r, h), (ffn, r), (r, ffn), (h, r), (r, h), (ffn, r)]
    shards = 2 * sum(block(rows // 2 * cols * 2) for rows, cols in shapes)
    assert shards == 59392
    for name in ("lora-fsdp2", "qlora-fsdp2"):
        assert selftest[name]["fake"]["phases"]["optimizer"]["gradients"] == shards, name
    # the NF4 base's shards are smaller than the bf16 base's
    assert selftest["qlora-fsdp2"]["fake"]["parameters"] < selftest["lora-fsdp2"]["fake"]["parameters"] / 1.9


def test_records_are_complete():
    pytest.importorskip("torch", reason="the case definitions need torch (the [validate] extra)")
    records = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]
    assert len(records) >= 10
    sys.path.insert(0, str(ROOT))
    from validation.torchtune.cases import CASES, contract_config

    assert {r["id"] for r in records} == set(CASES)
    for r in records:
        assert r["config"] == contract_config(CASES[r["id"]])
        assert r["versions"]["torchtune"] == "0.6.1" and r["versions"]["torchao"] == "0.10.0"
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        assert r["command"] == f"python -m validation.torchtune measure {r['id']}"
