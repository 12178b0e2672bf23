"""Rules that tie the architecture, the training setup and the layout together.

Each rule names the field at fault, its value and what is allowed; the single-input checks live
with their dataclasses. The rules are those the frameworks themselves enforce (Megatron-Core's
``divide()`` asserts, its context-parallel and MoE argument checks).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError, shown_value
from ..spec.optimizers import OPTIMIZERS
from ..spec.parallel import Parallel
from .sharding import layers_per_stage
from .states import resolve_zero_stage
from .titan_releases import SOURCES as TITAN_SOURCES, titan_rules
from ..spec.choices import DEEPSPEED_FIELDS, FSDP_FRAMEWORKS
from ..spec.training import Training


# Divisors are listed only for sizes below this: trial division up to sqrt(n) is then at most a
# thousand steps, however large a head count, width or expert count a configuration names.
_LISTED_BELOW = 10**6
_LISTED_AT_MOST = 12


def _divisors(n: int) -> str:
    """What divides `n`, in words: the divisors themselves when there are a few, else the rule."""
    if n < _LISTED_BELOW:
        small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
        ds = small + [n // d for d in reversed(small) if d * d != n]
        if len(ds) <= _LISTED_AT_MOST:
            return ", ".join(map(str, ds))
    return f"a divisor of {shown_value(n)}"


def _check_images(arch: Architecture, training: Training) -> None:
    """Images need a vision tower whose activations are modelled, a size it takes, and room in the sequence."""
    from ..spec import vision
    n = training.images_per_sample
    if arch.vision_tower is None:
        name, value = (("training.freeze_vision", True) if training.freeze_vision and not n
                       else ("training.images_per_sample", n))
        raise ConfigError(name, value, f"{'false' if name.endswith('vision') else '0'} for a model without a vision "
                          "tower", related=("model.vision_tower",))
    if not n and training.image_size is None:  # the encoder frozen, no images: nothing else to check
        return
    if n and training.adapter is not None:
        raise ConfigError("training.images_per_sample", n, "0 with an adapter",
                          "the activations the tower's adapters keep are not modelled (their weights and states "
                          "are: adapters.vision_modules)",
                          related=("training.adapter",))
    if n and training.mode != "training":
        raise ConfigError("training.images_per_sample", n, "0 outside training",
                          "inference and serving count the encoder in the serving estimate", related=("training.mode",))
    if n and training.attention != "flash":
        raise ConfigError("training.attention", training.attention, "flash with images",
                          "the vision tower is modelled with FlashAttention-2 (varlen) only", related=("training.images_per_sample",))
    size = training.image_size or vision.default_image_size(arch)
    unit = arch.vision_patch_size * arch.vision_spatial_merge_size
    tiled = arch.vision_tower == vision.LLAMA4  # Llama 4 resizes any image onto its tiles
    if size is None or (size % unit and not tiled):
        raise ConfigError("training.image_size", training.image_size, f"a multiple of {unit} px (patch x merge)",
                          "each image is a whole grid of merged patches", related=("model.vision_patch_size",))
    if arch.vision_image_size and size != arch.vision_image_size and not tiled:
        raise ConfigError("training.image_size", size, f"{arch.vision_image_size} (the tower's native size)",
                          "every image is resized to it", related=("model.vision_image_size",))
    tokens = n * vision.tokens_per_image(arch, size)
    if tokens > training.seq_len:
        raise ConfigError("training.images_per_sample", n,
                          f"at most {training.seq_len // vision.tokens_per_image(arch, size)} images of {size} px",
                          f"their {tokens:,} tokens do not fit in seq_len ({training.seq_len:,}), which counts them",
                          related=("training.seq_len", "training.image_size"))


def validate(arch: Architecture, training: Training, par: Parallel) -> int:
    """Raise `ConfigError` on the first inconsistency; return the ZeRO stage in force."""
    _check_model(arch, training, par)
    _check_tensor_split(arch, training, par)
    _check_experts(arch, par)
    _check_layout(arch, training, par)
    _check_batch(training, par)
    _check_framework(arch, training, par)
    _check_training_settings(arch, training, par)
    _check_compile_loss(training)
    from .liger import check as check_liger
    check_liger(arch, training)
    zero = resolve_zero_stage(training, par)
    if training.fp8_all_gather:
        check_fp8_all_gather(training, zero)
    if training.framework == "deepspeed":
        _check_deepspeed_settings(training, zero, par)
    return zero


def _check_model(arch: Architecture, training: Training, par: Parallel) -> None:
    """The model's own kind: a hybrid's layers, a vision tower's images, sparse attention."""
    if arch.is_hybrid:
        _check_hybrid(arch, training, par)
    elif training.ssm_kernels != "fused":
        raise ConfigError("training.ssm_kernels", training.ssm_kernels, "'fused' for a model without Mamba or "
                          "linear-attention layers", "it names the kernels those layers run")
    if training.images_per_sample or training.image_size is not None or training.freeze_vision:
        _check_images(arch, training)
    if arch.sdpa_mask_always and arch.position_embedding == "alibi" and \
            training.attn_implementation == "flash_attention_2":
        raise ConfigError("training.attn_implementation", "flash_attention_2", "sdpa for a Falcon with ALiBi",
                          "transformers' FalconFlashAttention2 raises \"`alibi` is not supported when `use_flash_attn` "
                          "is True\" (models/falcon/modeling_falcon.py, 5.23)", related=("model.position_embedding",))
    if arch.uses_sparse_attention:  # DeepSeek-V3.2 (memory/activations/sparse.py)
        from .activations.sparse import check_training
        check_training(arch, training, par)


