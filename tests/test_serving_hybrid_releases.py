"""Hybrid models (Mamba-1, Mamba-2, Gated DeltaNet beside attention) on vLLM 0.11 to 0.33, release by release
(estimator/serving/recurrent_state.py, the VllmRules hybrid fields): against what each release's own code computes
on CPU (tests/data/serving/hybrid/vllm-*.json, made by validation/vllm/hybrid_releases.py), and by hand from the
releases' source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import kv_cache, recurrent_state
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.vllm_versions import rules_for
from estimator.serving.weights import stage_layers
from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving, Speculative

DATA = Path(__file__).parent / "data" / "serving" / "hybrid"
RELEASES = ("0.15.0", "0.17.0", "0.18.0", "0.19.0", "0.20.0", "0.21.0", "0.25.0")
QWEN3_NEXT = "qwen3-next-80b-a3b"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def serve(model: str, gpu: str = "h100-80", tp: int = 1, **serving):
    return estimate_vllm(get_architecture(model), Serving(**serving), Parallel(tp=tp), Hardware(gpu),
                         get_hf_config(model))


def eagle(k: int) -> Speculative:
    return Speculative(method="eagle", num_speculative_tokens=k)


def _records():
    for release in RELEASES:
        data = json.loads((DATA / f"vllm-{release}.json").read_text())
        assert "-m validation.vllm.hybrid_releases --out" in data["command"], "each file names the command that made it"
        assert data["vllm_version"] == release
        for r in data["records"]:
            c = r["case"]
            yield pytest.param(r, id=f"{release}-{c['model']}-{c['gpu']}-tp{c['tp']}-pc{int(c['prefix_caching'])}"
                                     f"-k{c['num_speculative_tokens']}")


@pytest.mark.parametrize("record", list(_records()))
def test_hybrid_layout_matches_each_release(record):
    """The block, the states' mode, the state pages a request holds, the groups and, on the memory our estimate left,
    the blocks, tokens and concurrency: each release's own HybridAttentionMambaModelConfig / _align_hybrid_block_size,
    MambaSpec and get_kv_cache_configs (exact where vLLM's integers are, 3% for the rest)."""
    c, given, vllm = record["case"], record["given"], record["vllm"]
    arch, rules, k = get_architecture(c["model"]), rules_for(c["engine_version"]), c["num_speculative_tokens"]
    layout = recurrent_state.plan(arch, rules, c["gpu"], c["tp"], 2, 2, None, c["prefix_caching"],
                                  eagle(k) if k else None)
    assert (layout.block_size, layout.mode) == (vllm["block_size"], vllm["mamba_cache_mode"])
    assert layout.block_size * kv_cache.attention_page_per_token(arch, c["tp"], 2) == vllm["state_page_bytes"]
    length = c["max_model_len"]
    per_block = cdiv(length, layout.state_every) if layout.state_every else 0
    assert per_block + layout.state_pages == vllm["state_pages_per_request"]
    assert (layout.state_every or (layout.block_size if layout.mode == "align" else length)) == vllm["mamba_block_size"]
    specs = kv_cache.layer_specs(arch, c["tp"], layout.block_size, 2, 2, layout.state_pages, layout.state_every)
    groups = kv_cache.kv_groups(specs, rules.version)
    in_flight = kv_cache.in_flight_tokens(8192, 1, rules.version)  # no sliding window here: unused
    cap = kv_cache.capacity(groups, stage_layers(arch.num_layers, 1), tuple(given["available_kv_bytes"]), length,
                            in_flight, rules.kv_tokens_rule)
    assert groups.count == vllm["num_groups"]
    assert cap.num_blocks == vllm["num_blocks"]
    assert abs(cap.tokens - vllm["kv_cache_tokens"]) <= 0.03 * vllm["kv_cache_tokens"]
    assert cap.max_concurrency == pytest.approx(vllm["max_concurrency"], rel=1e-9)


def test_records_cover_every_release_read():
    """Each release read, the four hybrids, both prefix-caching settings, speculative decoding, a B200."""
    for release in RELEASES:
        cases = [r["case"] for r in json.loads((DATA / f"vllm-{release}.json").read_text())["records"]]
        assert {c["model"] for c in cases} == {"nemotron-h-8b", "jamba-mini-1.5", "falcon-h1-7b", QWEN3_NEXT}
        assert {c["prefix_caching"] for c in cases} == {False, True}
        assert any(c["num_speculative_tokens"] for c in cases) and any(c["gpu"] == "b200" for c in cases)
        assert {r["vllm"]["mamba_cache_mode"] for r in json.loads((DATA / f"vllm-{release}.json").read_text())[
            "records"]} == {"none", "all", "align"}


def test_all_mode_by_hand_0_15():
    """0.15.0 model_executor/models/config.py MambaModelConfig: prefix caching on a SupportsMambaPrefixCaching model
    (nemotron_h.py) sets mamba_cache_mode "all"; HybridAttentionMambaModelConfig: chunk = lcm(chunk_size 128, 16),
    block = chunk x cdiv(cdiv(state page, one token's page), chunk). Nemotron-H 8B: state 4,255,744 B (3 x (8,192 +
    2 x 8 x 128) x 2 B + 128 x 64 x 128 x 4 B), token page 2 x 8 x 128 x 2 = 4,096 B: cdiv = 1,039 tokens, block 128 x
    9 = 1,152. MambaSpec.max_memory_usage_bytes ("all"): cdiv(8,192, 1,152) = 8 pages in each of the 6 Mamba groups,
    beside the attention group's 8 blocks. Jamba (Mamba-1, no chunk_size in its config: get_mamba_chunk_size's 2048)
    at TP 2: state (3 + 16) x 4,096 x 2 B = 155,648 B, token page 2 x 4 x 128 x 2 = 2,048 B: 76 tokens, block 2,048;
    131,072 tokens: 64 pages a group, 8 groups."""
    nemotron = serve("nemotron-h-8b", engine_version="0.15", prefix_caching=True)
    assert (nemotron.resolved.block_size, nemotron.capacity.blocks_per_request) == (1152, 8 + 6 * 8)
    # a shared prefix of 4,096 tokens: 3 full blocks, cached in the attention group and in each Mamba group ("all" mode
    # caches a state a block; 0.19.0 MambaManager.find_longest_cache_hit hands a hit request null blocks before it)
    shared = serve("nemotron-h-8b", engine_version="0.15", prefix_caching=True, shared_prefix_tokens=4096)
    assert shared.effective_concurrency == (shared.capacity.num_blocks - 3 * 7) / (56 - 3 * 7)
    jamba = serve("jamba-mini-1.5", tp=2, engine_version="0.15", prefix_caching=True, max_model_len=131072)
    assert (jamba.resolved.block_size, jamba.capacity.blocks_per_request) == (2048, 8 * 64)
    assert any("mamba_cache_mode 'all'" in n for n in nemotron.notes)
    # 0.11.0 turns prefix caching off for every hybrid (MambaModelConfig): one page a state, block 16 x cdiv(1,039, 16)
    old = serve("nemotron-h-8b", engine_version="0.11", prefix_caching=True)
    assert (old.resolved.block_size, old.capacity.blocks_per_request) == (1040, 8 + 6)
    assert any("Prefix caching off although the config sets it on" in n and "MambaModelConfig" in n for n in old.notes)
    # Qwen3-Next (no SupportsMambaPrefixCaching) takes "align": two pages a GDN group (0.15.0 MambaSpec), 16-aligned
    qwen = serve(QWEN3_NEXT, "h200", tp=2, engine_version="0.15", prefix_caching=True, max_model_len=131072)
    assert (qwen.resolved.block_size, qwen.capacity.blocks_per_request) == (544, cdiv(131072, 544) + 3 * 2)


def test_speculative_state_pages_by_release():
    """MambaSpec.num_speculative_blocks = num_speculative_tokens (k = 2 here), and the convolution state grows by k
    rows (MambaStateShapeCalculator num_spec). Qwen3-Next at TP 2 without prefix caching: its state (3 + 2) x 8,192 / 2
    + 16 x 128 x 128 = 282,624 values = 565,248 B, block 16 x cdiv(565,248, 16 x 1,024) = 560 (544 without);
    0.15.0 counts 1 + k pages a GDN group (max_memory_usage_bytes); 0.11.0 one (its MambaSpec ignores them)."""
    arch = get_architecture(QWEN3_NEXT)
    for release, pages in (("0.11", 1), ("0.15", 3), ("0.33", 3)):
        layout = recurrent_state.plan(arch, rules_for(release), "h200", 2, 2, 2, None, False, eagle(2))
        assert (layout.block_size, layout.state_pages) == (560, pages)
        assert any("allocates 1 + 2 at run time" in n for n in layout.notes) == (release == "0.11")
    # Nemotron-H's conv state grows from 0.17.0 (nemotron_h.py passes num_spec; 0.15.0 does not): 4,255,744 + 2 x
    # 10,240 x 2 = 4,296,704 B, block 16 x cdiv(4,296,704, 65,536) = 1,056. With prefix caching 0.17.0-0.19.0 keep
    # "all" with no speculative page, 0.20.0-0.21.0 switch to "align" (2 + k), 0.25.0 "all" + k.
    nemotron = get_architecture("nemotron-h-8b")
    expected = {"0.17": ("all", 1152, 0), "0.19": ("all", 1152, 0), "0.20": ("align", 1056, 4),
                "0.21": ("align", 1056, 4), "0.25": ("all", 1152, 2), "0.33": ("align", 1056, 2 + 2 + 1)}
    for release, (mode, block, pages) in expected.items():
        layout = recurrent_state.plan(nemotron, rules_for(release), "h100-80", 1, 2, 2, None, True, eagle(2))
        assert (layout.mode, layout.block_size, layout.state_pages) == (mode, block, pages)
    without_caching = recurrent_state.plan(nemotron, rules_for("0.19"), "h100-80", 1, 2, 2, None, False, eagle(2))
    assert (without_caching.block_size, without_caching.state_pages) == (1056, 3)
    # Falcon-H1's grows from 0.33.0 (falcon_h1.py; absent in 0.25.0); Jamba's Mamba-1 never
    falcon, jamba = get_architecture("falcon-h1-7b"), get_architecture("jamba-mini-1.5")
    # 0.33.0 align mode: Falcon-H1's MambaMixer2 adds a prefill checkpoint page, Jamba's MambaMixer none
    assert [recurrent_state.plan(a, rules_for("0.33"), "h100-80", 1, 2, 2, None, True, None).state_pages
            for a in (falcon, jamba)] == [3, 2]
    assert [recurrent_state.speculative_conv_rows(falcon, rules_for(v), 2) for v in ("0.25", "0.33")] == [0, 2]
    assert recurrent_state.speculative_conv_rows(jamba, rules_for("0.33"), 2) == 0


def test_what_releases_refuse():
    """0.11.0 gpu_model_runner.py and 0.15.0 layers/mamba/abstract.py: 'Mamba with speculative decoding is not supported
    yet' but for qwen3_next; 0.15.0 MambaModelConfig asserts 'align' is not compatible with speculative decoding. 0.17.0
    runs both."""
    for release in ("0.11", "0.15"):
        with pytest.raises(ConfigError, match=r"serving.speculative.method"):
            serve("nemotron-h-8b", engine_version=release, speculative=eagle(2))
    with pytest.raises(ConfigError, match=r"serving.prefix_caching"):
        serve(QWEN3_NEXT, "h200", tp=2, engine_version="0.15", prefix_caching=True, speculative=eagle(2))
    assert serve(QWEN3_NEXT, "h200", tp=2, engine_version="0.15", speculative=eagle(2)).capacity.num_blocks > 0
    assert serve("nemotron-h-8b", engine_version="0.17", prefix_caching=True, speculative=eagle(2)).capacity.num_blocks


def test_blackwell_head_256_block_in_0_15_and_0_17():
    """0.15.0 and 0.17.0 HybridAttentionMambaModelConfig: head size 256 on a capability-100 GPU under FlashInfer (the
    default there: platforms/cuda.py _get_backend_priorities) aligns to 32 (flashinfer issue 1993); 0.18.0 drops it
    and 0.20.0-0.33.0 align to FlashInfer's smallest kernel block, 16 (flashinfer.py [16, 32, 64]), as on Hopper (0.33.0
    FlashAttention's FA4 fixed hd256 page of 128 applies only where FLASH_ATTN is chosen on sm100, not by default).
    Qwen3-Next (head 256) at TP 4: state 3 x 8,192 / 4 + 8 x 128 x 128 = 137,216 values = 274,432 B, the single KV
    head 1,024 B a token: 268 tokens, 32 x 9 = 288 on a B200 in 0.15/0.17, 16 x 17 = 272 elsewhere."""
    arch = get_architecture(QWEN3_NEXT)
    blocks = {(release, gpu): recurrent_state.plan(arch, rules_for(release), gpu, 4, 2, 2, None, False, None).block_size
              for release in ("0.11", "0.15", "0.17", "0.18", "0.25", "0.33") for gpu in ("b200", "b300", "h200")}
    assert {key for key, block in blocks.items() if block == 288} == {(r, g) for r in ("0.15", "0.17")
                                                                       for g in ("b200", "b300")}
    assert set(blocks.values()) == {272, 288}
    # the Mamba-based presets' heads are 128 wide: no change on a B200
    nemotron = get_architecture("nemotron-h-8b")
    assert recurrent_state.plan(nemotron, rules_for("0.15"), "b200", 1, 2, 2, None, False, None).block_size == 1040


def test_block_aligned_to_the_requested_block_from_0_20():
    """Up to 0.19.0 the requested block is a floor on 16-token alignment; 0.20.0 platforms/interface.py
    _align_hybrid_block_size aligns to max(smallest kernel block, block_size): Qwen3-Next at TP 2 with --block-size
    48: max(48, 16 x cdiv(548,864, 16 x 1,024)) = 544 in 0.19, 48 x cdiv(548,864, 48 x 1,024) = 576 in 0.20."""
    arch = get_architecture(QWEN3_NEXT)
    sizes = [recurrent_state.plan(arch, rules_for(v), "h200", 2, 2, 2, 48, False, None).block_size
             for v in ("0.19", "0.20", "0.25")]
    assert sizes == [544, 576, 576]


def test_eagle_head_of_a_hybrid_is_an_attention_layer():
    """An EAGLE head is a Llama decoder layer (llama_eagle.py): its KV layer joins the full-attention group. Qwen3-Next
    (12 attention + 36 GDN layers) with the head: 13 attention layers, group size 13, the GDN layers in 3 groups; at
    131,072 tokens with k = 2 under 0.19: cdiv(131,072, 560) = 235 attention blocks + 3 x (1 + 2) state pages."""
    ours = serve(QWEN3_NEXT, "h200", tp=2, engine_version="0.19", max_model_len=131072, speculative=eagle(2))
    assert ours.resolved.block_size == 560
    assert ours.capacity.blocks_per_request == 235 + 3 * 3 == cdiv(131072, 560) + 9
