"""Megatron flags that change memory (GitHub issue #13): --moe-router-dtype, --no-masked-softmax-fusion
and --cross-entropy-fusion-impl, each checked against numbers computed by hand from the sources the
estimator cites (and, for the records in tests/data/measured/megatron, by the harness)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.memory.activations.moe import moe_expert_backward_moment
from estimator.memory.megatron_pp_grad import LABEL as RECEIVED
from estimator import estimate_config
from estimator.models.loading import load_config
from estimator.spec.errors import ConfigError
from validation.core.report import tensors_peak

MEASURED = Path(__file__).parent / "data" / "measured" / "megatron"
MiB = 2**20


def _record_config(case: str) -> dict:
    return json.loads((MEASURED / f"{case}.json").read_text())["config"]


def _ledger(config: dict) -> dict[str, int]:
    return {line.name: line.bytes for line in estimate_config(config).activation_ledger}


def _transients(config: dict, stage: int) -> dict[str, int]:
    st = estimate_config(config).stages[stage]
    return {p.name: next(c.bytes for c in p.components if c.key == "transient") for p in st.phases}


GPT3_EAGER = {"model": {"hidden_size": 12288, "num_layers": 96, "num_attention_heads": 96, "intermediate_size": 49152,
                        "vocab_size": 51200, "gated_mlp": False, "norm": "layernorm", "linear_bias": True,
                        "position_embedding": "learned", "max_position_embeddings": 2048},
              "training": {"seq_len": 2048, "attention": "eager"}, "parallel": {"tp": 8, "pp": 8}}


def _gpt3(**training) -> dict:
    return {**GPT3_EAGER, "training": {**GPT3_EAGER["training"], **training}}


def test_fused_softmax_keeps_two_bytes_per_score():
    # scaled_upper_triang_masked_softmax keeps its bf16 output: 2 B x a/t x s^2 = 2 x 12 x 2048^2
    ledger = _ledger(_gpt3())
    assert ledger["softmax output (scores)"] == 2 * 12 * 2048 * 2048 == 100_663_296
    assert "causal mask (bool, made per layer)" not in ledger


def test_unfused_softmax_keeps_fp32_probabilities_their_copy_and_the_mask():
    # forward_torch_softmax: fp32 softmax 4 B, bf16 copy 2 B per score; the s x s bool mask per layer
    ledger = _ledger(_gpt3(attention_softmax_fusion=False))
    assert ledger["softmax output (fp32, unfused softmax)"] == 4 * 12 * 2048 * 2048 == 201_326_592
    assert ledger["softmax output cast to the compute dtype"] == 100_663_296
    assert ledger["causal mask (bool, made per layer)"] == 2048 * 2048 == 4_194_304


def test_the_fused_kernel_falls_back_outside_its_shapes():
    # is_kernel_available: sk <= 4096 ...
    assert "softmax output (fp32, unfused softmax)" in _ledger(_gpt3(seq_len=8192))
    # ... and b x heads/t a multiple of 4: 96 heads over TP 16 leave 6 per GPU
    six_heads = {**_gpt3(), "parallel": {"tp": 16, "pp": 8}}
    assert "softmax output (fp32, unfused softmax)" in _ledger(six_heads)
    assert "softmax output (scores)" in _ledger({**six_heads, "training": {**six_heads["training"],
                                                                            "micro_batch_size": 2}})


def test_the_unfused_record_per_layer():
    # measured per layer: 388.0 MiB (layer_kept_bytes); the ledger: 96 MiB of the other tensors + 288 MiB of
    # softmax (6 B x 12 x 2048^2) + 4 MiB of mask
    record = json.loads((MEASURED / "gpt3-175b-tp8-pp8-first-s2048-b1-unfused.json").read_text())
    assert record["config"]["training"]["attention_softmax_fusion"] is False
    per_layer = sum(_ledger(record["config"]).values())
    assert per_layer == 96 * MiB + 6 * 12 * 2048 * 2048 + 2048 * 2048 == 406_847_488
    # the harness's layer keeps 4 KiB more (its small per-layer buffers, 512-byte rounded)
    assert record["measured"]["layer_kept_bytes"][-1] - per_layer == 4096


LLAMA8B_TE = {"model": "llama-3.1-8b", "training": {"seq_len": 4096, "loss": "fused", "cross_entropy_impl": "te"},
              "parallel": {"tp": 2}}


def test_te_cross_entropy_keeps_only_the_logits():
    st = estimate_config(LLAMA8B_TE).stages[0]
    logits = {p.name: next(c.bytes for c in p.components if c.key == "logits") for p in st.phases if p.name != "optimizer"}
    # final-norm input and LM-head input 2 x 2 x 4096 x 4096 / 2, bf16 logits 2 x 4096 x 128256 / 2
    assert logits == {"forward": 33_554_432 + 525_336_576, "backward": 33_554_432 + 525_336_576}
    # forward: fp32 loss (4 B) and (max, sum, label logit) (12 B) per token, gathered over TP 2 (24 B)
    # backward: the gradient is the saved logits, scaled in place
    assert _transients(LLAMA8B_TE, 0) == {"forward": 4096 * (4 + 12 + 24), "backward": 0, "optimizer": 0}


def test_native_fused_cross_entropy_keeps_the_fp32_softmax():
    native = {**LLAMA8B_TE, "training": {**LLAMA8B_TE["training"], "cross_entropy_impl": "native"}}
    st = estimate_config(native).stages[0]
    logits = next(c.bytes for c in st.phases[0].components if c.key == "logits")
    assert logits == 33_554_432 + 4 * 4096 * 128256 // 2
    # backward starts with the bf16 gradient of the logits and, in the compiled calculate_gradients,
    # Inductor's fp32 copy of the softmax (index_put): 2 + 4 bytes per logit over TP 2, 4 more than standard
    standard = {**native, "training": {**native["training"], "loss": "standard"}}
    assert _transients(native, 0)["backward"] == (2 + 4) * 4096 * 128256 // 2
    assert _transients(native, 0)["backward"] - _transients(standard, 0)["backward"] == 4 * 4096 * 128256 // 2


MIXTRAL = "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1"


# Mixtral record (TP2 SP, EP4, ETP2, 2 local experts, s 4096): routed tokens before /t n = s x b x k x phi =
# 4096 x 2 = 8192; per rank the experts hold n x etp / t = 8192 tokens; one expert 4096 tokens x 14336 / 2 columns
SEND = 2 * 8192 * 4096 // 2  # the permuted tokens sent by the all-to-all, bf16 (32 MiB)
OUTPUTS = 2 * 8192 * 2 * 4096 // 2  # the experts' outputs (concatenated, and their unsorted copy), bf16 (64 MiB)


@pytest.mark.parametrize("dtype, forward, backward", [
    # combine: sent tokens + outputs + unsorted copy + reduce-scatter output and all-to-all output (bf16, 32 MiB
    # each); backward: the outputs' gradient + one expert's fc2-input gradient (4096 x 7168) and fc1-output
    # gradient (4096 x 14336), bf16
    (None, SEND + 2 * OUTPUTS + 2 * SEND, OUTPUTS + 2 * 4096 * 7168 * 3),
    # fp32 / fp64: the outputs cast to R bytes (R x 8192 x 4096 x 2 / 2) and the reduce-scatter output in R bytes
    # (R x 8192 x 4096 / 2); backward: the gradient cast to R bytes and its all-gather, R x 8192 x 4096 x (1 + 2) / 2,
    # unless the experts' backward is larger (fp32: 192 < 232 MiB)
    ("fp32", SEND + 2 * OUTPUTS + 4 * 8192 * 4096 + 2 * 8192 * 4096, OUTPUTS + 2 * 4096 * 7168 * 3),
    ("fp64", SEND + 2 * OUTPUTS + 8 * 8192 * 4096 + 4 * 8192 * 4096, 8 * 8192 * 4096 * 3 // 2),
])
def test_router_dtype_casts_the_combine(dtype, forward, backward):
    """Measured on the records (per-tensor breakdown of the forward peak of ...-router-fp64: 256 MiB fp64 cast,
    128 MiB fp64 reduce-scatter output, 64 + 64 MiB outputs and copy, 32 MiB sent tokens)."""
    config = _record_config(MIXTRAL)
    if dtype:
        config["training"]["moe_router_dtype"] = dtype
    t = _transients(config, 0)
    assert (t["forward"], t["backward"]) == (forward, backward)
    assert forward / MiB == {None: 224, "fp32": 352, "fp64": 544}[dtype]


def test_moe_block_recomputed_in_backward():
    """Selective recompute of "moe" and "layernorm" (record ...-sel-layernorm+moe): in backward the MoE block's
    forward runs again, so its tensors (the norm output the router reads 16 MiB, router logits and probabilities,
    dispatched tokens 64, experts' fc1 outputs 224 and SwiGLU outputs 112 MiB) exist again beside the larger of
    its moments: the experts' backward (64 + 56 + 112 = 232 MiB) over its combine (224 MiB, the measured peak of
    the record, 7.69 GiB against 7.62 estimated)."""
    config = _record_config("mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-sel-layernorm+moe")
    router = 2 * 4 * 4096 * 8 // 2 + 2 * 8192 * 2 // 2  # fp32 logits and probabilities; bf16 routing weights
    recomputed = 2 * 4096 * 4096 // 2 + router + OUTPUTS + 3 * (2 * 8192 * 14336 // 2)
    assert _transients(config, 0)["backward"] == recomputed + OUTPUTS + 2 * 4096 * 7168 * 3


@pytest.mark.parametrize("training, model, field", [
    ({"framework": "fsdp2", "moe_router_dtype": "fp32"}, "mixtral-8x7b", "training.moe_router_dtype"),
    ({"moe_router_dtype": "fp32"}, "llama-3.1-8b", "training.moe_router_dtype"),
    ({"framework": "hf", "attention_softmax_fusion": False}, "llama-3.1-8b", "training.attention_softmax_fusion"),
    ({"cross_entropy_impl": "te"}, "llama-3.1-8b", "training.cross_entropy_impl"),
    ({"framework": "fsdp2", "loss": "fused", "cross_entropy_impl": "te"}, "llama-3.1-8b", "training.cross_entropy_impl"),
    ({"moe_router_dtype": "bf16"}, "mixtral-8x7b", "training.moe_router_dtype"),
    ({"framework": "fsdp2", "moe_grouped_gemm": True}, "mixtral-8x7b", "training.moe_grouped_gemm"),
    ({"framework": "deepspeed", "moe_grouped_gemm": True}, "mixtral-8x7b", "training.moe_grouped_gemm"),
])
def test_flags_megatron_does_not_offer_here_are_refused(training, model, field):
    with pytest.raises(ConfigError) as e:
        estimate_config({"model": model, "training": training})
    assert e.value.field == field


# --defer-embedding-wgrad-compute on the Llama-3.1-70B last stage (TP8 SP, PP8, s 4096, b 1; vocab 128256
# padded to a multiple of 128 x 8 = 129024): each deferred micro-batch holds the output layer's input,
# bf16 [4096/8, 1, 8192], and its output gradient, bf16 [4096, 1, 129024/8] (layers.py buffers)
DEFERRED_PAIR = 2 * 4096 * 8192 // 8 + 2 * 4096 * 129024 // 8  # 8 MiB + 126 MiB


def _last_stage_totals(**training) -> dict[str, int]:
    config = _record_config("llama-3.1-70b-tp8-pp8-last-s4096-b1")
    config = {**config, "training": {**config["training"], "global_batch_size": 16, **training}}  # 8 micro-batches
    return dict(estimate_config(config).stages[7].phase_totals)


@pytest.mark.parametrize("limit, held", [(0, 7), (3, 3), (7, 7), (20, 7)])
def test_deferred_embedding_wgrad_keeps_earlier_micro_batches_pairs(limit, held):
    """At the last micro-batch the 7 earlier ones' pairs are held (at most the deferral limit); the step
    runs after the drain."""
    base = _last_stage_totals()
    deferred = _last_stage_totals(defer_embedding_wgrad_compute=True, wgrad_deferral_limit=limit)
    assert deferred["forward"] - base["forward"] == held * DEFERRED_PAIR
    assert deferred["backward"] - base["backward"] == held * DEFERRED_PAIR
    assert deferred["optimizer"] == base["optimizer"]


def test_deferred_embedding_wgrad_only_on_the_last_stage_and_with_several_micro_batches():
    config = _record_config("llama-3.1-70b-tp8-pp8-first-s4096-b1")
    on = {**config, "training": {**config["training"], "global_batch_size": 16, "defer_embedding_wgrad_compute": True}}
    off = {**config, "training": {**config["training"], "global_batch_size": 16}}
    assert estimate_config(on).stages[0].phase_totals == estimate_config(off).stages[0].phase_totals
    # one micro-batch per step: its own pair is its head input and its loss gradient, already counted
    assert _last_stage_totals(global_batch_size=2, defer_embedding_wgrad_compute=True) == \
        _last_stage_totals(global_batch_size=2)


@pytest.mark.parametrize("training, field", [
    ({"framework": "fsdp2", "defer_embedding_wgrad_compute": True}, "training.defer_embedding_wgrad_compute"),
    ({"wgrad_deferral_limit": 4}, "training.wgrad_deferral_limit"),
    ({"defer_embedding_wgrad_compute": True, "wgrad_deferral_limit": -1}, "training.wgrad_deferral_limit"),
])
def test_deferred_embedding_wgrad_refused_where_megatron_does_not_run_it(training, field):
    with pytest.raises(ConfigError) as e:
        estimate_config({"model": "llama-3.1-8b", "training": training, "parallel": {"pp": 2}})
    assert e.value.field == field


def test_deferring_the_embedding_wgrad_needs_a_pipeline():
    """Megatron-Core 0.16.1 model_parallel_config.py: "Cannot defer embedding wgrad compute when pipeline
    model parallel is not used"."""
    config = {"model": "llama-3.1-8b", "training": {"framework": "megatron", "defer_embedding_wgrad_compute": True},
              "parallel": {"tp": 2}}
    with pytest.raises(ConfigError) as err:
        estimate_config(config)
    assert err.value.field == "training.defer_embedding_wgrad_compute" and "pp = 1" in str(err.value)