def _check_tensor_split(arch: Architecture, training: Training, par: Parallel) -> None:
    """TP divides the heads and the MLP's width."""
    tp = par.tp
    if arch.num_attention_heads % tp:
        raise ConfigError("parallel.tp", tp, _divisors(arch.num_attention_heads),
                          f"num_attention_heads ({arch.num_attention_heads}) must be divisible by tp")
    if not arch.uses_mla and arch.num_kv_heads % tp and training.mode == "training":
        raise ConfigError("parallel.tp", tp, _divisors(arch.num_kv_heads),
                          f"num_kv_heads ({arch.num_kv_heads}) must be divisible by tp")
    if arch.intermediate_size and arch.num_dense_layers and arch.intermediate_size % tp:
        raise ConfigError("parallel.tp", tp, _divisors(arch.intermediate_size),
                          f"intermediate_size ({arch.intermediate_size}) must be divisible by tp")


def _check_experts(arch: Architecture, par: Parallel) -> None:
    """EP and ETP against the experts (or their absence)."""
    tp = par.tp
    if arch.is_moe:
        if arch.num_experts % par.ep:
            raise ConfigError("parallel.ep", par.ep, _divisors(arch.num_experts),
                              f"num_experts ({arch.num_experts}) must be divisible by ep")
        if arch.moe_intermediate_size % par.etp:
            raise ConfigError("parallel.etp", par.etp, _divisors(arch.moe_intermediate_size),
                              f"moe_intermediate_size ({arch.moe_intermediate_size}) must be divisible by etp")
        if par.gpus_per_stage % (par.ep * par.etp):
            raise ConfigError("parallel.ep", par.ep,
                              f"ep x etp dividing tp x cp x dp = {par.gpus_per_stage}",
                              f"ep x etp = {par.ep * par.etp} does not fit in the {par.gpus_per_stage} GPUs of a stage")
        if tp > 1 and not par.sequence_parallel:
            raise ConfigError("parallel.sequence_parallel", False, "true when tp > 1 with MoE layers",
                              "Megatron-Core requires sequence parallelism for MoE with tensor parallelism")
    elif par.ep > 1:
        raise ConfigError("parallel.ep", par.ep, "1 for a dense model", "the model has no experts")
    if par.etp != tp and not arch.is_moe:
        raise ConfigError("parallel.etp", par.etp, f"{tp} (= tp) for a dense model", "the model has no experts")


