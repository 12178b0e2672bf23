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

from .adapter import Adapter, adapter_from
from .rl import Rl, rl_from
from .dtypes import INFERENCE_WEIGHT_DTYPES, TRAINING_DTYPES
from .errors import ConfigError
from .choices import (ASYNC_TP_FRAMEWORKS, COMPILE_FRAMEWORKS, DEEPSPEED_FIELDS,
                      TRANSFORMERS_FRAMEWORKS)
from .values import check_section
from .field import record
from .memo import hash_once, not_owned
from .nccl import cumem
from .versions import torch_release



@record("training")
@not_owned
@hash_once
@dataclass(frozen=True)
class Training:
    mode: str = "training"
    framework: str = "megatron"
    framework_version: str | None = None  # the release whose rules apply (versions.py); None = the measured one
    te_version: str | None = None  # megatron: the TransformerEngine release (versions.py); None = the one it installs;
    # "not_installed" = neither TE nor Apex installed: torch's AdamW steps (optimizers.py megatron_torch_adamw)
    torch_version: str | None = None  # the PyTorch release, major.minor (versions.py TORCH_VERSIONS); None = 2.13
    # NCCL allocates with cuMem (NCCL_CUMEM_ENABLE in the training processes); None = off beside an SGLang rollout
    # engine, else the torch release's NCCL's default, on from torch 2.2 (spec/nccl.py uses_cumem)
    nccl_cumem: bool | None = None
    seq_len: int = 4096
    images_per_sample: int = 0  # vision-language models: images per sample, their tokens within seq_len
    image_size: int | None = None  # pixels per side; None: the tower's native size
    freeze_vision: bool = False  # the vision encoder frozen (no gradients, no states, no saved activations)
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
    recompute_every: int = 1  # with "full": checkpoint every N-th layer only (torchtitan/torchtune layer-level AC)
    recompute_modules: tuple[str, ...] = ("core_attn",)  # with "selective": Megatron's --recompute-modules
    optimizer_in_backward: bool = False  # step each parameter in backward (torchtune optimizer_in_bwd)
    offload_optimizer: str = "none"  # "cpu" / "nvme": master weights and optimizer states off the GPU
    offload_parameters: str = "none"  # "cpu" / "nvme": the sharded parameters off the GPU
    offload_activations: bool = False  # saved activations on the host between forward and backward (torchtune)
    attention: str = "flash"
    # hf, deepspeed, fsdp1 with attention "flash": transformers' attn_implementation; None = "sdpa" (its default)
    attn_implementation: str | None = None
    dropout: float = 0.0
    loss: str = "standard"
    fp8: bool = False
    fp8_recipe: str = "tensorwise"
    fp8_all_gather: bool = False  # fsdp2: FSDP2 all-gathers torchao float8 weights (enable_fsdp_float8_all_gather)
    async_tp: bool = False  # TP collectives overlapped with their GEMMs (--tp-comm-overlap, torchtitan async TP)
    liger_kernel: bool = False  # the Trainer's use_liger_kernel: Liger's RMSNorm, SwiGLU, RoPE (memory/liger.py)
    ssm_kernels: str = "fused"  # Mamba-2 mixers: mamba-ssm's kernels or transformers' torch fallback (mamba_torch.py)
    compile: bool = False  # torch.compile of the layers: Inductor's partitioner decides what they save (activations.py)
    # fsdp2 with compile: the loss compiles with the model (torchtitan's compile.components); None = the
    # release's default (memory/titan_releases.py)
    compile_loss: bool | None = None
    kv_cache_tokens: int | None = None
    kv_cache_dtype: str | None = None
    moe_capacity_factor: float = 1.0  # routed tokens per expert relative to a perfect balance
    moe_dispatcher: str = "alltoall"  # "deepep": Megatron-Core's flex dispatcher with DeepEP buffers; "allgather"
    moe_router_dtype: str | None = None  # megatron: --moe-router-dtype fp32/fp64; None = the compute dtype
    attention_softmax_fusion: bool = True  # megatron, eager attention: the fused softmax kernel (--no-masked-softmax-fusion = False)
    cross_entropy_impl: str = "native"  # megatron, loss "fused": --cross-entropy-fusion-impl native or te
    # hf: "trainer" (the HF Trainer through Accelerate's mixed precision) or "plain" (memory/trainer_loop.py)
    training_loop: str = "trainer"
    trl_version: str | None = None  # trl_sft: the TRL release (spec/trl.py); None = the measured one, 1.9.0
    # megatron, interleaved (vpp > 1): --microbatch-group-size-per-virtual-pipeline-stage; None = pp (Megatron's default)
    microbatch_group_size: int | None = None
    # megatron, interleaved: off = --no-overlap-p2p-communication; --overlap-p2p-communication-warmup-flush (with it)
    overlap_p2p_comm: bool = True
    overlap_p2p_comm_warmup_flush: bool = False
    # megatron: --activation-func-fp8-input-store, the fused SwiGLU keeps its input in float8_e4m3fn (activations.py)
    activation_func_fp8_input_store: bool = False
    # megatron: --defer-embedding-wgrad-compute, the last stage keeps the output layer's input and output
    # gradient of every micro-batch (up to --wgrad-deferral-limit, 0 = all) until the pipeline flush (memory.py)
    defer_embedding_wgrad_compute: bool = False
    wgrad_deferral_limit: int = 0
    # megatron: --moe-grouped-gemm, all local experts in grouped GEMMs (TE's GroupedLinear, or the legacy GroupedMLP
    # on the local spec; activations/moe.py)
    moe_grouped_gemm: bool = False
    # megatron: --moe-use-legacy-grouped-gemm, the legacy GroupedMLP (grouped_gemm's gmm) under the TE spec too
    moe_use_legacy_grouped_gemm: bool = False
    # megatron: --transformer-impl; "local" is Megatron-Core's own layer spec (no TransformerEngine module: its
    # unfused DotProductAttention, no TE workspace)
    transformer_impl: str = "transformer_engine"
    # megatron: --no-gradient-accumulation-fusion turns it off; on, the weight-gradient GEMMs accumulate into the
    # fp32 main gradients and hand autograd a cached dummy per weight shape (memory/wgrad_cache.py)
    gradient_accumulation_fusion: bool = True
    # DeepSpeed ZeRO buffers (elements). None = "auto" as the HF Trainer fills it (h^2, int(0.9 h^2), 10 h:
    # transformers integrations/deepspeed.py); stage3_max_live_parameters None = DeepSpeed's 1e9, overlap_comm
    # None = DeepSpeed's default (true under ZeRO-3 only); deepspeed_step.deepspeed_settings
    reduce_bucket_size: int | None = None
    stage3_prefetch_bucket_size: int | None = None
    stage3_max_live_parameters: int | None = None
    stage3_param_persistence_threshold: int | None = None
    overlap_comm: bool | None = None
    # deepspeed: zero_optimization.contiguous_gradients; None = DeepSpeed's default (on); off is modelled for ZeRO-2
    # (memory/deepspeed_noncontiguous.py), offload_optimizer turns it on (stage_1_and_2.py l. 259)
    contiguous_gradients: bool | None = None
    # deepspeed: the AdamW that steps ZeRO's flat fp32 partitions. None = a fused kernel (DeepSpeed's FusedAdam, from
    # the ds_config's optimizer section); "foreach": torch's AdamW the HF Trainer passes as the client optimizer
    # (adamw_torch) where the ds_config names none (memory/deepspeed_step.py)
    adamw_implementation: str | None = None
    adapter: Adapter | None = None  # LoRA / QLoRA / DoRA fine-tuning (adapters.py); None = every weight trains
    rl: Rl | None = None  # RL with a colocated rollout engine (rl.py)

    def __post_init__(self) -> None:
        _check_training(self)


