"""Adapters: LoRA, QLoRA and DoRA fine-tuning, what they train and what they keep.

LoRA (Hu et al. 2021) freezes the base weights and learns, beside each adapted linear layer of
``in`` inputs and ``out`` outputs, two matrices A (r x in) and B (out x r): r * (in + out)
trainable parameters per module. QLoRA (Dettmers et al. 2023) stores the frozen base linears in
4-bit NF4 with double-quantized block scales; DoRA (Liu et al. 2024) adds a learned magnitude per
output feature. The frozen base gets no gradient and no optimizer state; only the adapters (and
weights left trainable, PEFT's ``modules_to_save``) do.

How PEFT runs them (peft 0.21 ``tuners/lora/layer.py``), which decides the activations:

- adapters of a 16-bit base are kept in fp32 (``autocast_adapter_dtype=True``), so each adapted
  module casts its input to fp32 (``_cast_input_dtype``) and ``lora_A`` keeps that copy for its
  weight gradient; ``lora_B`` keeps ``lora_A``'s r-wide output;
- a frozen linear keeps nothing for a weight gradient, so tensors saved only for the base
  weights' gradients (a linear's input, a norm's normalised output before its frozen scale) are
  not kept (`activations.Entry.for_weights`);
- adapter dropout keeps its fp32 output for ``lora_A`` and a 1-byte mask, the mask only where the
  input needs a gradient;
- with frozen embeddings and no checkpointing the first layer's input needs no gradient, so its
  attention norm keeps nothing (measured, tests/data/measured/peft).

Contract names of the targets (``training.adapter.target_modules``): q, k, v, o, gate, up, down,
router, experts, or "all-linear" (PEFT: every linear layer but the output layer, and on MoE models
the router and the fused expert weights).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError

METHODS = ("lora", "qlora", "dora")
TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "router", "experts")
ALL_LINEAR = "all-linear"
BASE_DTYPES = ("bf16", "fp16", "fp32", "int8", "nf4", "int4")
QUANTIZED = ("int8", "nf4", "int4")

SOURCE = ("Hu et al. 2021 (LoRA): r x (in + out) per adapted module; peft 0.21 tuners/lora/layer.py (fp32 adapters "
          "of a 16-bit base, autocast_adapter_dtype; modules_to_save keeps a trainable copy beside the original)")
QLORA_SOURCE = ("Dettmers et al. 2023 (QLoRA): NF4 in blocks of 64 with double-quantized scales; bitsandbytes "
                "functional.quantize_4bit (uint8 absmax per 64, fp32 absmax per 256 blocks); torchao NF4Tensor "
                "(int8 scale per 64, one bf16 factor per 256 scales), measured in tests/data/measured/peft")


# bitsandbytes: Linear4bit and NF4 arrived in 0.39.0 (the QLoRA release); MatMul4Bit keeps its input A for
# backward through 0.43.1 (autograd/_functions.py: ctx.tensors = (A, B)) and nothing of it from 0.43.2 on
# (commit 9e753741, PR #1270 "fix QLoRA mem bug: delete useless buffered activation": (None, B)); the
# harness's emulation (validation/peft/bnb.py) equals 0.49.2 on real CPU runs
BNB_VERSION = "0.49.2"
BNB_FIRST_4BIT = (0, 39, 0)
BNB_LAST_SAVING_INPUT = (0, 43, 1)
BNB_SOURCE = ("bitsandbytes autograd/_functions.py MatMul4Bit: ctx.tensors = (A, B) through 0.43.1, (None, B) from "
              "0.43.2 (commit 9e753741, PR #1270); measured with the emulation in validation/peft/bnb.py")
BNB_VERSION_PATTERN = r"(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?"
_VERSION = re.compile(BNB_VERSION_PATTERN)



@dataclass(frozen=True)
class Adapter:
    """`training.adapter` of the contract. ``base_dtype`` None: nf4 for qlora, else the weights
    dtype of the run."""

    method: str = "lora"
    rank: int = 16
    alpha: float = 32.0
    target_modules: tuple[str, ...] = ("q", "v")  # PEFT's default for Llama-style models
    dropout: float = 0.0
    trainable_embeddings: bool = False
    base_dtype: str | None = None
    double_quant: bool = True  # NF4's block scales quantized again (bnb_4bit_use_double_quant)
    bitsandbytes_version: str = BNB_VERSION  # the release whose Linear4bit an hf/deepspeed QLoRA runs
    prepare_kbit: bool = False  # peft's prepare_model_for_kbit_training was called (kbit.py)

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):  # "all-linear" (or one name) in the JSON
            object.__setattr__(self, "target_modules", (self.target_modules,))
        elif isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        from .fields import check_section  # the registry reads this module's option lists
        check_section("adapter", self)
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ConfigError("training.adapter.target_modules", list(self.target_modules),
                              f"either {ALL_LINEAR!r} alone or a list of {', '.join(TARGETS)}")
        if self.method == "qlora" and self.base_dtype not in (None, "nf4"):
            raise ConfigError("training.adapter.base_dtype", self.base_dtype, "'nf4' (or auto) with method 'qlora'",
                              "QLoRA stores the base in NF4; choose method 'lora' for another base dtype",
                              related=("training.adapter.method",))
        nf4 = self.method == "qlora" or self.base_dtype == "nf4"
        if not self.double_quant and not nf4:
            raise ConfigError("training.adapter.double_quant", False, "true unless the base is NF4",
                              "double quantization is NF4's (bnb_4bit_use_double_quant)",
                              related=("training.adapter.base_dtype",))
        _check_bnb_version(self.bitsandbytes_version, nf4)

    @property
    def all_linear(self) -> bool:
        return self.target_modules == (ALL_LINEAR,)

    def to_dict(self) -> dict:
        """The contract's object: every field that differs from its default, and the method."""
        out = {"method": self.method}
        for name in ("rank", "alpha", "target_modules", "dropout", "trainable_embeddings", "base_dtype",
                     "double_quant", "bitsandbytes_version", "prepare_kbit"):
            value, default = getattr(self, name), getattr(Adapter(), name)
            if value != default:
                out[name] = ALL_LINEAR if name == "target_modules" and self.all_linear else (
                    list(value) if isinstance(value, tuple) else value)
        return out


