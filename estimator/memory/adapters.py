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
- with frozen embeddings and no checkpointing the first layer's input needs no gradient, so it
  keeps only what follows an adapted module: never its attention norm's tensors, and with MLP-only
  adapters nothing of its attention nor its MLP norm (adapter_activations.first_layer_kept; measured,
  tests/data/measured/peft).

Contract names of the targets (``training.adapter.target_modules``): q, k, v, o, gate, up, down,
router, experts, or "all-linear" (PEFT: every linear layer but the output layer). On MoE models peft 0.21.2 adapts
transformers 5's fused experts only for the model types it converts from v4 names (`PEFT_MOE_SOURCE`,
Architecture.peft_moe_conversion): there "all-linear" also takes the router and the fused experts, and for the
qwen2_moe-converted types (Qwen3-MoE, Qwen3-Next, DeepSeek) gate, up and down name the fused experts, leaving the
shared experts and dense MLPs unadapted; elsewhere (Llama 4, gpt-oss) only nn.Linear modules are adapted.

On a vision-language model peft matches the same names inside the vision tower (by suffix, over the whole model),
and "all-linear" takes the tower's and the projector's linears: their adapters are counted as trainable
(`vision_modules`), on the first stage. With images they would also keep activations: not modelled (refused).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from ..spec.errors import ConfigError
from ..spec.choices import ALL_LINEAR, QUANTIZED, TARGETS
from ..spec.adapter import Adapter, BNB_VERSION, base_dtype


SOURCE = ("Hu et al. 2021 (LoRA): r x (in + out) per adapted module; peft 0.21 tuners/lora/layer.py (fp32 adapters "
          "of a 16-bit base, autocast_adapter_dtype; modules_to_save keeps a trainable copy beside the original)")
QLORA_SOURCE = ("Dettmers et al. 2023 (QLoRA): NF4 in blocks of 64 with double-quantized scales; bitsandbytes "
                "functional.quantize_4bit (uint8 absmax per 64, fp32 absmax per 256 blocks); torchao NF4Tensor "
                "(int8 scale per 64, one bf16 factor per 256 scales), measured in tests/data/measured/peft")


# --- which modules are adapted ------------------------------------------------------------------

class Module(NamedTuple):
    """One adaptable linear of a layer: its contract name, widths, and copies per layer."""

    name: str
    in_features: int
    out_features: int
    copies: int = 1
    rank_factor: int = 1  # PEFT's ParamWrapper on fused experts: r x experts (x 2 for gate_up)
    part: str = ""  # the fused experts' parameter: "gate_up" or "down"


def layer_modules(arch, kind: str) -> list[Module]:
    """The linears of a layer that adapters can target, as transformers names them."""
    h = arch.hidden_size
    if arch.fused_qkv:  # one linear, h -> q + 2 kv (Qwen-1 modeling_qwen.py QWenAttention: c_attn =
        # nn.Linear(hidden_size, 3 * projection_size)), named after q: peft wraps it as one LoRA layer
        out = [Module("q", h, arch.q_width + 2 * arch.kv_width)]
    else:
        out = [Module("q", h, arch.q_width), Module("k", h, arch.kv_width), Module("v", h, arch.kv_width)]
    out.append(Module("o", arch.attention_output_width, h))
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
    out += [Module("experts", h, 2 * f if arch.gated_mlp else f, 1, 2 * e if arch.gated_mlp else e, "gate_up"),
            Module("experts", f, h, 1, e, "down")]
    return out


PEFT_MOE_SOURCE = ("peft 0.21.2 utils/transformers_weight_conversion.py _convert_peft_config_moe (lines 402-476): "
                   "for the model types of _MODEL_TO_CONVERSION_PATTERN whose pattern has a _MOE_TARGET_MODULE_MAPPING "
                   "(mixtral, qwen2_moe) it moves the v4 names to target_parameters, resolving \"all-linear\" to the "
                   "nn.Linear names plus the mapping's keys; other MoE types keep nn.Linear targets only (measured: "
                   "tests/data/measured/peft_wrap/moe-lora-wrap.json)")


def adaptable(arch, name: str) -> bool:
    """Unconverted (peft_moe_conversion "none"), peft wraps no fused experts and only an nn.Linear router
    (Llama4Router): gpt_oss's GptOssTopKRouter and GptOssExperts are neither nn.Linear nor a ParamWrapper target."""
    if arch.peft_moe_conversion != "none" or not arch.num_experts:
        return True
    return name != "experts" and (name != "router" or arch.router_is_linear)