@not_owned
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
    "fsdp1": "PyTorch FullyShardedDataParallel (FSDP1) MixedPrecision docs; accelerate FullyShardedDataParallelPlugin "
             "(bf16 param, reduce and buffer dtypes over fp32 weights)",
    "hf_fsdp2": "accelerate 1.15.0 utils/fsdp_utils.py fsdp2_prepare_model (trainable parameters upcast to fp32, "
                "MixedPrecisionPolicy(param_dtype=reduce_dtype=output_dtype=bf16), utils/dataclasses.py "
                "set_mixed_precision) and accelerator.py _prepare_fsdp2 (no autocast); PyTorch fully_shard docs",
    "torchtune": "torchtune recipes (full_finetune_*, lora_finetune_*): the model, its gradients and AdamW states in "
                 "one dtype (dtype: bf16), fused AdamW; FSDP2 fully_shard when distributed",
}


def _check_async_tp(t: Training) -> None:
    if not t.async_tp:
        return
    if t.framework not in ASYNC_TP_FRAMEWORKS or t.mode != "training":
        raise ConfigError("training.async_tp", True, "false unless framework is 'megatron' or 'fsdp2' (training)",
                          "TP communication overlap is Megatron-Core's --tp-comm-overlap (TransformerEngine "
                          "userbuffers) and torchtitan's async TP", related=("training.framework",))
    if t.framework == "fsdp2" and not t.compile:
        raise ConfigError("training.async_tp", True, "false unless compile is on under fsdp2",
                          "torchtitan's async TP is an Inductor pass (torchtitan parallelize_llama.py: 'Async TP "
                          "requires --training.compile')", related=("training.compile",))