def bnb_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.fullmatch(text)
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[union-attr, return-value]


def _check_bnb_version(text: str, nf4: bool) -> None:
    if bnb_version(text) < BNB_FIRST_4BIT:  # its form is the field's (fields.py pattern)
        raise ConfigError("training.adapter.bitsandbytes_version", text,
                          "a bitsandbytes release as major.minor[.patch], 0.39.0 or later (its first 4-bit release)")
    if text != BNB_VERSION and not nf4:
        raise ConfigError("training.adapter.bitsandbytes_version", text, f"{BNB_VERSION!r} (the default) unless the "
                          "base is NF4", "the release decides what bitsandbytes' 4-bit layer keeps",
                          related=("training.adapter.base_dtype",))


def bnb_keeps_input(training) -> bool:
    """An hf/deepspeed QLoRA on bitsandbytes through 0.43.1: every 4-bit linear keeps its input."""
    from .training import FSDP_FRAMEWORKS
    adapter = training.adapter
    return (adapter is not None and training.framework not in FSDP_FRAMEWORKS
            and base_dtype(adapter, training.param_dtype) == "nf4"
            and bnb_version(adapter.bitsandbytes_version) <= BNB_LAST_SAVING_INPUT)


def adapter_from(value: object) -> Adapter | None:
    """`training.adapter` as given in JSON (an object) or already built."""
    if value is None or isinstance(value, Adapter):
        return value
    if not isinstance(value, dict):
        raise ConfigError("training.adapter", value, "an object with method, rank, alpha, target_modules, dropout, "
                          "trainable_embeddings, base_dtype")
    known = [f for f in Adapter.__dataclass_fields__]
    for key in value:
        if key not in known:
            raise ConfigError(f"training.adapter.{key}", value[key], f"fields of adapter: {', '.join(known)}",
                              "unknown field")
    return Adapter(**value)


def base_dtype(adapter: Adapter, param_dtype: str) -> str:
    return adapter.base_dtype or ("nf4" if adapter.method == "qlora" else param_dtype)


# --- which modules are adapted ------------------------------------------------------------------

class Module(NamedTuple):
    """One adaptable linear of a layer: its contract name, widths, and copies per layer."""

    name: str
    in_features: int
    out_features: int
    copies: int = 1
    rank_factor: int = 1  # PEFT's ParamWrapper on fused experts: r x experts (x 2 for gate_up)


