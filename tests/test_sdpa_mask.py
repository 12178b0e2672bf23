"""transformers' SDPA with a 4-D mask (estimator/memory/activations/sdpa_mask.py): Gemma 3's sliding layers from the
window on, held by hand and to the H200's record of what ran."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.memory.activations.sdpa_mask import masked_layer_share, masked_sdpa_entries
from estimator.models.presets import get_architecture
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

MiB = 2**20
GPU = Path(__file__).parent / "data" / "measured" / "gpu"
NORECOMPUTE = "gemma-3-4b-bf16-adamw-norecompute-sdpa-s2048-b2-i4x896"
RECOMPUTE = "gemma-3-4b-bf16-adamw-recompute-sdpa-s4096-b1-i8x896"


def _record(stem: str) -> dict:
    return json.loads((GPU / f"{stem}.json").read_text())


def _gemma3_4b():
    from estimator import load_config
    return load_config(_record(NORECOMPUTE)["config"]).architecture


def test_gemma3_4b_sliding_layers_keep_the_bias_and_the_repeated_kv_by_hand():
    """34 layers, a global one every 6th: 29 slide over 1,024 tokens. At b 2, s 2,048 each keeps its bf16 bias
    (2 x 2048^2 x 2 B = 16 MiB) and k, v at 8 heads rather than 4 (2 x 4096 tokens x 4 heads x 256 x 2 B = 16 MiB
    more): 29 x 32 MiB = 928 MiB over the model."""
    arch = _gemma3_4b()
    training = Training(framework="hf", seq_len=2048, micro_batch_size=2, param_dtype="bf16")
    assert masked_layer_share(arch, training) == pytest.approx(29 / 34)
    entries = masked_sdpa_entries(arch, training, Parallel())
    assert [e.bytes(Parallel()) * 34 for e in entries] == pytest.approx([29 * 16 * MiB, 29 * 16 * MiB])


def test_the_mask_only_where_transformers_builds_one():
    """From the window on (masking_utils _ignore_causal_mask_sdpa: kv_length >= local_attention_size), under the
    transformers frameworks' SDPA only: not below the window, not eager (its own entries), not Megatron, not Gemma 2
    or gpt-oss (off SDPA), not a model without a window; Mistral's window slides in every layer, Llama 4's chunk
    takes the same path from the chunk on (masking_utils create_chunked_causal_mask, local_size the chunk)."""
    gemma = _gemma3_4b()

    def share(arch, **training):
        return masked_layer_share(arch, Training(**dict(dict(framework="hf", param_dtype="bf16"), **training)))

    assert share(gemma, seq_len=1023) == 0 and share(gemma, seq_len=1024) == pytest.approx(29 / 34)
    assert share(gemma, seq_len=2048, framework="deepspeed") == pytest.approx(29 / 34)
    assert share(gemma, seq_len=2048, attention="eager") == 0 and share(gemma, seq_len=2048, framework="megatron") == 0
    assert share(get_architecture("gpt-oss-20b"), seq_len=2048) == 0
    assert share(get_architecture("llama-3.1-8b"), seq_len=8192) == 0
    scout = get_architecture("llama-4-scout")  # 36 chunked layers of 48 (a global NoPE layer every 4th)
    assert share(scout, seq_len=8191) == 0 and share(scout, seq_len=8192) == 36 / 48
    mistral = get_architecture("mistral-7b")
    assert share(mistral, seq_len=4095) == 0 and share(mistral, seq_len=4096) == 1
    gemma2 = json.loads((GPU / "gemma-2-9b-bf16-adamw-norecompute-eager-s2048-b1.json").read_text())["config"]
    gemma2["training"]["attention"] = "flash"
    from estimator import load_config
    loaded = load_config(dict(gemma2, training=dict(gemma2["training"], seq_len=8192)))
    assert loaded.architecture.attention_logit_softcapping
    assert masked_layer_share(loaded.architecture, loaded.training) == 0


def test_the_h200_gemma3_step_as_it_ran():
    """The H200's Gemma 3 4B step on SDPA (no flash-attn installed; tests/data/measured/gpu): the forward's end and
    the backward's peak to 0.15% (1.07% under before the masked path; the rest is the 89 MiB every vision-language
    record of that run shows). Its recompute twin keeps none of it between layers: the extra tensors live inside
    the one layer recomputed at a time, below the loss's backward moment, and its step peaks in the optimizer."""
    record = _record(NORECOMPUTE)
    phases = {p.name: p.allocated_bytes for p in estimate_config(record["config"]).stages[0].phases}
    for phase in ("forward", "backward"):
        assert phases[phase] == pytest.approx(record["measured"]["phases"][phase]["peak_bytes"], rel=0.0015)
    twin = _record(RECOMPUTE)
    result = estimate_config(twin["config"])
    assert result.stages[0].peak_phase == "optimizer" == twin["measured"]["peak_phase"]
    assert result.allocated_peak_bytes == pytest.approx(twin["measured"]["peak_bytes"], rel=0.003)


def test_transformers_sends_the_sliding_layers_a_mask_and_repeated_kv():
    """A tiny Gemma 3 text model on SDPA (transformers 5.23, a real CPU run, what reaches torch's SDPA recorded):
    below the 8-token window every layer goes unmasked with its 2 grouped KV heads (enable_gqa); from the window
    on the 5 sliding layers get a b x 1 x s x s bool mask and k, v repeated to the 4 query heads, the global
    layer (every 6th) stays unmasked."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                                           vocab_size=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config)
    calls, original = [], torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, **kwargs):
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)
        calls.append((k.shape[1], v.shape[1], mask, kwargs.get("enable_gqa", False)))
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recorded
    try:
        seen = {}
        for s in (7, 8):
            calls.clear()
            with torch.no_grad():
                model(torch.zeros(2, s, dtype=torch.long))
            seen[s] = list(calls)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert seen[7] == [(2, 2, None, True)] * 6
    assert seen[8] == [(4, 4, ((2, 1, 8, 8), torch.bool), False)] * 5 + [(2, 2, None, True)]