def resolve_recipe(training: Training) -> Recipe:
    fw, p = training.framework, training.param_dtype
    if fw in ("megatron", "fsdp2", "fsdp1", "hf_fsdp2"):
        master = p != "fp32" if training.master_weights is None else training.master_weights
        grad = training.grad_dtype or "fp32"
        opt = training.optimizer_dtype or ("fp32" if master or fw == "megatron" else p)
    elif fw == "deepspeed":
        master = p != "fp32" if training.master_weights is None else training.master_weights
        grad = training.grad_dtype or (p if p != "fp8" else "bf16")
        opt = training.optimizer_dtype or "fp32"
    elif fw == "torchtune":  # pure bf16: gradients and optimizer states in the weights dtype
        master = bool(training.master_weights)
        grad = training.grad_dtype or (p if p in ("fp32", "bf16", "fp16") else "bf16")
        opt = training.optimizer_dtype or ("fp32" if master else grad)
    else:  # hf: torch.optim, no master copy unless asked for
        master = bool(training.master_weights)
        # PEFT's adapters are fp32 (autocast_adapter_dtype), so are their gradients and states
        trains = "fp32" if training.adapter else p
        grad = training.grad_dtype or (trains if trains in ("fp32", "bf16", "fp16") else "bf16")
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

def _check_training(t: Training) -> None:
    """Each field's type and range (estimator/spec/fields.py), then the rules between fields, in this order
    (the first broken rule is the one reported)."""
    check_section("training", t)
    _read_json_values(t)
    _check_dtypes(t)
    _check_recompute(t)
    _check_framework_settings(t)
    _check_compile(t)
    if t.offload_activations and (t.framework != "torchtune" or t.mode != "training"):
        raise ConfigError("training.offload_activations", True, "false unless framework is 'torchtune' (training)",
                          "activation offloading is modelled as torchtune's OffloadActivations "
                          "(enable_activation_offloading)", related=("training.framework",))
    if t.nccl_cumem and not cumem(torch_release(t.torch_version)):
        raise ConfigError("training.nccl_cumem", True, "false or empty with torch_version before 2.2",
                          "torch 2.0's NCCL 2.14.3 has no cuMem and 2.1's NCCL 2.18.1 allocations with it are not "
                          "modelled (spec/nccl.py)", related=("training.torch_version",))
    if t.attn_implementation is not None and (t.framework not in TRANSFORMERS_FRAMEWORKS or t.attention != "flash"):
        raise ConfigError("training.attn_implementation", t.attn_implementation, "empty unless attention is 'flash' "
                          "under hf, deepspeed, fsdp1 or hf_fsdp2", "it names the kernel transformers' modelling code runs as "
                          "flash attention", related=("training.attention", "training.framework"))
    if t.recompute_layers is not None and t.recompute != "full":
        raise ConfigError("training.recompute_layers", t.recompute_layers, "only with recompute 'full'",
                          f"recompute is {t.recompute!r}", related=("training.recompute",))
    if t.mode == "training" and t.param_dtype in ("fp8", "fp4") and t.framework == "hf":
        raise ConfigError("training.param_dtype", t.param_dtype, "'fp32', 'bf16' or 'fp16' with framework 'hf'",
                          "the HF Trainer does not train in fp8/fp4 parameters", related=("training.framework",))