def layer_modules(arch, kind: str) -> list[Module]:
    """The linears of a layer that adapters can target, as transformers names them."""
    h = arch.hidden_size
    out = [Module("q", h, arch.q_width), Module("k", h, arch.kv_width), Module("v", h, arch.kv_width),
           Module("o", arch.attention_output_width, h)]
    if kind == "dense":
        out += _mlp_modules(arch, arch.intermediate_size, 1)
        return out
    out.append(Module("router", h, arch.num_experts))
    if arch.num_shared_experts:
        out += _mlp_modules(arch, arch.shared_expert_intermediate_size, arch.num_shared_experts)
    # transformers 5 fuses the routed experts into 3-D parameters (gate_up_proj E x 2f x h,
    # down_proj E x h x f); PEFT adapts them with ParamWrapper: lora_A (r E x in), lora_B (out x r E),
    # the gate_up wrapper with 2 r E (peft 0.21, measured on Qwen3-30B-A3B)
    f, e = arch.moe_intermediate_size, arch.num_experts
    out += [Module("experts", h, 2 * f if arch.gated_mlp else f, 1, 2 * e if arch.gated_mlp else e),
            Module("experts", f, h, 1, e)]
    return out


def _mlp_modules(arch, width: int, copies: int) -> list[Module]:
    h = arch.hidden_size
    if arch.gated_mlp:
        return [Module("gate", h, width, copies), Module("up", h, width, copies), Module("down", width, h, copies)]
    return [Module("up", h, width, copies), Module("down", width, h, copies)]


def adapted(adapter: Adapter, name: str) -> bool:
    if adapter.all_linear:
        return True
    return name in adapter.target_modules


def adapted_modules(adapter: Adapter, arch, kind: str) -> list[Module]:
    return [m for m in layer_modules(arch, kind) if adapted(adapter, m.name)]


def module_parameters(adapter: Adapter, m: Module) -> int:
    """r (in + out) per module (r x rank_factor for fused experts); DoRA adds its magnitude (out)."""
    lora = adapter.rank * m.rank_factor * (m.in_features + m.out_features)
    return m.copies * (lora + (m.out_features if adapter.method == "dora" else 0))


def layer_parameters(adapter: Adapter, arch, kind: str) -> int:
    return sum(module_parameters(adapter, m) for m in adapted_modules(adapter, arch, kind))


def module_matrices(adapter: Adapter, m: Module) -> list[tuple[int, int]]:
    """The adapter's tensors of one module as (rows, columns): A, B (and DoRA's magnitude)."""
    r = adapter.rank * m.rank_factor
    out = [(r, m.in_features), (m.out_features, r)] * m.copies
    if adapter.method == "dora":
        out += [(m.out_features, 1)] * m.copies
    return out


def check_adapter(adapter: Adapter, arch, training, par) -> None:
    """What no framework offers, or what this model does not model, refused with the field named."""
    if training.mode != "training":
        raise ConfigError("training.adapter", adapter.method, "absent in inference mode",
                          "adapters are a training setup", related=("training.mode",))
    if training.framework == "megatron":
        raise ConfigError("training.adapter", adapter.method, "framework 'hf', 'deepspeed' or 'fsdp2'",
                          "Megatron-Bridge's PEFT is not modelled", related=("training.framework",))
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, "1 with an adapter",
                              "adapter fine-tunes are modelled on data parallelism (PEFT with DDP or DeepSpeed ZeRO, "
                              "FSDP2)", related=("training.adapter",))
    if arch.uses_mla:
        raise ConfigError("training.adapter", adapter.method, "absent for latent-attention (MLA) models",
                          "adapters on MLA projections are not modelled", related=("model",))
    if training.optimizer_in_backward:
        raise ConfigError("training.optimizer_in_backward", True, "false with an adapter",
                          "torchtune steps the optimizer in backward in its full fine-tuning recipes only",
                          related=("training.adapter",))
    if training.fp8:
        raise ConfigError("training.fp8", True, "false with an adapter", "FP8 adapters are not modelled",
                          related=("training.adapter",))
    from .training import FSDP_FRAMEWORKS
    if training.framework in FSDP_FRAMEWORKS and not adapter.double_quant:
        raise ConfigError("training.adapter.double_quant", False, f"true with framework {training.framework!r}",
                          "torchao's NF4 (torchtune's QLoRA) always quantizes its block scales again (to_nf4 "
                          "scaler_block_size 256)", related=("training.framework",))
    if training.framework in FSDP_FRAMEWORKS and adapter.bitsandbytes_version != BNB_VERSION:
        raise ConfigError("training.adapter.bitsandbytes_version", adapter.bitsandbytes_version,
                          f"{BNB_VERSION!r} (the default) with framework {training.framework!r}",
                          "its QLoRA quantizes with torchao's NF4, not bitsandbytes", related=("training.framework",))
    if adapter.prepare_kbit:
        from .kbit import check_prepare_kbit
        check_prepare_kbit(adapter, training)
    experts = any(m.name == "experts" for k in arch.kinds for m in adapted_modules(adapter, arch, k))
    if adapter.method == "dora" and experts:
        raise ConfigError("training.adapter.method", "dora", "'lora' or 'qlora' when the routed experts are adapted",
                          "PEFT's ParamWrapper does not support DoRA", related=("training.adapter.target_modules",))
    if adapter.dropout and experts:
        raise ConfigError("training.adapter.dropout", adapter.dropout, "0 when the routed experts are adapted",
                          "PEFT's ParamWrapper refuses lora_dropout", related=("training.adapter.target_modules",))
    names = {m.name for k in arch.kinds for m in layer_modules(arch, k)}
    missing = [t for t in adapter.target_modules if t != ALL_LINEAR and t not in names]
    if missing:
        raise ConfigError("training.adapter.target_modules", list(adapter.target_modules),
                          f"modules this model has: {', '.join(t for t in TARGETS if t in names)}",
                          f"{', '.join(missing)}: not in this model")