def _check_layout(arch: Architecture, training: Training, par: Parallel) -> None:
    """The pipeline, sequence and context splits against the layers and the sequence."""
    tp = par.tp
    if training.defer_embedding_wgrad_compute and par.pp == 1:
        # Megatron-Core 0.16.1 model_parallel_config.py __post_init__ raises the same
        raise ConfigError("training.defer_embedding_wgrad_compute", True, "false when pp = 1",
                          "Megatron-Core cannot defer the embedding's weight gradients without pipeline parallelism",
                          related=("parallel.pp",))
    if par.sequence_parallel and tp == 1:
        raise ConfigError("parallel.sequence_parallel", True, "false when tp is 1",
                          "sequence parallelism splits over the TP group")
    layers_per_stage(arch, par)  # raises on a split that does not divide
    if training.recompute_layers is not None:
        most = max(layers_per_stage(arch, par))
        if training.recompute_layers > most:
            raise ConfigError("training.recompute_layers", training.recompute_layers,
                              f"at most the layers of a stage ({most})")
    if par.cp > 1:
        if training.seq_len % (2 * par.cp):
            raise ConfigError("training.seq_len", training.seq_len, f"a multiple of 2 x cp = {2 * par.cp}",
                              "causal context parallelism splits the sequence into 2 x cp chunks (Megatron-Core)")
        if training.attention != "flash":
            raise ConfigError("training.attention", training.attention, "'flash' when cp > 1",
                              "context parallelism runs ring attention over flash kernels")
    if par.sequence_parallel and (training.seq_len // par.cp) % tp:
        raise ConfigError("training.seq_len", training.seq_len, f"a multiple of cp x tp = {par.cp * tp}",
                          "sequence parallelism splits each sequence over TP")


def _check_batch(training: Training, par: Parallel) -> None:
    """The global batch against the micro-batches a step runs."""
    gbs = training.global_batch_size
    if gbs is not None:
        per_step = training.micro_batch_size * par.dp
        if gbs % per_step:
            raise ConfigError("training.global_batch_size", gbs,
                              f"a multiple of micro_batch_size x dp = {per_step}")
        if par.pp_schedule in ("dualpipe", "dualpipev") and training.mode == "training":
            _check_dualpipe_microbatches(gbs, per_step, par)


def _check_framework(arch: Architecture, training: Training, par: Parallel) -> None:
    """What each framework runs: its schedules, recompute, sharding strategies."""
    if training.framework == "megatron" and training.mode == "training" and \
            (par.vpp > 1 or training.microbatch_group_size is not None):
        _check_interleaved(training, par)
    if training.optimizer_in_backward:
        _check_optimizer_in_backward(training, par)
    if training.recompute == "selective" and training.framework == "fsdp2":
        _check_op_level(arch, training)
    if training.framework == "torchtune":
        _check_torchtune(training, par)
    if training.framework == "hf_fsdp2":
        from .hf_fsdp2 import check as check_hf_fsdp2
        check_hf_fsdp2(training, par)
    if training.framework == "hf" and training.mode == "training":
        _check_trainer_splits(par)
    _check_trl_loss(training, par)
    if training.framework == "fsdp1":
        from .fsdp1 import check as check_fsdp1, check_tied_no_sync
        from .pipeline import microbatches
        check_fsdp1(training, par)
        if training.mode == "training":
            check_tied_no_sync(arch, training, par, microbatches(training, par))
    elif par.fsdp_sharding_strategy != "FULL_SHARD" or par.fsdp_shard_group_size is not None:
        strategy = par.fsdp_sharding_strategy != "FULL_SHARD"
        field = "fsdp_sharding_strategy" if strategy else "fsdp_shard_group_size"
        raise ConfigError(f"parallel.{field}", getattr(par, field),
                          f"{'FULL_SHARD' if strategy else 'empty'} unless framework is 'fsdp1'",
                          "FSDP1's sharding strategy (Accelerate's fsdp_sharding_strategy); fsdp2 and deepspeed shard "
                          "by zero_stage", related=("training.framework",))


def _check_trainer_splits(par: Parallel) -> None:
    """The HF Trainer over DDP (framework hf) splits no layer: transformers' own tensor parallelism (tp_plan, a
    DTensor plan without sequence parallelism) and Accelerate's ParallelismConfig (TP, CP) are not modelled, and
    nothing in the Trainer pipelines stages."""
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, "1 with framework 'hf'", "the HF Trainer over DDP is "
                              "modelled with data parallelism only (transformers' tp_plan and Accelerate's "
                              "ParallelismConfig are not); Megatron-Core or torchtitan split layers",
                              related=("training.framework",))


def _check_trl_loss(training: Training, par: Parallel) -> None:
    """TRL's chunked_nll (activations/trl_loss.py): measured under Accelerate's autocast (the whole step) and, on
    its own, over a 16-bit head run as it is (DeepSpeed ZeRO 0-2, the HF Trainer's FSDP2). Under ZeRO-3 TRL
    gathers the head's partitioned weight inside each chunk (trl 1.9.0 utils.py maybe_gather_lm_head_ctx), and
    over fp32 weights `w.float()` makes no copy: neither is modelled."""
    from .activations.trl_loss import chunked_unmodelled, trl_chunked
    if not trl_chunked(training):
        return
    why = chunked_unmodelled(training.framework, training.compute_dtype, training.param_dtype,
                             resolve_zero_stage(training, par))
    if why:
        raise ConfigError("training.loss", "chunked", "'standard' or liger_kernel under training_loop 'trl_sft' "
                          "unless the head runs 16-bit: framework 'hf' or 'fsdp1' under a bf16/fp16 compute dtype, "
                          "'deepspeed' (ZeRO 0-2) or 'hf_fsdp2' with a bf16/fp16 param dtype", why + ": not modelled",
                          related=("training.training_loop", "training.framework", "parallel.zero_stage"))


