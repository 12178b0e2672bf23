"""The measured Megatron-Core cases, and each one's configuration in the contract's JSON format
(/work/shared/CONTRACT.md) with framework "megatron"."""

from __future__ import annotations

from dataclasses import replace

from .harness import Arch, Setup

# Layer shapes from the published configurations (Megatron-LM examples / HF config.json).
GPT3_175B = Arch(hidden_size=12288, num_layers=96, num_attention_heads=96, num_query_groups=96,
                 kv_channels=128, ffn_hidden_size=49152, vocab_size=51200, swiglu=False,
                 normalization="LayerNorm", add_bias_linear=True, position_embedding="learned_absolute",
                 max_position_embeddings=2048)
LLAMA31_70B = Arch(hidden_size=8192, num_layers=80, num_attention_heads=64, num_query_groups=8,
                   kv_channels=128, ffn_hidden_size=28672, vocab_size=128256)
LLAMA31_8B = Arch(hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
                  kv_channels=128, ffn_hidden_size=14336, vocab_size=128256)
MIXTRAL_8X7B = Arch(hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
                    kv_channels=128, ffn_hidden_size=14336, vocab_size=32000, num_experts=8,
                    moe_router_topk=2, moe_ffn_hidden_size=14336)
# DeepSeek-V2-Lite-like: MLA (no q LoRA), 64 routed experts top-6, 2 shared experts. Every layer is
# MoE: the local layer spec (get_gpt_layer_local_spec with num_experts) builds one MoE layer spec for
# all layers, whatever moe_layer_freq says (a dense first layer needs the decoder block spec), and the
# record must describe the model that was built (its parameters match the estimator's exactly so)
DEEPSEEK_V2_LITE = Arch(hidden_size=2048, num_layers=27, num_attention_heads=16, num_query_groups=16,
                        kv_channels=128, ffn_hidden_size=10944, vocab_size=102400, num_experts=64,
                        moe_router_topk=6, moe_ffn_hidden_size=1408,
                        moe_shared_expert_intermediate_size=2816, first_dense_layers=0,
                        mla=(None, 512, 128, 64, 128))

# The same layers with DeepSeek-V3.2's lightning indexer (64 heads of 128, top-2048): Megatron-Core 0.16.1's
# DSAttention (harness.dsa_spec)
DEEPSEEK_V2_LITE_DSA = replace(DEEPSEEK_V2_LITE, dsa=(64, 128, 2048))

ARCHS = {"gpt3-175b": GPT3_175B, "llama-3.1-70b": LLAMA31_70B, "llama-3.1-8b": LLAMA31_8B,
         "mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v2-lite": DEEPSEEK_V2_LITE,
         "deepseek-v2-lite-dsa": DEEPSEEK_V2_LITE_DSA}
ARCH_NAMES = {id(a): name for name, a in ARCHS.items()}


def case_id(s: Setup) -> str:
    parts = [ARCH_NAMES[id(s.arch)], f"tp{s.tp}", f"pp{s.pp}", s.stage if s.pp > 1 else "only"]
    if s.ep > 1:
        parts.append(f"ep{s.ep}")
    parts.append(f"s{s.seq_len}-b{s.micro_batch_size}")
    if s.recompute == "full":
        parts.append(f"full-{s.recompute_method}{s.recompute_num_layers}")
    elif s.recompute == "selective":
        parts.append("sel-" + "+".join(s.recompute_modules))
    if s.attention == "unfused":
        parts.append("unfused")
    if s.loss_fusion:
        parts.append("lossfusion" + ("-te" if s.ce_impl == "te" else ""))
    if s.grouped_gemm:
        parts.append("gg")
    if s.arch.num_experts and s.dispatcher != "alltoall":
        parts.append(s.dispatcher)
    if s.router_dtype:
        parts.append(f"router-{s.router_dtype}")
    if s.arch.num_experts and s.capacity_factor != 1.0:
        parts.append(f"cf{s.capacity_factor:g}")
    if not s.distributed_optimizer:
        parts.append("nodistopt")
    if s.overlap_grad_reduce or s.overlap_param_gather:
        parts.append("overlap")
    return "-".join(parts)