# --- model states -------------------------------------------------------------------------------

def adapter_dtype(training, recipe) -> str:
    """The trainable tensors' dtype. PEFT keeps the adapters of a 16-bit base in fp32 under the HF
    Trainer; DeepSpeed casts the whole module to its 16-bit dtype (its fp32 copy is the master);
    FSDP2 keeps fp32 shards when it has master weights (torchtitan's mixed precision), else the
    weights dtype (torchtune's bf16 LoRA recipes)."""
    if training.framework == "hf":
        return "fp32"
    if training.framework in ("fsdp2", "fsdp1") and recipe.master_weights:  # FSDP1: the fp32 FlatParameter
        return "fp32"
    return recipe.param_dtype


def quantized_bytes(dtype: str, m: Module, framework: str, double_quant: bool = True) -> float:
    """Storage of one frozen base linear of `m`'s shape in a quantized dtype, with its scales."""
    n = m.in_features * m.out_features
    from .training import FSDP_FRAMEWORKS
    if dtype == "nf4" and framework in FSDP_FRAMEWORKS:  # torchao NF4Tensor (torchtune's QLoRA)
        # 4-bit codes, int8 scale per 64, bf16 factor per 256 scales; its mean and 16-entry code table
        # are allocations of their own (512 B each, the caching allocator's smallest block)
        return m.copies * (n / 2 + n / 64 + 2 * n / 16384 + 1024)
    if dtype == "nf4" and double_quant:  # bitsandbytes Params4bit (the HF/PEFT QLoRA), bitsandbytes 0.49.2
        # functional.quantize_4bit: uint8 absmax per 64, fp32 absmax per 256 blocks, and allocations of 512 B
        # blocks each: the 16-entry fp32 NF4 code, the fp32 offset, its own copy of the 256-entry fp32 dynamic
        # code (quantize_blockwise: code.to(device, copy=True)); measured against real bitsandbytes
        return m.copies * (n / 2 + n / 64 + 4 * n / 16384 + 2048)
    if dtype == "nf4":  # bnb_4bit_use_double_quant=False: an fp32 absmax per 64 and the NF4 code
        return m.copies * (n / 2 + 4 * n / 64 + 512)
    if dtype == "int8":  # bitsandbytes Int8Params: int8 weights and one fp32 scale per row (SCB)
        return m.copies * (n + 4 * m.out_features)
    if dtype == "int4":  # GPTQ QuantLinear, group 128: packed int4, fp16 scales and int4 zeros per
        # group, int32 g_idx per input feature
        return m.copies * (n / 2 + n / 128 * 2.5 + 4 * m.in_features)
    raise ValueError(dtype)


QUANTIZED_SOURCES = {
    "nf4": QLORA_SOURCE,
    "int8": "Dettmers et al. 2022 (LLM.int8()); bitsandbytes Int8Params (int8 weights, fp32 row scales SCB)",
    "int4": "Frantar et al. 2022 (GPTQ); gptqmodel/auto-gptq QuantLinear (qweight, qzeros, fp16 scales, g_idx; "
            "group size 128)",
}


class Inventory(NamedTuple):
    """A stage's parameters as an adapter fine-tune splits them (elements and bytes on one GPU,
    before any sharding)."""

    frozen: float  # elements of the frozen base
    frozen_bytes: float  # in their storage dtype (quantized linears with their scales)
    quantized: float  # elements of the base stored quantized
    adapters: float  # elements of the adapters
    saved: float  # elements of the trainable copies of the embedding and head (modules_to_save)
    small: float  # trainable tensors under 4096 elements (8-bit optimizers keep them in 32-bit)
    factored: float  # rows + columns of the trainable matrices (Adafactor)
    largest: float  # the largest trainable tensor
    tensors: int = 0  # trainable tensors (each has a step counter under torch's fused AdamW)

    @property
    def trainable(self) -> float:
        return self.adapters + self.saved