def _check_training_settings(arch: Architecture, training: Training, par: Parallel) -> None:
    """Precision, offload, optimizer and MoE settings against the framework and the model."""
    if training.mode == "training" and training.optimizer in ("paged_adamw", "paged_adamw8bit"):
        from .paged import check as check_paged
        check_paged(training)
    if training.offload_optimizer != "none" or training.offload_parameters != "none":
        _check_offload(training, par)
    if training.mode == "training":
        _check_low_precision(training, par)
    if training.mode == "training" and training.compute_dtype == "fp32" and training.param_dtype != "fp32":
        raise ConfigError("training.compute_dtype", "fp32", f"'bf16' or 'fp16' with param_dtype {training.param_dtype!r}",
                          "computing in a wider dtype than the parameters is not a recipe any framework runs")
    if training.moe_dispatcher != "alltoall":
        _check_dispatcher(arch, training, par)
    if training.moe_grouped_gemm and not arch.is_moe:
        raise ConfigError("training.moe_grouped_gemm", True, "false for a dense model",
                          "grouped GEMM runs a layer's experts together and the model has none")
    if training.moe_router_dtype is not None and not arch.is_moe:
        raise ConfigError("training.moe_router_dtype", training.moe_router_dtype, "empty/null for a dense model",
                          "--moe-router-dtype sets the dtype of an MoE router and the model has no experts")
    offered = [name for name, o in OPTIMIZERS.items() if training.framework not in o.not_in]
    if training.mode == "training" and training.optimizer not in offered:
        raise ConfigError("training.optimizer", training.optimizer,
                          f"one of {', '.join(map(repr, offered))} with framework {training.framework!r}",
                          f"{training.framework} does not offer {training.optimizer}", related=("training.framework",))


def _check_compile_loss(training: Training) -> None:
    """A torchtitan release without compile.components decides alone whether the loss compiles."""
    rules = titan_rules(training)
    if rules is None or training.compile_loss is None or rules.loss_compile_optional:
        return
    if training.compile_loss != rules.loss_compiled:
        version = training.framework_version
        does = "always compiles the loss with the model" if rules.loss_compiled else "never compiles the loss"
        raise ConfigError("training.compile_loss", training.compile_loss,
                          f"empty (auto) or {str(rules.loss_compiled).lower()} with framework_version {version!r}",
                          f"torchtitan {version} {does} ({TITAN_SOURCES['loss_compiled']}); compile.components "
                          "came with 0.2.0", related=("training.framework_version",))


def _check_deepspeed_settings(training: Training, zero: int, par: Parallel) -> None:
    """A ZeRO setting the stage in force never reads is refused rather than silently unused: stage 0
    reduces through the engine's fixed buffers (engine.py allreduce_gradients), the stage3_* settings
    are ZeRO-3's (DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py, stage3.py)."""
    for name, lowest in DEEPSPEED_FIELDS.items():
        value = getattr(training, name)
        if value is not None and zero < lowest:
            stages = "1, 2 or 3" if lowest == 1 else "3"
            raise ConfigError(f"training.{name}", value, f"empty (auto) unless zero_stage is {stages}",
                              f"DeepSpeed reads it from ZeRO stage {lowest} on; this run is on stage {zero}",
                              related=("parallel.zero_stage",))
    # contiguous_gradients off: modelled for ZeRO-2's dense data parallelism (deepspeed_noncontiguous); ZeRO-1 then
    # makes no gradient hooks without overlap_comm (stage_1_and_2.py l. 635), ZeRO-3 allocates no IPG bucket
    # (stage3.py l. 700) and keeps the bucket's gradients as their own .grad (__add_grad_to_ipg_bucket l. 1517):
    # neither measured. offload_optimizer turns it back on under ZeRO-1/2 (stage_1_and_2.py l. 259).
    forced_on = zero in (1, 2) and training.offload_optimizer != "none"
    if training.contiguous_gradients is False and not forced_on and (zero != 2 or par.dp < 2 or par.cp > 1
                                                                           or par.ep > 1):
        raise ConfigError("training.contiguous_gradients", False, "true or empty (auto) unless zero_stage is 2 "
                          "over more than one data-parallel rank, without context or expert parallelism (or 1-2 with "
                          "the optimizer offloaded)", "contiguous_gradients off is modelled for ZeRO-2 over "
                          "data-parallel ranks only (measured: tests/test_deepspeed_accumulation.py)",
                          related=("parallel.zero_stage",))