def _read_json_values(t: Training) -> None:
    """The values JSON gives as lists and objects, made the dataclass's own (hashable) types."""
    if isinstance(t.recompute_modules, list):  # JSON gives a list; keep the dataclass hashable
        object.__setattr__(t, "recompute_modules", tuple(t.recompute_modules))
    object.__setattr__(t, "adapter", adapter_from(t.adapter))  # JSON gives an object
    object.__setattr__(t, "rl", rl_from(t.rl))


def _check_dtypes(t: Training) -> None:
    """An adapter's gradients and optimizer states under the HF stack, and the weights dtype of the mode."""
    if t.adapter and t.framework == "hf":
        for field in ("grad_dtype", "optimizer_dtype"):
            if getattr(t, field) not in (None, "fp32"):
                raise ConfigError(f"training.{field}", getattr(t, field), "'fp32' (or auto) with an adapter under "
                                  "framework 'hf'", "PEFT keeps the adapters in fp32 and torch keeps their gradients "
                                  "and optimizer states in their dtype", related=("training.adapter",))
    weight_dtypes = INFERENCE_WEIGHT_DTYPES if t.mode == "inference" else TRAINING_DTYPES
    if t.param_dtype not in weight_dtypes:
        raise ConfigError("training.param_dtype", t.param_dtype, ", ".join(repr(a) for a in weight_dtypes),
                          f"not a weights dtype for {t.mode}")


def _check_recompute(t: Training) -> None:
    """The selective recompute's modules, and checkpointing every N-th layer."""
    if t.recompute_modules != ("core_attn",) and t.recompute != "selective":
        raise ConfigError("training.recompute_modules", list(t.recompute_modules), "only with recompute 'selective'",
                          f"recompute is {t.recompute!r}", related=("training.recompute",))
    if t.recompute_every != 1:
        _check_recompute_every(t)


def _check_framework_settings(t: Training) -> None:
    """Settings that only one framework (or a few) offers, and the framework's version."""
    if t.optimizer_in_backward and t.framework not in ("fsdp2", "torchtune"):
        raise ConfigError("training.optimizer_in_backward", True, "false unless framework is 'fsdp2' or 'torchtune'",
                          "stepping the optimizer inside backward is torchtune's optimizer_in_bwd (on FSDP2)",
                          related=("training.framework",))
    for field in DEEPSPEED_FIELDS:
        if getattr(t, field) is not None and t.framework != "deepspeed":
            raise ConfigError(f"training.{field}", getattr(t, field), "empty (auto) unless framework is 'deepspeed'",
                              "a DeepSpeed ZeRO setting", related=("training.framework",))
    if t.adamw_implementation is not None and (t.framework != "deepspeed" or t.optimizer != "adamw"):
        raise ConfigError("training.adamw_implementation", t.adamw_implementation,
                          "empty (auto) unless framework is 'deepspeed' and optimizer 'adamw'",
                          "the AdamW kernel that steps DeepSpeed ZeRO's flat partitions",
                          related=("training.framework", "training.optimizer"))
    _check_megatron_flags(t)
    _check_framework_version(t)
    from .trl import check as check_trl
    check_trl(t)
    if t.te_version is not None and t.framework != "megatron":
        raise ConfigError("training.te_version", t.te_version, "empty/null unless framework is 'megatron'",
                          "TransformerEngine is modelled under Megatron-Core only", related=("training.framework",))
    from .versions import TE_NONE
    if t.te_version == TE_NONE and (t.transformer_impl != "local" or t.fp8):
        raise ConfigError("training.te_version", t.te_version, "a TransformerEngine release with transformer_impl "
                          "'transformer_engine' or fp8", "TransformerEngine's layer spec and FP8 need it installed",
                          related=("training.transformer_impl", "training.fp8"))
    if t.training_loop == "trl_sft" and t.framework not in TRANSFORMERS_FRAMEWORKS:
        raise ConfigError("training.training_loop", t.training_loop, "'trainer' unless framework is 'hf', 'deepspeed', "
                          "'fsdp1' or 'hf_fsdp2'", "TRL's SFTTrainer runs transformers' models through the HF Trainer",
                          related=("training.framework",))
    if t.training_loop == "trl_sft" and (t.rl is not None or t.mode != "training"):
        field, value = ("training.rl", t.rl.algorithm) if t.rl is not None else ("training.mode", t.mode)
        raise ConfigError(field, value, "empty (supervised training) with training_loop 'trl_sft'",
                          "trl_sft is TRL's SFTTrainer; TRL's RL trainers (GRPO, DPO) run the Trainer's loop",
                          related=("training.training_loop",))
    if t.training_loop == "plain" and t.framework not in ("hf", "fsdp1"):
        raise ConfigError("training.training_loop", t.training_loop, "'trainer' unless framework is 'hf' or 'fsdp1'",
                          "a plain loop is modelled for the HF stack and FSDP1 (Lightning Fabric's FSDPStrategy runs "
                          "one); the other frameworks run their own loops", related=("training.framework",))


