"""Model states: parameters, gradients, master weights and optimizer states on one GPU.

Bytes per parameter come from the recipe's dtypes; ZeRO decides what is divided by the
data-parallel shard group (Rajbhandari et al. 2020, "ZeRO", section 5): stage 1 shards the
optimizer states (and master weights), stage 2 also the gradients, stage 3 also the
parameters. The shard group of non-expert parameters is DP x CP (Megatron's distributed
optimizer shards over the data-parallel-with-context group, Megatron-Bridge
``dense_optimizer_shard_size = DP*CP``); routed experts shard over their own data-parallel
group, (TP x CP x DP) / (EP x expert-TP) (Megatron-Core ``expert_data_parallel``).

With Megatron, bf16 and Adam this gives 2 + 4 + 4 + 8 = 18 bytes per parameter, and 6 + 12/d with
the distributed optimizer (Megatron-LM docs, distributed optimizer).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from .components import once
from ..spec.dtypes import bytes_per_element
from ..spec.errors import ConfigError
from ..spec.optimizers import OPTIMIZERS
from ..spec.parallel import Parallel
from .fsdp1 import shard_group
from .sharding import Bucket, StageParameters
from ..spec.choices import FSDP_FRAMEWORKS, FULLY_SHARDED_FRAMEWORKS
from ..spec.training import Recipe, Training

ZERO_SOURCE = "Rajbhandari et al. 2020 (ZeRO), section 5; Megatron-LM distributed optimizer docs"

def resolve_zero_stage(training: Training, par: Parallel) -> int:
    """The ZeRO stage the framework runs; fully_shard's default is full sharding (stage 3)."""
    fw = training.framework
    if fw == "fsdp1":  # Accelerate's fsdp_sharding_strategy decides (fsdp1.py; a contrary zero_stage is refused)
        from .fsdp1 import STRATEGY_ZERO
        return STRATEGY_ZERO[par.fsdp_sharding_strategy]
    stage = par.zero_stage if par.zero_stage is not None else (3 if fw in FULLY_SHARDED_FRAMEWORKS else 0)
    if fw == "hf" and stage != 0:
        raise ConfigError("parallel.zero_stage", stage, "0 with framework 'hf' (DDP)",
                          "use framework 'deepspeed' or 'fsdp2' to shard")
    if fw in FSDP_FRAMEWORKS and stage == 1:
        raise ConfigError("parallel.zero_stage", stage,
                          f"0 (no shard), 2 (reshard_after_forward=False) or 3 (full shard) with framework {fw!r}",
                          "FSDP2 has no optimizer-only sharding")
    return stage


def optimizer_state_bytes(b: Bucket, optimizer: str, dtype: str, experts: bool) -> float:
    """Optimizer state of a bucket's dense or expert part on one GPU, before ZeRO sharding."""
    state_bytes, B = OPTIMIZERS[optimizer].state_bytes, bytes_per_element(dtype)
    if experts:
        return state_bytes(b.expert, b.expert_small, b.expert_hidden_matrices, b.expert_factored, B)
    return state_bytes(b.dense, b.dense_small, b.dense_hidden_matrices, b.dense_factored, B)


FP8_SOURCE = ("TransformerEngine: FP8 training keeps the high-precision weights and adds FP8 copies (and their "
              "transposes on Hopper) unless fp8_model_init / Megatron --fp8-param-gather stores the weights in FP8; "
              "MXFP8 keeps row- and column-wise copies with one E8M0 scale per 32 (TE issues #1261, #1429, #1764)")


def fp8_bytes_per_weight(training: Training) -> tuple[float, float]:
    """(bytes of the stored linear weight, bytes of its extra FP8 copies) per parameter.

    Per-tensor and blockwise recipes: an FP8 copy and its transpose (1 + 1 byte); with FP8
    parameters the weight itself is the FP8 copy and only the transpose is extra. MXFP8: row- and
    column-wise copies, each 1 + 1/32 bytes; with FP8 parameters both live in the parameter."""
    mx = 1 + 1 / 32
    if training.fp8_recipe == "mxfp8":
        return (2 * mx, 0.0) if training.param_dtype == "fp8" else (2.0, 2 * mx)
    return (1.0, 1.0) if training.param_dtype == "fp8" else (2.0, 2.0)


