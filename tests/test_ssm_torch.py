"""training.ssm_kernels "torch": the Mamba-2 mixers on transformers' torch fallback, what runs without mamba-ssm and
causal-conv1d (estimator/memory/activations/mamba_torch.py). By hand (one term), against the autograd graph of real
CPU mixers (every saved tensor), and against the HF harness's fake-tensor records of the fallback
(tests/data/measured/ssm_torch/, `python -m validation.gpu.fallback --write CASE`)."""

import json
from pathlib import Path

import pytest

from estimator import Architecture, ConfigError, estimate_config
from estimator.memory.activations.hybrid import mamba_mixer_entries
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

RECORDS = sorted((Path(__file__).parent / "data" / "measured" / "ssm_torch").glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_records_are_there():
    """Falcon-H1's two GPU cases (0.5B, no gated norm), Falcon-H1-7B (gated norm) and Nemotron-H-8B, with and
    without recompute, each measured on the fallback under transformers 5.23."""
    ids = {p.stem for p in RECORDS}
    assert {"falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2",
            "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1"} <= ids
    assert any(i.startswith("falcon-h1-7b") for i in ids) and any(i.startswith("nemotron-h-8b") for i in ids)
    for path in RECORDS:
        record = load(path)
        assert record["config"]["training"]["ssm_kernels"] == "torch" and record["versions"]["transformers"] == "5.23.0"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_peak_is_the_fallbacks(path):
    """The allocated peak within 5% of the fake-tensor step on the torch path (the estimate's peak less its cuBLAS
    workspaces, which the harness does not see)."""
    record = load(path)
    result = estimate_config(record["config"])
    stage = result.stages[result.peak_stage]
    peak = stage.allocated_peak_bytes - stage.component("workspace").bytes
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.05)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_every_phase_is_the_fallbacks(path):
    """Forward, backward and the optimizer step each within 5% of the record's phase (the workspaces aside): to
    0.05% but for the backward of a recomputed layer, where the einsums' gradients (not modelled) leave Falcon-H1-7B
    0.4% and Nemotron-H-8B 2.1% under (both records peak in the optimizer step), and Qwen3-Next-80B-A3B's Gated
    DeltaNet (forward +0.06%, backward -0.2%: its per-chunk gradients not modelled)."""
    record = load(path)
    result = estimate_config(record["config"])
    for phase in result.stages[result.peak_stage].phases:
        estimated = sum(c.bytes for c in phase.components if c.key != "workspace")
        assert estimated == pytest.approx(record["measured"]["phases"][phase.name]["total"], rel=0.05), phase.name


def test_the_fallback_is_what_the_fused_kernel_is_not():
    """Falcon-H1-0.5B at 2 x 4,096 tokens: the fallback's step holds 3.2x the fused kernel's (the fake records:
    65.99 GB and 20.34 GB)."""
    fused = next(p for p in (RECORDS[0].parents[1]).glob("falcon-h1-0.5b-*-s4096-b2.json"))
    config = load(fused)["config"]
    torch_config = json.loads(json.dumps(config))
    torch_config["training"]["ssm_kernels"] = "torch"
    ratio = estimate_config(torch_config).stages[0].allocated_peak_bytes / \
        estimate_config(config).stages[0].allocated_peak_bytes
    assert 3.1 < ratio < 3.4


def test_one_term_by_hand():
    """Falcon-H1-0.5B (24 heads of 64, n = 128, one group, chunks of 128) at b = 2, s = 4,096: 32 chunks, no padding.
    L, G and M's copy: 3 x 4 B x b x c x L x H x L = 12 x 2 x 32 x 128 x 24 x 128 = 301,989,888 B; the conv's output
    s + k - 1 = 4,099 long over H p + 2 g n = 1,792 channels: 2 B x 2 x 4,099 x 1,792 = 29,381,632 B; the chunk
    states (33 with the initial one) and the 32 chunk-start states' copy: 4 B x 2 x 65 x 24 x 64 x 128 =
    102,236,160 B."""
    arch = Architecture(hidden_size=1024, num_layers=36, num_attention_heads=8, num_kv_heads=2, head_dim=64,
                        vocab_size=32784, intermediate_size=2048, parallel_mamba=True, mamba_num_heads=24,
                        mamba_head_dim=64, mamba_state_size=128, mamba_num_groups=1, mamba_chunk_size=128,
                        mamba_gated_norm=False)
    training = Training(framework="hf", seq_len=4096, micro_batch_size=2, ssm_kernels="torch")
    entries = {e.name: e for e in mamba_mixer_entries(arch, training, Parallel(), "in_proj input")}
    par = Parallel()
    assert entries["L = exp(segment sums), G = C B^T and M's copy per chunk (fp32)"].bytes(par) == 301_989_888
    assert entries["conv output, k - 1 positions longer (kept by its SiLU)"].bytes(par) == 29_381_632
    assert entries["chunk states with the initial one, and the chunk-start states' copy (fp32)"].bytes(par) == \
        102_236_160