class _Dispatcher(NamedTuple):
    """Why a token dispatcher other than the default all-to-all is Megatron-Core's only, and what
    a dense model or an inference run is told about it."""

    why: str
    dense: str
    inference: str


# Megatron-Core's MoEFlexTokenDispatcher on DeepEP (asserts TPxEP > 1 and moe_enable_deepep; DeepEP's
# Buffer.get_dispatch_config asserts a tuned group size, estimator/memory/deepep.py) and MoEAllGatherTokenDispatcher
# (token_dispatcher.py); the other frameworks have neither
DISPATCHERS = {
    "deepep": _Dispatcher("DeepEP is Megatron-Core's flex token dispatcher (--moe-token-dispatcher-type flex "
                          "--moe-enable-deepep)", "DeepEP dispatches tokens to experts and the model has none",
                          "DeepEP's low-latency inference buffers are not modelled"),
    "allgather": _Dispatcher("the all-gather dispatcher is Megatron-Core's (--moe-token-dispatcher-type allgather)",
                             "a token dispatcher sends tokens to experts and the model has none",
                             "the all-gather dispatcher's memory is modelled for training only"),
}


def _check_dispatcher(arch: Architecture, training: Training, par: Parallel) -> None:
    """A dispatcher other than all-to-all: Megatron's, for MoE training, with each one's own limits."""
    from .deepep import GROUP_SIZES
    name, about = training.moe_dispatcher, DISPATCHERS[training.moe_dispatcher]
    if not arch.is_moe:
        raise ConfigError("training.moe_dispatcher", name, "'alltoall' for a dense model", about.dense)
    if name == "deepep" and par.ep == 1:
        raise ConfigError("training.moe_dispatcher", name, "'alltoall' when ep is 1",
                          "DeepEP exchanges tokens between expert-parallel ranks; it needs ep > 1")
    if training.framework != "megatron":
        raise ConfigError("training.moe_dispatcher", name, "'alltoall' unless framework is 'megatron'", about.why)
    if training.mode != "training":
        raise ConfigError("training.moe_dispatcher", name, "'alltoall' in inference mode", about.inference)
    if name == "deepep" and par.ep * par.etp not in GROUP_SIZES:
        raise ConfigError("parallel.ep", par.ep, "ep x etp in " + ", ".join(map(str, GROUP_SIZES)),
                          f"with moe_dispatcher 'deepep' the group is ep x etp = {par.ep * par.etp}, and "
                          "DeepEP's Buffer.get_dispatch_config has configs only for these sizes")
    if name == "allgather" and training.moe_router_dtype is not None:
        # token_combine casts the unpermuted outputs over every gathered token to the probabilities' dtype
        # before its reduce-scatter: not measured yet (validation/megatron), so not modelled
        raise ConfigError("training.moe_router_dtype", training.moe_router_dtype,
                          "empty/null with moe_dispatcher 'allgather'",
                          "the all-gather dispatcher's combine in the router dtype is not modelled")

def _check_dualpipe_microbatches(gbs: int, per_step: int, par: Parallel) -> None:
    """deepseek-ai/DualPipe step(): DualPipe asserts num_chunks % 2 == 0 and num_chunks >= 2 x
    num_ranks (half go each way); DualPipeV num_chunks >= 2 x num_ranks."""
    m, two_way = gbs // per_step, par.pp_schedule == "dualpipe"
    if m < 2 * par.pp or (two_way and m % 2):
        raise ConfigError("training.global_batch_size", gbs,
                          f"{'an even multiple' if two_way else 'a multiple'} of micro_batch_size x dp = {per_step} "
                          f"with at least 2 x pp = {2 * par.pp} micro-batches",
                          f"{par.pp_schedule} runs {m} micro-batches here", related=("parallel.pp_schedule",))