def _setups() -> list[Setup]:
    g = Setup(GPT3_175B, 2048, 1, tp=8, pp=8, dp=2)
    l70 = Setup(LLAMA31_70B, 4096, 1, tp=8, pp=8, dp=2)
    l8 = Setup(LLAMA31_8B, 4096, 1, tp=2, pp=1, dp=4)
    mx = Setup(MIXTRAL_8X7B, 4096, 1, tp=2, pp=4, dp=4, ep=4, layers=2)
    ds = Setup(DEEPSEEK_V2_LITE, 4096, 1, tp=1, pp=1, dp=8, ep=8, layers=4)
    dsa = Setup(DEEPSEEK_V2_LITE_DSA, 4096, 1, tp=1, pp=1, dp=8, ep=8, layers=2)
    return [
        # dense GPT-3 175B-like, TP8 PP8: first / middle / last stage, recompute variants
        g, replace(g, stage="middle"), replace(g, stage="last"),
        replace(g, stage="last", loss_fusion=True),
        replace(g, recompute="full"), replace(g, recompute="full", recompute_method="block", recompute_num_layers=6),
        replace(g, recompute="selective", recompute_modules=("core_attn",)),
        replace(g, attention="unfused", layers=2),
        # Llama-3.1-70B-like, TP8 PP8
        l70, replace(l70, stage="middle"), replace(l70, stage="last"),
        replace(l70, stage="middle", recompute="full", recompute_method="block", recompute_num_layers=5),
        replace(l70, stage="middle", recompute="selective", recompute_modules=("layernorm",)),
        replace(l70, stage="middle", recompute="selective", recompute_modules=("mlp",)),
        replace(l70, stage="middle", recompute="selective", recompute_modules=("core_attn", "mlp", "layernorm")),
        replace(l70, stage="last", loss_fusion=True),
        replace(l70, overlap_grad_reduce=True, overlap_param_gather=True),
        replace(l70, distributed_optimizer=False),
        # Llama-3.1-8B-like, TP2, no pipeline
        l8, replace(l8, micro_batch_size=2, seq_len=2048), replace(l8, loss_fusion=True),
        # MoE: Mixtral-like (TP2 PP4 EP4, 2 layers built per stage), alltoall dispatcher
        mx, replace(mx, stage="last"), replace(mx, recompute="full"),
        replace(mx, router_dtype="fp32"), replace(mx, recompute="selective", recompute_modules=("layernorm", "moe")),
        # --cross-entropy-fusion-impl te (TE's in-place cross-entropy, emulated)
        replace(l70, stage="last", loss_fusion=True, ce_impl="te"), replace(l8, loss_fusion=True, ce_impl="te"),
        replace(mx, router_dtype="fp64"),
        # DeepSeek-V2-Lite-like: MLA, shared experts, top-6, EP8, 4 layers (1 dense, 3 MoE)
        ds, replace(ds, recompute="selective", recompute_modules=("mla_up_proj", "layernorm")),
        replace(ds, capacity_factor=1.25),
        # the two MoE --recompute-modules entries: the experts' activation function (moe_act,
        # CheckpointWithoutOutput in experts.py) and the shared expert (shared_experts.py)
        # (moe_act needs --moe-grouped-gemm: the legacy GroupedMLP on the local spec, its grouped_gemm
        # kernels emulated, kernels.gmm)
        replace(ds, recompute="selective", recompute_modules=("moe_act",), grouped_gemm=True),
        replace(ds, recompute="selective", recompute_modules=("shared_experts",)),
        # --moe-token-dispatcher-type allgather: the hidden states all-gathered over EP x expert-TP, the
        # permutation's data-dependent sizes from balanced routing under fake tensors (shims.BalancedRouting)
        replace(mx, dispatcher="allgather"),
        replace(mx, dispatcher="allgather", recompute="selective", recompute_modules=("layernorm", "moe")),
        # --moe-grouped-gemm: the legacy GroupedMLP differentiates all local experts at once (kernels.gmm)
        replace(mx, grouped_gemm=True),
        # DeepSeek Sparse Attention (issue 28): the DSA layers at 4k tokens, 2 layers; TP 2 with sequence
        # parallelism (the indexer all-gathers its inputs); two sequences of 2k; full recompute, uniform
        # (every layer: DSAttention's KL loss is made only in the recomputed forward, `torch.is_grad_enabled()`)
        # and block (the first layer; the second keeps its tensors); selective recompute of MLA's up-projections
        # with the norms, and of the experts' activation. Selective recompute of core_attn is refused by the
        # estimator: MLA's _checkpointed_attention_forward does not pass DSAttention x and qr.
        dsa, replace(dsa, tp=2, dp=4, ep=4), replace(dsa, seq_len=2048, micro_batch_size=2),
        replace(dsa, recompute="full"),
        replace(dsa, recompute="full", recompute_method="block", recompute_num_layers=1),
        replace(dsa, recompute="selective", recompute_modules=("mla_up_proj", "layernorm")),
        replace(dsa, recompute="selective", recompute_modules=("moe_act",), grouped_gemm=True),
        # the real-GPU Megatron step's full-recompute run (validation/gpu/megatron_step.py RUNS): TP 1, 4 layers, the
        # local spec's unfused attention at 4k tokens, whose recomputed layer peaks at its softmax (issue 22)
        Setup(LLAMA31_8B, 4096, 1, tp=1, pp=1, dp=1, layers=4, attention="unfused", recompute="full",
              recompute_method="uniform", recompute_num_layers=1),
        # the same layers with selective recompute of the core attention: the checkpointed DotProductAttention's
        # softmax recomputed and differentiated in backward (estimator/memory/megatron_softmax_moment.py)
        Setup(LLAMA31_8B, 4096, 1, tp=1, pp=1, dp=1, layers=4, attention="unfused", recompute="selective",
              recompute_modules=("core_attn",)),
    ]