def _check_ssm_kernels(t: Training) -> None:
    """transformers' torch fallback of the Mamba-2 kernels is transformers' code, eager (memory/activations/mamba_torch.py)."""
    if t.ssm_kernels == "fused":
        return
    if t.framework not in TRANSFORMERS_FRAMEWORKS:
        raise ConfigError("training.ssm_kernels", t.ssm_kernels, "'fused' unless framework is 'hf', 'deepspeed', "
                          "'fsdp1' or 'hf_fsdp2'",
                          "the torch fallback is transformers' modelling code; Megatron-Core's Mamba mixer and the "
                          "other frameworks call mamba-ssm's kernels", related=("training.framework",))
    if t.compile:
        raise ConfigError("training.ssm_kernels", t.ssm_kernels, "'fused' with compile on",
                          "the torch fallback is modelled eager (what its ops save); a compiled one saves what "
                          "Inductor's partitioner keeps", related=("training.compile",))


def _check_compile(t: Training) -> None:
    """torch.compile: the frameworks and the mode it is modelled for, async TP, the loss's compile."""
    if t.compile and t.framework not in COMPILE_FRAMEWORKS:
        raise ConfigError("training.compile", True, "false unless framework is 'fsdp2', 'torchtune' or 'hf'",
                          "torch.compile is torchtitan's --compile.enable, torchtune's compile: True and the HF "
                          "Trainer's torch_compile=True; Megatron runs its own fused kernels (TransformerEngine, "
                          "Apex) and the DeepSpeed engine is modelled eager", related=("training.framework",))
    if t.compile and t.mode != "training":
        raise ConfigError("training.compile", True, "false unless mode is 'training'",
                          "it changes what the layers save for backward", related=("training.mode",))
    _check_async_tp(t)
    _check_ssm_kernels(t)
    if t.compile_loss is not None and (t.framework != "fsdp2" or not t.compile):
        raise ConfigError("training.compile_loss", t.compile_loss, "empty (auto) unless framework is 'fsdp2' and "
                          "compile is on", "it is torchtitan's compile.components: whether the loss compiles with "
                          "the model", related=("training.framework", "training.compile"))


def _check_recompute_every(t: Training) -> None:
    """Layer-level checkpointing of every N-th layer is a PyTorch-native option: torchtitan's
    ``selective_ac_option = N`` (v0.1-v0.2) and torchtune's ``ac_mode="selective", ac_option=N``."""
    if t.recompute != "full":
        raise ConfigError("training.recompute_every", t.recompute_every, "1 unless recompute is 'full'",
                          f"recompute is {t.recompute!r}; every N-th layer is checkpointed in full",
                          related=("training.recompute",))
    if t.framework not in ("fsdp2", "torchtune"):
        raise ConfigError("training.recompute_every", t.recompute_every, "1 unless framework is 'fsdp2' or 'torchtune'",
                          "checkpointing every N-th layer is torchtitan's and torchtune's layer-level AC; use "
                          "recompute_layers for Megatron's block method", related=("training.framework",))
    if t.recompute_layers is not None:
        raise ConfigError("training.recompute_every", t.recompute_every, "1 when recompute_layers is set",
                          "choose the first n layers of a stage (recompute_layers) or every N-th (recompute_every)",
                          related=("training.recompute_layers",))