def _check_interleaved(training: Training, par: Parallel) -> None:
    """Megatron-Core's interleaved schedule runs the micro-batches in groups per virtual stage and
    refuses groups that leave the pipeline waiting (activations.interleaved_microbatches_error)."""
    from .pipeline import interleaved_microbatches_error, microbatch_group, microbatches
    group = training.microbatch_group_size
    if par.vpp == 1:
        raise ConfigError("training.microbatch_group_size", group, "empty/null (auto) when vpp is 1",
                          "Megatron-Core reads it only in the interleaved schedule", related=("parallel.vpp",))
    g = microbatch_group(par, group)
    if g < par.pp:
        raise ConfigError("training.microbatch_group_size", group, f"at least pp = {par.pp}, or empty/null (auto)",
                          "Megatron-Core runs at least a pipeline's depth of micro-batches per virtual stage",
                          related=("parallel.pp",))
    m = microbatches(training, par)
    why = interleaved_microbatches_error(par.pp, m, g)
    if why:  # the automatic global batch always fills whole groups: a given one is at fault
        raise ConfigError("training.global_batch_size", training.global_batch_size,
                          f"one whose micro-batches per step leave {why}",
                          f"{m} micro-batches per step in groups of {g}: Megatron-Core's interleaved schedule "
                          "refuses it (schedules.py forward_backward_pipelining_with_interleaving)",
                          related=("training.microbatch_group_size", "parallel.pp", "parallel.vpp"))


def _check_op_level(arch: Architecture, training: Training) -> None:
    """Under fsdp2, "selective" is torchtitan's operator-level policy (activations.op_level), which
    has no module list and is modelled for dense attention blocks with flash attention."""
    why = "with framework 'fsdp2', selective recompute is torchtitan's operator-level policy"
    if training.recompute_modules != ("core_attn",):
        raise ConfigError("training.recompute_modules", list(training.recompute_modules),
                          "unset with framework 'fsdp2'", why + ", which takes no module list",
                          related=("training.framework", "training.recompute"))
    if arch.is_moe or arch.uses_mla:
        raise ConfigError("training.recompute", "selective", "'none' or 'full' for MoE or MLA models under 'fsdp2'",
                          why + "; what it saves of MoE and MLA layers is not modelled yet",
                          related=("training.framework",))
    if training.attention != "flash":
        raise ConfigError("training.attention", training.attention, "'flash' with selective recompute under fsdp2",
                          why + ", measured with SDPA/flash kernels", related=("training.recompute",))


def _check_optimizer_in_backward(training: Training, par: Parallel) -> None:
    """torchtune refuses optimizer_in_bwd with gradient accumulation (the step would run on a
    partial gradient) and has no pipeline schedule to run it in."""
    per_step = training.micro_batch_size * par.dp
    if training.global_batch_size not in (None, per_step):
        raise ConfigError("training.optimizer_in_backward", True,
                          f"false when global_batch_size ({training.global_batch_size}) is more than "
                          f"micro_batch_size x dp = {per_step}",
                          "the step runs inside each backward, so there is no gradient accumulation",
                          related=("training.global_batch_size",))
    if par.pp > 1:
        raise ConfigError("training.optimizer_in_backward", True, "false when pp > 1",
                          "torchtune's optimizer_in_bwd runs without pipeline parallelism", related=("parallel.pp",))


