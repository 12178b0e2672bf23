"""``plan --emit megatron``: a configuration written as a ``torchrun ... pretrain_gpt.py`` command
(Megatron-LM core_v0.16.1 flags), the allocator setting and NCCL_CUMEM_ENABLE (where the configuration
sets it) as exported environment variables. Its
pieces (`megatron_model`, `megatron_training`, `megatron_parallel`: the flags of the model, the
training setup and the layout) are the flags the Megatron-Bridge and slime writers spell too."""

from __future__ import annotations

import shlex

from ..spec.errors import ConfigError
from .emit_check import refuse


def megatron_command(cfg, per_node: int) -> str:
    arch, tr, par = cfg.architecture, cfg.training, cfg.parallel
    if tr.framework != "megatron":
        raise ConfigError("--emit", "megatron", f"a configuration with framework 'megatron' (this one is "
                          f"{tr.framework!r})")
    words: list[str] = []
    words += megatron_model(arch)
    words += megatron_training(tr, arch)
    words += megatron_parallel(par, tr)
    gpus = par.gpus
    nodes = gpus // per_node if gpus % per_node == 0 and gpus >= per_node else 1
    launcher = ["torchrun", "--nproc_per_node", str(gpus // nodes), "--nnodes", str(nodes), "pretrain_gpt.py"]
    lines = []
    if cfg.hardware.expandable_segments:
        lines.append("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if tr.nccl_cumem is not None:
        lines.append(f"export NCCL_CUMEM_ENABLE={int(tr.nccl_cumem)}")
    lines.append(shlex.join(launcher) + " \\\n    " + " \\\n    ".join(_pairs(words)))
    return "\n".join(lines) + "\n"


def _pairs(words: list[str]) -> list[str]:
    """Flags with their values on one line each."""
    out: list[str] = []
    for w in words:
        if w.startswith("--") or not out:
            out.append(shlex.quote(w))
        else:
            out[-1] += " " + shlex.quote(w)
    return out


def megatron_model(arch) -> list[str]:
    for field, default in (("norms_per_layer", 2), ("qk_norm_full_width", False), ("attention_sinks", False),
                           ("sliding_window", None), ("attention_logit_softcapping", None),
                           ("final_logit_softcapping", None), ("norm_unit_offset", False),
                           ("attention_chunk_size", None), ("qk_l2_norm", False)):
        if getattr(arch, field) != default:
            raise refuse("megatron", f"model.{field}", getattr(arch, field), f"{default} (the GPT model of "
                          "pretrain_gpt.py)")
    w = ["--num-layers", arch.num_layers, "--hidden-size", arch.hidden_size,
         "--num-attention-heads", arch.num_attention_heads, "--vocab-size", arch.vocab_size]
    if arch.intermediate_size:
        w += ["--ffn-hidden-size", arch.intermediate_size]
    elif arch.is_moe:  # every layer MoE: the dense width is never built; give Megatron one
        w += ["--ffn-hidden-size", arch.moe_intermediate_size]
    if arch.uses_mla:
        w += ["--multi-latent-attention", "--kv-lora-rank", arch.kv_lora_rank, "--qk-head-dim", arch.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", arch.qk_rope_head_dim, "--v-head-dim", arch.v_head_dim]
        if arch.q_lora_rank:
            w += ["--q-lora-rank", arch.q_lora_rank]
        if arch.uses_sparse_attention:  # Megatron-Core 0.16.1 DSAttention (TransformerConfig dsa_indexer_*)
            w += ["--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", arch.index_n_heads,
                  "--dsa-indexer-head-dim", arch.index_head_dim, "--dsa-indexer-topk", arch.index_topk]
    else:
        if arch.num_kv_heads != arch.num_attention_heads:
            w += ["--group-query-attention", "--num-query-groups", arch.num_kv_heads]
        if arch.head_dim != arch.hidden_size // arch.num_attention_heads:
            w += ["--kv-channels", arch.head_dim]
        if arch.qk_norm:
            w += ["--qk-layernorm"]
    if arch.gated_mlp:
        w += ["--swiglu"]
    w += ["--normalization", "RMSNorm" if arch.norm == "rmsnorm" else "LayerNorm"]
    if not arch.linear_bias:
        w += ["--disable-bias-linear"]
    if arch.qkv_bias:
        w += ["--add-qkv-bias"]
    if arch.position_embedding == "rope":
        w += ["--position-embedding-type", "rope"]
    else:
        w += ["--position-embedding-type", "learned_absolute", "--max-position-embeddings",
              arch.max_position_embeddings]
    if not arch.tie_embeddings:
        w += ["--untie-embeddings-and-output-weights"]
    if arch.is_moe:
        w += ["--num-experts", arch.num_experts, "--moe-router-topk", arch.num_experts_per_token,
              "--moe-ffn-hidden-size", arch.moe_intermediate_size]
        if arch.num_shared_experts:
            w += ["--moe-shared-expert-intermediate-size",
                  arch.num_shared_experts * arch.shared_expert_intermediate_size]
        if arch.shared_expert_gate:
            w += ["--moe-shared-expert-gate"]
        if arch.router_bias:
            w += ["--moe-router-enable-expert-bias"]
        if arch.first_dense_layers or arch.moe_layer_frequency != 1:
            pattern = [1 if arch.is_moe_layer(i) else 0 for i in range(arch.num_layers)]
            w += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    if arch.mtp_layers:
        w += ["--mtp-num-layers", arch.mtp_layers]
    return [str(x) for x in w]


_RECIPES = {"tensorwise": "tensorwise", "mxfp8": "mxfp8", "blockwise": "blockwise"}


def megatron_training(tr, arch) -> list[str]:
    from ..spec.training import resolve_recipe
    if tr.mode != "training":
        raise refuse("megatron", "training.mode", tr.mode, "'training' (pretrain_gpt.py trains)")
    for field in ("adapter", "rl"):
        if getattr(tr, field) is not None:
            raise refuse("megatron", f"training.{field}", "{...}", "none")
    w = ["--seq-length", tr.seq_len, "--micro-batch-size", tr.micro_batch_size]
    if tr.global_batch_size is not None:
        w += ["--global-batch-size", tr.global_batch_size]
    w += _precision(tr, resolve_recipe(tr))
    w += megatron_recompute(tr)
    w += _kernels_and_loss(tr)
    w += _optimizer(tr)
    if arch.is_moe:
        w += _moe(tr)
    for field in ("compile", "optimizer_in_backward", "offload_activations", "fp8_all_gather",
                  "activation_func_fp8_input_store"):
        if getattr(tr, field):
            raise refuse("megatron", f"training.{field}", True, "false")
    if tr.recompute_every != 1:
        raise refuse("megatron", "training.recompute_every", tr.recompute_every, "1")
    return [str(x) for x in w]


def _precision(tr, recipe) -> list:
    """--bf16/--fp16, FP8, the gradient-reduce and optimizer-state dtypes."""
    w: list = []
    base = "fp32" if tr.param_dtype == "fp32" else tr.param_dtype
    if base in ("bf16", "fp8"):
        w += ["--bf16"]
    elif base == "fp16":
        w += ["--fp16"]
    elif base != "fp32":
        raise refuse("megatron", "training.param_dtype", tr.param_dtype, "'fp32', 'bf16', 'fp16' or 'fp8'")
    expected_compute = "fp32" if base == "fp32" else "fp16" if base == "fp16" else "bf16"
    if tr.compute_dtype != expected_compute:
        raise refuse("megatron", "training.compute_dtype", tr.compute_dtype, f"{expected_compute!r} with "
                      f"{tr.param_dtype} parameters")
    if tr.fp8:
        w += ["--fp8-format", "hybrid", "--fp8-recipe", _RECIPES.get(tr.fp8_recipe, "tensorwise")]
        if tr.param_dtype == "fp8":
            w += ["--fp8-param-gather"]
    grads = recipe.grad_dtype
    if base == "bf16" or base == "fp8":
        if grads == "bf16":
            w += ["--grad-reduce-in-bf16"]
        elif grads != "fp32":
            raise refuse("megatron", "training.grad_dtype", grads, "'fp32' or 'bf16'")
    elif base == "fp16" and grads == "fp32":
        w += ["--accumulate-allreduce-grads-in-fp32"]
    if not recipe.master_weights and base != "fp32":
        raise refuse("megatron", "training.master_weights", False, "true (Megatron keeps fp32 main parameters)")
    if recipe.optimizer_dtype != "fp32":
        w += ["--use-precision-aware-optimizer", "--exp-avg-dtype", recipe.optimizer_dtype, "--exp-avg-sq-dtype",
              recipe.optimizer_dtype]
    return w


def _kernels_and_loss(tr) -> list:
    """Attention backend, dropout, the fused loss, softmax fusion and the deferred embedding wgrad."""
    w: list = []
    if tr.attention == "eager":
        w += ["--attention-backend", "unfused"]
    w += ["--hidden-dropout", repr(tr.dropout), "--attention-dropout", repr(tr.dropout)]
    if tr.loss == "fused":
        w += ["--cross-entropy-loss-fusion"]
        if tr.cross_entropy_impl != "native":
            w += ["--cross-entropy-fusion-impl", tr.cross_entropy_impl]
    elif tr.loss != "standard":
        raise refuse("megatron", "training.loss", tr.loss, "'standard' or 'fused'")
    if not tr.attention_softmax_fusion:
        w += ["--no-masked-softmax-fusion"]
    if tr.defer_embedding_wgrad_compute:
        w += ["--defer-embedding-wgrad-compute"]
        if tr.wgrad_deferral_limit:
            w += ["--wgrad-deferral-limit", tr.wgrad_deferral_limit]
    return w


def _optimizer(tr) -> list:
    optim = {"adamw": [], "sgd": ["--optimizer", "sgd", "--sgd-momentum", "0"], "sgd_momentum": ["--optimizer", "sgd"],
             "muon": ["--optimizer", "muon"]}.get(tr.optimizer)
    if optim is None:
        raise refuse("megatron", "training.optimizer", tr.optimizer, "adamw, sgd, sgd_momentum or muon")
    if tr.offload_optimizer == "cpu":
        return optim + ["--optimizer-cpu-offload"]
    if tr.offload_optimizer != "none" or tr.offload_parameters != "none":
        raise refuse("megatron", "training.offload_parameters", tr.offload_parameters, "'none'")
    return optim


def _moe(tr) -> list:
    w = {"alltoall": ["--moe-token-dispatcher-type", "alltoall"],
         "allgather": ["--moe-token-dispatcher-type", "allgather"],
         "deepep": ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"]}[tr.moe_dispatcher]
    if tr.moe_grouped_gemm:
        w += ["--moe-grouped-gemm"]
    if tr.moe_use_legacy_grouped_gemm:
        w += ["--moe-use-legacy-grouped-gemm"]
    if tr.moe_router_dtype:
        w += ["--moe-router-dtype", tr.moe_router_dtype]
    if tr.moe_capacity_factor != 1.0:
        w += ["--moe-expert-capacity-factor", repr(tr.moe_capacity_factor)]
    return w


def megatron_recompute(tr) -> list:
    if tr.recompute == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", *tr.recompute_modules]
    if tr.recompute == "full":
        if tr.recompute_layers is not None:
            return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                    tr.recompute_layers]
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    return []


def megatron_parallel(par, tr) -> list[str]:
    w = ["--tensor-model-parallel-size", par.tp, "--pipeline-model-parallel-size", par.pp,
         "--context-parallel-size", par.cp]
    if par.cp > 1 and par.cp_comm_type != "p2p":
        w += ["--cp-comm-type", par.cp_comm_type]
    if par.ep != 1:
        w += ["--expert-model-parallel-size", par.ep]
    if par.etp != par.tp:
        w += ["--expert-tensor-parallel-size", par.etp]
    if par.sequence_parallel:
        w += ["--sequence-parallel"]
    if par.pp_layout is not None:
        w += ["--pipeline-model-parallel-layout", par.pp_layout]
    elif par.vpp > 1:
        w += ["--num-virtual-stages-per-pipeline-rank", par.vpp]
    if par.pp_first_stage_layers is not None:
        w += ["--decoder-first-pipeline-num-layers", par.pp_first_stage_layers]
    if par.pp_last_stage_layers is not None:
        w += ["--decoder-last-pipeline-num-layers", par.pp_last_stage_layers]
    if par.pp_account_for_embedding:
        w += ["--account-for-embedding-in-pipeline-split"]
    if par.pp_account_for_loss:
        w += ["--account-for-loss-in-pipeline-split"]
    if par.pp_schedule not in ("1f1b", "interleaved"):
        raise refuse("megatron", "parallel.pp_schedule", par.pp_schedule, "'1f1b' or 'interleaved'")
    zero = par.zero_stage or 0
    if zero == 1:
        w += ["--use-distributed-optimizer"]
    elif zero in (2, 3):
        w += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if zero == 2 else "optim_grads_params"]
    if par.comm_overlap == 1.0:
        w += ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if zero else [])
    elif par.comm_overlap == 0.5 and zero:
        w += ["--overlap-grad-reduce"]
    elif par.comm_overlap != 0.0:
        raise refuse("megatron", "parallel.comm_overlap", par.comm_overlap, "1.0 (both overlaps), 0.5 (gradients "
                      "only, with a sharded optimizer) or 0.0")
    return [str(x) for x in w]
