"""--moe-use-legacy-grouped-gemm (training.moe_use_legacy_grouped_gemm): Megatron-Core 0.16.1's legacy GroupedMLP
under the TransformerEngine spec (extensions/transformer_engine_spec_provider.py grouped_mlp_modules), the module the
Megatron harness builds for its -gg records (the local spec's grouped GEMM). GroupedMLP (transformer/moe/experts.py)
keeps weight1 and weight2 as one parameter each for all local experts and differentiates them with grouped_gemm's
gmm, which returns the weight gradients to autograd (and so to the DDP hooks that add them into main_grad) whatever
gradient_accumulation_fusion says; TEGroupedMLP's GroupedLinear writes them into main_grad under the fusion and hands
autograd TE's cached dummy, and runs its grouped GEMM on 4 streams with a cuBLASLt workspace each. The Megatron
replay (megatron_replay.py, megatron_moe_replay.py) lays the legacy experts out as those two parameters in the expert
buffers and makes their gradients in backward under the fusion too."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit import emit
from validation.core.report import tensors_peak

MEASURED = Path(__file__).parent / "data" / "measured" / "megatron"
SCRIPT = Path(__file__).parent / "data" / "launch" / "megatron" / "train_mixtral_8x7b_distributed.sh"
MiB = 2**20
MIXTRAL_GG = "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-gg"
# the harness's legacy grouped-GEMM records: peak bytes measured, the estimate's (tensors_peak) today
GG_RECORDS = {
    MIXTRAL_GG: (8823058944, 8812249088),  # 8795471872 before the received output gradient (megatron_pp_grad.py)
    "deepseek-v2-lite-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg": (13494987264, 13478254592),
    "deepseek-v2-lite-dsa-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg": (26351313920, 26323556604),
}


def _record(case: str) -> dict:
    return json.loads((MEASURED / f"{case}.json").read_text())


@pytest.mark.parametrize("case", sorted(GG_RECORDS))
def test_the_harness_records_are_held_with_the_field_set(case):
    """The harness builds GroupedMLP without gradient-accumulation fusion (validation/megatron/cases.py): each -gg
    record says so in its config, and the estimate of that config is within 0.4% of its measured peak."""
    record = _record(case)
    training = record["config"]["training"]
    assert training["moe_grouped_gemm"] and training["moe_use_legacy_grouped_gemm"]
    assert training["gradient_accumulation_fusion"] is False
    measured, estimated = GG_RECORDS[case]
    assert record["measured"]["peak_bytes"] == measured
    stage = estimate_config(record["config"]).stages[record["stage"]]
    assert tensors_peak(stage) == estimated
    assert abs(estimated / measured - 1) < 0.004


def _mixtral_fused(legacy: bool):
    """The Mixtral record's rank (TP2 SP, EP4, ETP2: 2 local experts; first of 4 stages) as Megatron-LM runs it by
    default, with gradient-accumulation fusion."""
    config = copy.deepcopy(_record(MIXTRAL_GG)["config"])
    config["training"].update(gradient_accumulation_fusion=True, moe_use_legacy_grouped_gemm=legacy)
    return estimate_config(config).stages[0]


def test_under_the_fusion_the_legacy_experts_return_their_weight_gradients():
    """Backward's experts' moment with the fusion on: GroupedMLP's weighted SwiGLU backward writes fc1's output
    gradient, 8192 routed tokens x 2 x 7168 columns (224 MiB), beside fc2's weight gradient [2, 7168, 4096] bf16 (112
    MiB) not yet handed to the hook: 336 MiB; TE's GroupedLinear writes that gradient into main_grad, 224 MiB."""
    legacy, te = _mixtral_fused(True), _mixtral_fused(False)

    def backward(stage):
        phase = next(p for p in stage.phases if p.name == "backward")
        return next(c.bytes for c in phase.components if c.key == "transient")

    swiglu_grad, fc2_wgrad = 2 * 8192 * 2 * 7168, 2 * 2 * 7168 * 4096
    assert backward(legacy) == swiglu_grad + fc2_wgrad == 336 * MiB
    assert backward(te) == swiglu_grad == 224 * MiB


