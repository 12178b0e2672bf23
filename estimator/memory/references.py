"""Worked examples other calculators and guides print, and what this estimator says of the same runs.

Three sources (their figures as they print them; the project's research notes write them out):

- "A Practical Guide to LLM GPU Memory Estimation" (a blog post): an RL run of Qwen2.5-7B with slime's
  flags (Megatron-Core training, a colocated SGLang rollout), on 8 H100s (setup A) and on 4 (setup B);
  the recipes ``qwen2.5-7b-grpo-slime-8xh100`` and ``-4xh100`` are those runs.
- a mode-based calculator: parameters x bytes per component, plus ``batch x seq x hidden x layers x
  multiplier x bytes`` for activations and ``batch x tokens x hidden x layers x 2 x bytes`` for the KV cache;
- a training-memory calculator's default: an 8B model on one GPU, Korthikanti's ``s b h (34 + 5 a s / h)``
  with the attention term dropped under selective recompute, and a flat 10% overhead.

Each `Row` states the figure as printed, the arithmetic that gives it (so the comparison is with what
the source computed, not a guess), this estimator's number for the same thing per GPU, whether they
agree, and why not. Nothing here is read at import: the recipes are loaded when a comparison is made.
"""

from __future__ import annotations

from typing import NamedTuple

GB = 1e9
GiB = 2**30

GUIDE = "'A Practical Guide to LLM GPU Memory Estimation' (blog post), RL example"
MODE_CALCULATOR = "a mode-based calculator's example table (training and inference)"
CALCULATOR_8B = "a training-memory calculator's default example (8B model, one GPU)"
SLIME_DISTRIBUTED_OPTIMIZER = ("THUDM/slime v0.3.1 slime/backends/megatron_utils/arguments.py "
                               "_set_default_megatron_args: use_distributed_optimizer = True")
AGREE = 0.10  # within 10% counts as reproduced: the sources print two or three digits


class Row(NamedTuple):
    item: str
    printed: str  # the source's figure and note, as printed
    theirs: float  # bytes the source's own arithmetic gives (`arithmetic`)
    arithmetic: str
    ours: float  # bytes per GPU, this estimator
    ours_text: str  # what ours is made of
    why: str  # why they differ, or why an agreement is partly a coincidence ("" when there is nothing to say)
    unit: str = "bytes"  # of `theirs` and `ours`: "bytes", "parameters" or "B per token x hidden per layer"

    @property
    def reproduced(self) -> bool:
        return abs(self.ours - self.theirs) <= AGREE * self.theirs


class Comparison(NamedTuple):
    title: str
    source: str
    recipe: str  # the bundled recipe (or "" when the source describes no full run)
    rows: tuple[Row, ...]
    notes: tuple[str, ...]


def _phase_parts(result, phase: str) -> dict[str, int]:
    parts: dict[str, int] = {}
    for p in result.rl_phases:
        if p.name == phase:
            for c in p.components:
                parts[c.key] = parts.get(c.key, 0) + c.bytes
    return parts


# --- the practical guide's RL example ------------------------------------------------------------------

# The guide's per-GPU table (GB), setups A (8 GPUs) and B (4 GPUs)
GUIDE_TABLE = {
    "A": {"parameters": 14.0, "gradients": 5.6, "optimizer": 22.4, "kv": 24.5, "activations": 9.8,
          "overhead": 3.7, "total": 80.0},
    "B": {"parameters": 14.0, "gradients": 7.0, "optimizer": 28.0, "kv": 12.0, "activations": 7.5,
          "overhead": 3.7, "total": 52.0},
}
GUIDE_RECIPES = {"A": "qwen2.5-7b-grpo-slime-8xh100", "B": "qwen2.5-7b-grpo-slime-4xh100"}
QWEN_LAYERS, QWEN_HIDDEN = 28, 3584


def guide_kv_formula(tokens: int, batch: int, tp: int) -> float:
    """The guide's KV cache: 2 x layers x hidden x seq x batch x 2 B, over TP (no GQA)."""
    return 2 * QWEN_LAYERS * QWEN_HIDDEN * tokens * batch * 2 / tp