def _check_framework_version(t: Training) -> None:
    """A version the framework offers (versions.py); hf offers none."""
    from .versions import offered
    versions = offered(t.framework)
    if t.framework_version is not None and t.framework_version not in versions:
        allowed = (f"one of {', '.join(map(repr, versions))} (or empty/null for the default) with framework "
                   f"{t.framework!r}" if versions else f"empty/null with framework {t.framework!r}")
        raise ConfigError("training.framework_version", t.framework_version, allowed,
                          "the releases whose rules the estimator knows" if versions else
                          f"the estimator's {t.framework} rules are not keyed on a version",
                          related=("training.framework",))


def _check_legacy_grouped_gemm(t: Training) -> None:
    """--moe-use-legacy-grouped-gemm: Megatron-Core's legacy GroupedMLP, read only with --moe-grouped-gemm."""
    if t.moe_use_legacy_grouped_gemm and not (t.framework == "megatron" and t.moe_grouped_gemm):
        raise ConfigError("training.moe_use_legacy_grouped_gemm", True,
                          "false unless framework is 'megatron' and moe_grouped_gemm is true",
                          "it is Megatron-Core's --moe-use-legacy-grouped-gemm, which picks the grouped GEMM "
                          "--moe-grouped-gemm runs", related=("training.moe_grouped_gemm", "training.framework"))
    if t.moe_use_legacy_grouped_gemm and t.compute_dtype != "bf16":
        # Megatron-Core 0.16.1 transformer/moe/experts.py GroupedMLP.forward: `assert self.config.bf16`
        raise ConfigError("training.compute_dtype", t.compute_dtype, "'bf16' with moe_use_legacy_grouped_gemm",
                          "Megatron-Core's legacy GroupedMLP runs in bf16 only",
                          related=("training.moe_use_legacy_grouped_gemm",))
    if t.moe_use_legacy_grouped_gemm and t.fp8 and t.recompute == "selective" and "moe_act" in t.recompute_modules:
        # Megatron-Core 0.16.1 transformer/moe/experts.py GroupedMLP.__init__ raises the same
        raise ConfigError("training.recompute_modules", list(t.recompute_modules),
                          "no moe_act with FP8 on the legacy GroupedMLP (moe_use_legacy_grouped_gemm)",
                          "Megatron-Core's legacy GroupedMLP cannot recompute the experts' activation under FP8",
                          related=("training.moe_use_legacy_grouped_gemm", "training.fp8"))
    if t.moe_use_legacy_grouped_gemm and t.fp8:
        # GroupedMLP.forward runs grouped_gemm's gmm on the bf16 weights whatever config.fp8 says (no FP8 path,
        # Megatron-Core 0.16.1 experts.py), while TE's linears run FP8: a mix the FP8 rules do not model
        raise ConfigError("training.fp8", True, "false with moe_use_legacy_grouped_gemm",
                          "the legacy GroupedMLP's experts run their GEMMs in bf16 under FP8 while the other "
                          "linears run FP8; that mix is not modelled",
                          related=("training.moe_use_legacy_grouped_gemm",))