def test_the_legacy_experts_take_no_te_workspaces_nor_dummy_gradients():
    """TE keeps one cuBLASLt workspace (32 MiB + 1 KiB on Hopper, gemm.py get_cublas_workspace_size_bytes) and one
    per grouped-GEMM stream (4) on an MoE stage: the
    legacy GroupedMLP runs no TE GEMM for its experts, so one. TE's cached dummy weight gradients (wgrad_cache.py),
    bf16, one per weight shape: the attention's [3072, 4096] and [4096, 2048] (TP 2) for both, the experts' fc1
    [14336, 4096] and fc2 [4096, 7168] (ETP 2) only for TE's GroupedLinear."""
    legacy, te = _mixtral_fused(True), _mixtral_fused(False)
    cublas, te_each = 2 * 32 * MiB, 32 * MiB + 1024
    assert legacy.component("workspace").bytes == cublas + te_each
    assert te.component("workspace").bytes == cublas + 5 * te_each
    attention = 2 * (3072 * 4096 + 4096 * 2048)
    assert legacy.component("wgrad_cache").bytes == attention == 40 * MiB
    assert te.component("wgrad_cache").bytes == attention + 2 * (14336 * 4096 + 4096 * 7168) == 208 * MiB


def _resolved(case: str, **training):
    from estimator.memory.resolved import resolve
    from estimator.models.loading import load_config

    config = copy.deepcopy(_record(case)["config"])
    config["training"].update(training)
    cfg = load_config(config)
    return resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)


def test_the_replay_lays_out_the_legacy_experts_one_weight_per_fc():
    """The Mixtral record's rank (h 4096, expert FFN 14336 gated, 8 experts over EP 4: 2 local, ETP 2): each MoE
    layer's GroupedMLP holds weight1 [4096, 2 x 14336 x 2 / 2] and weight2 [2 x 14336 / 2, 4096] (experts.py
    GroupedMLP.__init__), one parameter each, where TE's GroupedLinear holds one per local expert. DDP's expert
    buffers over the expert-data-parallel group (TP 2 x DP 4) / (EP 4 x ETP 2) = 1 hold both layers' 2 x (117,440,512
    + 58,720,256) elements; with the dense buffers' 107,560,960 (over DP 4) that is the record's measured parameter
    buffers, 2 B each, and its fp32 main_grad buffers, 4 B each."""
    from estimator.memory import megatron_moe_replay, megatron_replay
    from estimator.memory.megatron_moe_replay import ExpertShard

    cfg = _resolved(MIXTRAL_GG)
    embedding, layers, head = megatron_replay.rank_tensors(cfg, cfg.stages[0])
    weight1, weight2 = 4096 * (2 * 14336 * 2 // 2), (2 * 14336 // 2) * 4096
    assert (weight1, weight2) == (117_440_512, 58_720_256)
    for layer in layers:
        assert [n for n in layer if isinstance(n, ExpertShard)] == [weight1, weight2]
    order = embedding + [n for layer in layers for n in layer] + head
    (dense, over), (experts, expert_over) = megatron_moe_replay.groups(cfg, order)
    assert (over, expert_over) == (4, 1) and len(experts) == 4
    dense_n, expert_n = sum(order[i] for i in dense), sum(order[i] for i in experts)
    assert (dense_n, expert_n) == (107_560_960, 2 * (weight1 + weight2))
    measured = _record(MIXTRAL_GG)["measured"]
    assert measured["parameters"] == 2 * (dense_n + expert_n) == 919_764_992
    assert measured["gradients"] == 4 * (dense_n + expert_n) == 1_839_529_984
    te = _resolved(MIXTRAL_GG, moe_use_legacy_grouped_gemm=False)
    _, te_layers, _ = megatron_replay.rank_tensors(te, te.stages[0])
    assert [n for n in te_layers[0] if isinstance(n, ExpertShard)] == [weight1 / 2] * 2 + [weight2 / 2] * 2


def test_the_legacy_experts_forward_and_backward_in_the_replay():
    """GroupedMLP.forward makes what TEGroupedMLP's does (gmm's fc1 output [tokens, 2 x 14336 / 2], the fused
    weighted SwiGLU's output, gmm's fc2 output in the combine), so the layer's plan is the same and keeps the
    ledger's bytes: 8,192 routed tokens (4096 x top-2, EP's share over TP 2 and ETP 2) x 14336 x 2 B = 224 MiB fc1
    output, 112 MiB fc2 input; without the fusion the backward's moment is fc2's weight gradient (2 x 7168 x 4096 x
    2 B = 112 MiB) and fc1 output's gradient (224 MiB)."""
    from estimator.memory import megatron_moe_replay
    from estimator.memory.megatron_moe_replay import KEEP
    from estimator.memory.reserved_layers import requests
    from estimator.memory.stage_shared import _shared

    plans = []
    for legacy in (True, False):
        cfg = _resolved(MIXTRAL_GG, moe_use_legacy_grouped_gemm=legacy)
        shared = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, cfg.zero_stage, cfg.padded_vocab)
        plan = megatron_moe_replay.plan(cfg, shared, cfg.stages[0], "moe")
        ledger = requests(shared.entries["moe"], shared.parallel)
        assert sum(ledger[:plan.start]) + sum(step[1] for step in plan.steps if step[0] == KEEP) == sum(ledger)
        plans.append(plan)
    legacy, te = plans
    assert legacy == te
    assert [step[1] / MiB for step in legacy.steps if step[0] == KEEP][2:4] == [224, 112]
    assert [b / MiB for b in legacy.backward] == [112, 224]