def inventory(arch, training, recipe, sp) -> Inventory:
    adapter = training.adapter
    base = base_dtype(adapter, recipe.param_dtype)
    from .dtypes import bytes_per_element
    quantized = quantized_bytes_total = 0.0
    adapters = small = factored = largest = 0.0
    count = 0
    for kind, layers in sp.kind_counts:
        for m in layer_modules(arch, kind):
            if base in QUANTIZED and stored_quantized(training, arch, m.name):
                quantized += layers * m.copies * m.in_features * m.out_features
                quantized_bytes_total += layers * quantized_bytes(base, m, training.framework, adapter.double_quant)
            if not adapted(adapter, m.name):
                continue
            adapters += layers * module_parameters(adapter, m)
            for rows, cols in module_matrices(adapter, m):
                small += layers * rows * cols if rows * cols < 4096 else 0.0
                factored += layers * (rows + cols)
                largest = max(largest, rows * cols)
                count += layers
    saved = 0.0
    if adapter.trainable_embeddings:
        tensors = [t for t in arch.embedding_tensors() + arch.head_tensors() if t.role in ("embedding", "head")]
        saved = sum(t.numel for t in tensors)
        factored += sum(sum(t.shape) for t in tensors)
        largest = max([largest] + [t.numel for t in tensors])
        count += len(tensors)
    P = bytes_per_element(recipe.param_dtype if base in QUANTIZED else base)  # the rest of a quantized base
    if adapter.prepare_kbit:  # peft's prepare_model_for_kbit_training casts the rest to fp32 (kbit.py)
        P = 4.0
    if training.framework == "fsdp1" and recipe.master_weights and base not in QUANTIZED and not adapter.base_dtype:
        P = 4.0  # FSDP1's FlatParameters keep the weights' own dtype, fp32 under mixed precision (fsdp1.py)
    frozen = sp.local
    frozen_bytes = quantized_bytes_total + P * (frozen - quantized)
    return Inventory(frozen, frozen_bytes, quantized, adapters, saved, small, factored, largest, count)


def stored_quantized(training, arch, name: str) -> bool:
    """Whether a frozen linear is stored quantized: every nn.Linear of the layers (fused 3-D experts are
    not nn.Linear and stay 16-bit), except under torchtune's Qwen2 LoRA builder (the contract's qkv_bias
    marks Qwen2), whose attention projections without an adapter are plain bf16 nn.Linear whatever
    quantize_base (torchtune 0.6.1 models/qwen2/_component_builders.py lora_qwen2_self_attention;
    measured, tests/data/measured/torchtune/qwen2.5-7b-qlora-*-w2)."""
    if name == "experts":
        return False
    if training.framework == "torchtune" and arch.qkv_bias and name in ("q", "k", "v", "o"):
        return adapted(training.adapter, name)
    return True


# torch's fused AdamW keeps each parameter's `step` as a 0-dim fp32 tensor on its device (torch/optim/adam.py:
# "host step on CPU if both capturable and fused are off"): one 512-byte block of the caching allocator each
# (measured, tests/data/measured/peft and torchtune); the HF Trainer's adamw_torch_fused and torchtune's configs
# (fused: True) run it
STEP_COUNTER_BYTES = 512
FUSED_ADAMW_FRAMEWORKS = ("hf", "torchtune")