def _check_megatron_flags(t: Training) -> None:
    """Megatron-Core's own switches are refused under the other frameworks, which do not offer them."""
    if t.moe_router_dtype is not None and t.framework != "megatron":
        raise ConfigError("training.moe_router_dtype", t.moe_router_dtype, "empty/null unless framework is 'megatron'",
                          "the router dtype is Megatron-Core's --moe-router-dtype", related=("training.framework",))
    if t.activation_func_fp8_input_store and t.framework != "megatron":
        raise ConfigError("training.activation_func_fp8_input_store", True, "false unless framework is 'megatron'",
                          "it is Megatron-Core's --activation-func-fp8-input-store (its fused SwiGLU)",
                          related=("training.framework",))
    if t.defer_embedding_wgrad_compute and t.framework != "megatron":
        raise ConfigError("training.defer_embedding_wgrad_compute", True, "false unless framework is 'megatron'",
                          "it is Megatron-Core's --defer-embedding-wgrad-compute (the output layer's deferred "
                          "weight-gradient GEMMs)", related=("training.framework",))
    if t.wgrad_deferral_limit != 0 and not t.defer_embedding_wgrad_compute:
        raise ConfigError("training.wgrad_deferral_limit", t.wgrad_deferral_limit,
                          "0 unless defer_embedding_wgrad_compute is true",
                          "it is Megatron-Core's --wgrad-deferral-limit, read only when the output layer's weight "
                          "gradients are deferred", related=("training.defer_embedding_wgrad_compute",))
    if t.moe_grouped_gemm and t.framework != "megatron":
        raise ConfigError("training.moe_grouped_gemm", True, "false unless framework is 'megatron'",
                          "it is Megatron-Core's --moe-grouped-gemm (the legacy GroupedMLP's grouped GEMMs)",
                          related=("training.framework",))
    _check_legacy_grouped_gemm(t)
    if t.framework == "megatron" and t.recompute == "selective" and "moe_act" in t.recompute_modules \
            and not t.moe_grouped_gemm:
        # Megatron-Core 0.16.1 transformer_config.py __post_init__ raises the same
        raise ConfigError("training.recompute_modules", list(t.recompute_modules),
                          "moe_act only with moe_grouped_gemm under megatron",
                          "Megatron-Core recomputes the experts' activation only in its grouped-GEMM experts",
                          related=("training.moe_grouped_gemm",))
    if not t.attention_softmax_fusion and t.framework != "megatron":
        raise ConfigError("training.attention_softmax_fusion", False, "true unless framework is 'megatron'",
                          "turning off the fused masked softmax is Megatron's --no-masked-softmax-fusion; the other "
                          "frameworks' eager attention is modelled as they run it", related=("training.framework",))
    if t.microbatch_group_size is not None and t.framework != "megatron":
        raise ConfigError("training.microbatch_group_size", t.microbatch_group_size,
                          "empty/null (auto) unless framework is 'megatron'",
                          "it is Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage",
                          related=("training.framework",))
    if (not t.overlap_p2p_comm or t.overlap_p2p_comm_warmup_flush) and t.framework != "megatron":
        field = "overlap_p2p_comm" if not t.overlap_p2p_comm else "overlap_p2p_comm_warmup_flush"
        raise ConfigError(f"training.{field}", getattr(t, field), "the default unless framework is 'megatron'",
                          "it is Megatron-Core's interleaved pipeline's p2p mode", related=("training.framework",))
    if t.overlap_p2p_comm_warmup_flush and not t.overlap_p2p_comm:
        raise ConfigError("training.overlap_p2p_comm_warmup_flush", True, "false unless overlap_p2p_comm is true",
                          "Megatron-Core's warm-up flush overlaps the p2p communication (model_parallel_config.py)",
                          related=("training.overlap_p2p_comm",))
    _check_megatron_impl(t)
    if t.cross_entropy_impl != "native":
        if t.framework != "megatron":
            raise ConfigError("training.cross_entropy_impl", t.cross_entropy_impl, "'native' unless framework is "
                              "'megatron'", "it is Megatron's --cross-entropy-fusion-impl", related=("training.framework",))
        if t.loss != "fused":
            raise ConfigError("training.cross_entropy_impl", t.cross_entropy_impl, "'native' unless loss is 'fused'",
                              "Megatron reads --cross-entropy-fusion-impl only with --cross-entropy-loss-fusion "
                              "(loss 'fused')", related=("training.loss",))


def _check_megatron_impl(t: Training) -> None:
    """--transformer-impl and --no-gradient-accumulation-fusion are Megatron-LM's; the local spec has no
    flash attention (Megatron-Core 0.16.1 gpt_layer_specs.py get_gpt_layer_local_spec: DotProductAttention)."""
    if t.transformer_impl != "transformer_engine" and t.framework != "megatron":
        raise ConfigError("training.transformer_impl", t.transformer_impl, "'transformer_engine' unless framework "
                          "is 'megatron'", "it is Megatron-LM's --transformer-impl", related=("training.framework",))
    if t.transformer_impl == "local" and t.attention != "eager":
        raise ConfigError("training.attention", t.attention, "'eager' with transformer_impl 'local'",
                          "Megatron-Core's local layer spec computes attention with its unfused DotProductAttention",
                          related=("training.transformer_impl",))
    if not t.gradient_accumulation_fusion and t.framework != "megatron":
        raise ConfigError("training.gradient_accumulation_fusion", False, "true unless framework is 'megatron'",
                          "it is Megatron-LM's --no-gradient-accumulation-fusion", related=("training.framework",))