def test_the_gg_records_replay(monkeypatch):
    """The Mixtral -gg record is replayed (no flat share): 309.1 MiB of cache where the flat 10% share gave 848.4
    MiB (TE's GroupedLinear on the same rank: 311.1 MiB). The replay's allocated peak (on the largest rank of the
    first stage) is the ledger's plus 884,736 B, as it is for TE's experts on the same rank: the legacy layout
    adds no difference of its own. That 864 KiB is blocks handed out whole, their rest (1 MiB or less in the large
    pool) not split off, which the allocator counts as allocated (allocator.py `should_split`; the live requests at
    the replay's peak sum to the ledger's exactly). The received output gradient ([2048, 1, 4096] bf16, 16 MiB: held
    to the stage's backward, megatron_replay.py `_Walk.forward`) made the difference 17,661,952 B until the ledger's
    backward listed it too (megatron_pp_grad.py). The DeepSeek -gg records keep the flat share for their own reasons
    (selective recompute; sparse attention), no longer for the legacy experts."""
    from estimator.memory import reserved

    peaks = {}
    for legacy in (True, False):
        made: list = []

        class Program(reserved._Program):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                made.append(self)

        monkeypatch.setattr(reserved, "_Program", Program)
        config = copy.deepcopy(_record(MIXTRAL_GG)["config"])
        config["training"]["moe_use_legacy_grouped_gemm"] = legacy
        result = estimate_config(config)
        stage = result.stages[0]
        fragmentation = stage.component("fragmentation")
        assert "megatron_replay.py" in fragmentation.source and "flat share" not in fragmentation.formula
        per_stage = len(made) // len(result.stages)  # each stage's ranks, in the stages' order
        peak = max(p.allocator.allocated_peak for p in made[:per_stage])
        peaks[legacy] = (fragmentation.bytes, peak - stage.allocated_peak_bytes)
    assert peaks[True] == (324_156_416, 884_736)
    assert peaks[False] == (326_249_472, 884_736)
    assert round(0.10 * 8_896_136_192) / MiB == pytest.approx(848.4, abs=0.05)  # the flat share it replaces
    for case, why in (("deepseek-v2-lite-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg", "selective recompute"),
                      ("deepseek-v2-lite-dsa-tp1-pp1-only-ep8-s4096-b1-sel-moe_act-gg", "sparse attention")):
        formula = estimate_config(_record(case)["config"]).stages[0].component("fragmentation").formula
        assert f"flat share, no allocator replay: {why}" in formula and "legacy" not in formula