def _check_offload(training: Training, par: Parallel) -> None:
    """Offload as each framework offers it (estimator/memory/offload.py names the sources)."""
    fw, opt, params = training.framework, training.offload_optimizer, training.offload_parameters
    zero = resolve_zero_stage(training, par)
    field, value = ("training.offload_optimizer", opt) if opt != "none" else ("training.offload_parameters", params)
    if training.mode != "training":
        raise ConfigError(field, value, "'none' in inference mode", "offload moves training states")
    if fw == "hf":
        raise ConfigError(field, value, "'none' with framework 'hf'",
                          "the HF Trainer offloads through DeepSpeed: use framework 'deepspeed'",
                          related=("training.framework",))
    if fw in FSDP_FRAMEWORKS:
        if opt != params or "nvme" in (opt, params):
            raise ConfigError(field, value, "offload_optimizer and offload_parameters both 'cpu' (or both 'none') "
                              f"with framework {fw!r}", "FSDP2's CPUOffloadPolicy moves the sharded parameters, "
                              "their gradients and the optimizer step to the host together",
                              related=("training.offload_optimizer", "training.offload_parameters"))
        if zero < 2:
            raise ConfigError(field, value, f"'none' unless zero_stage is 2 or 3 with framework {fw!r}",
                              "CPUOffloadPolicy offloads fully_shard's shards", related=("parallel.zero_stage",))
    if fw == "megatron":
        if params != "none" or opt == "nvme":
            raise ConfigError(field, value, "offload_optimizer 'cpu' only with framework 'megatron'",
                              "Megatron-Core offloads the optimizer to the CPU (--optimizer-cpu-offload)")
        if zero != 1 or training.optimizer != "adamw":
            raise ConfigError(field, value, "'none' unless zero_stage is 1 and optimizer 'adamw' with framework "
                              "'megatron'", "--optimizer-cpu-offload runs in the distributed optimizer with Adam",
                              related=("parallel.zero_stage", "training.optimizer"))
    if fw == "deepspeed":
        if opt != "none" and zero < 1:
            raise ConfigError("training.offload_optimizer", opt, "'none' unless zero_stage is 1, 2 or 3",
                              "ZeRO-Offload offloads the optimizer's partition", related=("parallel.zero_stage",))
        if (opt == "nvme" or params != "none") and zero != 3:
            raise ConfigError(field, value, "nvme and parameter offload only with zero_stage 3",
                              "ZeRO-Infinity (DeepSpeed offload_param, NVMe) runs on ZeRO stage 3",
                              related=("parallel.zero_stage",))


def _check_low_precision(training: Training, par: Parallel) -> None:
    if training.param_dtype == "fp4":
        raise ConfigError("training.param_dtype", "fp4", "'fp32', 'bf16', 'fp16' or 'fp8' for training",
                          "FP4 training recipes are not modelled; fp4 weights are for inference")
    if training.param_dtype == "fp8" and not training.fp8:
        raise ConfigError("training.param_dtype", "fp8", "'bf16' unless fp8 is true",
                          "fp8 parameters (fp8_model_init / --fp8-param-gather) belong to the FP8 recipe")
    if training.fp8:
        _check_fp8(training, par)


def _check_fp8(training: Training, par: Parallel) -> None:
    """FP8 recipes as each stack offers them: Megatron-Core with TransformerEngine (tensorwise, mxfp8,
    blockwise); FSDP2 with torchao's Float8Linear (torchtitan's Float8LinearConverter): tensorwise or rowwise
    (torchao/float8/config.py Float8LinearRecipeName), or its MXFP8Linear (mxfp8, compiled), the weights kept
    in their own dtype."""
    from ..spec.choices import FP8_RECIPES_BY_FRAMEWORK

    fw = training.framework
    if fw not in FP8_RECIPES_BY_FRAMEWORK:
        raise ConfigError("training.fp8", True, "false unless framework is 'megatron' or 'fsdp2'",
                          "FP8 is modelled for Megatron-Core with TransformerEngine and for FSDP2 with torchao "
                          "float8 linears", related=("training.framework",))
    recipes = FP8_RECIPES_BY_FRAMEWORK[fw]
    if training.fp8_recipe not in recipes:
        stack = "TransformerEngine" if fw == "megatron" else "torchao's Float8Linear"
        raise ConfigError("training.fp8_recipe", training.fp8_recipe,
                          f"{' or '.join(map(repr, recipes))} with framework {fw!r}",
                          f"{stack} has no {training.fp8_recipe} recipe", related=("training.framework",))
    if fw == "fsdp2" and training.fp8_recipe == "mxfp8" and not training.compile:
        # torchao 0.18 prototype/moe_training/mxfp8_linear.py mx_mm saves (input_hp, weight_hp) as Float8Linear
        # does, so the ledger is the same; its eager MX casts (MXTensor.to_mx) are not measured, and torchtitan
        # warns that MXFP8 needs torch.compile (components/quantization/mx.py MXFP8LinearConverter)
        raise ConfigError("training.fp8_recipe", "mxfp8", "'tensorwise' or 'rowwise' when compile is false",
                          "under fsdp2 the MXFP8 recipe (torchao's MXFP8Linear) is modelled with compiled blocks, "
                          "whose casts Inductor fuses; set compile true", related=("training.compile",))
    if fw == "megatron" and par.zero_stage == 3:
        raise ConfigError("parallel.zero_stage", 3, "0, 1 or 2 with fp8",
                          "FP8 weights under Megatron-FSDP full sharding are not modelled")
    if fw == "fsdp2" and training.param_dtype == "fp8":
        raise ConfigError("training.param_dtype", "fp8", "'bf16' (or 'fp32') with fp8 under framework 'fsdp2'",
                          "torchao's Float8Linear keeps its weights in their dtype and casts them per matmul",
                          related=("training.framework",))