def _qwen2_moe_names(arch) -> bool:
    """peft maps gate_proj, up_proj and down_proj to the fused experts (_MOE_TARGET_MODULE_MAPPING["qwen2_moe"])
    and drops them from target_modules, so the shared experts' and dense layers' MLPs are not adapted."""
    return bool(arch.num_experts) and arch.peft_moe_conversion == "qwen2_moe"


def _mlp_modules(arch, width: int, copies: int) -> list[Module]:
    h = arch.hidden_size
    if arch.gated_mlp:
        return [Module("gate", h, width, copies), Module("up", h, width, copies), Module("down", width, h, copies)]
    return [Module("up", h, width, copies), Module("down", width, h, copies)]


# The vision tower's linears as transformers 5.23 names them, with the contract target whose peft suffix
# (validation/peft/build.py TARGET_MODULES: q_proj, ..., down_proj) matches them, or None where only "all-linear"
# takes them. peft matches target_modules by name suffix over the whole model (peft 0.21.2
# tuners/tuners_utils.py check_target_module_exists), and "all-linear" takes every nn.Linear but the output
# embedding (tuners_utils.py _maybe_include_all_linear_layers), the tower's and the projector's included; the patch
# embeddings' Conv2d/Conv3d and Gemma 3's projector matrix (an nn.Parameter) are not nn.Linear. Measured: the wrap of
# the real classes, tests/data/measured/peft/vlm-lora-wrap.json.
def vision_modules(arch, freeze_vision: bool = False) -> list[tuple[str | None, Module]]:
    """(contract target or None, module) for each adaptable linear of the tower, `copies` = its blocks; with the
    encoder frozen only the projector's (LLaMA-Factory's freeze_vision_tower keeps the tower out of the targets)."""
    from ..spec import vision as _vision
    if arch.vision_tower is None:
        return []
    c, f, n, D = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_layers, arch.hidden_size
    if arch.vision_tower == _vision.QWEN2_5_VL:  # modeling_qwen2_5_vl.py: Qwen2_5_VLVisionAttention qkv, proj;
        # Qwen2_5_VLMLP gate_proj, up_proj, down_proj; Qwen2_5_VLPatchMerger mlp.0, mlp.2
        m = arch.vision_spatial_merge_size ** 2 * c
        encoder = [(None, Module("qkv", c, 3 * c, n)), (None, Module("proj", c, c, n)),
                   ("gate", Module("gate", c, f, n)), ("up", Module("up", c, f, n)), ("down", Module("down", f, c, n))]
        projector = [(None, Module("merger_fc1", m, m)), (None, Module("merger_fc2", m, D))]
    elif arch.vision_tower == _vision.LLAMA4:  # modeling_llama4.py: Llama4VisionAttention q/k/v/o_proj,
        # Llama4VisionMLP fc1, fc2; Llama4UnfoldConvolution.linear; the pixel-shuffle MLP fc1, fc2;
        # Llama4MultiModalProjector.linear_1
        q, p = arch.vision_projector_size, arch.vision_patch_size
        encoder = [(t, Module(t, c, c, n)) for t in ("q", "k", "v", "o")] + [
            (None, Module("fc1", c, f, n)), (None, Module("fc2", f, c, n)),
            (None, Module("patch_embed", _vision.CHANNELS * p * p, c)),
            (None, Module("adapter_fc1", c * arch.vision_spatial_merge_size ** 2, q)), (None, Module("adapter_fc2", q, q))]
        projector = [(None, Module("projector", q, D))]
    else:  # modeling_siglip.py: SiglipAttention q_proj, k_proj, v_proj, out_proj; SiglipMLP fc1, fc2
        encoder = [(t, Module(t, c, c, n)) for t in ("q", "k", "v")] + [
            (None, Module("out_proj", c, c, n)), (None, Module("fc1", c, f, n)), (None, Module("fc2", f, c, n))]
        projector = []
    return projector if freeze_vision else encoder + projector


def adapted_vision_modules(adapter: Adapter, arch, freeze_vision: bool = False) -> list[Module]:
    return [m for target, m in vision_modules(arch, freeze_vision)
            if adapter.all_linear or (target is not None and target in adapter.target_modules)]


def fused_targets(adapter: Adapter, arch) -> Adapter:
    """With one q, k, v linear (`Architecture.fused_qkv`) q, k or v names it: peft wraps the one module
    (Phi-3 qkv_proj, GPT-NeoX and Falcon query_key_value, GPT-2 and Qwen-1 c_attn), so ["q", "v"] adapts it once,
    as "q": what peft's default targets give for gpt2, gpt_neox and falcon (peft 0.21 utils/constants.py
    TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING; measured: tests/data/measured/peft/gpt2-medium-8layers-*,
    falcon-7b-8layers-*)."""
    targets = adapter.target_modules
    if not arch.fused_qkv or adapter.all_linear or not {"k", "v"} & set(targets):
        return adapter
    return replace(adapter, target_modules=tuple(dict.fromkeys("q" if t in ("k", "v") else t for t in targets)))