def fsdp2_gathered_block_bytes(training: Training, P: float, stage) -> tuple[float, str]:
    """(bytes per parameter of a block FSDP2 gathers, the formula's text). With fp8_all_gather, torchao's
    WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather casts each float8 linear's weight shard to float8
    and FSDP2 gathers 1 byte per weight (torchao/float8/fsdp_utils.py); the rest of the block (norms)
    stays at P. The one fp32 scale per weight (tensorwise) is left out (4 B per matrix). The linear share
    is the stage's dense hidden matrices over its block parameters (MoE experts are not float8 linears)."""
    if not training.fp8_all_gather:
        return P, f"{P:g} B"
    blocks = stage.local - stage.root_local
    share = stage.total.dense_hidden_matrices / blocks if blocks > 0 else 0.0
    return P - (P - 1.0) * share, (f"(1 B x the float8 linear weights, {100 * share:.3f}% of a block, + {P:g} B x "
                                   "the rest; torchao float8 all-gather)")


class ModelStates(NamedTuple):
    """Persistent model-state bytes on one GPU of a stage, with the formulas that made them."""

    parameters: float
    gradients: float
    master_weights: float
    optimizer_states: float
    fp8_weight_copies: float
    formulas: Callable[[], dict[str, str]]  # written on first call (a layout search reads only the bytes)
    zero_stage: int
    vision_parameters: float = 0.0  # the vision tower's share of `parameters` (a first stage of a vision-language model)
    optimizer_source: str = ""  # a version's rule for the optimizer states (megatron_fsdp.py), beside the optimizer's

    def formula(self, name: str) -> Callable[[], str]:
        """The formula of one state, as a function that writes it when a component is shown."""
        return lambda: self.formulas()[name]


def untrained(stage: StageParameters, training: Training) -> Bucket:
    """The stage's weights that get no gradient: a frozen vision encoder (training.freeze_vision), and under
    transformers DeepSeek-V3.2's indexers (transformers 5.23 DeepseekV32Indexer.forward is @torch.no_grad(), and
    torch's optimizers skip a parameter whose .grad is None)."""
    out = stage.vision_encoder if training.freeze_vision else Bucket()
    return out.plus(stage.indexers) if training.framework == "hf" and training.mode == "training" else out


def model_states(stage: StageParameters, training: Training, recipe: Recipe, par: Parallel,
                 zero: int) -> ModelStates:
    """`zero`: the stage the framework runs (`resolve_zero_stage`, resolved once per configuration)."""
    d_dense, d_expert = _shard_groups(training, par)

    def sharded(bytes_dense: float, bytes_expert: float, from_stage: int) -> float:
        if zero >= from_stage:
            return bytes_dense / d_dense + bytes_expert / d_expert
        return bytes_dense + bytes_expert

    nd, ne = stage.dense_local, stage.expert_local
    trained = _trained(stage, training)
    nt = trained.dense
    G = bytes_per_element(recipe.grad_dtype)
    P_stored, M = _stored_and_master_bytes(training, recipe)
    dense, expert, copies, fp8_split = _parameter_bytes(stage, training, recipe, P_stored)
    params = sharded(dense, expert, parameter_shard_stage(training))
    grads = sharded(G * nt, G * ne, 2)
    masters = sharded(M * nt, M * ne, 1)
    opt_dense = optimizer_state_bytes(trained, training.optimizer, recipe.optimizer_dtype, experts=False)
    opt_expert = optimizer_state_bytes(trained, training.optimizer, recipe.optimizer_dtype, experts=True)
    opt = sharded(opt_dense, opt_expert, 1)
    # the tower's parameters, at the stage's bytes per parameter (its weights are not FP8 linears)
    vision = params * stage.vision_tower.dense / nd if nd and stage.vision_tower.dense and not fp8_split else 0.0
    return ModelStates(
        parameters=params, gradients=grads, master_weights=masters, optimizer_states=opt, fp8_weight_copies=copies,
        formulas=once(lambda: _state_formulas(stage, training, recipe, par, zero)),  # written when first shown
        zero_stage=zero, vision_parameters=vision,
    )


def _shard_groups(training: Training, par: Parallel) -> tuple[int, int]:
    """(the dense parameters' shard group, DP x CP, the experts', expert DP). FSDP1's HYBRID_SHARD: its shard
    group (fsdp1.py)."""
    return shard_group(training, par) * par.cp, max(1, par.expert_data_parallel)


def _trained(stage: StageParameters, training: Training) -> Bucket:
    """The stage's parameters that train: a frozen vision encoder (training.freeze_vision) has no gradients,
    master copies or optimizer states, nor DeepSeek-V3.2's indexers under transformers, which run under no_grad
    (activations/sparse_hf.py)."""
    return stage.total.plus(untrained(stage, training).times(-1))


def _stored_and_master_bytes(training: Training, recipe: Recipe) -> tuple[float, float]:
    """(bytes of a stored parameter, bytes of its master copy)."""
    P = bytes_per_element(recipe.param_dtype)
    master = recipe.master_weights
    if training.framework in FULLY_SHARDED_FRAMEWORKS and master:
        # FSDP2 (and FSDP1's FlatParameter, fsdp1.py) keeps the sharded parameters in fp32: they are the master
        # copy; the bf16 copies are gathered per unit while it runs (see transients).
        return 4.0, 0.0
    return P, (4.0 if master else 0.0)


