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
    """Only Megatron, and only where the last stage runs each micro-batch's backward right after its forward."""
    cfg, sp = last_stage()
    moments = moe_moments(cfg.architecture, cfg.training, cfg.parallel, sp)
    exchange = moments[0]
    from estimator.memory.components import component

    loss = (component("logits", "loss", LOSS, "", ""),)
    charged = combine_before_the_loss(cfg.training, cfg.parallel, moments, loss)
    assert sum(c.bytes for c in charged[0]) == 4 * OUT - LOSS
    # the stage memo's tuple itself is kept (counted once by the memo), the backward's and the recomputed layer's as
    # they are
    assert charged.held is moments and charged[1] is moments[1] and charged[2] is moments[2]
    interleaved = dataclasses.replace(cfg.parallel, vpp=2, pp_schedule="interleaved")
    assert combine_before_the_loss(cfg.training, interleaved, moments, loss)[0] is exchange
    fsdp2 = SimpleNamespace(framework="fsdp2")  # the one field the rule reads of the training
    assert combine_before_the_loss(fsdp2, cfg.parallel, moments, loss)[0] is exchange
    assert combine_before_the_loss(cfg.training, cfg.parallel, moments, ())[0] is exchange


@pytest.mark.parametrize(("run", "measured_gib"), [(RUN, 114.002)])
def test_the_last_stage_within_a_quarter_point(run, measured_gib):
    """The run's last stage: 113.77 GiB against the largest rank's max_memory_allocated (was 115.42, +1.25%)."""
    stage = next(s for s in estimate_config(imported(RECORD).config).stages if s.stage == 1)
    assert RECORD["measured"]["max_allocated_bytes"] / 2**30 == pytest.approx(measured_gib, abs=0.001)
    assert stage.allocated_peak_bytes / RECORD["measured"]["max_allocated_bytes"] - 1 == pytest.approx(-0.0021,
                                                                                                         abs=0.001)