def _ours_kv(tokens: int, sequences: int, tp: int) -> float:
    """This estimator's KV cache of `sequences` x `tokens` for Qwen2.5-7B at TP `tp` (inference mode)."""
    from .memory import estimate_config
    cfg = {"model": "qwen2.5-7b", "training": {"mode": "inference", "seq_len": tokens, "micro_batch_size": sequences},
           "parallel": {"tp": tp}}
    return next(c.bytes for c in estimate_config(cfg).stages[0].components if c.key == "kv_cache")


def _guide_activations_as_read(setup: str) -> float:
    """The guide reads --recompute-num-layers N as 'N layers recomputed, the rest stored' (Megatron's
    block method): the recipe's training step with recompute_layers N."""
    from .memory import estimate_config
    from ..models.presets import get_recipe
    cfg = get_recipe(GUIDE_RECIPES[setup]).config
    cfg["training"]["recompute_layers"] = 1 if setup == "A" else 2
    return _phase_parts(estimate_config(cfg), "training")["activations"]


class _GuideRun(NamedTuple):
    """One setup's recipe and its estimate: what every row of the comparison reads."""
    setup: str
    recipe: object  # the bundled recipe (models.presets.Recipe)
    result: object  # its estimate
    g: dict  # the guide's figures for the setup (GUIDE_TABLE)
    tp: int
    dp: int
    rl: dict
    train: dict[str, int]
    rollout: dict[str, int]
    per_gpu: int  # bf16: elements on this GPU


