"""The training (or inference) setup, and the precision recipe each framework implies.

`Training` holds what the user chose; a field left as ``None`` takes its framework's default when
`resolve_recipe` turns it into a `Recipe`, the fully specified set of dtypes the memory model
uses. The defaults follow each stack's documentation:

- megatron: bf16 parameters, fp32 main gradients (``--accumulate-allreduce-grads-in-fp32``),
  fp32 master weights and Adam states (Megatron-LM ``docs/.../dist_optimizer.md``: 18 bytes per
  parameter, 6 + 12/d with the distributed optimizer).
- fsdp2: sharded fp32 parameters (they are the master copy), fp32 gradients and states;
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` gathers bf16 copies of the
  units in flight (PyTorch ``fully_shard`` docs; torchtitan's default policy).
- deepspeed: bf16 parameters and gradients, fp32 master partition and Adam states (ZeRO paper,
  Rajbhandari et al. 2020, section 3: 2 + 2 + 12 bytes).
- hf: the Trainer's torch optimizer: no master copy; gradients and optimizer states take the
  parameter's dtype (torch.optim keeps state like the parameter), so pure bf16 costs 2 + 2 + 4
  bytes per parameter and fp32 parameters under bf16 autocast 4 + 4 + 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import INFERENCE_WEIGHT_DTYPES, TRAINING_DTYPES
from .errors import ConfigError

MODES = ("training", "inference")
FRAMEWORKS = ("megatron", "fsdp2", "deepspeed", "hf")
OPTIMIZERS = ("adamw", "adam8bit", "sgd", "sgd_momentum", "adafactor", "lion", "muon")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
LOSSES = ("standard", "fused", "chunked")
# FP8 scaling recipes of TransformerEngine: per-tensor (delayed or current scaling, Hopper),
# MXFP8 (1x32 blocks with E8M0 scales, Blackwell), blockwise (DeepSeek-V3's 128x128 weight blocks)
FP8_RECIPES = ("tensorwise", "mxfp8", "blockwise")
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
KV_CACHE_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
# MoE token dispatcher: Megatron-Core's MoEAlltoAllTokenDispatcher, or its flex dispatcher on DeepEP
# (--moe-token-dispatcher-type flex --moe-enable-deepep), whose fixed buffers estimator/deepep.py sizes
MOE_DISPATCHERS = ("alltoall", "deepep")


@dataclass(frozen=True)
class Training:
    mode: str = "training"
    framework: str = "megatron"
    seq_len: int = 4096
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    param_dtype: str = "bf16"
    grad_dtype: str | None = None
    master_weights: bool | None = None
    optimizer_dtype: str | None = None
    compute_dtype: str = "bf16"
    optimizer: str = "adamw"
    recompute: str = "none"
    recompute_layers: int | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)  # with "selective": Megatron's --recompute-modules
    attention: str = "flash"
    dropout: float = 0.0
    loss: str = "standard"
    fp8: bool = False
    fp8_recipe: str = "tensorwise"
    kv_cache_tokens: int | None = None
    kv_cache_dtype: str | None = None
    moe_capacity_factor: float = 1.0  # routed tokens per expert relative to a perfect balance
    moe_dispatcher: str = "alltoall"  # "deepep": Megatron-Core's flex dispatcher with DeepEP buffers

    def __post_init__(self) -> None:
        _check_training(self)


@dataclass(frozen=True)
class Recipe:
    """Every dtype decided: what the memory model reads. ``None`` never appears here."""

    framework: str
    param_dtype: str  # dtype the parameters are stored in (for FSDP2: the gathered compute copy)
    grad_dtype: str
    master_weights: bool  # an fp32 master copy exists besides the parameters
    optimizer_dtype: str
    compute_dtype: str
    autocast_weight_copies: bool  # fp32 parameters cast to a 16-bit compute dtype while running
    sources: tuple[str, ...]


FRAMEWORK_SOURCES = {
    "megatron": "Megatron-LM docs, distributed optimizer (dist_optimizer.md)",
    "fsdp2": "PyTorch fully_shard / MixedPrecisionPolicy docs; torchtitan default policy",
    "deepspeed": "Rajbhandari et al. 2020 (ZeRO), section 3; DeepSpeed bf16 optimizer",
    "hf": "PyTorch torch.optim (state follows the parameter's dtype); HF Trainer docs",
}


def resolve_recipe(training: Training) -> Recipe:
    fw, p = training.framework, training.param_dtype
    if fw in ("megatron", "fsdp2"):
        master = p != "fp32" if training.master_weights is None else training.master_weights
        grad = training.grad_dtype or "fp32"
        opt = training.optimizer_dtype or ("fp32" if master or fw == "megatron" else p)
    elif fw == "deepspeed":
        master = p != "fp32" if training.master_weights is None else training.master_weights
        grad = training.grad_dtype or (p if p != "fp8" else "bf16")
        opt = training.optimizer_dtype or "fp32"
    else:  # hf: torch.optim, no master copy unless asked for
        master = bool(training.master_weights)
        grad = training.grad_dtype or (p if p in ("fp32", "bf16", "fp16") else "bf16")
        opt = training.optimizer_dtype or ("fp32" if master else grad)
    if p == "fp32" or master is False:
        master = False if p == "fp32" else master
    autocast = p == "fp32" and training.compute_dtype != "fp32"
    return Recipe(
        framework=fw, param_dtype=p, grad_dtype=grad, master_weights=master,
        optimizer_dtype=opt, compute_dtype=training.compute_dtype,
        autocast_weight_copies=autocast, sources=(FRAMEWORK_SOURCES[fw],),
    )


# --- validation ----------------------------------------------------------------------------------

def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"training.{name}", value, ", ".join(repr(a) for a in allowed))


def _positive_int(name: str, value: object, required: bool = True) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"training.{name}", value, "a positive integer")


def _check_training(t: Training) -> None:
    _one_of("mode", t.mode, MODES)
    _one_of("framework", t.framework, FRAMEWORKS)
    _positive_int("seq_len", t.seq_len)
    _positive_int("micro_batch_size", t.micro_batch_size)
    _positive_int("global_batch_size", t.global_batch_size, required=False)
    weight_dtypes = INFERENCE_WEIGHT_DTYPES if t.mode == "inference" else TRAINING_DTYPES
    _one_of("param_dtype", t.param_dtype, weight_dtypes)
    if t.grad_dtype is not None:
        _one_of("grad_dtype", t.grad_dtype, ("fp32", "bf16", "fp16"))
    if t.optimizer_dtype is not None:
        _one_of("optimizer_dtype", t.optimizer_dtype, ("fp32", "bf16", "fp16"))
    if t.master_weights is not None and not isinstance(t.master_weights, bool):
        raise ConfigError("training.master_weights", t.master_weights, "true or false")
    _one_of("compute_dtype", t.compute_dtype, ("fp32", "bf16", "fp16"))
    _one_of("optimizer", t.optimizer, OPTIMIZERS)
    _one_of("recompute", t.recompute, RECOMPUTE)
    _positive_int("recompute_layers", t.recompute_layers, required=False)
    modules = t.recompute_modules
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not modules or \
            any(m not in RECOMPUTE_MODULES for m in modules):
        raise ConfigError("training.recompute_modules", modules,
                          "a non-empty list of " + ", ".join(repr(m) for m in RECOMPUTE_MODULES))
    if isinstance(modules, list):  # JSON gives a list; keep the dataclass hashable
        object.__setattr__(t, "recompute_modules", tuple(modules))
    if t.recompute_modules != ("core_attn",) and t.recompute != "selective":
        raise ConfigError("training.recompute_modules", list(t.recompute_modules), "only with recompute 'selective'",
                          f"recompute is {t.recompute!r}")
    if t.recompute_layers is not None and t.recompute != "full":
        raise ConfigError("training.recompute_layers", t.recompute_layers, "only with recompute 'full'",
                          f"recompute is {t.recompute!r}")
    _one_of("attention", t.attention, ATTENTION)
    if isinstance(t.dropout, bool) or not isinstance(t.dropout, (int, float)) or not 0 <= t.dropout < 1:
        raise ConfigError("training.dropout", t.dropout, "a probability in [0, 1)")
    _one_of("loss", t.loss, LOSSES)
    if not isinstance(t.fp8, bool):
        raise ConfigError("training.fp8", t.fp8, "true or false")
    _one_of("fp8_recipe", t.fp8_recipe, FP8_RECIPES)
    _positive_int("kv_cache_tokens", t.kv_cache_tokens, required=False)
    if t.kv_cache_dtype is not None:
        _one_of("kv_cache_dtype", t.kv_cache_dtype, KV_CACHE_DTYPES)
    if (isinstance(t.moe_capacity_factor, bool) or not isinstance(t.moe_capacity_factor, (int, float))
            or t.moe_capacity_factor < 1):
        raise ConfigError("training.moe_capacity_factor", t.moe_capacity_factor, "a number >= 1.0")
    _one_of("moe_dispatcher", t.moe_dispatcher, MOE_DISPATCHERS)
    if t.mode == "training" and t.param_dtype in ("fp8", "fp4") and t.framework == "hf":
        raise ConfigError("training.param_dtype", t.param_dtype, "'fp32', 'bf16' or 'fp16' with framework 'hf'",
                          "the HF Trainer does not train in fp8/fp4 parameters")