CASES: dict[str, Setup] = {case_id(s): s for s in _setups()}


def architecture(a: Arch) -> dict:
    """The contract's canonical architecture object for an Arch."""
    arch = {
        "name": ARCH_NAMES.get(id(a), "custom"), "hidden_size": a.hidden_size,
        "num_layers": a.num_layers, "num_attention_heads": a.num_attention_heads,
        "num_kv_heads": a.num_query_groups, "head_dim": a.kv_channels,
        "intermediate_size": a.ffn_hidden_size, "vocab_size": a.vocab_size,
        "tie_embeddings": not a.untie_embeddings, "gated_mlp": a.swiglu,
        "norm": "rmsnorm" if a.normalization == "RMSNorm" else "layernorm",
        "linear_bias": a.add_bias_linear, "qkv_bias": a.add_qkv_bias, "qk_norm": a.qk_layernorm,
        "position_embedding": "rope" if a.position_embedding == "rope" else "learned",
    }
    if a.position_embedding != "rope":
        arch["max_position_embeddings"] = a.max_position_embeddings
    if a.num_experts:
        arch.update(num_experts=a.num_experts, num_experts_per_token=a.moe_router_topk,
                    moe_intermediate_size=a.moe_ffn_hidden_size,
                    first_dense_layers=a.first_dense_layers)
        if a.moe_shared_expert_intermediate_size:
            # Megatron's shared expert is one MLP of the summed width
            arch.update(num_shared_experts=1,
                        shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size)
    if a.mla:
        q_lora, kv_lora, qk_dim, rope_dim, v_dim = a.mla
        arch.update(kv_lora_rank=kv_lora, qk_nope_head_dim=qk_dim, qk_rope_head_dim=rope_dim,
                    v_head_dim=v_dim)
        if q_lora:
            arch["q_lora_rank"] = q_lora
    if a.dsa:
        arch.update(index_n_heads=a.dsa[0], index_head_dim=a.dsa[1], index_topk=a.dsa[2])
    return arch