def _saved_bytes(output, exclude: set[int]) -> int:
    """The bytes of every storage a node of `output`'s autograd graph saves, once each, less `exclude` (parameters,
    buffers, the input) and host-side 0-d scalars (a Python number autograd wraps: on a GPU it stays on the host)."""
    import torch

    seen, storages, stack = set(), {}, [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            value = getattr(node, attr)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor) and t.dim() > 0 and t.untyped_storage().data_ptr() not in exclude:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        stack.extend(f for f, _ in node.next_functions)
    return sum(storages.values())


@pytest.mark.parametrize("model, seq, gated", [("falcon_h1", 64, False), ("falcon_h1", 60, False),
                                               ("falcon_h1", 60, True), ("nemotron_h", 60, True)])
def test_every_saved_tensor_of_a_real_mixer(model, seq, gated):
    """A tiny mixer of transformers 5.23 on CPU in bf16 (its torch path: no mamba-ssm here), 3 x seq tokens, 6 heads
    of 10, n = 12, 2 groups, chunks of 16 (60 tokens: the last chunk padded): the storages its autograd graph keeps
    are the ledger's, to the byte, from in_proj's input on."""
    import torch

    H, p, n, g, L, b, h = 6, 10, 12, 2, 16, 3, 64
    if model == "falcon_h1":
        from transformers import FalconH1Config
        from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer
        config = FalconH1Config(hidden_size=h, mamba_n_heads=H, mamba_d_head=p, mamba_d_ssm=H * p, mamba_d_state=n,
                                mamba_n_groups=g, mamba_chunk_size=L, mamba_rms_norm=gated, mamba_norm_before_gate=False,
                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        mixer = FalconH1Mixer(config, 0)
        mixer.register_buffer("mup_vector", torch.ones(2 * H * p + 2 * g * n + H))  # FalconH1Model sets it
    else:
        from transformers import NemotronHConfig
        from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer
        config = NemotronHConfig(hidden_size=h, mamba_num_heads=H, mamba_head_dim=p, ssm_state_size=n, n_groups=g,
                                 chunk_size=L, num_hidden_layers=1, layers_block_type=["mamba"])
        mixer = NemotronHMamba2Mixer(config, 0)
    mixer = mixer.to(torch.bfloat16).train()
    x = torch.randn(b, seq, h, dtype=torch.bfloat16, requires_grad=True)
    exclude = {t.untyped_storage().data_ptr() for t in [*mixer.parameters(), *mixer.buffers(), x]}
    measured = _saved_bytes(mixer(x), exclude)
    arch = Architecture(hidden_size=h, num_layers=1, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                        vocab_size=1000, intermediate_size=128, parallel_mamba=True, mamba_num_heads=H,
                        mamba_head_dim=p, mamba_state_size=n, mamba_num_groups=g, mamba_chunk_size=L,
                        mamba_gated_norm=gated)
    training = Training(framework="hf", seq_len=seq, micro_batch_size=b, ssm_kernels="torch")
    entries = mamba_mixer_entries(arch, training, Parallel(), "in_proj input")
    if model == "nemotron_h":  # its in_proj reads the block norm's output: the input here, excluded above
        entries = entries[1:]
    assert sum(e.bytes(Parallel()) for e in entries) == measured


@pytest.mark.parametrize("b, seq, h, n, r", [(2, 5, 16, 4, 4), (3, 7, 24, 6, 5)])
def test_every_saved_tensor_of_a_real_mamba1_mixer(b, seq, h, n, r):
    """Jamba's Mamba-1 mixer (transformers 5.23 JambaMambaMixer, bf16 on CPU: causal_conv1d_fn's and
    mamba_selective_scan's torch code, the recurrent loop over the tokens): the storages its autograd graph keeps
    are the ledger's (memory/activations/mamba_torch.py torch_mamba1_entries), to the byte, from in_proj's input on."""
    import torch
    from transformers import JambaConfig
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    from estimator.memory.activations.hybrid import mamba1_entries

    config = JambaConfig(hidden_size=h, mamba_expand=2, mamba_d_state=n, mamba_dt_rank=r, mamba_d_conv=4,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, num_experts=1)
    mixer = JambaMambaMixer(config, 0).to(torch.bfloat16).train()
    x = torch.randn(b, seq, h, dtype=torch.bfloat16, requires_grad=True)
    exclude = {t.untyped_storage().data_ptr() for t in [*mixer.parameters(), *mixer.buffers(), x]}
    measured = _saved_bytes(mixer(x), exclude)
    arch = Architecture(hidden_size=h, num_layers=2, num_attention_heads=4, num_kv_heads=2, vocab_size=100,
                        intermediate_size=32, attention_layer_period=2, attention_layer_offset=1, mamba_expand=2,
                        mamba_state_size=n, mamba_dt_rank=r, mamba_conv_kernel=4)
    entries = mamba1_entries(arch, Training(framework="hf", seq_len=seq, micro_batch_size=b, ssm_kernels="torch"),
                             Parallel())
    after_input = [e.name for e in entries].index("in_proj input") + 1  # its input is the mixer's input here
    assert sum(e.bytes(Parallel()) for e in entries[after_input:]) == measured


@pytest.mark.parametrize("changes, allowed", [
    ({"ssm_kernels": "triton"}, "one of 'fused', 'torch', 'torch_5.17'"),
    ({"ssm_kernels": "torch_5.17", "framework": "fsdp2"}, "'fused' unless framework is 'hf', 'deepspeed', 'fsdp1' or 'hf_fsdp2'"),
    ({"ssm_kernels": "torch", "framework": "megatron"}, "'fused' unless framework is 'hf', 'deepspeed', 'fsdp1' or 'hf_fsdp2'"),
    ({"ssm_kernels": "torch", "compile": True}, "'fused' with compile on"),
])
def test_a_bad_value_names_the_field(changes, allowed):
    with pytest.raises(ConfigError) as caught:
        Training(**{"framework": "hf", **changes})
    assert caught.value.field == "training.ssm_kernels" and allowed in str(caught.value)


def test_a_model_without_ssm_layers_refuses_the_fallback():
    """Llama has no Mamba or linear-attention layer: naming their kernels there is an input with no effect."""
    with pytest.raises(ConfigError) as caught:
        estimate_config({"model": "llama-3.2-1b", "training": {"framework": "hf", "ssm_kernels": "torch"}})
    assert caught.value.field == "training.ssm_kernels" and "without Mamba or linear-attention layers" in str(
        caught.value)


# transformers 5.17 and earlier (ssm_kernels "torch_5.17"): the H200's two runs (tests/test_accuracy.py holds them to
# 5%) and the fake-tensor steps of 5.17.0 (MAMBA_FALLBACK_FAKE_PEAKS)
def test_the_broadcast_products_by_hand():
    """Falcon-H1-0.5B at b = 2, s = 4,096 (32 chunks of L = 128, H = 24, p = 64, n = 128): G's product
    b x c x L x L x H x n in fp32 = 4 x 2 x 32 x 128 x 128 x 24 x 128 = 12,884,901,888 B, the largest (Y_diag's has
    p = 64 for n: half); backward makes both operands' gradients at its size: 25,769,803,776 B."""
    from estimator.memory.activations.mamba_torch import broadcast_products
    from estimator.memory.mamba_torch_moment import broadcast_backward_moment

    arch = Architecture(hidden_size=1024, num_layers=36, num_attention_heads=8, num_kv_heads=2, head_dim=64,
                        vocab_size=32784, intermediate_size=2048, parallel_mamba=True, mamba_num_heads=24,
                        mamba_head_dim=64, mamba_state_size=128, mamba_num_groups=1, mamba_chunk_size=128,
                        mamba_gated_norm=False)
    training = Training(framework="hf", seq_len=4096, micro_batch_size=2, ssm_kernels="torch_5.17")
    products = broadcast_products(arch, training, Parallel())
    assert products["G = (C * B).sum(-1): b x c x L x L x H x n"] == 12_884_901_888
    assert products["Y_diag = (M * x).sum(3): b x c x L x L x H x p"] == 6_442_450_944
    [moment] = broadcast_backward_moment(arch, training, Parallel())
    assert moment.bytes == 25_769_803_776


def test_the_fake_steps_of_transformers_5_17():
    """The estimate with ssm_kernels 'torch_5.17' (the GPU records' configs) less its workspaces within 5% of the
    5.17.0 fake-tensor peaks: +0.12% and +0.82% (the recomputed mixer's freed tensors and live gradients left out)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_accuracy import MAMBA_FALLBACK_FAKE_PEAKS

    for case, fake in MAMBA_FALLBACK_FAKE_PEAKS.items():
        record = load(Path(__file__).parent / "data" / "measured" / "gpu" / f"{case}.json")
        assert record["config"]["training"]["ssm_kernels"] == "torch_5.17"
        result = estimate_config(record["config"])
        stage = result.stages[result.peak_stage]
        assert stage.allocated_peak_bytes - stage.component("workspace").bytes == pytest.approx(fake, rel=0.05)


def test_what_ran_out_of_memory_on_the_h200():
    """validation/gpu/cases.py FALLBACK_ONLY_MODELS: on the H200 (143,771 MiB, transformers 5.17's fallback) every
    Nemotron-H-8B and Falcon-H1-7B case ran out of memory (2026-11-26); estimated with ssm_kernels 'torch_5.17' each
    needs more than the card holds (the least, Falcon-H1-7B with recompute at 8k: 154.7 GB)."""
    from validation.gpu.cases import FALLBACK_ONLY_MODELS

    measured = Path(__file__).parent / "data" / "measured"
    paths = [p for m in FALLBACK_ONLY_MODELS for p in sorted(measured.glob(f"{m}-*.json"))]
    assert len(paths) == 9
    for path in paths:
        config = load(path)["config"]
        config["training"]["ssm_kernels"] = "torch_5.17"
        config["hardware"] = {"gpu": "h200"}
        result = estimate_config(config)
        assert result.stages[result.peak_stage].allocated_peak_bytes > 143_771 * 2**20, path.stem


@pytest.mark.parametrize("model", ["tiny-falcon-h1", "tiny-falcon-h1-plain", "tiny-nemotron-h", "tiny-jamba",
                                   "tiny-qwen3-next"])
def test_the_tiny_models_fallback_against_their_fused_kernels(model):
    """The HF harness's tiny hybrids (validation/hybrid/models.py), 2 x 64 tokens, fake tensors: the fallback's
    backward peak less the emulated kernels' (validation.gpu.fallback) is the estimate's 'torch' less its 'fused',
    to 2% (the harness rounds every storage to 512 B; Jamba's with its loop's select gradients, +1.6%)."""
    from validation.gpu.fallback import torch_fallback
    from validation.hf.cases import contract_config
    from validation.hf.step import Run, measure

    run = Run(model, 64, 2)
    fused = measure(run, fake=True)["phases"]["backward"]["total"]
    with torch_fallback():
        fallback = measure(run, fake=True)["phases"]["backward"]["total"]
    config = contract_config(run)

    def backward(kernels: str) -> int:
        config["training"]["ssm_kernels"] = kernels
        stage = estimate_config(config).stages[0]
        phase = next(p for p in stage.phases if p.name == "backward")
        return sum(c.bytes for c in phase.components)

    assert backward("torch") - backward("fused") == pytest.approx(fallback - fused, rel=0.02)


def test_the_mamba1_loops_backward_on_a_real_mixer():
    """A real CPU Jamba mixer (bf16, 2 x 32 tokens, d = 64, n = 16) under the harness's storage tracker: its
    backward's peak is 3.95 (b, d, s, n) fp32 tensors over what its forward left (discrete_A, discrete_B and the
    states): the two select gradients accumulated, a step's zero tensor and their sum, less what its first steps
    freed; the estimate charges four."""
    import torch
    from transformers import JambaConfig
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    from estimator.memory.mamba_torch_moment import mamba1_backward_moment
    from validation.core.tracker import StorageTracker

    b, seq, h, n = 2, 32, 32, 16
    config = JambaConfig(hidden_size=h, mamba_expand=2, mamba_d_state=n, mamba_dt_rank=4, mamba_d_conv=4,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, num_experts=1)
    mixer = JambaMambaMixer(config, 0).to(torch.bfloat16).train()
    x = torch.randn(b, seq, h, dtype=torch.bfloat16, requires_grad=True)
    tracker = StorageTracker()
    with tracker:
        tracker.start()
        y = mixer(x)
        after_forward = sum(delta for _, delta in tracker.events)
        y.backward(torch.ones_like(y))
    live, peak = 0, 0
    for _, delta in tracker.events:
        live += delta
        peak = max(peak, live)
    full = 4 * b * seq * 2 * h * n
    assert peak - after_forward == 1_034_240 == round(3.9453125 * full)
    arch = Architecture(hidden_size=h, num_layers=2, num_attention_heads=4, num_kv_heads=2, vocab_size=100,
                        intermediate_size=32, attention_layer_period=2, attention_layer_offset=1, mamba_expand=2,
                        mamba_state_size=n, mamba_dt_rank=4, mamba_conv_kernel=4)
    [moment] = mamba1_backward_moment(arch, Training(framework="hf", seq_len=seq, micro_batch_size=b,
                                                     ssm_kernels="torch"), Parallel())
    assert moment.bytes == 4 * full == pytest.approx(peak - after_forward, rel=0.02)


def test_the_notes_say_which_kernels():
    """Every estimate of a Mamba or Gated DeltaNet hybrid under transformers says which kernels it assumed and what
    the other path keeps more per mixer."""
    config = {"model": "falcon-h1-7b", "training": {"framework": "hf", "seq_len": 4096, "micro_batch_size": 1}}
    fused = estimate_config(config)
    assert any(n.startswith("SSM kernels 'fused'") and "(44 mixers)" in n for n in fused.notes)
    config["training"]["ssm_kernels"] = "torch"
    torch_ = estimate_config(config)
    assert any(n.startswith("SSM kernels 'torch'") for n in torch_.notes)
    qwen = {"model": "qwen3-next-80b-a3b", "training": {"framework": "hf", "seq_len": 4096, "micro_batch_size": 1}}
    plain = estimate_config(qwen)
    qwen["training"]["ssm_kernels"] = "torch"
    said = estimate_config(qwen)
    def forward(result) -> int:  # its peak is the optimizer step's (80B parameters' states)
        return sum(c.bytes for c in next(p for p in result.stages[0].phases if p.name == "forward").components)

    assert forward(said) - forward(plain) == pytest.approx(36 * 0.96 * 2**30, rel=0.01)  # the note's 0.96 GiB
    assert any(n.startswith("SSM kernels 'fused': the Gated DeltaNet") and "(36 layers)" in n for n in plain.notes)
    assert any(n.startswith("SSM kernels 'torch': the Gated DeltaNet") for n in said.notes)


@pytest.mark.parametrize("b, seq, hk, hv, K, V", [(3, 100, 2, 4, 12, 10), (2, 128, 2, 4, 12, 10), (3, 70, 4, 4, 8, 8),
                                                  (2, 64, 2, 4, 16, 16)])
def test_every_saved_tensor_of_a_real_gated_deltanet(b, seq, hk, hv, K, V):
    """Qwen3-Next's Gated DeltaNet (transformers 5.23 Qwen3NextGatedDeltaNet, bf16 on CPU: causal_conv1d_fn's and
    torch_chunk_gated_delta_rule's torch code, chunks of 64; 100 and 70 tokens pad the last, 64 make one): the storages its
    autograd graph keeps are the ledger's (gated_delta_net_entries with memory/activations/gdn_torch.py), to the byte,
    from in_proj's input on."""
    import torch
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from estimator.memory.activations.hybrid import gated_delta_net_entries

    h = 48
    config = Qwen3NextConfig(hidden_size=h, linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=K,
                             linear_value_head_dim=V, linear_conv_kernel_dim=4, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    layer = Qwen3NextGatedDeltaNet(config, 0).to(torch.bfloat16).train()
    x = torch.randn(b, seq, h, dtype=torch.bfloat16, requires_grad=True)
    exclude = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers(), x]}
    measured = _saved_bytes(layer(x), exclude)
    arch = Architecture(hidden_size=h, num_layers=4, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                        vocab_size=100, intermediate_size=32, full_attention_interval=4, linear_num_key_heads=hk,
                        linear_num_value_heads=hv, linear_key_head_dim=K, linear_value_head_dim=V,
                        linear_conv_kernel_dim=4)
    entries = gated_delta_net_entries(arch, Training(framework="hf", seq_len=seq, micro_batch_size=b,
                                                     ssm_kernels="torch"), Parallel())
    after_input = [e.name.startswith("in_proj input") for e in entries].index(True) + 1
    assert sum(e.bytes(Parallel()) for e in entries[after_input:]) == measured