def adapter_states(inv: Inventory, training, recipe, par, zero: int, frozen_with_grads: float = 0.0):
    """Model states of an adapter fine-tune on one GPU. The frozen base is sharded like any
    parameter where the framework shards parameters (FSDP2's fully_shard and DeepSpeed ZeRO-3
    partition frozen parameters too), else replicated; gradients, master weights and optimizer
    states exist for the trainable tensors only (the optimizer is built over them) and shard from
    ZeRO 2 and 1 as in `states.model_states`; `inv` is the stage's `inventory`. `frozen_with_grads`:
    frozen elements that get gradients anyway (FSDP1 units holding frozen and trainable weights, fsdp1.py)."""
    from .dtypes import bytes_per_element
    from .optimizers import OPTIMIZERS
    from .components import once
    from .states import ModelStates
    from .training import FSDP_FRAMEWORKS

    d = par.dp
    param_stage = 2 if training.framework in FSDP_FRAMEWORKS + ("fsdp1",) else 3  # FSDP2 keeps shards at 2 too

    def sharded(value: float, from_stage: int) -> float:
        return value / d if zero >= from_stage else value

    A = bytes_per_element(adapter_dtype(training, recipe))
    # the trainable embedding/head copies keep the weights dtype under the HF Trainer (PEFT copies
    # the module; autocast_adapter_dtype casts adapter layers only)
    S = bytes_per_element(recipe.param_dtype) if training.framework == "hf" else A
    if training.adapter.prepare_kbit:  # copied from the embedding and head that prepare cast to fp32 (kbit.py)
        S = 4.0
    hf = training.framework == "hf"
    G_a = A if hf else bytes_per_element(recipe.grad_dtype)  # torch: a gradient takes its tensor's dtype
    G_s = S if hf else G_a
    M = 4.0 if recipe.master_weights and A < 4 and not hf else 0.0
    O_a = A if hf else bytes_per_element(recipe.optimizer_dtype)
    O_s = S if hf else O_a
    opt = OPTIMIZERS[training.optimizer]

    def states(n: float, s: float) -> float:
        share = n / inv.trainable if inv.trainable else 0.0
        return opt.state_bytes(n, inv.small * share, n, inv.factored * share, s)

    def per_param(n: float, s: float) -> float:
        return states(n, s) / n if n else 0.0

    params = sharded(inv.frozen_bytes + A * inv.adapters + S * inv.saved, param_stage)
    grads = sharded(G_a * (inv.adapters + frozen_with_grads) + G_s * inv.saved, 2)
    masters = sharded(M * inv.trainable, 1)
    # a step counter per trainable tensor, on every rank (each holds a shard of every tensor)
    counters = STEP_COUNTER_BYTES * inv.tensors if training.framework in FUSED_ADAMW_FRAMEWORKS and \
        training.optimizer == "adamw" else 0
    optimizer = sharded(states(inv.adapters, O_a) + states(inv.saved, O_s), 1) + counters
    base = base_dtype(training.adapter, recipe.param_dtype)

    def write() -> dict[str, str]:
        shard = f" / d (d = DP = {d})"
        rest = "fp32, prepare_model_for_kbit_training" if training.adapter.prepare_kbit else recipe.param_dtype
        quant = (f"{inv.frozen_bytes / 2**20:,.0f} MiB frozen base ({inv.quantized:,.0f} linear weights in {base} with "
                 f"their scales, {inv.frozen - inv.quantized:,.0f} others in {rest})"
                 if base in QUANTIZED else f"{bytes_per_element(base):g} B x {inv.frozen:,.0f} frozen ({base})")
        trainable = f" + {A:g} B x {inv.adapters:,.0f} adapter params"
        if inv.saved:
            trainable += f" + {S:g} B x {inv.saved:,.0f} trainable embedding/head copies"
        grads_text = f"{G_a:g} B x {inv.adapters:,.0f} adapter params" + (
            f" + {G_s:g} B x {inv.saved:,.0f} embedding/head copies" if inv.saved else "") + (
            f" + {G_a:g} B x {frozen_with_grads:,.0f} frozen params sharing their FSDP1 units' FlatParameters"
            if frozen_with_grads else " (frozen base: none)")
        return {
            "parameters": quant + trainable + (shard if zero >= param_stage else ""),
            "fp8_weight_copies": "",
            "gradients": grads_text + (shard if zero >= 2 else ""),
            "master_weights": f"4 B (fp32) x {inv.trainable:,.0f} trainable params" + (shard if zero >= 1 else ""),
            "optimizer_states": f"{training.optimizer} states of the trainable params only: "
                                f"{per_param(inv.adapters, O_a):.4g} B x {inv.adapters:,.0f} adapter params"
                                + (f" + {per_param(inv.saved, O_s):.4g} B x {inv.saved:,.0f} copies" if inv.saved
                                   else "") + (shard if zero >= 1 else "")
                                + (f" + {STEP_COUNTER_BYTES} B x {inv.tensors:,} fused AdamW step counters" if counters
                                   else ""),
        }

    return ModelStates(parameters=params, gradients=grads, master_weights=masters, optimizer_states=optimizer,
                       fp8_weight_copies=0.0, formulas=once(write), zero_stage=zero)


# --- activations --------------------------------------------------------------------------------