@pytest.mark.parametrize("training, field", [
    ({"framework": "megatron", "moe_use_legacy_grouped_gemm": True}, "training.moe_use_legacy_grouped_gemm"),
    ({"framework": "fsdp2", "moe_use_legacy_grouped_gemm": True}, "training.moe_use_legacy_grouped_gemm"),
    # GroupedMLP.forward: `assert self.config.bf16, "Currently GroupedMLP for MoE only supports bf16."`
    ({"framework": "megatron", "moe_grouped_gemm": True, "moe_use_legacy_grouped_gemm": True,
      "param_dtype": "fp16", "compute_dtype": "fp16", "grad_dtype": "fp32"}, "training.compute_dtype"),
    # GroupedMLP.__init__: "moe_act recompute for fp8 or fp4 cannot work with the legacy GroupedMLP."
    ({"framework": "megatron", "moe_grouped_gemm": True, "moe_use_legacy_grouped_gemm": True, "fp8": True,
      "recompute": "selective", "recompute_modules": ["moe_act"]}, "training.recompute_modules"),
    # GroupedMLP.forward has no FP8 path (gmm on the bf16 weights): the experts in bf16 beside FP8 linears
    ({"framework": "megatron", "moe_grouped_gemm": True, "moe_use_legacy_grouped_gemm": True, "fp8": True},
     "training.fp8"),
])
def test_refusals(training, field):
    with pytest.raises(ConfigError) as err:
        estimate_config({"model": "mixtral-8x7b", "training": training, "parallel": {"ep": 8, "dp": 8}})
    assert err.value.field == field


def test_the_megatron_importer_maps_the_flag():
    """Megatron-LM's Mixtral example (--moe-grouped-gemm) with --moe-use-legacy-grouped-gemm added: the field is
    set and the flag is no longer reported as not modelled; without --moe-grouped-gemm the flag changes nothing
    (grouped_mlp_modules reads it only then)."""
    script = SCRIPT.read_text()
    assert script.count("--moe-grouped-gemm") == 1
    result = import_config(script.replace("--moe-grouped-gemm", "--moe-grouped-gemm --moe-use-legacy-grouped-gemm"),
                           "megatron", gpus=32)
    assert result.config["training"]["moe_grouped_gemm"] is True
    assert result.config["training"]["moe_use_legacy_grouped_gemm"] is True
    assert "--moe-use-legacy-grouped-gemm" not in [s.name for s in result.unsupported]
    assert "--moe-use-legacy-grouped-gemm" in [s.name for s in result.read]
    alone = import_config(script.replace("--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm"), "megatron", gpus=32)
    assert "moe_use_legacy_grouped_gemm" not in alone.config["training"]
    assert "moe_grouped_gemm" not in alone.config["training"]
    line = next(s for s in alone.read if s.name == "--moe-use-legacy-grouped-gemm")
    assert "read only with --moe-grouped-gemm" in str(line)


def test_the_megatron_emitter_writes_the_flag_and_it_reads_back():
    config = {"model": "mixtral-8x7b", "training": {"seq_len": 4096, "global_batch_size": 128,
                                                   "moe_grouped_gemm": True, "moe_use_legacy_grouped_gemm": True,
                                                   "moe_dispatcher": "alltoall"},
              "parallel": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "etp": 1, "zero_stage": 1}}
    text = emit("megatron", config)
    assert "--moe-grouped-gemm \\\n    --moe-use-legacy-grouped-gemm \\\n" in text
    result = import_config(text)
    assert result.kind == "megatron" and result.unsupported == () and result.unknown == ()
    assert result.config["training"]["moe_use_legacy_grouped_gemm"] is True
    assert estimate_imported(result).to_json() == estimate_config(config).to_json()


