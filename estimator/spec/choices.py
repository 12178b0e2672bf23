"""The values each choice field allows, and the groups of them the rules test.

The field registry (`fields`) offers these lists; the records (`training`, `adapter`, `rl`,
`architecture`, `parallel`, `serving`) check against them through the registry. They live below
both, so that the registry imports no record.
"""

# --- training -----------------------------------------------------------------------------------
MODES = ("training", "inference")
FRAMEWORKS = ("megatron", "fsdp2", "deepspeed", "hf", "torchtune", "fsdp1", "hf_fsdp2")
# the stacks that shard with PyTorch FSDP2's fully_shard: torchtitan (fsdp2), torchtune, and the HF Trainer through
# Accelerate's FSDP2 plugin (hf_fsdp2: memory/hf_fsdp2.py)
FSDP_FRAMEWORKS = ("fsdp2", "torchtune", "hf_fsdp2")
# the stacks whose sharded states are fully sharded FSDP's (fp32 shards as the master copy): FSDP2's and
# PyTorch FSDP1 (FullyShardedDataParallel) as the HF Trainer with Accelerate runs it (fsdp1.py)
FULLY_SHARDED_FRAMEWORKS = FSDP_FRAMEWORKS + ("fsdp1",)
# the frameworks whose step runs transformers' modelling code (the HF Trainer, DeepSpeed's engine, FSDP1 and FSDP2
# under it)
TRANSFORMERS_FRAMEWORKS = ("hf", "deepspeed", "fsdp1", "hf_fsdp2")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
# under the transformers frameworks, which kernel "flash" is: transformers' attn_implementation (its default sdpa)
ATTN_IMPLEMENTATIONS = ("sdpa", "flash_attention_2")
# CUDA_MODULE_LOADING (hardware.cuda_module_loading; spec/cuda_modules.py)
LOADING_MODES = ("lazy", "eager")
LOSSES = ("standard", "fused", "chunked")
# the Mamba-2 mixers' kernels: mamba-ssm's and causal-conv1d's, or transformers' torch fallback without them (5.18 and
# later: einsums; 5.17 and earlier: broadcast products)
SSM_KERNELS = ("fused", "torch", "torch_5.17")
# FP8 scaling recipes of TransformerEngine: per-tensor (delayed or current scaling, Hopper),
# MXFP8 (1x32 blocks with E8M0 scales, Blackwell), blockwise (DeepSeek-V3's 128x128 weight blocks);
# under fsdp2, torchao's Float8Linear: tensorwise or rowwise (torchao/float8/config.py Float8LinearRecipeName), or
# torchao's MXFP8Linear (torchtitan's MXFP8LinearConverter, components/quantization/mx.py; compiled blocks only)
FP8_RECIPES = ("tensorwise", "mxfp8", "blockwise", "rowwise")
FP8_RECIPES_BY_FRAMEWORK = {"megatron": ("tensorwise", "mxfp8", "blockwise"), "fsdp2": ("tensorwise", "rowwise", "mxfp8")}
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
KV_CACHE_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
# MoE token dispatcher: Megatron-Core's MoEAlltoAllTokenDispatcher, its flex dispatcher on DeepEP
# (--moe-token-dispatcher-type flex --moe-enable-deepep), whose fixed buffers estimator/memory/deepep.py sizes,
# or its MoEAllGatherTokenDispatcher (--moe-token-dispatcher-type allgather: all-gathers the hidden
# states over the EP x expert-TP group, reduce-scatters the experts' outputs back; activations.MEGATRON_ALLGATHER)
MOE_DISPATCHERS = ("alltoall", "deepep", "allgather")
# Megatron-Core --moe-router-dtype (transformer_config.py moe_router_dtype: None, 'fp32', 'fp64'); None =
# the router runs in the compute dtype
MOE_ROUTER_DTYPES = ("fp32", "fp64")
# Megatron-Core --cross-entropy-fusion-impl with --cross-entropy-loss-fusion (model_parallel_config.py)
CROSS_ENTROPY_IMPLS = ("native", "te")
# Megatron-LM --transformer-impl (arguments.py): TransformerEngine's layer spec, or Megatron-Core's own ("local":
# gpt_layer_specs.py get_gpt_layer_local_spec, with its unfused DotProductAttention and no TE module)
TRANSFORMER_IMPLS = ("transformer_engine", "local")
# hf: the HF Trainer through Accelerate (autocast, fp32 outputs) or a plain loop (memory/trainer_loop.py); trl_sft:
# TRL's SFTTrainer, the Trainer's loop with its own loss (activations/trl_loss.py)
TRAINING_LOOPS = ("trainer", "plain", "trl_sft")
# fsdp1: torch ShardingStrategy names as Accelerate's fsdp_sharding_strategy takes them (memory/fsdp1.py)
FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# deepspeed: the AdamW stepping ZeRO's flat partitions (memory/deepspeed_step.py): torch's foreach client optimizer or a
# fused kernel (DeepSpeed's FusedAdam from the ds_config, torch's fused AdamW)
ADAMW_IMPLEMENTATIONS = ("fused", "foreach")
# DeepSpeed's ZeRO settings, and the lowest ZeRO stage that reads each (stage_1_and_2.py, stage3.py)
DEEPSPEED_FIELDS = {"reduce_bucket_size": 1, "overlap_comm": 1, "contiguous_gradients": 1,
                    "stage3_prefetch_bucket_size": 3,
                    "stage3_max_live_parameters": 3, "stage3_param_persistence_threshold": 3}
