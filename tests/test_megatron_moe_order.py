"""An MoE layer's moments in the allocated ledger as Megatron-Core 0.16.1 with TransformerEngine makes them
(estimator/memory/moe_moments.py combine_before_the_loss, activations/moe.py te_grouped_wgrad_in_main_grad), worked
by hand from SimuMax's DeepSeek-V3 B200 run with EP 4 x PP 2 (tests/data/measured/published/simumax_b200: h 7168,
256 experts over EP 4 = 64 local, expert FFN 2048, top-8, s 4096, b 1, TP 1, vocabulary 129,280, bf16, TE's grouped
GEMM, TE's fused cross-entropy, gradient-accumulation fusion on: Megatron-LM's default). The logits are 129,408
wide: --tokenizer-type NullTokenizer adds its EOD token to --vocab-size 129280, padded to a multiple of 128."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from estimator import estimate_config
from estimator.memory.activations.moe import te_grouped_wgrad_in_main_grad
from estimator.memory.moe_moments import combine_before_the_loss, moe_moments
from estimator.memory.resolved import resolve
from estimator.models.loading import load_config
from validation.published_megatron.replay import imported, records

MiB = 2**20
RUN = "deepseekv3_l4_tp1_ep4_pp2_dp4_mbc4_cef"
RECORD = next(r for r in records("simumax_b200") if r["id"] == RUN)
TOKENS = 8 * 4096  # phi*k*s*b: each of the 4,096 tokens sent to 8 experts
OUT = TOKENS * 7168 * 2  # one [routed tokens, h] bf16 tensor: 448 MiB
LOSS = 4096 * 7168 * 2 * 2 + 4096 * 129408 * 2  # final norm and LM head inputs (56 MiB each), the logits (1,011)


def last_stage(**training):
    cfg = load_config(imported(RECORD).config)
    cfg = resolve(cfg.architecture, dataclasses.replace(cfg.training, **training), cfg.parallel, cfg.hardware)
    return cfg, cfg.stages[1]


def moments(**training):
    cfg, sp = last_stage(**training)
    forward, backward, _ = moe_moments(cfg.architecture, cfg.training, cfg.parallel, sp)
    return [c.bytes for c in forward], [c.bytes for c in backward]


def test_the_experts_weight_gradients_go_into_main_grad():
    """TE's GroupedLinear under gradient-accumulation fusion: fc2's backward makes the outputs' gradient sorted by
    local expert (448 MiB) and its input gradient (8 x 4096 x 2048 x 2 B = 128 MiB), not the weight gradient, which
    the grouped GEMM writes into main_grad; the activation's backward (fc1's gate and up gradient, 256 MiB) is
    smaller. Without the fusion the 64 local experts' fc2 weight gradient (64 x 2048 x 7168 x 2 B = 1,792 MiB) is
    made beside them (TE's `torch.empty(w.size())` per expert, as the legacy GroupedMLP's grouped_gemm bgrad)."""
    _, backward = moments()
    assert [b / MiB for b in backward] == [448, 128]
    assert backward == [OUT, TOKENS * 2048 * 2]
    _, unfused = moments(gradient_accumulation_fusion=False)
    assert [b / MiB for b in unfused] == [448, 128, 1792]
    assert unfused[2] == 64 * 2048 * 7168 * 2


def test_which_grouped_gemm_writes_into_main_grad():
    cfg, _ = last_stage()
    assert te_grouped_wgrad_in_main_grad(cfg.training)
    assert not te_grouped_wgrad_in_main_grad(dataclasses.replace(cfg.training, gradient_accumulation_fusion=False))
    assert not te_grouped_wgrad_in_main_grad(dataclasses.replace(cfg.training, moe_grouped_gemm=False))


def test_the_combine_comes_before_the_logits():
    """The combine's moment: the permuted tokens sent (held by MoELayer.forward), the experts' outputs, their copy
    unsorted by local expert and the returning all-to-all's output, 4 x 448 = 1,792 MiB, made before the decoder
    returns and so before the final norm's input, the LM head's input and the logits (1,123 MiB), which the forward
    phase charges beside it: its moment net of them, 669 MiB; the forward peak is everything else + 1,792 MiB."""
    forward, _ = moments()
    assert forward == [OUT] * 4
    assert LOSS / MiB == 1123
    stage = next(s for s in estimate_config(imported(RECORD).config).stages if s.stage == 1)
    phase = next(p for p in stage.phases if p.name == "forward")
    transient = next(c for c in phase.components if c.key == "transient")
    assert [c.bytes for c in transient.parts] == [OUT] * 4 + [-LOSS]
    assert next(c for c in phase.components if c.key == "logits").bytes == LOSS
    rest = sum(c.bytes for c in phase.components if c.key not in ("logits", "transient"))
    assert phase.allocated_bytes == rest + 4 * OUT
    assert stage.peak_phase == "forward" and stage.allocated_peak_bytes == phase.allocated_bytes


def test_the_combine_stays_beside_the_loss_where_another_forward_can_run():
    """Only Megatron, and only where the last stage runs each micro-batch's backward right after its forward: there
    the combine comes before the loss's saved tensors are made and the experts' backward after they are freed."""
    cfg, sp = last_stage()
    moments = moe_moments(cfg.architecture, cfg.training, cfg.parallel, sp)
    exchange = moments[0]
    from estimator.memory.components import component

    loss = (component("logits", "loss", LOSS, "", ""),)
    charged = combine_before_the_loss(cfg.training, cfg.parallel, moments, loss)
    assert sum(c.bytes for c in charged[0]) == 4 * OUT - LOSS
    # the experts' backward runs after the loss's backward freed its saved tensors (LOSS_BEFORE_THE_LAYERS): its
    # moment net of them, 448 + 128 - 1,123 MiB
    assert sum(c.bytes for c in charged[1]) == OUT + TOKENS * 2048 * 2 - LOSS
    # the stage memo's tuple itself is kept (counted once by the memo), the recomputed layer's moment as it is
    assert charged.held is moments and charged[2] is moments[2]
    interleaved = dataclasses.replace(cfg.parallel, vpp=2, pp_schedule="interleaved")
    fsdp2 = SimpleNamespace(framework="fsdp2")  # the one field the rule reads of the training
    for kept in (combine_before_the_loss(cfg.training, interleaved, moments, loss),
                 combine_before_the_loss(fsdp2, cfg.parallel, moments, loss),
                 combine_before_the_loss(cfg.training, cfg.parallel, moments, ())):
        assert kept[0] is exchange and kept[1] is moments[1]


@pytest.mark.parametrize(("run", "measured_gib"), [(RUN, 114.002)])
def test_the_last_stage_within_a_quarter_point(run, measured_gib):
    """The run's last stage: 113.77 GiB against the largest rank's max_memory_allocated (was 115.42, +1.25%)."""
    stage = next(s for s in estimate_config(imported(RECORD).config).stages if s.stage == 1)
    assert RECORD["measured"]["max_allocated_bytes"] / 2**30 == pytest.approx(measured_gib, abs=0.001)
    assert stage.allocated_peak_bytes / RECORD["measured"]["max_allocated_bytes"] - 1 == pytest.approx(-0.0021,
                                                                                                         abs=0.001)


MIXTRAL_LAST = "mixtral-8x7b-tp2-pp4-last-ep4-s4096-b1"  # the Megatron harness's MoE last stage (fake tensors)


def _mixtral_last() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "data" / "measured" / "megatron" / f"{MIXTRAL_LAST}.json").read_text())


def test_the_experts_backward_comes_after_the_loss_on_the_harness_last_stage():
    """The Megatron harness's Mixtral last stage (TP 2 SP, EP 4, ETP 2: two local experts, 8,192 routed tokens; the
    vocabulary 32,000 over TP 2): its backward peaks in the loss's backward (measured 8,469.3 MiB, the forward's
    8,469.4), where the estimate charged the experts' backward moment, 232 MiB (the outputs' gradient 64 MiB, one
    expert's fc2 input gradient 56 and fc1 output gradient 112), beside the loss's saved tensors (the final norm's and
    the LM head's inputs, 16 MiB each; the fp32 softmax of the logits, 250): 8,566.0 MiB, 1.1% over. The loss's
    backward frees those before the decoder's last layer runs its backward (LOSS_BEFORE_THE_LAYERS; the harness's
    trace, test_the_harness_frees_the_loss_before_the_experts_backward), so the moment is net of them (232 - 282 MiB)
    and the loss's gradient (125 MiB) is backward's largest: 8,459.0 MiB, 0.12% under."""
    from validation.core.report import tensors_peak

    record = _mixtral_last()
    stage = estimate_config(record["config"]).stages[record["stage"]]
    assert record["measured"]["peak_bytes"] == 8880823296 and record["measured"]["peak_phase"] == "forward"
    backward = next(p for p in stage.phases if p.name == "backward")
    assert next(c for c in backward.components if c.key == "logits").bytes == (16 + 16 + 250) * MiB
    transient = next(c for c in backward.components if c.key == "transient")
    assert transient.bytes == 2 * 4096 * 16000 == 125 * MiB
    experts = (64 + 56 + 112) * MiB
    assert experts - 282 * MiB < transient.bytes
    assert tensors_peak(stage) == 8459.01953125 * MiB
    assert tensors_peak(stage) / record["measured"]["peak_bytes"] - 1 == pytest.approx(-0.0012, abs=0.0001)


def test_the_harness_frees_the_loss_before_the_experts_backward():
    """The harness's trace of that record's step (validation/megatron/harness.py traced_step, fake tensors): in
    backward the fp32 softmax of the logits [4096, 1, 16000] is freed before the first expert's SwiGLU backward output
    [4096, 14336] is made, and backward's peak is the loss's moment (the measured record's 8,469.3 MiB)."""
    pytest.importorskip("megatron.core")
    from validation.megatron.cases import CASES
    from validation.megatron.harness import traced_step

    tracker = traced_step(CASES[MIXTRAL_LAST]).tracker
    marks = {name: i for i, name in tracker.marks}
    events = list(enumerate(tracker.events))[marks["backward"]:marks["after_backward"]]
    softmax_freed = next(i for i, (key, delta) in events
                         if delta < 0 and tracker.labels[key].endswith("float32 (4096, 1, 16000)"))
    swiglu_made = next(i for i, (key, delta) in events
                       if delta > 0 and tracker.labels[key] == "empty_like.default bfloat16 (4096, 14336)")
    assert softmax_freed < swiglu_made
    live = sum(delta for _, delta in tracker.events[:marks["backward"]])
    peak, at = live, marks["backward"]
    for i, (_, delta) in events:
        live += delta
        if live > peak:
            peak, at = live, i
    assert peak == _mixtral_last()["measured"]["phases"]["backward"]["total"] and at < softmax_freed