def test_megatron_bridge_reads_the_key_and_its_emitter_refuses_it():
    """The Bridge importer reads Megatron-Core's keys by the Megatron importer's rules: model.moe_use_legacy_grouped_gemm
    (TransformerConfig's field in Megatron-Core 0.16.1) sets the field, as --moe-use-legacy-grouped-gemm does. The
    emitter writes only keys of the ConfigContainer of Megatron-Bridge 067f987d, whose Megatron-LM (2a75ac12) no
    longer has it (Megatron-LM 2caa681a removed the deprecated GroupedMLP, #3410): it refuses the field by name."""
    line = ("torchrun --nproc_per_node 8 scripts/training/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config "
            "model.moe_grouped_gemm=true model.moe_use_legacy_grouped_gemm=true")
    result = import_config(line, "megatron-bridge")
    assert result.config["training"]["moe_grouped_gemm"] is True
    assert result.config["training"]["moe_use_legacy_grouped_gemm"] is True
    read = next(s for s in result.read if s.name == "model.moe_use_legacy_grouped_gemm")
    assert read.note == "training.moe_use_legacy_grouped_gemm = true"
    config = {"model": "qwen3-30b-a3b", "training": {"framework": "megatron", "seq_len": 4096,
                                                     "global_batch_size": 128, "moe_grouped_gemm": True,
                                                     "moe_use_legacy_grouped_gemm": True,
                                                     "moe_dispatcher": "alltoall"},
              "parallel": {"dp": 8, "ep": 8, "zero_stage": 1}}
    with pytest.raises(ConfigError, match="--moe-use-legacy-grouped-gemm has none"):
        emit("megatron-bridge", config)


def test_under_the_fusion_the_replay_makes_the_legacy_experts_gradients(monkeypatch):
    """With gradient-accumulation fusion (Megatron-LM's default) the replay's backward makes each legacy expert
    weight's gradient, weight2's (58,720,256 x 2 B = 112 MiB) then weight1's (224 MiB) per layer, for DDP's hook to
    add into main_grad (grouped_gemm's gmm returns them), and keeps no TE dummy of their shapes: only the attention's,
    [3072, 4096] and [4096, 2048] (TP 2), where TE's GroupedLinear adds fc1's [14336, 4096] and fc2's [4096, 7168]
    (ETP 2) and makes no expert gradient."""
    from estimator.memory import megatron_replay
    from estimator.memory.megatron_moe_replay import ExpertShard

    made = []
    gradient = megatron_replay._Walk._gradient

    def recorded(self, n, always=False):
        if isinstance(n, ExpertShard):
            made.append((n, always))
        return gradient(self, n, always)

    monkeypatch.setattr(megatron_replay._Walk, "_gradient", recorded)
    for legacy, dummies, expert_gradients in (
            (True, [3072 * 4096, 4096 * 2048], [(58_720_256, True), (117_440_512, True)] * 2),
            (False, [3072 * 4096, 4096 * 2048, 14336 * 4096, 4096 * 7168], [(29_360_128, False)] * 2
             + [(58_720_256, False)] * 2 + [(29_360_128, False)] * 2 + [(58_720_256, False)] * 2)):
        cfg = _resolved(MIXTRAL_GG, gradient_accumulation_fusion=True, moe_use_legacy_grouped_gemm=legacy)
        assert megatron_replay.replay_rule(cfg) is None
        assert sorted(megatron_replay._dummies(cfg, cfg.stages[0])) == sorted(dummies)
        made.clear()
        _mixtral_fused(legacy)
        first = len(expert_gradients)  # the first stage's first backward, its two MoE layers from the last
        assert made[:first] == expert_gradients