# the stacks whose torch.compile switch is modelled (training.compile): torchtitan's --compile.enable, torchtune's
# compile: True, the HF Trainer's torch_compile=True
COMPILE_FRAMEWORKS = ("fsdp2", "torchtune", "hf")
# the stacks whose TP communication overlap is modelled (training.async_tp): Megatron-Core's --tp-comm-overlap
# (TransformerEngine userbuffers) and torchtitan's async TP (--parallelism.enable_async_tensor_parallel)
ASYNC_TP_FRAMEWORKS = ("megatron", "fsdp2")

# --- adapters ------------------------------------------------------------------------------------
METHODS = ("lora", "qlora", "dora")
TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "router", "experts")
ALL_LINEAR = "all-linear"
BASE_DTYPES = ("bf16", "fp16", "fp32", "int8", "nf4", "int4")
QUANTIZED = ("int8", "nf4", "int4")
BNB_VERSION_PATTERN = r"(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?"

# --- hardware ------------------------------------------------------------------------------------
# CUBLAS_WORKSPACE_CONFIG as PyTorch reads it (aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize):
# one or more :SIZE:COUNT pairs, SIZE in KiB
CUBLAS_WORKSPACE_PATTERN = r"(?::\d{1,7}:\d{1,4}){1,8}"

# --- RL ------------------------------------------------------------------------------------------
ALGORITHMS = ("grpo", "ppo", "dpo")
RL_ENGINES = ("vllm", "sglang")  # the rollout engines

# --- architecture --------------------------------------------------------------------------------
NORMS = ("rmsnorm", "layernorm")
VISION_TOWERS = ("qwen2_5_vl", "siglip", "llama4")  # estimator/spec/vision.py
# how peft 0.21.2 maps transformers v4 expert names onto transformers 5's fused expert parameters
# (utils/transformers_weight_conversion.py _convert_peft_config_moe, _MOE_TARGET_MODULE_MAPPING): "mixtral" (w1, w2,
# w3; "all-linear" takes the router and the fused experts), "qwen2_moe" (gate_proj, up_proj, down_proj name the fused
# experts, so they leave the shared experts and dense MLPs), "none" (not converted: "all-linear" takes nn.Linear only)
PEFT_MOE_CONVERSIONS = ("mixtral", "qwen2_moe", "none")
# none: Nemotron-H's attention has no positions; alibi: transformers' Falcon with alibi (a bias on the scores)
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")

# --- parallel layout -----------------------------------------------------------------------------
# Pipeline schedules (parallel.pp_schedule): 1F1B (Narayanan et al. 2021), Megatron's interleaved
# 1F1B (implied by vpp > 1), ZB-H1 (Qi et al. 2023), DualPipe and DualPipeV (DeepSeek-AI 2024,
# section 3.2.1; deepseek-ai/DualPipe).
PP_SCHEDULES = ("1f1b", "interleaved", "zero_bubble", "dualpipe", "dualpipev")
TWO_CHUNK_SCHEDULES = ("dualpipe", "dualpipev")  # two model chunks per rank, no vpp
# Megatron-LM's --cp-comm-type (arguments.py; TransformerEngine's attention/dot_product_attention/context_parallel.py):
# p2p = the KV ring (AttnFuncWithCPAndKVP2P), a2a = the Ulysses all-to-all (AttnFuncWithCPAndQKVOA2A), allgather =
# K and V all-gathered (AttnFuncWithCPAndKVAllGather), a2a+p2p = hierarchical (a2a within, p2p across)
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")

# --- serving -------------------------------------------------------------------------------------
SERVING_ENGINES = ("vllm", "sglang")
SERVING_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")  # None (or "auto" in a config): the model's dtype
WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "gptq_int4", "awq_int4", "nvfp4", "mxfp4")
SPECULATIVE_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM CacheConfig.block_size's allowed values (0.11 config/cache.py)

# serving.limit_mm_per_prompt (spec/mm_limits.py): vLLM's --limit-mm-per-prompt as modality=count pairs
MM_LIMITS_PATTERN = r"(image|video)=\d{1,4}(,(image|video)=\d{1,4})*"
MM_LIMITS_TEXT = ("comma-separated modality=count pairs such as 'image=1,video=0' (modalities image and video, "
                  "counts 0 to 9999, each modality once)")