def reads_input_directly(training) -> bool:
    """``lora_A`` reads the module's own input (no fp32 cast, no dropout), which then stays saved
    for it: adapters in the compute dtype (torchtune's bf16 LoRA) without dropout."""
    from .dtypes import bytes_per_element
    from .training import resolve_recipe
    A = adapter_dtype(training, resolve_recipe(training))
    return bytes_per_element(A) == bytes_per_element(training.compute_dtype) and not training.adapter.dropout


def trainable_weights(training, arch) -> frozenset[str]:
    """The weights whose gradients an adapter run computes, by the names `activations.Entry.for_weights`
    uses: the embedding and head copies when trained, and the adapted modules when their adapters
    read the module's input as it is."""
    adapter = training.adapter
    names = {"embedding", "head"} if adapter.trainable_embeddings else set()
    if reads_input_directly(training):
        names |= {m.name for k in arch.kinds for m in adapted_modules(adapter, arch, k)}
    from .fsdp1 import frozen_weights_train
    if frozen_weights_train(training):  # a layer's weights share its FSDP1 FlatParameter with adapters (fsdp1.py)
        names |= {m.name for k in arch.kinds for m in layer_modules(arch, k)} | {"norm"}
    return frozenset(names)


def kept(entries: list, training, arch, inputs_kept: frozenset[str] = frozenset()) -> list:
    """The tensors a run keeps: without an adapter, all; with one, not those saved only for the
    gradients of frozen weights, unless the frozen layer keeps its input itself (`inputs_kept`)."""
    if training.adapter is None:
        return entries
    trainable = trainable_weights(training, arch) | inputs_kept
    return [e for e in entries if not e.for_weights or any(w in trainable for w in e.for_weights)]


# the order of a layer's linears: an input needs a gradient when an adapted module comes before it
_LAYER_ORDER = (("q", "k", "v"), ("o",), ("gate", "up", "router"), ("down",))


def bnb_kept_inputs(training, arch, kind: str, first: bool) -> frozenset[str]:
    """The 4-bit linears of a layer whose MatMul4Bit keeps its input (bitsandbytes through 0.43.1,
    `bnb_keeps_input`): every one whose input or weight needs a gradient (``any(needs_input_grad[:2])``).
    The weights are frozen, so in the first layer of a run whose embeddings need no gradient
    (`first`), only those after an adapted module of the layer."""
    if not bnb_keeps_input(training):
        return frozenset()
    adapter = training.adapter
    names = {m.name for m in layer_modules(arch, kind) if m.name != "experts"}  # fused experts stay 16-bit
    if not first:
        return frozenset(names)
    out: set[str] = set()
    upstream = False
    for group in _LAYER_ORDER:
        if upstream:
            out |= names & set(group)
        upstream = upstream or any(adapted(adapter, n) for n in group if n in names)
    return frozenset(out)


def first_layer_input_frozen(training) -> bool:
    """The first layer's input needs no gradient: the embeddings are frozen and nothing makes them
    require grad (the HF Trainer calls enable_input_require_grads when it checkpoints)."""
    adapter = training.adapter
    return (adapter is not None and not adapter.trainable_embeddings and training.recompute == "none"
            and training.mode == "training")


def attention_input_adapted(adapter: Adapter, arch) -> bool:
    return any(adapted(adapter, name) for name in ("q", "k", "v"))


def module_entries(arch, training, par, m: Module, first: bool) -> list:
    """What one adapted module keeps for its backward: ``lora_A``'s input (the fp32 cast, or the
    dropout output and its mask) and ``lora_B``'s input, the r-wide output of ``lora_A``."""
    from .activations import Entry, tokens_per_gpu
    from .dtypes import bytes_per_element
    from .training import resolve_recipe
    adapter = training.adapter
    dtype = adapter_dtype(training, resolve_recipe(training))
    A, T, n = bytes_per_element(dtype), tokens_per_gpu(training, par), m.copies
    width = f"in_{m.name}" + (f"*{n}" if n > 1 else "")
    out = []
    if adapter.dropout:
        out.append(Entry(f"{m.name} adapter: dropout output ({dtype}, lora_A input)", T * m.in_features * n, A, "none",
                         f"{A:g}*s*b*{width}"))
        # no mask where the input needs no gradient: the first layer's q, k, v with frozen embeddings
        if not (first and m.name in ("q", "k", "v")):
            out.append(Entry(f"{m.name} adapter: dropout mask", T * m.in_features * n, 1, "none", f"s*b*{width}"))
    elif not reads_input_directly(training):
        out.append(Entry(f"{m.name} adapter: input cast to {dtype} (lora_A input)", T * m.in_features * n, A, "none",
                         f"{A:g}*s*b*{width}"))
    r = adapter.rank * m.rank_factor
    out.append(Entry(f"{m.name} adapter: lora_A output (lora_B input)", T * r * n, A, "none",
                     f"{A:g}*s*b*r" + (f"*{n}" if n > 1 else "")))
    if adapter.method == "dora":
        out += dora_entries(training, m, A, T, first)
    return out


