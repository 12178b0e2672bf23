"""The training setup and layout a Megatron-LM command line describes: precision, recompute,
kernels, MoE runtime, optimizer, parallel sizes, pipeline, sharding.
"""

from __future__ import annotations

import re

from ..spec.choices import LOADING_MODES
from ..spec.errors import ConfigError
from .build import ConfigBuilder, to_float
from .result import Ledger
from .megatron_args import _Args, _EAGER_BACKENDS, _FP8_RECIPES, _IGNORED, _IGNORED_GROUPS, _group, VERSION


# --- the training setup -------------------------------------------------------------------------

def _training(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    seq = args.int("--seq-length") or args.int("--encoder-seq-length")
    if seq is None:
        raise ConfigError("--seq-length", None, "an integer", "missing")
    build.set("training.seq_len", seq, "--seq-length")
    mbs = args.int("--micro-batch-size")
    if mbs is None:
        ledger.note("no --micro-batch-size: 1")
    elif mbs != 1:
        build.set("training.micro_batch_size", mbs, "--micro-batch-size")
    else:
        ledger.mapped("--micro-batch-size", 1, "training.micro_batch_size = 1 (the default)")
    gbs = args.int("--global-batch-size")
    if gbs is not None:
        build.set("training.global_batch_size", gbs, "--global-batch-size")
    _precision(args, build, ledger)
    _recompute(args, build, ledger)
    _kernels(args, build, ledger)
    _optimizer(args, build, ledger)


def _precision(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    bf16, fp16 = args.on("--bf16"), args.on("--fp16")
    if bf16 and fp16:
        raise ConfigError("--bf16", "--fp16", "one of --bf16 and --fp16", "both given")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    if dtype == "fp32":
        build.put("training.param_dtype", "fp32")
        build.put("training.compute_dtype", "fp32")
        ledger.note("neither --bf16 nor --fp16: fp32 parameters and compute (Megatron's default)")
    elif dtype == "fp16":
        build.set("training.param_dtype", "fp16", "--fp16", "")
        build.put("training.compute_dtype", "fp16")
    else:
        ledger.mapped("--bf16", "", "training.param_dtype = \"bf16\" (the default)")
    # bf16 accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16 (validate_args);
    # fp16 keeps them in fp16 unless --accumulate-allreduce-grads-in-fp32
    if args.on("--grad-reduce-in-bf16"):
        build.set("training.grad_dtype", "bf16", "--grad-reduce-in-bf16", "")
    elif fp16 and not args.on("--accumulate-allreduce-grads-in-fp32"):
        build.put("training.grad_dtype", "fp16")
        ledger.note("--fp16 without --accumulate-allreduce-grads-in-fp32: fp16 gradients")
    elif args.on("--accumulate-allreduce-grads-in-fp32"):
        ledger.mapped("--accumulate-allreduce-grads-in-fp32", "", "training.grad_dtype = \"fp32\"")
    fmt = args.take("--fp8-format")
    if fmt is not None:
        build.set("training.fp8", True, "--fp8-format", fmt)
        recipe = args.take("--fp8-recipe", "delayed")  # TransformerConfig default: delayed scaling
        if recipe not in _FP8_RECIPES:
            ledger.not_modelled("--fp8-recipe", recipe, "estimated with per-tensor scales (tensorwise)")
        elif "--fp8-recipe" in args.values:
            build.set("training.fp8_recipe", _FP8_RECIPES[recipe], "--fp8-recipe", recipe,
                      why="delayed scaling keeps per-tensor scales" if recipe == "delayed" else "")
        else:
            ledger.note("no --fp8-recipe: Megatron's delayed scaling, per-tensor scales (fp8_recipe tensorwise)")
        if args.on("--fp8-param-gather"):
            build.set("training.param_dtype", "fp8", "--fp8-param-gather", "",
                      why="the weights are stored in FP8, cast from the fp32 master copy")
    if args.on("--use-precision-aware-optimizer"):
        ledger.mapped("--use-precision-aware-optimizer", "", "with the dtypes below")
        avg, sq = args.take("--exp-avg-dtype", "fp32"), args.take("--exp-avg-sq-dtype", "fp32")
        if avg == sq and avg in ("fp32", "bf16", "fp16"):
            if avg != "fp32":
                build.set("training.optimizer_dtype", avg, "--exp-avg-dtype / --exp-avg-sq-dtype", avg)
        else:
            ledger.not_modelled("--exp-avg-dtype / --exp-avg-sq-dtype", f"{avg} / {sq}",
                                "moments of different or FP8 dtypes; estimated in fp32")
        grads = args.take("--main-grads-dtype", "fp32")
        if grads == "bf16":
            build.set("training.grad_dtype", "bf16", "--main-grads-dtype", grads)
        params = args.take("--main-params-dtype", "fp32")
        if params != "fp32":
            ledger.not_modelled("--main-params-dtype", params, "fp16 master weights; estimated in fp32")


def _recompute(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    granularity = args.take("--recompute-granularity")
    if args.on("--recompute-activations"):  # validate_args: the same as --recompute-granularity selective
        granularity = "selective"
        ledger.mapped("--recompute-activations", "", "training.recompute = \"selective\"")
    modules = args.take("--recompute-modules")
    if args.on("--moe-layer-recompute"):  # TransformerConfig: selective, with "moe" added to the modules
        granularity = "selective"
        modules = list(modules or ["core_attn"]) + ["moe"]
        ledger.mapped("--moe-layer-recompute", "", "recompute module moe (Megatron-Core turns it into that)")
    if granularity is None:
        return
    if granularity == "selective":
        build.set("training.recompute", "selective", "--recompute-granularity", granularity)
        if modules is not None:
            listed = [modules] if isinstance(modules, str) else list(modules)
            known = [m for m in listed if m != "moe_router"]
            build.set("training.recompute_modules", sorted(set(known), key=listed.index), "--recompute-modules",
                      listed)
        return
    if granularity != "full":
        raise ConfigError("--recompute-granularity", granularity, "'full' or 'selective'")
    method = args.take("--recompute-method")
    n = args.int("--recompute-num-layers", low=0)
    if method == "block" and n == 0:  # transformer_block.py _checkpointed_forward: the first 0 layers of a stage
        ledger.mapped("--recompute-granularity full --recompute-method block --recompute-num-layers", 0,
                      "training.recompute = \"none\" (the block method checkpoints the first 0 layers)")
        return
    if n == 0:
        raise ConfigError("--recompute-num-layers", 0, "an integer >= 1 (0 only with --recompute-method block)")
    build.set("training.recompute", "full", "--recompute-granularity", granularity)
    if method == "block" and n is not None:
        build.set("training.recompute_layers", n, "--recompute-num-layers", n, why="--recompute-method block")
    elif method == "uniform" and n not in (None, 1):
        ledger.not_modelled("--recompute-method uniform --recompute-num-layers", n,
                            f"checkpoints every {n} layers as one unit; estimated as each layer checkpointed")
    elif method is not None:
        ledger.mapped("--recompute-method", method, "every layer recomputed")


def _kernels(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    impl = args.take("--transformer-impl", "transformer_engine")  # arguments.py default: transformer_engine
    if impl not in ("transformer_engine", "local"):
        raise ConfigError("--transformer-impl", impl, "'transformer_engine' or 'local'")
    if impl == "local":  # gpt_layer_specs.py get_gpt_layer_local_spec: Megatron-Core's unfused DotProductAttention
        build.set("training.transformer_impl", "local", "--transformer-impl", impl)
        build.set("training.attention", "eager", "--transformer-impl", impl,
                  why="the local spec's DotProductAttention keeps the scores (no flash attention)")
    elif "--transformer-impl" in args.values:
        ledger.mapped("--transformer-impl", impl, "training.transformer_impl = \"transformer_engine\" (the default)")
    if args.on("--no-gradient-accumulation-fusion"):
        build.set("training.gradient_accumulation_fusion", False, "--no-gradient-accumulation-fusion", "")
    backend = str(args.take("--attention-backend", "auto")).removeprefix("AttnBackend.")
    if backend in _EAGER_BACKENDS:
        build.set("training.attention", "eager", "--attention-backend", backend)
    elif "--attention-backend" in args.values and impl == "local":
        ledger.mapped("--attention-backend", backend, "read by TransformerEngine's attention, not the local spec's")
    elif "--attention-backend" in args.values:
        ledger.mapped("--attention-backend", backend, "training.attention = \"flash\" (no s x s scores kept)")
    if args.on("--use-flash-attn"):
        ledger.mapped("--use-flash-attn", "", "training.attention = \"flash\"")
    hidden = to_float("--hidden-dropout", args.take("--hidden-dropout", 0.1))  # TransformerConfig defaults: 0.1
    attention = to_float("--attention-dropout", args.take("--attention-dropout", 0.1))
    eager = build.get("training.attention") == "eager"
    dropout = max(hidden, attention) if eager else hidden
    if eager and hidden != attention:
        ledger.not_modelled("--attention-dropout / --hidden-dropout", f"{attention} / {hidden}",
                            f"one dropout probability for both: {dropout}")
    if dropout:
        given = "--hidden-dropout" in args.values
        build.set("training.dropout", dropout, "--hidden-dropout" if given else "(no --hidden-dropout)", hidden,
                  why="" if given else "Megatron's default 0.1")
    else:
        ledger.mapped("--hidden-dropout / --attention-dropout", f"{hidden} / {attention}", "training.dropout = 0")
    if args.on("--no-masked-softmax-fusion"):
        build.set("training.attention_softmax_fusion", False, "--no-masked-softmax-fusion", "")
    if args.on("--cross-entropy-loss-fusion"):
        build.set("training.loss", "fused", "--cross-entropy-loss-fusion", "")
        impl = args.take("--cross-entropy-fusion-impl", "native")
        if impl != "native":
            build.set("training.cross_entropy_impl", impl, "--cross-entropy-fusion-impl")
    elif "--cross-entropy-fusion-impl" in args.values:
        ledger.mapped("--cross-entropy-fusion-impl", args.take("--cross-entropy-fusion-impl"),
                      "read only with --cross-entropy-loss-fusion")
    if args.on("--defer-embedding-wgrad-compute"):
        build.set("training.defer_embedding_wgrad_compute", True, "--defer-embedding-wgrad-compute", "")
        limit = args.int("--wgrad-deferral-limit", low=0)
        if limit:
            build.set("training.wgrad_deferral_limit", limit, "--wgrad-deferral-limit")
    group = args.int("--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None:
        build.set("training.microbatch_group_size", group, "--microbatch-group-size-per-virtual-pipeline-stage")
    if args.on("--no-overlap-p2p-communication"):
        build.set("training.overlap_p2p_comm", False, "--no-overlap-p2p-communication", "")
    if args.on("--overlap-p2p-communication-warmup-flush"):
        build.set("training.overlap_p2p_comm_warmup_flush", True, "--overlap-p2p-communication-warmup-flush", "")
    if build.get("model.num_experts"):
        _moe_runtime(args, build, ledger)


def _moe_runtime(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    dispatcher = args.take("--moe-token-dispatcher-type", "allgather")  # TransformerConfig default: allgather
    if dispatcher == "flex":
        backend = args.take("--moe-flex-dispatcher-backend", "deepep")
        if backend == "deepep" or args.on("--moe-enable-deepep"):
            build.set("training.moe_dispatcher", "deepep", "--moe-token-dispatcher-type", "flex (DeepEP)")
        else:
            ledger.not_modelled("--moe-flex-dispatcher-backend", backend, "estimated as DeepEP's buffers")
            build.put("training.moe_dispatcher", "deepep")
    elif dispatcher in ("alltoall", "allgather"):
        build.set("training.moe_dispatcher", dispatcher, "--moe-token-dispatcher-type", dispatcher,
                  why="Megatron-Core's default" if "--moe-token-dispatcher-type" not in args.values else "")
    else:
        raise ConfigError("--moe-token-dispatcher-type", dispatcher, "'allgather', 'alltoall' or 'flex'")
    if args.on("--moe-enable-deepep") and dispatcher != "flex":
        ledger.mapped("--moe-enable-deepep", "", "read only with --moe-token-dispatcher-type flex")
    if args.on("--moe-grouped-gemm"):
        build.set("training.moe_grouped_gemm", True, "--moe-grouped-gemm", "")
    if args.on("--moe-use-legacy-grouped-gemm"):  # transformer_engine_spec_provider.py grouped_mlp_modules
        if build.get("training.moe_grouped_gemm"):
            build.set("training.moe_use_legacy_grouped_gemm", True, "--moe-use-legacy-grouped-gemm", "")
        else:
            ledger.mapped("--moe-use-legacy-grouped-gemm", "", "read only with --moe-grouped-gemm")
    router = args.take("--moe-router-dtype")
    if router is not None:
        build.set("training.moe_router_dtype", router, "--moe-router-dtype")
    capacity = args.take("--moe-expert-capacity-factor")
    if capacity is not None:
        build.set("training.moe_capacity_factor", to_float("--moe-expert-capacity-factor", capacity),
                  "--moe-expert-capacity-factor")


def _optimizer(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    name = args.take("--optimizer", "adam")
    if name == "adam":  # Megatron's "adam" is AdamW (decoupled weight decay)
        if "--optimizer" in args.values:
            ledger.mapped("--optimizer", name, "training.optimizer = \"adamw\"")
    elif name == "sgd":
        momentum = to_float("--sgd-momentum", args.take("--sgd-momentum", 0.9))
        build.set("training.optimizer", "sgd_momentum" if momentum else "sgd", "--optimizer", name)
    elif name in ("muon", "dist_muon"):
        build.set("training.optimizer", "muon", "--optimizer", name)
    else:
        raise ConfigError("--optimizer", name, "'adam', 'sgd', 'muon' or 'dist_muon'")
    if args.on("--optimizer-cpu-offload"):
        build.set("training.offload_optimizer", "cpu", "--optimizer-cpu-offload", "")
        fraction = to_float("--optimizer-offload-fraction", args.take("--optimizer-offload-fraction", 1.0))
        if fraction != 1.0:
            ledger.not_modelled("--optimizer-offload-fraction", fraction, "estimated with all of it offloaded")


# --- the layout ---------------------------------------------------------------------------------

def _parallel(args: _Args, build: ConfigBuilder, ledger: Ledger, world: int | None) -> None:
    tp = args.int("--tensor-model-parallel-size", default=1)
    pp = args.int("--pipeline-model-parallel-size", default=1)
    cp = args.int("--context-parallel-size", default=1)
    for flag, path, value in (("--tensor-model-parallel-size", "parallel.tp", tp),
                              ("--pipeline-model-parallel-size", "parallel.pp", pp),
                              ("--context-parallel-size", "parallel.cp", cp)):
        if flag in args.values:
            build.set(path, value, flag)
    if world is None:
        raise ConfigError("--gpus", None, "the number of GPUs: the command line has no torchrun prefix "
                          "(--nproc_per_node, --nnodes) to give the world size", "missing")
    if world % (tp * pp * cp):
        raise ConfigError("--gpus", world, f"a multiple of tp x pp x cp = {tp * pp * cp}",
                          "Megatron's data-parallel size is world / (tp x pp x cp)")
    build.put("parallel.dp", world // (tp * pp * cp))
    _cp_comm_type(args, build, ledger, cp)
    ledger.note(f"data parallel {world // (tp * pp * cp)} = {world} GPUs / (tp {tp} x pp {pp} x cp {cp})")
    ep = args.int("--expert-model-parallel-size")
    if ep is not None:
        build.set("parallel.ep", ep, "--expert-model-parallel-size")
    etp = args.int("--expert-tensor-parallel-size")
    if etp is not None and not _may_have_experts(args, build):
        # a dense model: Megatron builds the expert groups from it (parallel_state.py) but no layer uses them
        ledger.ignore("--expert-tensor-parallel-size", etp, "no effect: the model has no experts (no --num-experts)")
    elif etp is not None:
        build.set("parallel.etp", etp, "--expert-tensor-parallel-size")
    sp = args.on("--sequence-parallel")
    if tp > 1:  # Megatron's default is off; ours follows TP, so it is written either way
        build.set("parallel.sequence_parallel", sp, "--sequence-parallel" if sp else "(no --sequence-parallel)", "",
                  why="" if sp else "Megatron's default is off")
    elif sp:
        ledger.mapped("--sequence-parallel", "", "off: validate_args turns it off when TP is 1")
    _pipeline(args, build, pp)
    _sharding(args, build, ledger)


def _cp_comm_type(args: _Args, build: ConfigBuilder, ledger: Ledger, cp: int) -> None:
    """--cp-comm-type (nargs '+': one type for every layer, or one per layer) as parallel.cp_comm_type."""
    value = args.take("--cp-comm-type")
    if value is None:
        return
    listed = [value] if isinstance(value, str) else list(value)
    if cp == 1:
        ledger.ignore("--cp-comm-type", listed, "no effect: no context parallelism")
    elif len(set(listed)) == 1:
        build.set("parallel.cp_comm_type", listed[0], "--cp-comm-type")
    else:
        ledger.not_modelled("--cp-comm-type", listed, "a type per layer: estimated as the default, p2p")


def named_moe(model: str | None) -> bool:
    """Whether a bundled preset of that name has experts."""
    from ..models.presets import get_architecture, preset_ids
    return model in preset_ids() and get_architecture(model).is_moe


def _may_have_experts(args: _Args, build: ConfigBuilder) -> bool:
    """--num-experts, or a named model that is a MoE preset or a Hub id this import cannot look into."""
    from ..models.presets import preset_ids
    if build.named_model:
        return build.named_model not in preset_ids() or named_moe(build.named_model)
    return bool(args.int("--num-experts", low=0))


def _pipeline(args: _Args, build: ConfigBuilder, pp: int) -> None:
    layout = args.take("--pipeline-model-parallel-layout")
    if layout is not None:
        build.set("parallel.pp_layout", str(layout), "--pipeline-model-parallel-layout")
    stages = args.int("--num-virtual-stages-per-pipeline-rank")
    per_stage = args.int("--num-layers-per-virtual-pipeline-stage")
    if stages is not None and stages > 1:
        build.set("parallel.vpp", stages, "--num-virtual-stages-per-pipeline-rank")
    elif per_stage is not None:  # validate_args: (layers [+1 embedding] [+1 loss]) / pp / per_stage
        layers = build.get("model.num_layers") or 0
        layers += int(args.on("--account-for-embedding-in-pipeline-split"))
        layers += int(args.on("--account-for-loss-in-pipeline-split"))
        if layers % pp or (layers // pp) % per_stage:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", per_stage,
                              f"a divisor of the layers per pipeline stage ({layers} / {pp})")
        vpp = layers // pp // per_stage
        if vpp > 1:
            build.set("parallel.vpp", vpp, "--num-layers-per-virtual-pipeline-stage", per_stage)
    for flag, path in (("--decoder-first-pipeline-num-layers", "parallel.pp_first_stage_layers"),
                       ("--decoder-last-pipeline-num-layers", "parallel.pp_last_stage_layers")):
        value = args.int(flag, low=0)
        if value is not None:
            build.set(path, value, flag)
    for flag, path in (("--account-for-embedding-in-pipeline-split", "parallel.pp_account_for_embedding"),
                       ("--account-for-loss-in-pipeline-split", "parallel.pp_account_for_loss")):
        if args.on(flag):
            build.set(path, True, flag, "")


def _sharding(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    distributed = args.on("--use-distributed-optimizer")
    if args.on("--use-megatron-fsdp"):
        strategy = args.take("--data-parallel-sharding-strategy", "no_shard")
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy)
        if stage is None:
            raise ConfigError("--data-parallel-sharding-strategy", strategy,
                              "'no_shard', 'optim', 'optim_grads' or 'optim_grads_params'")
        build.set("parallel.zero_stage", stage, "--use-megatron-fsdp --data-parallel-sharding-strategy", strategy)
    elif distributed:
        build.set("parallel.zero_stage", 1, "--use-distributed-optimizer", "")
    if args.on("--use-torch-fsdp2"):
        ledger.not_modelled("--use-torch-fsdp2", "", "Megatron on PyTorch FSDP2; estimated with Megatron's own "
                                                     "buffers and the ZeRO stage above")
    grads, params = args.on("--overlap-grad-reduce"), args.on("--overlap-param-gather")
    # comm_overlap: the share of data-parallel traffic hidden behind compute. Under the distributed
    # optimizer the reduce-scatter and the all-gather move the same bytes, so one of the two is half.
    sharded = build.get("parallel.zero_stage", 0) not in (0, None)
    share = (1.0 if grads and (params or not sharded) else 0.5 if (grads or params) and sharded else
             1.0 if grads else 0.0)
    if share != 1.0:
        build.put("parallel.comm_overlap", share)
    label = " ".join(f for f, on in (("--overlap-grad-reduce", grads), ("--overlap-param-gather", params)) if on)
    ledger.mapped(label or "(no --overlap-grad-reduce, --overlap-param-gather)", "",
                  f"parallel.comm_overlap = {share} (the data-parallel traffic hidden behind compute)")


def _account_rest(args: _Args, ledger: Ledger) -> None:
    """Every flag not read above: ignored (no effect on memory or speed) or not modelled."""
    for flag, value in args.values.items():
        if flag in args.used:
            continue
        group = _group(flag)
        reason = _IGNORED.get(flag)
        if reason is None and group in _IGNORED_GROUPS:
            reason = _IGNORED_GROUPS[group]
        value = "" if value is True else value  # a switch shows no value
        if reason is not None:
            ledger.ignore(flag, value, reason or "read with another flag")
        else:
            ledger.not_modelled(flag, value, f"a {VERSION} flag ({group}) the estimate does not model")


def _allocator(env: dict[str, str], build: ConfigBuilder) -> None:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, CUBLAS_WORKSPACE_CONFIG (the size of PyTorch's
    cuBLAS workspaces) and CUDA_MODULE_LOADING, set in the script or before the command."""
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if re.search(r"expandable_segments:\s*True", conf):
        build.set("hardware.expandable_segments", True, "PYTORCH_CUDA_ALLOC_CONF", conf)
    workspace = env.get("CUBLAS_WORKSPACE_CONFIG")
    if workspace is not None:
        build.set("hardware.cublas_workspace_config", workspace.strip(), "CUBLAS_WORKSPACE_CONFIG", workspace)
    loading = env.get("CUDA_MODULE_LOADING", "").strip().lower()
    if loading in LOADING_MODES:  # DEFAULT means EAGER before CUDA 12.2 and LAZY after: left to the default
        build.set("hardware.cuda_module_loading", loading, "CUDA_MODULE_LOADING", env["CUDA_MODULE_LOADING"])