# --moe-token-dispatcher-type allgather on the Mixtral record's rank (TP2 SP, EP4, ETP2): every rank of the
# EP x ETP group (8) gathers 4096 / 2 tokens, 16384 x 4096 bf16 = 128 MiB, into Megatron's global buffer 'mpu'
# (kept); its two local experts get 16384 x 2 / 8 x 2 = 8192 routed tokens
GATHERED = 2 * 16384 * 4096  # 128 MiB


def test_allgather_dispatcher_moments():
    """Per-tensor breakdown of the record ...-allgather (python -m validation.megatron measure): the forward's
    last MoE moment holds the experts' concatenated outputs (8192 x 4096 bf16, 64 MiB) and the unpermute's zeros
    over every gathered token (128 MiB); the backward's first holds the reduce-scatter's gradient all-gathered
    (128 MiB) and its gather per routed token (64 MiB), below the experts' backward (64 + 56 + 112 = 232 MiB);
    the global buffer (128 MiB) is persistent; the backward also holds the output gradient received from stage 1
    (4096/2 x 4096 bf16, 16 MiB: megatron_pp_grad.py). Measured peak 8.17 GiB (backward) against 8.20 estimated."""
    config = _record_config("mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-allgather")
    assert config["training"]["moe_dispatcher"] == "allgather"
    t = _transients(config, 0)
    assert t["forward"] == OUTPUTS + GATHERED
    assert t["backward"] == OUTPUTS + 2 * 4096 * 7168 * 3
    assert (t["forward"] / MiB, t["backward"] / MiB) == (192, 232)
    # the global buffer is persistent: in every phase, the optimizer step's included; the received output
    # gradient in backward alone (one micro-batch: no steady-state forward holds the previous one)
    buffers = {p.name: sum(c.bytes for c in p.components if c.key == "buffers")
               for p in estimate_config(config).stages[0].phases}
    assert buffers == {"forward": GATHERED, "backward": GATHERED + 2 * 4096 // 2 * 4096, "optimizer": GATHERED}


def test_allgather_moe_block_recomputed_in_backward():
    """Record ...-sel-layernorm+moe-allgather: the recomputed MoE block (as in test_moe_block_recomputed_in_backward)
    beside the experts' backward (232 MiB, above the combine's 192 MiB) and the global buffer."""
    config = _record_config("mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-sel-layernorm+moe-allgather")
    router = 2 * 4 * 4096 * 8 // 2 + 2 * 8192 * 2 // 2
    recomputed = 2 * 4096 * 4096 // 2 + router + OUTPUTS + 3 * (2 * 8192 * 14336 // 2)
    assert _transients(config, 0)["backward"] == recomputed + OUTPUTS + 2 * 4096 * 7168 * 3


def test_sequence_parallel_gathers_into_megatrons_global_buffer():
    """Megatron-Core utils.py GlobalMemoryBuffer 'mpu': tensor_parallel/layers.py gathers a column-parallel
    linear's sequence-parallel input into it, s x b x h over the TP group, and keeps it. Llama-3.1-70B TP 8
    at 4096 tokens: 4096 x 8192 bf16 = 64 MiB on every stage, through every phase; none without SP."""
    config = _record_config("llama-3.1-70b-tp8-pp8-middle-s4096-b1")
    for stage in estimate_config(config).stages:
        for phase in stage.phases:
            assert sum(c.bytes for c in phase.components if c.key == "buffers" and c.label != RECEIVED) == \
                2 * 4096 * 8192
    no_sp = {**config, "parallel": {**config["parallel"], "sequence_parallel": False}}
    assert all(c.key != "buffers" or c.label == RECEIVED
               for st in estimate_config(no_sp).stages for p in st.phases for c in p.components)


@pytest.mark.parametrize("training, field", [
    ({"framework": "fsdp2", "moe_dispatcher": "allgather"}, "training.moe_dispatcher"),
    ({"mode": "inference", "moe_dispatcher": "allgather"}, "training.moe_dispatcher"),
    ({"moe_dispatcher": "allgather", "moe_router_dtype": "fp32"}, "training.moe_router_dtype"),
])
def test_allgather_dispatcher_refusals(training, field):
    with pytest.raises(ConfigError) as e:
        estimate_config({"model": "mixtral-8x7b", "training": training})
    assert e.value.field == field


def test_allgather_refused_for_a_dense_model():
    with pytest.raises(ConfigError) as e:
        estimate_config({"model": "llama-3.1-8b", "training": {"moe_dispatcher": "allgather"}})
    assert e.value.field == "training.moe_dispatcher"


# --moe-grouped-gemm (legacy GroupedMLP, grouped_gemm's gmm emulated by the harness): backward differentiates
# every local expert at once. Mixtral record's rank (TP2 SP, EP4, ETP2, 2 local experts): 8192 routed tokens x
# 14336 / 2 = 7168 columns per expert on this rank
def test_grouped_gemm_backward_moment_mixtral():
    """Record ...-gg (python -m validation.megatron measure): the backward peak is the weighted SwiGLU's backward,
    +336 MiB over the backward's start: fc2's weight gradient [2, 7168, 4096] bf16 (112 MiB) and the SwiGLU's
    backward output [8192, 14336] bf16 (224 MiB), beside fc2's input gradient [8192, 7168] (112 MiB) in place of
    the freed SwiGLU output, the experts' outputs' gradient (64 MiB) freed. fc2's backward moment is smaller
    (64 + 112 + 112 = 288 MiB). Measured peak 8414.3 MiB, estimated 8356.0 (-0.7%; the backward's start is 58
    MiB short, as in the SequentialMLP record's estimate, whose experts' moment 232 MiB is 56 MiB over the
    measured +176)."""
    config = _record_config("mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-gg")
    assert config["training"]["moe_grouped_gemm"] is True
    moment = 2 * 2 * 7168 * 4096 + 2 * 8192 * 14336
    assert _transients(config, 0)["backward"] == moment
    assert moment / MiB == 336
    measured = json.loads((MEASURED / "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-gg.json").read_text())["measured"]
    assert measured["peak_bytes"] == 8823058944 and measured["peak_phase"] == "backward"
    assert tensors_peak(estimate_config(config).stages[0]) == pytest.approx(measured["peak_bytes"], rel=0.01)
    # SequentialMLP (the flag off): one expert's fc2-input and fc1-output gradients beside the outputs' gradient
    config["training"].update(moe_grouped_gemm=False, moe_use_legacy_grouped_gemm=False)
    assert _transients(config, 0)["backward"] == OUTPUTS + 2 * 4096 * 7168 * 3


def test_grouped_gemm_backward_moment_with_moe_act_recomputed():
    """Record ...-sel-moe_act-gg (DeepSeek-V2-Lite-like, TP1, EP8: 8 local experts, 4096 x 6 = 24576 routed
    tokens, f_e 1408, h 2048). Per-tensor trace of its first MoE layer's backward: the checkpoint recomputes
    the SwiGLU output (66 MiB, held) and copies it into the discarded output's storage (66), fc2's backward
    returns its input gradient (66) and weight gradient [8, 1408, 2048] (44) beside the outputs' gradient
    [24576, 2048] (96): 338 MiB; then the outputs' gradient and the copy are freed and the SwiGLU's backward
    writes [24576, 2816] (132): 308 MiB. (The record's peak is the logits', elsewhere.)"""
    cfg = load_config(_record_config("deepseek-v2-lite-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg"))
    assert cfg.training.moe_grouped_gemm
    entries = moe_expert_backward_moment(cfg.architecture, cfg.training, cfg.parallel)
    swiglu_out = 2 * 24576 * 1408
    fc2 = 2 * 24576 * 2048 + swiglu_out + 2 * 8 * 1408 * 2048 + 2 * swiglu_out
    assert sum(e.bytes(cfg.parallel) for e in entries) == fc2
    assert fc2 / MiB == 338
    # without moe_act fc2's saved input is kept (not a transient): fc2's backward moment, the outputs' gradient,
    # fc2's input and weight gradients (96 + 66 + 44 = 206 MiB), over the SwiGLU's backward (44 + 132 = 176)
    config = _record_config("deepseek-v2-lite-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg")
    config["training"]["recompute"] = "none"
    del config["training"]["recompute_modules"]
    plain = load_config(config)
    entries = moe_expert_backward_moment(plain.architecture, plain.training, plain.parallel)
    assert sum(e.bytes(plain.parallel) for e in entries) == 2 * 24576 * 2048 + swiglu_out + 2 * 8 * 1408 * 2048


@pytest.mark.parametrize("training, field", [
    # Megatron-Core 0.16.1 transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm"
    ({"framework": "megatron", "recompute": "selective", "recompute_modules": ["moe_act"]}, "training.recompute_modules"),
    ({"framework": "megatron", "moe_grouped_gemm": True}, "training.moe_grouped_gemm"),  # a dense model has no experts
])
def test_grouped_gemm_refusals(training, field):
    model = "mixtral-8x7b" if "moe_act" in training.get("recompute_modules", []) else "llama-3.1-8b"
    with pytest.raises(ConfigError) as err:
        estimate_config({"model": model, "training": training})
    assert err.value.field == field


def test_a_megatron_stage_memo_keeps_one_chunk_apart_from_interleaved():
    """Megatron's block recompute frees the later layers before the first n are recomputed only on a rank with one
    chunk (recompute_moment.freed_before_recompute), so the stage memo (memory.static_key) keys a Megatron stage on
    whether it runs one chunk: the same stages estimated after their interleaved twin (same ends and kinds, 8 layers
    a rank) equal their estimate on a fresh architecture, and the other way round."""
    from dataclasses import replace as _replace

    from estimator import Hardware, Parallel, Training, estimate
    from estimator.models.presets import get_architecture

    training = Training(framework="megatron", seq_len=4096, micro_batch_size=1, global_batch_size=64,
                        recompute="full", recompute_layers=2)  # recompute_layers: the block method
    one, two = Parallel(tp=2, pp=4, dp=8), Parallel(tp=2, pp=4, dp=8, vpp=2)
    hardware = Hardware(gpu="h100-80")

    def fresh():  # an architecture object of its own: a memo of its own
        return _replace(get_architecture("llama-3.1-8b"))

    alone = {par: estimate(fresh(), training, par, hardware).device_total_bytes for par in (one, two)}
    shared = fresh()
    for first, then in ((two, one), (one, two)):
        estimate(shared, training, first, hardware)
        assert estimate(shared, training, then, hardware).device_total_bytes == alone[then]
    assert alone[one] != alone[two]


def test_a_megatron_stage_memo_keeps_each_block_recompute_count_apart():
    """Under the block method a Megatron static part reads how many of the stage's layers are recomputed (the later
    ones are freed first, recompute_moment.freed_before_recompute), so memory.static_key adds that count: the measured
    DeepSeek-V2-Lite DSA run with 1 recomputed layer, estimated after the same run with 2, gives its fresh estimate
    (the memo without the count gave 27.0 GB for 20.2 GB)."""
    import json
    from dataclasses import replace as _replace
    from pathlib import Path

    from estimator import estimate
    from estimator.models.loading import load_config

    path = Path(__file__).parent / "data/measured/megatron/deepseek-v2-lite-dsa-tp1-pp1-only-ep8-s4096-b1-full-block1.json"
    config = load_config(json.loads(path.read_text())["config"])
    one, two = config.training, _replace(config.training, recompute_layers=2)

    def peak(arch, training):
        return estimate(arch, training, config.parallel, config.hardware).allocated_peak_bytes

    alone = {t: peak(_replace(config.architecture), t) for t in (one, two)}
    for first, then in ((two, one), (one, two)):
        shared = _replace(config.architecture)  # an architecture object of its own: a memo of its own
        peak(shared, first)
        assert peak(shared, then) == alone[then]
    assert alone[one] != alone[two]