def _guide_run(setup: str) -> _GuideRun:
    from .memory import estimate_config
    from ..models.presets import get_recipe
    recipe = get_recipe(GUIDE_RECIPES[setup])
    result = estimate_config(recipe.config)
    tp, dp = recipe.config["parallel"]["tp"], recipe.config["parallel"]["dp"]
    train, rollout = _phase_parts(result, "training"), _phase_parts(result, "rollout")
    return _GuideRun(setup, recipe, result, GUIDE_TABLE[setup], tp, dp, recipe.config["training"]["rl"], train,
                     rollout, train["parameters"] // 2)


def _guide_state_rows(run: _GuideRun) -> tuple[Row, ...]:
    """Parameters, gradients and optimizer states: the guide's arithmetic against Megatron's sharding."""
    setup, g, tp, dp, train, per_gpu = run.setup, run.g, run.tp, run.dp, run.train, run.per_gpu
    n = run.result.parameters_total
    return (
        Row("Model parameters", f"{g['parameters']} GB (bf16, 7B x 2 bytes)", 7e9 * 2, "7e9 x 2 B",
            train["parameters"], f"2 B x {per_gpu:,} (TP {tp}: a quarter of every matrix, norms whole)",
            f"the guide counts the whole model ({n:,} parameters) on every GPU; Megatron's TP {tp} splits it"),
        Row("Gradients", f"{g['gradients']} GB (sharded across TP=4)",
            7e9 * 4 / tp if setup == "B" else g["gradients"] * GB,
            "7e9 x 4 B (fp32) / TP 4" if setup == "B" else "no dtype gives it: 0.8 x setup B's 7e9 x 4 B / 4",
            train["gradients"], f"4 B (fp32 main gradients) x {per_gpu:,}",
            "" if setup == "B" else "A's 5.6 is four fifths of B's fp32 figure, with the same TP: no rule gives it"),
        Row("Optimizer states", f"{g['optimizer']} GB (Adam fp32, partially sharded)",
            7e9 * 16 / tp if setup == "B" else g["optimizer"] * GB,
            "7e9 x 16 B / TP 4" if setup == "B" else "0.8 x setup B's 7e9 x 16 B / 4",
            train["master_weights"] + train["optimizer_states"],
            f"(4 B fp32 master + 8 B Adam moments) x {per_gpu:,} / DP {dp} (distributed optimizer)",
            f"slime always runs Megatron's distributed optimizer ({SLIME_DISTRIBUTED_OPTIMIZER}): 12 B per "
            f"parameter (master and two moments; the gradients are counted above), over TP and DP {dp}; the guide's "
            "16 B over TP only counts 4 B more and shards nothing over DP"),
    )


def _guide_kv_row(run: _GuideRun) -> Row:
    """The guide's KV formula (no GQA, 32 sequences) against this estimator's KV cache."""
    g, tp, rl, rollout = run.g, run.tp, run.rl, run.rollout
    kv_tokens = 8192 if run.setup == "A" else 4096
    return Row("KV cache", f"{g['kv']} GB (seq={kv_tokens}, {QWEN_LAYERS} layers)", guide_kv_formula(kv_tokens, 32, tp),
            f"2 x {QWEN_LAYERS} layers x {QWEN_HIDDEN} hidden x {kv_tokens} tokens x 32 sequences x 2 B / TP {tp}",
            _ours_kv(kv_tokens, 32, tp), f"the same 32 sequences of {kv_tokens:,} tokens: 2 x 4 KV heads x 128 x 2 B "
            f"per token and layer, / TP {tp}",
            "the guide's formula has no GQA: Qwen2.5-7B keeps 4 KV heads of 128 (512 wide), not 3584, 7x less; "
            f"and the rollout holds {rl['rollout_batch_size']} prompts x {rl['samples_per_prompt']} samples, not 32 "
            f"sequences: {rollout['kv_cache'] / GiB:.2f} GiB per GPU in the recipe's rollout phase")


def _guide_activation_rows(run: _GuideRun) -> tuple[Row, ...]:
    """The activations as the guide reads the recompute flags, and as slime runs them."""
    setup, g, train = run.setup, run.g, run.train
    as_read = _guide_activations_as_read(setup)
    return (
        Row("Activations", f"{g['activations']} GB (micro-batch=1, recompute {1 if setup == 'A' else 2} "
            f"layer{'s' if setup == 'B' else ''})", g["activations"] * GB, "as printed",
            as_read, f"the recipe's training step if {1 if setup == 'A' else 2} of the 28 layers were recomputed and "
            "the rest stored (Megatron's block method)",
            "" if setup == "A" else "with 2 of 28 layers recomputed at 5,120 tokens the stored layers take less",
            ),
        Row("Activations as slime runs them", "(not in the guide)", g["activations"] * GB, "the guide's figure",
            train["activations"] + train.get("logits", 0),
            "--recompute-method uniform checkpoints every layer (chunks of 1 or 2 layers): the layers' inputs, "
            "one layer recomputed, and the loss",
            "slime's flags checkpoint every layer (uniform method), so little is stored"),
    )


def _guide_outside_rows(run: _GuideRun) -> tuple[Row, ...]:
    """What lies outside the model states and activations, and the total per GPU."""
    g, train, result = run.g, run.train, run.result
    outside = train["communication"] + train["runtime"] + train["fragmentation"]
    return (
        Row("Framework overhead", f"{g['overhead']} GB (SGLang + Ray + PyTorch runtime)", g["overhead"] * GB,
            "as printed", outside, "CUDA context, NCCL communicators, allocator fragmentation (10%)",
            "different things: the estimate counts the CUDA context and NCCL per process group and the "
            "allocator's fragmentation, not the host-side Ray and SGLang processes"),
        Row("Total per GPU", f"~{g['total']:g} GB", g["total"] * GB, "the sum of the rows",
            result.device_total_bytes, "the largest phase (rollout, scoring, training), not a sum",
            "the guide adds the rollout's KV cache to the trainer's states; with slime's colocation the trainer "
            "is offloaded while the engine generates, so the phases take turns"),
    )


def guide_rl(setup: str) -> Comparison:
    """The guide's setup A or B against the recipe of the same run."""
    run = _guide_run(setup)
    recipe, tp, dp = run.recipe, run.tp, run.dp
    rows = _guide_state_rows(run) + (_guide_kv_row(run),) + _guide_activation_rows(run) + _guide_outside_rows(run)
    notes = (
        f"{GUIDE}: setup {setup}, {recipe.config['parallel']['tp'] * dp} H100s, TP {tp}.",
        "The guide's 'GB' are of two kinds: its parameters are 7e9 x 2 bytes (decimal GB), its KV cache is its "
        "formula's bytes in GiB. Each row compares bytes: the guide's arithmetic against the estimate.",
        "Setup B has fewer GPUs at the same TP, so DP drops to 1 and the distributed optimizer shards nothing: "
        "per GPU B needs more optimizer memory than A, not less (the guide claims 35% less).",
    )
    return Comparison(f"The practical guide's RL example, setup {setup}", GUIDE, recipe.id, rows, notes)


def guide_memory_saving() -> tuple[float, float]:
    """(the guide's claimed saving of setup B over A, this estimator's): 1 - B / A per GPU."""
    from .memory import estimate_config
    from ..models.presets import get_recipe
    totals = [estimate_config(get_recipe(GUIDE_RECIPES[s]).config).device_total_bytes for s in ("A", "B")]
    return 0.35, 1 - totals[1] / totals[0]


# --- the training-memory calculator's 8B example ----------------------------------------------------------

def _gpt_architecture(layers: int, hidden: int) -> dict:
    """A GPT-style layer of the given shape (Korthikanti's: multi-head attention, a 4h GELU MLP, LayerNorm,
    biases), with GPT-2's vocabulary: what an architecture-based estimate needs beyond a shape."""
    return {"hidden_size": hidden, "num_layers": layers, "num_attention_heads": hidden // 128,
            "intermediate_size": 4 * hidden, "vocab_size": 50257, "gated_mlp": False, "norm": "layernorm",
            "linear_bias": True, "position_embedding": "learned", "max_position_embeddings": 4096}


CALCULATOR_8B_TABLE = {"parameters": 16.1, "gradients": 16.1, "optimizer": 96.4, "activations": 18.3,
                       "overhead": 14.7, "total": 161.4}
CALCULATOR_8B_CONFIG = {"model": "llama-3.1-8b", "training": {
    "framework": "megatron", "seq_len": 4096, "micro_batch_size": 1, "grad_dtype": "bf16",
    "recompute": "selective"}, "parallel": {"dp": 1}, "hardware": {"gpu": "h100-80"}}


def calculator_8b() -> Comparison:
    """Llama-3.1-8B, one GPU, batch 1 x 4096, bf16, Adam, selective recompute, no ZeRO: Megatron with bf16
    gradients (no --accumulate-allreduce-grads-in-fp32) is the stack whose states match its 2 + 2 + 12 B."""
    from .memory import estimate_config
    result = estimate_config(CALCULATOR_8B_CONFIG)
    stage = result.stages[0]
    step = {c.key: c.bytes for p in stage.phases if p.name == "optimizer" for c in p.components}
    at_peak = {c.key: c.bytes for c in stage.components}
    n = result.parameters_total
    t = CALCULATOR_8B_TABLE
    s, h, layers = 4096, 4096, 32
    ours_multiplier = at_peak["activations"] / (s * h * layers)
    rows = (
        Row("Parameters", f"{t['parameters']} GB", 2 * n, f"2 B x {n:,}", step["parameters"], "2 B (bf16) x "
            f"{n:,}", ""),
        Row("Gradients", f"{t['gradients']} GB", 2 * n, f"2 B x {n:,}", step["gradients"], "2 B (bf16 gradients, "
            "grad_dtype bf16) x the parameters", ""),
        Row("Optimizer states", f"{t['optimizer']} GB (adam, 12N)", 12 * n, f"12 B x {n:,}",
            step["master_weights"] + step["optimizer_states"], "4 B fp32 master + 8 B Adam moments", ""),
        Row("Activations", f"{t['activations']} GB (34 s b h per layer)", 34 * s * h * layers,
            f"34 x {s} x 1 x {h} x {layers} layers", at_peak["activations"],
            f"this model's layers as they run: {ours_multiplier:.1f} B per token x hidden per layer",
            "34 s b h is a GPT layer's (multi-head attention, a 4h GELU MLP); Llama-3.1-8B's grouped-query "
            "attention keeps smaller k and v and its 3.5h SwiGLU MLP more, and the loss's logits come on top"),
        Row("Framework overhead", f"{t['overhead']} GB (10%)", 0.10 * (t["total"] - t["overhead"]) * GB,
            "10% of the other rows", sum(at_peak.get(k, 0) for k in ("runtime", "communication", "fragmentation")),
            "the CUDA context, NCCL's world of one rank and the allocator's fragmentation (10% of the allocated peak)",
            f"Megatron-Core on one GPU still makes NCCL communicators of one rank (the world's, TP's, DP x CP's and "
            f"the gradient norm's: {at_peak.get('communication', 0) / GB:.2f} GB outside the allocator, "
            f"estimator/spec/nccl.py), which a flat 10% does not hold"),
        Row("Total", f"{t['total']} GB", t["total"] * GB, "the sum of the rows", result.device_total_bytes,
            "the peak moment of the step (the optimizer step here) and what lies outside the allocator",
            "the rows peak at different moments: activations are freed before the optimizer step, whose "
            "temporaries and states make the peak"),
    )
    return Comparison("A training-memory calculator's 8B example", CALCULATOR_8B, "", rows,
                      ("Its states are reproduced exactly: 2 + 2 + 12 B per parameter is Megatron's bf16 recipe "
                       "with bf16 gradients.",))


# --- the mode-based calculator's table --------------------------------------------------------------------

MODE_TABLE = (  # scenario, params (stated), batch, seq, layers, hidden, its total (GiB)
    ("Medium transformer training", 700e6, 8, 2048, 32, 4096, 44.50),
    ("Serving configuration", 700e6, 4, 1024, 32, 4096, 8.37),
    ("Large fine-tuning run", 1300e6, 4, 4096, 40, 5120, 66.70),
)


def mode_calculator() -> Comparison:
    """What an architecture-based estimate can say of a table of shapes and parameter counts."""
    from .memory import estimate_config
    from ..spec.architecture import parameter_counts
    from ..models.loading import load_config
    rows = []
    for name, stated, batch, seq, layers, hidden, total in MODE_TABLE:
        arch = _gpt_architecture(layers, hidden)
        shape_params = parameter_counts(load_config({"model": arch}).architecture).total
        rows.append(Row(f"{name}: parameters", f"{stated / 1e6:,.0f}M ({layers} layers, hidden {hidden})", stated,
                        "as printed", shape_params, f"a GPT-style model of {layers} layers at hidden {hidden}",
                        f"{layers} layers at hidden {hidden} hold about 12 x layers x hidden^2 = "
                        f"{12 * layers * hidden ** 2 / 1e9:.1f}B weights: the stated count and the shape do not "
                        "describe one model", "parameters"))
    serving = _gpt_architecture(32, 4096)
    kv = next(c.bytes for c in estimate_config({"model": serving, "training": {
        "mode": "inference", "seq_len": 1024, "micro_batch_size": 4, "param_dtype": "int8", "kv_cache_dtype": "bf16"}
    }).stages[0].components if c.key == "kv_cache")
    rows.append(Row("Serving configuration: KV cache", "batch x tokens x hidden x layers x 2 x bytes",
                    4 * 1024 * 4096 * 32 * 2 * 2, "4 x 1024 x 4096 x 32 x 2 x 2 B", kv,
                    "keys and values of every layer and head, bf16", ""))
    training = _gpt_architecture(32, 4096)
    per_layer = _activation_multiplier(training, seq=2048, attention="flash")
    eager = _activation_multiplier(training, seq=2048, attention="eager")
    rows.append(Row("Training: activation multiplier", "8 to 12 (its FAQ), times 2 B", 12 * 2, "12 x 2 B, the top of its range",
                    per_layer, f"bytes per token x hidden per layer a GPT layer keeps (flash attention; {eager:.0f} with "
                    "eager attention at 2,048 tokens)",
                    "a flat multiplier ignores what decides the saved tensors: the MLP's width and gating, GQA, the "
                    "attention kernel (eager attention keeps the a x s scores of every token, growing with the "
                    "sequence), dropout masks and recompute; Korthikanti et al. 2022 count 34 + 5 a s / h for a GPT "
                    "layer with dropout", "B per token x hidden per layer"))
    return Comparison("A mode-based calculator's example table", MODE_CALCULATOR, "", tuple(rows),
                      ("The table's totals cannot be reproduced from its inputs: the parameter counts and the shapes "
                       "describe different models, and the multiplier, mode and checkpoint factors are not given.",))


def _activation_multiplier(arch: dict, seq: int, attention: str) -> float:
    """Bytes one layer keeps per token x hidden (no recompute, bf16, one micro-batch)."""
    from .memory import estimate_config
    result = estimate_config({"model": arch, "training": {"framework": "megatron", "seq_len": seq,
                                                           "attention": attention}})
    per_layer = sum(line.bytes for line in result.activation_ledger if line.kind == "dense")
    return per_layer / (seq * arch["hidden_size"])


def comparisons() -> tuple[Comparison, ...]:
    return guide_rl("A"), guide_rl("B"), calculator_8b(), mode_calculator()