def adapted(adapter: Adapter, name: str) -> bool:
    if adapter.all_linear:
        return True
    return name in adapter.target_modules


def peft_adapts(adapter: Adapter, arch, m: Module) -> bool:
    """Whether peft wraps module `m` (PEFT_MOE_SOURCE): the contract names, with qwen2_moe's conversion of gate, up
    and down onto the routed experts (gate_up needs gate and up, `check_adapter`)."""
    if not adaptable(arch, m.name):
        return False
    if _qwen2_moe_names(arch):
        if m.name in ("gate", "up", "down"):
            return False
        if m.name == "experts" and not adapter.all_linear and "experts" not in adapter.target_modules:
            targets = set(adapter.target_modules)
            return {"gate", "up"} <= targets if m.part == "gate_up" else "down" in targets
    return adapted(adapter, m.name)


def adapted_modules(adapter: Adapter, arch, kind: str) -> list[Module]:
    return [m for m in layer_modules(arch, kind) if peft_adapts(adapter, arch, m)]


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
    from ..spec.choices import FSDP_FRAMEWORKS
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
    names = {m.name for k in arch.kinds for m in layer_modules(arch, k) if adaptable(arch, m.name)}
    if _qwen2_moe_names(arch):  # gate, up and down name the routed experts (PEFT_MOE_SOURCE)
        names |= {"gate", "up", "down"}
        if not adapter.all_linear and len({"gate", "up"} & set(adapter.target_modules)) == 1:
            raise ConfigError("training.adapter.target_modules", list(adapter.target_modules),
                              "gate and up together, or neither", "peft fuses gate_proj and up_proj into the experts' "
                              "gate_up_proj and refuses one without the other (utils/transformers_weight_conversion.py "
                              "_convert_peft_config_moe)")
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
        from ..spec.adapter import base_dtype, peft_adapters_in_base_dtype
        from ..spec.choices import QUANTIZED
        in_base = (peft_adapters_in_base_dtype(training.adapter)
                   and base_dtype(training.adapter, recipe.param_dtype) not in QUANTIZED)
        return recipe.param_dtype if in_base else "fp32"  # peft before 0.12.0 (spec/adapter.py PEFT_SOURCE)
    if training.framework in ("fsdp2", "fsdp1", "hf_fsdp2") and recipe.master_weights:
        return "fp32"  # FSDP1: the fp32 FlatParameter; hf_fsdp2: peft's fp32 adapters, which Accelerate keeps
    return recipe.param_dtype


def saved_copy_bytes(training, recipe) -> float:
    """Bytes per element of the trainable embedding/head copies (modules_to_save): the weights dtype under the HF
    Trainer (PEFT copies the module; autocast_adapter_dtype casts adapter layers only), fp32 where
    prepare_model_for_kbit_training cast the originals first (kbit.py), else the adapters' dtype."""
    from ..spec.dtypes import bytes_per_element
    if training.adapter.prepare_kbit:
        return 4.0
    if training.framework == "hf":
        return bytes_per_element(recipe.param_dtype)
    return bytes_per_element(adapter_dtype(training, recipe))


def quantized_bytes(dtype: str, m: Module, framework: str, double_quant: bool = True) -> float:
    """Storage of one frozen base linear of `m`'s shape in a quantized dtype, with its scales."""
    n = m.in_features * m.out_features
    from ..spec.choices import FSDP_FRAMEWORKS
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
    from ..spec.dtypes import bytes_per_element
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
    for m in adapted_vision_modules(adapter, arch, training.freeze_vision) if sp.first else ():
        adapters += module_parameters(adapter, m)  # the tower's adapters, on the first stage with the tower
        for rows, cols in module_matrices(adapter, m):
            small += rows * cols if rows * cols < 4096 else 0.0  # module_matrices lists each copy's matrices
            factored += rows + cols
            largest = max(largest, rows * cols)
            count += 1
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
    from .components import once
    from .states import ModelStates, parameter_shard_stage
    from .fsdp1 import shard_group
    d = shard_group(training, par)  # DP, or FSDP1 HYBRID_SHARD's shard group (fsdp1.py)
    param_stage = parameter_shard_stage(training)

    def sharded(value: float, from_stage: int) -> float:
        return value / d if zero >= from_stage else value

    A, S = _trainable_bytes(training, recipe)
    G_a, G_s = _gradient_bytes(training, recipe)
    M = 4.0 if recipe.master_weights and A < 4 and training.framework != "hf" else 0.0
    O_a, O_s = _optimizer_dtype_bytes(training, recipe)
    params = sharded(inv.frozen_bytes + A * inv.adapters + S * inv.saved, param_stage)
    grads = sharded(G_a * (inv.adapters + frozen_with_grads) + G_s * inv.saved, 2)
    masters = sharded(M * inv.trainable, 1)
    optimizer = sharded(_optimizer_states(inv, training, inv.adapters, O_a)
                        + _optimizer_states(inv, training, inv.saved, O_s), 1) + _step_counter_bytes(inv, training)
    return ModelStates(parameters=params, gradients=grads, master_weights=masters, optimizer_states=optimizer,
                       fp8_weight_copies=0.0, zero_stage=zero,
                       formulas=once(lambda: _adapter_state_formulas(inv, training, recipe, zero, d,
                                                                     frozen_with_grads)))