DORA_SOURCE = ("Liu et al. 2024 (DoRA); peft 0.21 tuners/lora/dora.py DoraLinearLayer.forward: (m/||W + BA|| - 1) x "
               "base_result + m/||W + BA|| x lora_B(lora_A(x)) x scaling, the norm detached; measured in "
               "tests/data/measured/peft")


def dora_entries(training, m: Module, A: float, T: float, first: bool) -> list:
    """DoRA scales the base output and the adapter output by m / ||W + BA||: both products keep
    their out-wide input for the magnitude's gradient, with the norm, the scale and scale - 1 (fp32
    vectors). With adapter dropout PEFT recomputes the base output from the dropped-out fp32 input,
    F.linear(x, W.to(fp32)), which keeps that fp32 copy of the weight for the input's gradient
    (none where the input needs no gradient)."""
    from .activations import Entry
    from .dtypes import bytes_per_element
    n, o = m.copies, m.out_features
    B = A if training.adapter.dropout else bytes_per_element(training.compute_dtype)
    out = [Entry(f"{m.name} DoRA: base output (magnitude gradient)", T * o * n, B, "none", f"{B:g}*s*b*out"),
           Entry(f"{m.name} DoRA: adapter output (magnitude gradient)", T * o * n, A, "none", f"{A:g}*s*b*out"),
           Entry(f"{m.name} DoRA: norm, scale and scale - 1 (fp32)", 3 * o * n, 4, "none", "3*4*out",
                 split_by_cp=False)]
    if training.adapter.dropout and not (first and m.name in ("q", "k", "v")):
        out.append(Entry(f"{m.name} DoRA: fp32 copy of the base weight (F.linear input gradient)",
                         o * m.in_features * n, A, "none", f"{A:g}*out*in", split_by_cp=False))
    return out


def bnb_held_entries(entries: list, training, arch, kind: str) -> list:
    """What a layer's 4-bit linears keep outside its checkpoint: bitsandbytes through 0.43.1 holds
    MatMul4Bit's input A in ``ctx.tensors``, an attribute of the autograd node rather than a tensor
    saved with ``save_for_backward``, so non-reentrant checkpointing (the HF Trainer's
    gradient_checkpointing) cannot drop it: each checkpointed layer keeps the inputs of its 4-bit
    linears from forward until its backward (measured, tests/data/measured/peft/*-bnb0.43.1)."""
    from .activations import ATTENTION_OUTPUT
    if training.recompute != "full" or not bnb_keeps_input(training):
        return []
    names = bnb_kept_inputs(training, arch, kind, first=False)
    return [e for e in entries if set(e.for_weights) & names or (e.name == ATTENTION_OUTPUT and "o" in names)]


def adapted_layer_entries(entries: list, arch, training, par, kind: str, first: bool = False) -> list:
    """A layer's full-fine-tuning ledger as an adapter run keeps it: without what frozen weights'
    gradients alone would read, with what each adapted module keeps. `first`: the first layer with
    a frozen input (`first_layer_input_frozen`), whose attention norm keeps nothing when q, k or v is
    adapted (otherwise the layer is counted as any other: at most its norm's tensors over)."""
    from .activations import _norm, tokens_per_gpu
    out = kept(entries, training, arch, bnb_kept_inputs(training, arch, kind, first))
    if first and attention_input_adapted(training.adapter, arch):
        norm = {e.name for e in _norm("attention norm input", tokens_per_gpu(training, par), arch, training)}
        out = [e for e in out if e.name not in norm]
    for m in adapted_modules(training.adapter, arch, kind):
        out += module_entries(arch, training, par, m, first)
    return out


def adapter_count(adapter: Adapter, arch) -> int:
    """The adapters' parameters over the whole model."""
    return sum(n * layer_parameters(adapter, arch, kind) for kind, n in arch.kind_counts())


def trainable_count(arch, training) -> int:
    """Trainable parameters of the whole model (the output's ``parameters.trainable``)."""
    adapter = training.adapter
    layers = adapter_count(adapter, arch)
    saved = 0
    if adapter.trainable_embeddings:
        saved = sum(t.numel for t in arch.embedding_tensors() + arch.head_tensors() if t.role in ("embedding", "head"))
    return layers + saved