def parameter_shard_stage(training: Training) -> int:
    """The ZeRO stage from which parameters are sharded. FSDP2 keeps its parameters sharded under
    reshard_after_forward=False too (zero_stage 2): only the gathered compute copies stay between forward and
    backward (memory.py transients)."""
    return 2 if training.framework in FULLY_SHARDED_FRAMEWORKS else 3


def _parameter_bytes(stage: StageParameters, training: Training, recipe: Recipe,
                     P_stored: float) -> tuple[float, float, float, tuple | None]:
    """(dense parameters' bytes, expert parameters' bytes, FP8 copies' bytes, before sharding; the FP8 split:
    bytes of an FP8 weight, linear weights, bytes of the others, other weights, or None without FP8)."""
    nd, ne = stage.dense_local, stage.expert_local
    # fsdp2: torchao's Float8Linear keeps its weight as it is (the fp32 shard; FSDP2 gathers a bf16 copy, or with
    # fp8_all_gather a float8 one: memory.py transients) and casts it in every matmul; nothing FP8 persists
    # (torchao/float8/float8_linear.py matmul_with_hp_or_float8_args)
    if not training.fp8 or training.framework == "fsdp2":
        return P_stored * nd, P_stored * ne, 0.0, None
    # linear weights (the hidden matrices) run in FP8; norms, embedding and head stay bf16
    stored, extra = fp8_bytes_per_weight(training)
    hd, he = stage.total.dense_hidden_matrices, stage.total.expert_hidden_matrices
    P = bytes_per_element(recipe.param_dtype)
    P_rest = 2.0 if P < 2 else P
    return (stored * hd + P_rest * (nd - hd), stored * he + P_rest * (ne - he), extra * (hd + he),
            (stored, hd + he, P_rest, nd + ne - hd - he))


def _state_formulas(stage: StageParameters, training: Training, recipe: Recipe, par: Parallel,
                    zero: int) -> dict[str, str]:
    """The formulas of `model_states`, from the same parts."""
    d_dense, d_expert = _shard_groups(training, par)
    nd, ne = stage.dense_local, stage.expert_local
    trained = _trained(stage, training)
    nt = trained.dense
    P = bytes_per_element(recipe.param_dtype)
    P_stored, _ = _stored_and_master_bytes(training, recipe)
    fp8_split = _parameter_bytes(stage, training, recipe, P_stored)[3]
    if fp8_split:
        param_text = "({:g} B x {:,.0f} linear weights + {:g} B x {:,.0f} others)".format(*fp8_split)
    else:
        param_text = f"{P_stored:g} B ({'fp32 shard' if P_stored == 4 and P != 4 else recipe.param_dtype})"
    d = f"d = DP*CP = {d_dense}"
    de = f", d_e = expert DP = {d_expert}" if ne else ""
    count = f"{nd:,.0f} params" if not ne else f"({nd:,.0f} dense + {ne:,.0f} expert params)"
    why = "the vision encoder frozen" if training.freeze_vision else "the indexers untrained, under no_grad"
    trained_count = count if nt == nd else f"{nt:,.0f} trained params ({why})"

    def formula(per_param: str, from_stage: int, counted: str = count) -> str:
        times = "" if per_param.startswith("(") else f" x {counted}"
        return f"{per_param}{times} / d ({d}{de})" if zero >= from_stage else f"{per_param}{times}"

    opt_bytes = (optimizer_state_bytes(trained, training.optimizer, recipe.optimizer_dtype, experts=False)
                 + optimizer_state_bytes(trained, training.optimizer, recipe.optimizer_dtype, experts=True))
    per_param_states = opt_bytes / (nt + ne) if nt + ne else 0.0
    hidden = stage.total.dense_hidden_matrices + stage.total.expert_hidden_matrices
    return {
        "parameters": formula(param_text, parameter_shard_stage(training)),
        "fp8_weight_copies": (f"{fp8_bytes_per_weight(training)[1]:g} B x {hidden:,.0f} linear weights "
                              f"({training.fp8_recipe} recipe)") if fp8_split else "",
        "gradients": formula(f"{bytes_per_element(recipe.grad_dtype):g} B ({recipe.grad_dtype})", 2, trained_count),
        "master_weights": formula("4 B (fp32)", 1, trained_count),
        "optimizer_states": formula(f"{per_param_states:.4g} B ({training.optimizer} states in "
                                    f"{recipe.optimizer_dtype})", 1, trained_count),
    }