def contract_config(s: Setup) -> dict:
    """The run as the estimator's JSON config. One micro-batch per step (global batch =
    micro-batch x dp): the record holds one micro-batch in flight on this rank. The model keeps
    its full depth; layers not on this rank's stage do not matter for the stage compared."""
    arch = architecture(s.arch)
    arch["num_layers"] = s.stage_layers * s.pp  # the depth actually built (see the record)
    training = {
        "mode": "training", "framework": "megatron", "seq_len": s.seq_len,
        "micro_batch_size": s.micro_batch_size, "global_batch_size": s.micro_batch_size * s.dp,
        "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": True,
        "optimizer_dtype": "fp32", "compute_dtype": "bf16", "optimizer": "adamw",
        "recompute": s.recompute, "attention": "flash" if s.attention == "fused" else "eager",
        "dropout": 0.0, "loss": "fused" if s.loss_fusion else "standard",
    }
    if s.recompute == "full":
        training["recompute_layers"] = s.stage_layers if s.recompute_method == "uniform" \
            else min(s.recompute_num_layers, s.stage_layers)
    if s.recompute == "selective":
        training["recompute_modules"] = list(s.recompute_modules)
    if s.attention == "unfused":
        training["attention_softmax_fusion"] = s.softmax_fusion
        # the harness builds the local spec, whose core attention is then Megatron's own DotProductAttention
        # (harness.layer_spec): the estimator's transformer_impl local (its norms stay TE's, emulated)
        training["transformer_impl"] = "local"
    if s.loss_fusion:
        training["cross_entropy_impl"] = s.ce_impl
    if s.arch.num_experts:
        training["moe_capacity_factor"] = s.capacity_factor
        training["moe_dispatcher"] = s.dispatcher
        if s.router_dtype:
            training["moe_router_dtype"] = s.router_dtype
        if s.grouped_gemm:
            training["moe_grouped_gemm"] = True
            # the legacy GroupedMLP (harness.layer_spec: the local spec's grouped GEMM), what the TE spec builds with
            # --moe-use-legacy-grouped-gemm: it returns its weight gradients (activations/moe.py LEGACY_GROUPED_MLP);
            # the harness builds every linear without gradient-accumulation fusion (harness.py)
            training["moe_use_legacy_grouped_gemm"] = True
            training["gradient_accumulation_fusion"] = False
    parallel = {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "sequence_parallel": s.sp,
                "zero_stage": 1 if s.distributed_optimizer else 0}
    if s.arch.num_experts:
        parallel.update(ep=s.ep, etp=s.etp or s.tp)
    return {"model": arch, "training": training, "parallel": parallel, "hardware": {"gpu": "h100-80"}}


def not_expressible(s: Setup) -> list[str]:
    """Settings of the run that the estimator's config has no field for."""
    notes = []
    if s.recompute == "full" and s.recompute_method == "uniform" and s.recompute_num_layers > 1:
        notes.append("recompute_method uniform with chunks > 1")
    if s.overlap_grad_reduce or s.overlap_param_gather:
        notes.append("overlap_grad_reduce / overlap_param_gather")
    return notes


def describe(s: Setup) -> str:
    return (f"{ARCH_NAMES[id(s.arch)]}-like layers, Megatron-Core GPTModel (local spec, TE attention "
            f"and norms emulated), TP{s.tp}{' SP' if s.sp else ''} PP{s.pp} ({s.stage} stage, "
            f"{s.stage_layers} layers built) DP{s.dp} EP{s.ep}, seq {s.seq_len}, micro-batch "
            f"{s.micro_batch_size}, recompute {s.recompute}"
            + (f" ({s.recompute_method}, {s.recompute_num_layers})" if s.recompute == "full" else "")
            + (f" ({', '.join(s.recompute_modules)})" if s.recompute == "selective" else "")
            + (", legacy GroupedMLP (--moe-grouped-gemm; grouped_gemm's gmm emulated, kernels.gmm)"
               if s.grouped_gemm else "")
            + f", {'distributed optimizer' if s.distributed_optimizer else 'Float16 optimizer'}")


def record_fields(s: Setup) -> dict:
    """What the record says of the rank built, between its configuration and its measurement."""
    return {
        "stage": s.stage_index,
        "layers_built": s.stage_layers,
        "layers_note": ("the config's num_layers is layers_built x pp: every stage holds "
                        "layers_built layers; per-layer figures are layer_kept_bytes")
        + ("; every layer is MoE (the local layer spec builds MoE layers throughout, so the config "
           "says first_dense_layers 0)" if s.arch.num_experts else ""),
        "not_expressible": not_expressible(s),
    }