def _trainable_bytes(training, recipe) -> tuple[float, float]:
    """Bytes per element of (the adapters, the trainable embedding/head copies): the copies keep the weights
    dtype under the HF Trainer (PEFT copies the module; autocast_adapter_dtype casts adapter layers only)."""
    from ..spec.dtypes import bytes_per_element
    return bytes_per_element(adapter_dtype(training, recipe)), saved_copy_bytes(training, recipe)


def _gradient_bytes(training, recipe) -> tuple[float, float]:
    """Bytes per gradient element of (the adapters, the copies). torch: a gradient takes its tensor's dtype."""
    from ..spec.dtypes import bytes_per_element
    if training.framework == "hf":
        return _trainable_bytes(training, recipe)
    G = bytes_per_element(recipe.grad_dtype)
    return G, G


def _optimizer_dtype_bytes(training, recipe) -> tuple[float, float]:
    """Bytes per optimizer-state element of (the adapters, the copies): their own dtypes under the HF Trainer."""
    from ..spec.dtypes import bytes_per_element
    if training.framework == "hf":
        return _trainable_bytes(training, recipe)
    B = bytes_per_element(recipe.optimizer_dtype)
    return B, B


def _optimizer_states(inv: Inventory, training, n: float, state_bytes: float) -> float:
    """The optimizer's states of `n` of the trainable elements (their share of the small tensors and of the
    factored rows and columns), before sharding."""
    from ..spec.optimizers import OPTIMIZERS
    share = n / inv.trainable if inv.trainable else 0.0
    return OPTIMIZERS[training.optimizer].state_bytes(n, inv.small * share, n, inv.factored * share, state_bytes)


def _step_counter_bytes(inv: Inventory, training) -> int:
    """Fused AdamW's step counters: one per trainable tensor, on every rank (each holds a shard of every tensor)."""
    if training.framework in FUSED_ADAMW_FRAMEWORKS and training.optimizer == "adamw":
        return STEP_COUNTER_BYTES * inv.tensors
    return 0


def _adapter_state_formulas(inv: Inventory, training, recipe, zero: int, d: int,
                            frozen_with_grads: float) -> dict[str, str]:
    """The formulas of `adapter_states`, written when first shown."""
    from ..spec.dtypes import bytes_per_element
    from .states import parameter_shard_stage
    A, S = _trainable_bytes(training, recipe)
    G_a, G_s = _gradient_bytes(training, recipe)
    O_a, O_s = _optimizer_dtype_bytes(training, recipe)
    base = base_dtype(training.adapter, recipe.param_dtype)
    counters = _step_counter_bytes(inv, training)

    def per_param(n: float, s: float) -> float:
        return _optimizer_states(inv, training, n, s) / n if n else 0.0

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
        "parameters": quant + trainable + (shard if zero >= parameter_shard_stage(training) else ""),
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


def adapter_count(adapter: Adapter, arch) -> int:
    """The adapters' parameters over the whole model."""
    return sum(n * layer_parameters(adapter, arch, kind) for kind, n in arch.kind_counts())


def vision_adapter_count(adapter: Adapter, arch, freeze_vision: bool = False) -> int:
    """The adapters peft puts in a vision-language model's tower and projector (`vision_modules`)."""
    return sum(module_parameters(adapter, m) for m in adapted_vision_modules(adapter, arch, freeze_vision))


def trainable_count(arch, training) -> int:
    """Trainable parameters of the whole model (the output's ``parameters.trainable``, peft's
    print_trainable_parameters): the decoder layers' adapters, the vision tower's, and the trainable copies."""
    adapter = training.adapter
    layers = adapter_count(adapter, arch) + vision_adapter_count(adapter, arch, training.freeze_vision)
    saved = 0
    if adapter.trainable_embeddings:
        saved = sum(t.numel for t in arch.embedding_tensors() + arch.head_tensors() if t.role in ("embedding", "head"))
    return layers + saved