def check_fp8_all_gather(training: Training, zero: int) -> None:
    """torchao's enable_fsdp_float8_all_gather: FSDP2 gathers float8 weights. torchao/float8/config.py
    (Float8LinearConfig.__post_init__) asserts it only with tensorwise scaling of the weight."""
    field = "training.fp8_all_gather"
    if training.framework != "fsdp2":
        raise ConfigError(field, True, "false unless framework is 'fsdp2'",
                          "float8 all-gather is torchao's FSDP2 extension (enable_fsdp_float8_all_gather)",
                          related=("training.framework",))
    if not training.fp8:
        raise ConfigError(field, True, "false unless fp8 is true", "only float8 linears' weights are gathered "
                          "in float8", related=("training.fp8",))
    if training.fp8_recipe != "tensorwise":
        raise ConfigError(field, True, "false unless fp8_recipe is 'tensorwise'",
                          "torchao: enable_fsdp_float8_all_gather only supports tensorwise scaling granularity "
                          f"(fp8_recipe is {training.fp8_recipe!r})", related=("training.fp8_recipe",))
    if zero < 2:
        raise ConfigError(field, True, "false unless zero_stage is 2 or 3",
                          f"with zero_stage {zero} FSDP2 does not shard the parameters, so nothing is gathered",
                          related=("parallel.zero_stage",))


def _check_torchtune(training: Training, par: Parallel) -> None:
    """torchtune's recipes as modelled: FSDP2 data parallelism (its tensor-parallel plans are not
    modelled), and its activation checkpointing: every layer, or every N-th (``ac_mode="selective",
    ac_option=N`` is recompute 'full' with recompute_every N)."""
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, "1 with framework 'torchtune'",
                              "torchtune's recipes are modelled on FSDP2 data parallelism",
                              related=("training.framework",))
    if training.recompute == "selective":
        raise ConfigError("training.recompute", "selective", "'none' or 'full' with framework 'torchtune'",
                          "torchtune's selective AC checkpoints every N-th layer: recompute 'full' with "
                          "recompute_every N", related=("training.framework",))


HYBRID_MEASURED = ("the hybrid layers' saved tensors are modelled for the HF Trainer's stack (transformers 5.23 with "
                   "flash-linear-attention, causal-conv1d and mamba-ssm), the one measured (tests/data/measured)")


def _check_hybrid(arch: Architecture, training: Training, par: Parallel) -> None:
    """A model with linear-attention or Mamba layers (estimator/spec/hybrid.py): what is modelled."""
    which = "model.hybrid_override_pattern" if arch.hybrid_override_pattern else "model.attention_layer_period" \
        if arch.attention_layer_period else "model.parallel_mamba" if arch.parallel_mamba else "model.full_attention_interval"
    for name, value, allowed in (("adapter", training.adapter, "none"), ("fp8", training.fp8 or None, "false"),
                                 ("compile", training.compile or None, "false")):
        if value is not None and training.mode == "training":
            raise ConfigError(f"training.{name}", value, f"{allowed} for a model with linear-attention or Mamba layers",
                              HYBRID_MEASURED, related=(which,))
    if par.cp > 1:
        raise ConfigError("parallel.cp", par.cp, "1 for a model with linear-attention or Mamba layers",
                          "their recurrent state runs along the whole sequence: context parallelism is not modelled",
                          related=(which,))
    # TP splits the heads of every mixer (Megatron-Core 0.16 ssm/mamba_mixer.py and ssm/gated_delta_net.py,
    # vLLM mamba_mixer2.py and gdn_linear_attn.py shard by heads)
    heads = (("model.linear_num_key_heads", arch.linear_num_key_heads), ("model.mamba_num_heads", arch.mamba_num_heads),
             ("model.mamba_num_groups", arch.mamba_num_groups),
             # Mamba-1 (vLLM mamba_mixer.py): the inner channels; its dt and B/C norms replicated
             ("model.mamba_expand", arch.mamba_expand and arch.mamba_expand * arch.hidden_size))
    for name, n in heads:
        if n and n % par.tp and not (name == "model.mamba_num_groups" and training.mode == "inference"):
            raise ConfigError("parallel.tp", par.tp, _divisors(n), f"{name.split('.')[1]} ({n}) must be divisible by tp",
                              related=(name,))
