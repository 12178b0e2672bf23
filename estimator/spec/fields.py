"""Every input field, once: its name, type, range, label, help and default.

The CLI's override flags, the app's widgets, the shareable URL, the validation messages and the
reference `docs/config.md` all read this table, so a field is described in one place. Defaults
are not restated: they are the dataclasses' own (`Training`, `Parallel`, `Hardware`,
`Architecture`); a field whose default is ``None`` is decided by the framework or derived from
other fields, and `Field.auto` says how.

Every number has an upper bound where no real run goes, with the bound in the message: an estimate
then answers in bounded time and every figure stays finite, whatever a config file or a shared
link says. The bounds are generous: about ten times the largest published run or model.
"""

from __future__ import annotations

from .choices import (ADAMW_IMPLEMENTATIONS, ALGORITHMS, ALL_LINEAR, ATTENTION, ATTN_IMPLEMENTATIONS, BASE_DTYPES, BNB_VERSION_PATTERN, CROSS_ENTROPY_IMPLS,
                      CP_COMM_TYPES, CUBLAS_WORKSPACE_PATTERN, FP8_RECIPES, FRAMEWORKS, FSDP1_STRATEGIES,
                      KV_CACHE_DTYPES, LOADING_MODES, LOSSES, METHODS, MODES, MOE_DISPATCHERS, MOE_ROUTER_DTYPES, NORMS, OFFLOAD_DEVICES,
                      POSITION_EMBEDDINGS, PP_SCHEDULES, TRANSFORMER_IMPLS, RECOMPUTE, RECOMPUTE_MODULES, RL_ENGINES,
                      TARGETS, TRAINING_LOOPS, VISION_TOWERS)
from .dtypes import INFERENCE_WEIGHT_DTYPES, TRAINING_DTYPES
from .gpus import GPUS
from .optimizers import OPTIMIZERS
from .versions import MEGATRON_TE, TE_NONE, TE_VERSIONS, TORCH_VERSIONS, VERSIONS, default_versions_text
from .serving_fields import SERVING_FIELDS
from .transformers_fields import TRANSFORMERS_FIELDS
from .hybrid_fields import HYBRID_FIELDS, HYBRID_TRAINING_FIELDS
from .trl_fields import TRL_FIELDS
from .field import (Field, MAX_CHUNKS, MAX_EXPERTS, MAX_GPUS, MAX_HEADS, MAX_LAYERS, MAX_PIPELINE, MAX_SAMPLES,
                    MAX_TOKENS, MAX_VOCAB, MAX_WIDTH, _bool, _choice, _int)

_DTYPES = tuple(dict.fromkeys(TRAINING_DTYPES + INFERENCE_WEIGHT_DTYPES))


_T, _P, _H, _M = "training", "parallel", "hardware", "model"
_SAVERS = "Optimizer and memory savers"
_LAYOUT = "Parallel layout"

TRAINING_FIELDS: tuple[Field, ...] = (
    _choice("mode", _T, "Mode", "Training keeps gradients and optimizer states; inference keeps the weights and a "
            "KV cache only.", "Run", MODES),
    _choice("framework", _T, "Framework", "The training stack. It sets the default precision recipe (which copies "
            "of the weights exist, in which dtype) and what ZeRO stage means: megatron = Megatron-LM/NeMo, fsdp2 = "
            "PyTorch FSDP2 (torchtitan), deepspeed = DeepSpeed ZeRO, hf = Hugging Face Trainer with torch.optim, "
            "torchtune = its recipes, fsdp1 / hf_fsdp2 = the HF Trainer over Accelerate's FSDP1 / FSDP2 (no "
            "autocast, bf16 gathered over fp32 shards).",
            "Run", FRAMEWORKS),
    _choice("framework_version", _T, "Framework version", "The release of the framework whose rules apply: "
            "megatron 0.16 (Megatron-Core 0.16.1) or 0.19 (0.19.0, the current release); fsdp2 0.3.0 (torchtitan) "
            "or main, or the releases of torchtitan's published benchmarks (0.2.0, 0.1.0, and 2024-12: main at "
            "9dec370); torchtune 0.6.1; deepspeed 0.19.5 or 0.12.3 (before 0.15.4 ZeRO-3 restarts its count of "
            "gathered parameters at the end of the backward; before 0.19.3 ZeRO-3 keeps the embedding gathered from "
            "each backward to the optimizer step, so with gradient accumulation every later micro-batch starts "
            "with it gathered; before 0.13.2 ZeRO steps the optimizer once at "
            "initialisation, making Adam's moments there). Each version-dependent rule cites the release it "
            "comes from (estimator/spec/versions.py); hf has no versioned rules.", "Run", VERSIONS, optional=True,
            auto="the release the estimator's records were measured on: " + default_versions_text()),
    _choice("te_version", _T, "TransformerEngine version", "megatron: the TransformerEngine release the run "
            "installs. Its FusedAdam in 2.10 and 2.11 builds Adam's moments at a Megatron-FSDP DTensor's global "
            "shape, whole on every GPU (fixed in 2.12). not_installed: neither TransformerEngine nor Apex is installed "
            "(transformer_impl local): Megatron-Core steps with torch's AdamW, whose foreach kernels make sqrt(v) "
            "of a whole parameter group (4 B per parameter of the rank's shard in its step).", "Run",
            TE_VERSIONS + (TE_NONE,), optional=True,
            auto="the one the Megatron-Core release installs: "
                 + ", ".join(f"{m}: {te}" for m, te in MEGATRON_TE.items())),
    _choice("torch_version", _T, "PyTorch version", "The PyTorch release the run uses (major.minor). Before 2.1 "
            "torch's foreach AdamW adds eps out of place (torch/optim/adamw.py _multi_tensor_adamw: `denom = "
            "torch._foreach_add(exp_avg_sq_sqrt, eps)`), so its step holds two temporaries the size of each "
            "parameter group, sqrt(v) and sqrt(v) + eps, where 2.1 on holds one.", "Run", TORCH_VERSIONS,
            optional=True, auto="the measured stack's (torch 2.11-2.13)"),
    _bool("nccl_cumem", _T, "NCCL allocates with cuMem", "NCCL_CUMEM_ENABLE in the training processes. With cuMem "
          "each of NCCL's device allocations takes its own 2 MiB: a communicator of one rank (megatron, deepspeed at "
          "world size 1, and Megatron's groups of size 1) holds 194 x 2 MiB = 388 MiB from torch 2.7 (NCCL 2.26 on), "
          "and under torch 2.2-2.6 (NCCL 2.19-2.21: 32 channels, no runtime connect) 97 x 2 MiB and the net proxy's "
          "64 MiB shared buffer, 258 MiB. Without it (slime's and verl's training processes set "
          "NCCL_CUMEM_ENABLE=0 to match their engines) it allocates the net proxy's shared buffer instead, 512 MiB "
          "from torch 2.7 (64 MiB before), its small allocations sharing one 2 MiB page a process.", "Run",
          optional=True, auto="off beside an SGLang rollout engine (training.rl.engine sglang: "
          "SGLang and the trainers syncing weights to it set NCCL_CUMEM_ENABLE=0), else the torch release's NCCL's "
          "default: on from torch 2.2 (NCCL 2.19)"),
    _choice("training_loop", _T, "HF training loop", "hf: trainer = transformers' Trainer (or any loop through "
            "Accelerate's prepare) with bf16/fp16 mixed precision: the forward runs under autocast, so peft's fp32 "
            "adapters keep 16-bit inputs, and its 16-bit outputs (the logits) are copied to fp32; plain = the model "
            "called directly, autocast only over weights wider than the compute dtype. fsdp1: trainer = the HF "
            "Trainer through Accelerate; plain = a loop of one's own over FSDP1, such as Lightning Fabric's "
            "FSDPStrategy with bf16-true weights. trl_sft = TRL's SFTTrainer (its release: trl_version): loss "
            "chunked (no Liger) is its chunked_nll, standard its nll.", "Run", TRAINING_LOOPS),
    _int("seq_len", _T, "Sequence length (tokens)", "Tokens per sample. Activation memory grows linearly with it "
         "(quadratically with eager attention).", "Run", hi=MAX_TOKENS, step=1024),
    _int("images_per_sample", _T, "Images per sample", "Vision-language models: images in each sample. Each runs "
         "through the vision tower; its tokens are part of the sequence length.", "Run", lo=0, hi=4096),
    _int("image_size", _T, "Image size (px)", "Vision-language models: pixels per side of each (square) image; "
         "patches per image = (size / patch)^2.", "Run", hi=2**16, optional=True, step=112,
         auto="the tower's native size (SigLIP); required for Qwen2.5-VL"),
    _bool("freeze_vision", _T, "Freeze the vision encoder", "Vision-language models: the encoder (patch embedding "
          "and blocks) gets no gradients or optimizer states and runs without saving activations; the merger or "
          "projector stays trained (LLaMA-Factory's freeze_vision_tower).", "Run"),
    _int("micro_batch_size", _T, "Micro-batch size", "Samples per forward/backward pass on each data-parallel "
         "rank. Activations scale with it.", "Run", hi=2**16),
    _int("global_batch_size", _T, "Global batch size", "Samples per optimizer step over all data-parallel ranks; "
         "with the micro-batch size and DP it sets the micro-batches per step. Under pipeline parallelism the "
         "stages hold up to PP micro-batches in flight, so the global batch decides the first stage's activations.",
         "Run", hi=MAX_SAMPLES, optional=True,
         auto="micro-batch size x DP; under PP, enough micro-batches to fill the pipeline (PP for 1F1B, 2 x PP "
              "interleaved): more does not add memory"),
    _choice("param_dtype", _T, "Weights dtype", "The dtype the parameters are stored and used in. Inference also "
            "accepts int8/int4/fp4 weights.", "Precision", _DTYPES),
    _choice("grad_dtype", _T, "Gradients dtype", "The dtype gradients are accumulated and reduced in.", "Precision",
            ("fp32", "bf16", "fp16"), optional=True, auto="the framework's default: fp32 for Megatron and FSDP2, "
            "the weights dtype for DeepSpeed and the HF Trainer"),
    _bool("master_weights", _T, "fp32 master weights", "Keep an fp32 master copy of weights stored in a lower "
          "precision (4 bytes per parameter).", "Precision", optional=True,
          auto="the framework's default: on for 16-bit weights except under the HF Trainer"),
    _choice("optimizer_dtype", _T, "Optimizer states dtype", "The dtype of the optimizer's moments.", "Precision",
            ("fp32", "bf16", "fp16"), optional=True,
            auto="fp32 with master weights (and always under Megatron), else the weights dtype"),
    _choice("compute_dtype", _T, "Compute dtype", "The dtype of activations and matrix multiplies. bf16 over fp32 "
            "weights is autocast (mixed precision).", "Precision", ("fp32", "bf16", "fp16")),
    _bool("fp8", _T, "FP8 training", "FP8 matmuls on top of the weights dtype. megatron: Transformer Engine, "
          "adds FP8 weight copies and scales; fsdp2: torchao float8 linears (torchtitan), which keep the weights "
          "and the saved inputs in their dtype and cast per matmul.", "Precision"),
    _choice("fp8_recipe", _T, "FP8 scaling recipe", "With FP8 training: tensorwise (per-tensor scales, Hopper), "
            "mxfp8 (1x32 blocks, Blackwell) or blockwise (DeepSeek-V3's 128x128 weight blocks) under megatron; "
            "tensorwise or rowwise (torchao, one scale per row) under fsdp2, or mxfp8 with compile (torchao's "
            "MXFP8Linear, torchtitan's mx converter, Blackwell only): like Float8Linear it keeps the weights and the "
            "saved inputs in their dtype.", "Precision", FP8_RECIPES),
    _bool("fp8_all_gather", _T, "FP8 all-gather", "fsdp2 with fp8 and the tensorwise recipe: FSDP2 gathers the "
          "float8 linears' weights in float8 (torchao enable_fsdp_float8_all_gather), 1 byte per weight instead "
          "of the bf16 copy.", "Precision"),
    _bool("async_tp", _T, "Async TP", "Overlap the tensor-parallel all-gathers and reduce-scatters with the GEMMs "
          "that use them, chunk by chunk: megatron --tp-comm-overlap (TransformerEngine userbuffers, every pass), "
          "fsdp2 with compile: torchtitan's async TP (Inductor's micro-pipeline TP, the forward's collectives). "
          "Changes the step time and, under fsdp2, the reserved peak: plain TP's reduce-scatter cat of the partial "
          "sums (one full-sequence copy) stays reserved, the fused op's is not made.", _LAYOUT),
    _bool("liger_kernel", _T, "Liger kernels", "hf, deepspeed, fsdp1, hf_fsdp2: the Trainer's use_liger_kernel (LLaMA-Factory "
          "enable_liger_kernel, axolotl's Liger plugin, OpenRLHF --ds.use_liger_kernel). liger-kernel 0.8.5 patches the "
          "model with its defaults: RMSNorm keeps its input and an fp32 rstd per row, SwiGLU keeps gate and up and "
          "recomputes the SiLU, RoPE rotates in place; its fused linear cross-entropy is loss 'chunked'. In the step time "
          "each of the three is one Triton kernel (one read and one write) in place of the eager ops, and the chunked "
          "loss runs the LM head's GEMMs chunk by chunk inside the forward. Modelled for "
          "dense RMSNorm/SwiGLU decoders (Llama, Mistral, Qwen2, Qwen3, Phi-3, Granite); refused where Liger patches "
          "nothing or its patch is not modelled.", _SAVERS),
    _bool("compile", _T, "torch.compile", "fsdp2 (torchtitan --compile.enable, per block), torchtune (compile: "
          "True, per layer) or hf (the Trainer's torch_compile=True): each layer saves what Inductor's min-cut "
          "partitioner keeps (torch 2.13 torch/_functorch/partitioners.py min_cut_rematerialization_partition) "
          "instead of the eager tensors: matmul and attention inputs and outputs, the norms' inputs and fp32 rsqrt; "
          "pointwise results (fp32 norm upcasts, normalised tensors, SiLU/softmax outputs) are recomputed in "
          "backward. Measured on CPU for tiny transformers Llama and Qwen3 layers (flash/SDPA and eager "
          "attention); the torchtitan and torchtune layers follow the same partitioner rules (derived, not "
          "measured). The loss is compiled too where the framework compiles it, without TP: torchtitan's loss "
          "(standard or chunked; from 0.1.0 on torchtitan compiles it with the model, compile_loss) and torchtune's "
          "chunked loss "
          "(compile_loss): the logits stay 16-bit and no fp32 copy of them exists; the HF Trainer's loss keeps its "
          "eager ledger. Not under megatron, whose "
          "own fused kernels this would replace, nor deepspeed.", _SAVERS),
    _bool("compile_loss", _T, "Compile the loss", "fsdp2 with compile: the cross-entropy compiles with the model "
          "(torchtitan's compile.components lists \"loss\", its default since 0.2.0; 0.1.0 always compiles it, "
          "the December 2024 main never). Compiled, the loss keeps the 16-bit logits and two fp32 values per token; "
          "eager, the fp32 log-softmax beside the logits and their fp32 upcast.", _SAVERS, optional=True,
          auto="the release's default: with the model from 0.1.0 on, never in 2024-12"),
    _choice("optimizer", _T, "Optimizer", "adamw/adam8bit keep two moments per parameter; sgd none; sgd_momentum, "
            "lion and muon one; adafactor factored second moments.", _SAVERS, tuple(OPTIMIZERS)),
    _bool("optimizer_in_backward", _T, "Optimizer step in backward", "Under fsdp2 (torchtune's optimizer_in_bwd): "
          "each parameter is stepped as soon as its gradient is ready and the gradient freed, so no full set of "
          "gradients is ever alive. Needs one micro-batch per step (no gradient accumulation).", _SAVERS),
    _choice("offload_optimizer", _T, "Offload optimizer states", "Keep the fp32 master weights and optimizer "
            "states (and the step) in host memory or on NVMe: DeepSpeed ZeRO-Offload (cpu, stages 1-3) and "
            "ZeRO-Infinity (nvme, stage 3), FSDP2's CPUOffloadPolicy (cpu, with the parameters), Megatron's "
            "--optimizer-cpu-offload (cpu, distributed optimizer). The host memory it needs is shown too.", _SAVERS,
            OFFLOAD_DEVICES),
    _choice("offload_parameters", _T, "Offload parameters", "Keep the sharded parameters in host memory or on "
            "NVMe and gather them to the GPU layer by layer: DeepSpeed ZeRO-3 offload_param (cpu or nvme), FSDP2's "
            "CPUOffloadPolicy (cpu, with the optimizer states).", _SAVERS, OFFLOAD_DEVICES),
    _int("reduce_bucket_size", _T, "DeepSpeed reduce bucket (elements)", "DeepSpeed ZeRO's reduce_bucket_size "
         "(stages 1-3): ZeRO-1/2 allocate the bucket in full, in the weights' 16-bit dtype, when a backward's first "
         "gradient is ready (twice with overlap_comm) whatever the trainable count; ZeRO-3 keeps one from the "
         "start. DeepSpeed's own default is 500,000,000.", _SAVERS, hi=2**40, optional=True,
         auto="the HF Trainer's 'auto': hidden_size x hidden_size", step=1_000_000),
    _bool("overlap_comm", _T, "DeepSpeed overlap_comm", "DeepSpeed ZeRO's overlap_comm (stages 1-3): reduce "
          "gradients during the backward; ZeRO-1/2 then keep two reduce buckets.", _SAVERS, optional=True,
          auto="DeepSpeed's default: on under ZeRO-3 only"),
    _bool("contiguous_gradients", _T, "DeepSpeed contiguous_gradients", "DeepSpeed ZeRO's contiguous_gradients: "
          "on, ZeRO-1/2 copy each gradient into the reduce bucket and the rank's reduced ones into one flat "
          "partition; off (modelled for ZeRO-2), the bucket's gradients and the rank's own stay the parameters' "
          ".grad tensors. offload_optimizer turns it on.", _SAVERS, optional=True, auto="DeepSpeed's default: on"),
    _choice("adamw_implementation", _T, "DeepSpeed AdamW kernel", "deepspeed with adamw: what steps ZeRO's flat fp32 "
            "partitions. foreach: torch's AdamW, the HF Trainer's client optimizer (adamw_torch) where the ds_config "
            "has no optimizer section; it makes sqrt(v) of a whole partition (ZeRO-3: of a sub-group) beside it. "
            "fused: DeepSpeed's FusedAdam (the ds_config's optimizer section) or torch's fused AdamW, in place.",
            _SAVERS, ADAMW_IMPLEMENTATIONS, optional=True, auto="fused (DeepSpeed's FusedAdam)"),
    _int("stage3_prefetch_bucket_size", _T, "DeepSpeed ZeRO-3 prefetch bucket (elements)", "Parameters ZeRO-3 "
         "gathers ahead at every module hook (whole tensors, while under stage3_max_live_parameters). DeepSpeed's "
         "own default is 50,000,000.", _SAVERS, hi=2**40,
         optional=True, auto="the HF Trainer's 'auto': int(0.9 x hidden_size x hidden_size)", step=1_000_000),
    _int("stage3_max_live_parameters", _T, "DeepSpeed ZeRO-3 max live parameters", "ZeRO-3 prefetches while its "
         "count of gathered parameters is under this; since every module hook prefetches, the count reaches it "
         "(a module's own parameters are gathered whatever the count, a tensor crossing the bound whole).", _SAVERS,
         hi=2**40, optional=True, auto="DeepSpeed's default, 1,000,000,000", step=1_000_000),
    _int("stage3_param_persistence_threshold", _T, "DeepSpeed ZeRO-3 persistence threshold (elements)",
         "ZeRO-3 keeps every parameter of at most this many elements gathered after its first use (norms, biases). "
         "DeepSpeed's own default is 100,000.", _SAVERS, lo=0, hi=2**40, optional=True,
         auto="the HF Trainer's 'auto': 10 x hidden_size", step=1024),
    _bool("offload_activations", _T, "Offload activations", "Under torchtune (enable_activation_offloading): every "
          "tensor the layers save for backward moves to host memory during forward and comes back layer by layer in "
          "backward; the loss's tensors stay on the GPU. The host memory it needs is shown too.", _SAVERS),
    _choice("recompute", _T, "Activation recomputation", "none keeps every activation; selective recomputes the "
            "modules listed below (Megatron, Korthikanti et al. 2022) or, under fsdp2, follows torchtitan's "
            "operator-level policy (keeps matmul and attention outputs, recomputes every second matmul and all "
            "elementwise work); full keeps only each layer's input and recomputes the layer in backward.", _SAVERS,
            RECOMPUTE),
    Field("recompute_modules", _T, "choices", "Recomputed modules (selective)", "With selective recomputation: "
          "which parts of each layer are recomputed in backward instead of kept (Megatron's --recompute-modules). "
          "core_attn = the attention core; mlp, moe, moe_act, layernorm, mla_up_proj, shared_experts as named.",
          _SAVERS, options=RECOMPUTE_MODULES),
    _int("recompute_layers", _T, "Recomputed layers per stage", "With full recomputation: how many layers of each "
         "stage are recomputed.", _SAVERS, hi=MAX_LAYERS, optional=True, auto="all the layers of the stage"),
    _int("recompute_every", _T, "Checkpoint every N-th layer", "With full recomputation under fsdp2: checkpoint "
         "only every N-th layer (torchtitan's and torchtune's layer-level activation checkpointing); the others "
         "keep all their activations. 1 = every layer.", _SAVERS, hi=MAX_LAYERS),
    _choice("attention", _T, "Attention kernel", "flash keeps no s x s score matrix; eager materialises the scores "
            "(memory grows with the square of the sequence length). Under hf, deepspeed, fsdp1 and hf_fsdp2, flash is "
            "transformers' default SDPA: its sliding-window or chunked layers take a mask from the window on, each "
            "keeping an s x s bias and k, v for every head, and Qwen2.5-VL's vision tower attends window by window. "
            "Falcon always passes a 4-D mask (sdpa_mask_always), so SDPA cannot run FlashAttention-2: Falcon-7B's 71 "
            "query heads against one key/value head without enable_gqa rule out every fused backend, leaving the "
            "math one (fp32 q, k, v and softmax kept; measured), and equal head counts keep the mask as a bias.",
            _SAVERS, ATTENTION),
    _choice("attn_implementation", _T, "Transformers attention", "hf, deepspeed, fsdp1, hf_fsdp2 with flash attention: "
            "transformers' attn_implementation. sdpa (its default) is torch's SDPA with the masks above; "
            "flash_attention_2 is flash-attn's kernel (measured for Falcon), sliding windows inside the kernel, no "
            "mask.", _SAVERS, ATTN_IMPLEMENTATIONS, optional=True, auto="sdpa (transformers' default)"),
    _choice("loss", _T, "Loss computation", "standard keeps the full logits and an fp32 softmax; fused (e.g. "
            "Liger/Apex cross-entropy) and chunked avoid most of that.", _SAVERS, LOSSES),
    Field("dropout", _T, "float", "Dropout", "Dropout probability; above 0 the masks are kept for backward. Under "
          "hf, deepspeed, fsdp1 and hf_fsdp2 it is the model config's attention_dropout (its residual and embedding dropouts "
          "are the model's *_dropout fields); elsewhere the embeddings and residual branches drop out too (Megatron's "
          "hidden_dropout).",
          _SAVERS, min=0.0, max=1.0, below_max=True, step=0.05),
    Field("moe_capacity_factor", _T, "float", "MoE capacity factor", "Routed tokens per expert relative to a "
          "perfect balance (1.0). Larger values reserve room for imbalance.", _SAVERS, min=1.0, max=256.0,
          step=0.25),
    _choice("moe_dispatcher", _T, "MoE token dispatcher", "alltoall = Megatron-Core's all-to-all dispatcher (a "
            "send buffer per MoE layer); deepep = the flex dispatcher with DeepEP, whose fixed NVLink/RDMA buffers "
            "count as communication memory; allgather (megatron) = Megatron-Core's all-gather dispatcher "
            "(--moe-token-dispatcher-type allgather: every rank of the EP x expert-TP group gathers all of its "
            "tokens into Megatron's global buffer and reduce-scatters the experts' outputs back).", _SAVERS,
            MOE_DISPATCHERS),
    _choice("moe_router_dtype", _T, "MoE router dtype", "megatron: --moe-router-dtype. fp32/fp64 run the router's "
            "logits and probabilities in that dtype; the expert outputs are then cast to it before the expert-TP "
            "reduce-scatter of the combine (and their gradients in backward).", _SAVERS, MOE_ROUTER_DTYPES,
            optional=True, auto="the compute dtype (Megatron's default, no --moe-router-dtype)"),
    _bool("attention_softmax_fusion", _T, "Fused masked softmax", "megatron with eager attention: the fused "
          "upper-triangular softmax kernel keeps one 16-bit probability per score where its shapes allow (16 < s <= "
          "4096, s and b x heads/TP multiples of 4); off (--no-masked-softmax-fusion) or outside those shapes, the "
          "fp32 softmax and its 16-bit copy are kept, 6 bytes per score.", _SAVERS),
    _bool("activation_func_fp8_input_store", _T, "FP8 SwiGLU input store", "megatron: "
          "--activation-func-fp8-input-store. The fused SwiGLU (dense MLPs, routed and shared experts) keeps its "
          "input, fc1's output, as float8_e4m3fn (1 byte, no scale) for backward instead of the compute dtype; not "
          "where moe_act recomputation checkpoints the experts' activation (the checkpoint keeps that input as it "
          "is).", _SAVERS),
    _bool("moe_grouped_gemm", _T, "MoE grouped GEMM", "megatron: --moe-grouped-gemm. A rank's local experts run "
          "in grouped GEMMs (TransformerEngine's GroupedLinear under transformer_impl transformer_engine; the "
          "legacy GroupedMLP's grouped_gemm gmm on the local spec or with moe_use_legacy_grouped_gemm), so "
          "backward differentiates them all at once: the SwiGLU's backward output of every local expert exists together, instead of one expert's at a time "
          "(SequentialMLP), and so does the fc2 weight gradient of all of them, but where TransformerEngine writes "
          "it into the main gradients (gradient_accumulation_fusion).", _SAVERS),
    _bool("moe_use_legacy_grouped_gemm", _T, "Legacy MoE grouped GEMM", "megatron with moe_grouped_gemm: "
          "--moe-use-legacy-grouped-gemm. The experts run in Megatron-Core's legacy GroupedMLP (the grouped_gemm "
          "package's gmm, one weight tensor per fc for all local experts) instead of TransformerEngine's "
          "GroupedLinear: its weight gradients are new tensors handed to the main gradients' hooks even under "
          "gradient_accumulation_fusion (no cached dummy for the experts), and TransformerEngine's grouped GEMM "
          "keeps no per-stream workspaces. bf16 only; the local spec (transformer_impl local) always runs it.",
          _SAVERS),
    _choice("cross_entropy_impl", _T, "Fused cross-entropy", "megatron with loss 'fused' "
            "(--cross-entropy-loss-fusion): native keeps the fp32 softmax like the standard loss and its compiled "
            "backward holds an fp32 copy of it beside the 16-bit gradient (4 bytes per logit more); te "
            "(--cross-entropy-fusion-impl te) writes the gradient into the 16-bit logits during forward and keeps "
            "only them.", _SAVERS, CROSS_ENTROPY_IMPLS),
    _choice("transformer_impl", _T, "Megatron layer implementation", "megatron: --transformer-impl. "
            "transformer_engine (the default) builds the layers from TransformerEngine modules; local is "
            "Megatron-Core's own spec: its unfused DotProductAttention (attention must be eager) and no "
            "TransformerEngine workspace.", _SAVERS, TRANSFORMER_IMPLS),
    _bool("gradient_accumulation_fusion", _T, "Gradient-accumulation fusion", "megatron: on unless "
          "--no-gradient-accumulation-fusion. The weight-gradient GEMMs accumulate into the fp32 main gradients and "
          "hand autograd a dummy gradient that TransformerEngine caches, one per weight shape and kept for the run "
          "(TE 2.3+ base.py get_dummy_wgrad; its grouped GEMM from TE 2.10): a weight-sized 16-bit buffer per "
          "distinct linear shape on the stage, the output layer's included. Off, each weight gradient is a "
          "transient tensor added to the main gradient and freed.", _SAVERS),
    _int("microbatch_group_size", _T, "Micro-batches per virtual-stage group", "megatron, interleaved (vpp > 1): "
         "--microbatch-group-size-per-virtual-pipeline-stage, the micro-batches each model chunk runs in a row "
         "(from pp to the micro-batches per step). Rank r warms up 2(pp - r - 1) + (vpp - 1) x this many chunk "
         "forwards, so a larger group keeps more activations in flight.", _SAVERS, hi=MAX_SAMPLES, optional=True,
         auto="pp (Megatron-Core's default, a depth-first schedule)"),
    _bool("overlap_p2p_comm", _T, "Overlap pipeline p2p", "megatron, interleaved (vpp > 1): off is "
          "--no-overlap-p2p-communication. Overlapped (Megatron-LM's default), the schedule keeps the warm-up's last "
          "received input and its gradient for the step, and the last rank a received gradient per slot of its "
          "receive buffer (megatron_vpp_grad.py).", _SAVERS),
    _bool("overlap_p2p_comm_warmup_flush", _T, "Overlap p2p in warm-up and flush", "megatron, interleaved, with "
          "overlap_p2p_comm: --overlap-p2p-communication-warmup-flush; the cool-down receives the next backward's "
          "gradient ahead.", _SAVERS),
    _bool("defer_embedding_wgrad_compute", _T, "Defer output-layer wgrad", "megatron with PP > 1: "
          "--defer-embedding-wgrad-compute (needs gradient accumulation fusion). The last stage defers the output "
          "layer's weight-gradient GEMMs to the pipeline flush, so it keeps that layer's input and its output "
          "gradient (the logits' gradient, B x s x b x V/TP) of every micro-batch until then, up to "
          "wgrad_deferral_limit.", _SAVERS),
    _int("wgrad_deferral_limit", _T, "Wgrad deferral limit", "megatron with defer_embedding_wgrad_compute: "
         "--wgrad-deferral-limit, the micro-batches whose output-layer weight gradients are deferred (later ones "
         "are computed at once); 0 defers every micro-batch.", _SAVERS, lo=0),
    _int("kv_cache_tokens", _T, "KV cache tokens", "Inference: cached context per sequence.", "Inference",
         hi=MAX_TOKENS, optional=True, auto="the sequence length", step=1024),
    _choice("kv_cache_dtype", _T, "KV cache dtype", "Inference: the dtype of the cached keys and values.",
            "Inference", KV_CACHE_DTYPES, optional=True, auto="the weights dtype"),
) + HYBRID_TRAINING_FIELDS + TRL_FIELDS

PARALLEL_FIELDS: tuple[Field, ...] = (
    _int("tp", _P, "Tensor parallel (TP)", "GPUs that split every layer's matrices (Megatron tensor parallelism). "
         "Usually within a node.", _LAYOUT, hi=MAX_HEADS),
    _int("pp", _P, "Pipeline stages (PP)", "GPUs that split the layers into consecutive stages. Each stage has its "
         "own memory; the busiest one decides the fit.", _LAYOUT, hi=MAX_PIPELINE),
    _int("vpp", _P, "Virtual stages per rank (VPP)", "Interleaved 1F1B: model chunks per pipeline rank (> 1 needs "
         "PP > 1). Cuts the bubble, adds in-flight activations.", _LAYOUT, hi=MAX_CHUNKS),
    _int("dp", _P, "Data parallel (DP)", "Replicas of the model; ZeRO/FSDP shards states over them.", _LAYOUT,
         hi=MAX_GPUS),
    _int("cp", _P, "Context parallel (CP)", "GPUs that split each sequence (ring attention); divides activations "
         "by CP.", _LAYOUT, hi=MAX_GPUS),
    _choice("cp_comm_type", _P, "CP communication", "Megatron's --cp-comm-type: how TransformerEngine's attention "
            "exchanges the sequence under CP. p2p = K and V passed around a ring; a2a = all-to-all of q, k, v and the "
            "output (Ulysses: heads split over CP); allgather = K and V all-gathered; a2a+p2p = hierarchical. Only "
            "a2a's allocation order is replayed for the reserved memory.", _LAYOUT, CP_COMM_TYPES),
    _int("ep", _P, "Expert parallel (EP)", "MoE: GPUs that split the routed experts. Carved out of DP x CP x TP, so "
         "it does not add GPUs.", _LAYOUT, hi=MAX_EXPERTS),
    _int("etp", _P, "Expert tensor parallel (ETP)", "MoE: tensor parallelism inside each expert.", _LAYOUT,
         hi=MAX_HEADS, optional=True, auto="= TP"),
    _choice("zero_stage", _P, "ZeRO / sharding stage", "0 = no sharding; 1 = optimizer states sharded over DP "
            "(Megatron's distributed optimizer); 2 = + gradients; 3 = + parameters (FSDP full shard).", _LAYOUT,
            (0, 1, 2, 3), optional=True, auto="the framework's default: 3 under fsdp2, else 0"),
    _choice("fsdp_sharding_strategy", _P, "FSDP1 sharding strategy", "fsdp1: Accelerate's fsdp_sharding_strategy. "
            "FULL_SHARD shards parameters, gradients and optimizer states over DP and gathers a unit's parameters "
            "for its forward and again for its backward; SHARD_GRAD_OP keeps a unit gathered from its forward to "
            "its backward; HYBRID_SHARD shards within a group of fsdp_shard_group_size ranks and replicates across "
            "groups; NO_SHARD replicates everything (DDP-like).", _LAYOUT, FSDP1_STRATEGIES),
    _int("fsdp_shard_group_size", _P, "HYBRID_SHARD group", "fsdp1 with HYBRID_SHARD: the ranks each FlatParameter "
         "is sharded over (FSDP takes a node's GPUs); DP is a multiple of it.", _LAYOUT, hi=MAX_GPUS, optional=True,
         auto="8, a node of 8 GPUs"),
    Field("comm_overlap", _P, "float", "Communication overlap", "Roofline: the fraction of data-parallel (DP/FSDP) "
          "and pipeline communication hidden behind compute (1.0 = all of it).", _LAYOUT, min=0.0, max=1.0,
          step=0.1),
    _bool("sequence_parallel", _P, "Sequence parallelism", "Shard norm and dropout activations over TP.", _LAYOUT,
          optional=True, auto="on when TP > 1"),
    _int("pp_first_stage_layers", _P, "Layers on the first stage", "Uneven pipeline: layers on stage 0 (it also "
         "holds the embedding).", _LAYOUT, hi=MAX_LAYERS, optional=True, auto="an even split"),
    _int("pp_last_stage_layers", _P, "Layers on the last stage", "Uneven pipeline: layers on the last stage (it "
         "also holds the LM head and the loss).", _LAYOUT, hi=MAX_LAYERS, optional=True, auto="an even split"),
    _choice("pp_schedule", _P, "Pipeline schedule", "1f1b = PipeDream-Flush (rank r holds PP - r micro-batches); "
            "interleaved = Megatron's interleaved 1F1B (what VPP > 1 runs); zero_bubble = ZB-H1 (Qi et al. 2023: "
            "1F1B's peak, a third of its bubble, deferred weight-gradient inputs on the later ranks); dualpipe = "
            "DeepSeek-V3's bidirectional schedule (each rank holds stages r and PP-1-r: twice the parameters, "
            "PP+1 stage micro-batches in flight); dualpipev = its V-shaped 'cut-in-half' variant (2 x PP stages, "
            "ranks hold r and 2PP-1-r: 1x parameters).", _LAYOUT, PP_SCHEDULES),
    _bool("pp_account_for_embedding", _P, "Embedding counts as a layer", "Megatron's "
          "account_for_embedding_in_pipeline_split: the split counts the embedding as one layer, so the first "
          "virtual stage holds one layer fewer; num_layers + 1 (+ 1 with the loss flag) must divide by PP x VPP.",
          _LAYOUT),
    _bool("pp_account_for_loss", _P, "Loss counts as a layer", "Megatron's account_for_loss_in_pipeline_split: "
          "the last virtual stage holds one layer fewer.", _LAYOUT),
    Field("pp_layout", _P, "text", "Pipeline layout", "Megatron's pipeline_model_parallel_layout: one group per "
          "virtual stage in layer order, separated by a vertical bar, of E (embedding), t (a transformer layer), m "
          "(MTP) and L (loss); (...)*n and x*n repeat, commas are ignored. DeepSeek-V3 on PP 16 (Megatron-Bridge): "
          "Et*4, then 14 groups t*4, then tmL. Its group count is PP x VPP (2 x PP under dualpipev).", _LAYOUT,
          optional=True, auto="the split the other fields give"),
    _int("world_size", _P, "World size", "A check: must equal TP x PP x CP x DP.", _LAYOUT, hi=MAX_GPUS * 64,
         optional=True, auto="not checked", widget=False),
)

HARDWARE_FIELDS: tuple[Field, ...] = (
    _choice("gpu", _H, "GPU", "The GPU the run is checked against (its capacity as CUDA reports it).", "GPU",
            tuple(GPUS)),
    _bool("expandable_segments", _H, "Expandable segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: "
          "less allocator fragmentation.", "GPU"),
    Field("cublas_workspace_config", _H, "text", "CUBLAS_WORKSPACE_CONFIG", "The environment variable PyTorch "
          "sizes its cuBLAS workspaces by (one per thread that runs matrix products, two in training): the sum of "
          "SIZE KiB x COUNT over its :SIZE:COUNT pairs. Deterministic runs set :4096:8 (32 MiB; Megatron-LM's "
          "--deterministic-mode asks for it).", "GPU", pattern=CUBLAS_WORKSPACE_PATTERN,
          pattern_text="one or more :SIZE:COUNT pairs (SIZE in KiB), such as :4096:8 or :4096:2:16:8",
          optional=True, auto="PyTorch's default for the GPU: 32 MiB on Hopper and Blackwell, :4096:2:16:8 "
          "(8.125 MiB) before"),
    _choice("cuda_module_loading", _H, "CUDA_MODULE_LOADING", "The environment variable that decides when CUDA "
            "loads kernel modules: lazy loads a kernel's module at its first launch, eager every module of a "
            "library when it starts (on an H200, torch 2.11 + CUDA 13: 750.8-766.8 MiB outside the allocator "
            "after a training step lazy, 1,752.8 MiB eager). Unset means lazy since PyTorch 1.13 and CUDA 12.2. "
            "eager is offered where it was measured (Hopper).", "GPU", LOADING_MODES, optional=True,
            auto="lazy, what unset means on the measured stack (PyTorch 1.13+ sets it; CUDA 12.2+ defaults to it)"),
)


def _w(name, label, help, group="Shape", lo=1, hi=MAX_WIDTH, **kw) -> Field:
    return _int(name, _M, label, help, group, lo=lo, hi=hi, **kw)


_MOE, _MLA, _MORE = "Mixture of experts", "Latent attention (MLA)", "More"
_VIS, _NOVIS = "Vision tower", "none: required with a vision tower"

ARCHITECTURE_FIELDS: tuple[Field, ...] = (
    _w("hidden_size", "Hidden size (h)", "Width of the residual stream.", step=128),
    _w("num_layers", "Layers", "Transformer layers.", hi=MAX_LAYERS),
    _w("num_attention_heads", "Attention heads", "Query heads.", hi=MAX_HEADS),
    _w("num_kv_heads", "KV heads", "Key/value heads (GQA/MQA).", hi=MAX_HEADS, optional=True,
       auto="= attention heads"),
    _w("head_dim", "Head dim", "Per-head width.", optional=True, auto="hidden size / attention heads"),
    _w("intermediate_size", "MLP width", "Dense MLP intermediate size.", optional=True, step=256,
       auto="none: required unless every layer is MoE"),
    _w("vocab_size", "Vocabulary", "Vocabulary size before padding.", hi=MAX_VOCAB),
    _bool("tie_embeddings", _M, "Tied embeddings", "The LM head shares the embedding matrix.", "Details"),
    _bool("gated_mlp", _M, "Gated MLP (SwiGLU)", "Three MLP matrices instead of two.", "Details"),
    _choice("norm", _M, "Norm", "RMSNorm or LayerNorm (LayerNorm has a bias).", "Details", NORMS),
    _bool("linear_bias", _M, "Biases on linear layers", "GPT-2 / Megatron default.", "Details"),
    _bool("qkv_bias", _M, "QKV bias", "Biases on q, k, v only (Qwen2).", "Details"),
    _bool("qk_norm", _M, "QK norm", "Per-head norm on q and k (Qwen3).", "Details"),
    _choice("position_embedding", _M, "Positions", "RoPE, a learned position table, ALiBi (transformers' Falcon with "
            "alibi: no parameters, one batch x heads x s x s mask each step, kept to backward by SDPA's fused kernel "
            "or full recompute) or none.", "Details",
            POSITION_EMBEDDINGS),
    _w("max_position_embeddings", "Position table rows", "Rows of a learned position table.", "Details",
       hi=MAX_TOKENS, optional=True, auto="none: required with learned positions", step=1024),
    _w("num_experts", "Routed experts", "Experts per MoE layer; 0 = dense.", _MOE, lo=0, hi=MAX_EXPERTS),
    _w("num_experts_per_token", "Experts per token (top-k)", "Routed experts each token goes to.", _MOE,
       hi=MAX_EXPERTS, optional=True, auto="none: required with experts"),
    _w("moe_intermediate_size", "Expert width", "Intermediate size of one routed expert.", _MOE, optional=True,
       auto="none: required with experts", step=128),
    _w("num_shared_experts", "Shared experts", "Always-on experts per MoE layer.", _MOE, lo=0, hi=1024),
    _w("shared_expert_intermediate_size", "Shared expert width", "Intermediate size of one shared expert.", _MOE,
       optional=True, auto="= expert width", step=128),
    _w("first_dense_layers", "Leading dense layers", "Layers before the first MoE layer (DeepSeek "
       "first_k_dense_replace).", _MOE, lo=0, hi=MAX_LAYERS),
    _w("moe_layer_frequency", "MoE every N layers", "Every N-th layer is MoE.", _MOE, hi=MAX_LAYERS),
    _w("q_lora_rank", "q LoRA rank", "Latent rank of the queries (DeepSeek-V2/V3).", _MLA, optional=True,
       auto="none: queries are projected directly", step=64),
    _w("kv_lora_rank", "kv LoRA rank", "Latent rank of keys and values; set to use MLA.", _MLA, optional=True,
       auto="none: ordinary attention", step=64),
    _w("qk_nope_head_dim", "qk no-RoPE head dim", "MLA: per-head width of q and k without RoPE.", _MLA,
       optional=True, auto="none: required with MLA"),
    _w("qk_rope_head_dim", "qk RoPE head dim", "MLA: per-head width of q and k with RoPE.", _MLA, optional=True,
       auto="none: required with MLA"),
    _w("v_head_dim", "v head dim", "MLA: per-head width of the values.", _MLA, optional=True,
       auto="none: required with MLA"),
    _w("index_n_heads", "Indexer heads", "DeepSeek Sparse Attention (V3.2): heads of the lightning indexer that "
       "picks the keys each query attends to; set to use sparse attention (with MLA).", _MLA, hi=MAX_HEADS,
       optional=True, auto="none: dense attention"),
    _w("index_head_dim", "Indexer head dim", "DeepSeek Sparse Attention: width of an index query head and of the "
       "one index key per token (a multiple of 128).", _MLA, optional=True, auto="none: required with indexer heads"),
    _w("index_topk", "Indexer top-k", "DeepSeek Sparse Attention: keys each query attends to (2048 in "
       "DeepSeek-V3.2).", _MLA, hi=MAX_TOKENS, optional=True, auto="none: required with indexer heads", step=256),
    _w("mtp_layers", "MTP modules", "Multi-token-prediction modules (DeepSeek-V3).", _MORE, lo=0, hi=64),
    Field("name", _M, "text", "Name", "A name for this architecture.", _MORE),
    _w("norms_per_layer", "Norms per layer", "Gemma-2/3 and OLMo-2 differ from the usual 2.", _MORE, lo=1, hi=16),
    _bool("qk_norm_full_width", _M, "Full-width QK norm", "OLMo-2: one norm over all of q and of k.", _MORE),
    _bool("attention_sinks", _M, "Attention sinks", "gpt-oss: one learned sink logit per head.", _MORE),
    _bool("router_bias", _M, "Router bias", "DeepSeek-V3 e_score_correction_bias.", _MORE),
    _bool("shared_expert_gate", _M, "Shared expert gate", "Qwen2-MoE: a sigmoid gate on the shared expert.", _MORE),
    _w("sliding_window", "Sliding window", "Local attention window in tokens.", _MORE, hi=MAX_TOKENS, optional=True,
       auto="none: global attention", step=1024),
    _w("attention_chunk_size", "Attention chunk", "Llama 4: a local layer's query attends only to the earlier "
       "tokens of its own chunk.", _MORE, hi=MAX_TOKENS, optional=True, auto="none: no chunked attention", step=1024),
    _bool("qk_l2_norm", _M, "QK L2 norm", "Llama 4: the RoPE layers L2-normalise q and k heads.", _MORE, widget=False),
    _bool("moe_dense_experts", _M, "Every token through every expert", "transformers' Llama4TextMoe (HF Trainer, "
          "DeepSpeed, FSDP1): all tokens through all experts, scaled by the router.", _MOE, widget=False),
    _bool("eager_softmax_in_compute_dtype", _M, "Eager softmax in the compute dtype", "transformers' Llama 4 eager "
          "attention: the softmax of the 16-bit scores, no fp32 upcast (one 16-bit copy kept).", _MORE, widget=False),
    _w("sliding_window_pattern", "Global layer every N", "0 = every layer uses the window (or chunk); N = every "
       "N-th layer is global (Llama 4's NoPE layers).", _MORE, lo=0, hi=MAX_LAYERS),
    Field("attention_logit_softcapping", _M, "float", "Attention logit soft-cap", "Gemma-2: cap x tanh(scores / "
          "cap).", _MORE, min=0.0, max=1e6, optional=True, auto="none", widget=False),
    Field("final_logit_softcapping", _M, "float", "Final logit soft-cap", "Gemma-2: cap x tanh(logits / cap).",
          _MORE, min=0.0, max=1e6, optional=True, auto="none", widget=False),
    _bool("norm_unit_offset", _M, "Norm scales by 1 + w", "Gemma: RMSNorm multiplies by (1 + w), in fp32.", _MORE,
          widget=False),
    _bool("norm_fp32_scale", _M, "Norm scales in fp32", "Nemotron-H: RMSNorm multiplies its scale in fp32 and casts "
          "after, so the normalised tensor it keeps is fp32.", _MORE, widget=False),
    _bool("logits_fp32", _M, "fp32 logits", "The model's forward casts its logits to fp32 (transformers "
          "NemotronHForCausalLM: lm_head(x).float()), so the compute-dtype logits die at once.", _MORE, widget=False),
    _bool("loss_in_logits_dtype", _M, "Loss in the logits' dtype", "The model's own loss calls cross_entropy on "
          "its 16-bit logits, with no fp32 upcast (Qwen-1's modeling_qwen.py, lit-gpt's chunked_cross_entropy; "
          "transformers' ForCausalLMLoss upcasts). Without autocast (DeepSpeed's fp16/bf16 engine, a plain loop over "
          "16-bit weights) the log-softmax it keeps and its two gradients are then 16-bit; under autocast "
          "cross_entropy runs in fp32 anyway.", _MORE, widget=False),
) + HYBRID_FIELDS + (
    _choice("vision_tower", _M, "Vision tower", "Vision-language models: qwen2_5_vl = Qwen2.5-VL's window-attention "
            "ViT and 2x2 patch merger; siglip = SigLIP with Gemma 3's pooling projector; llama4 = Llama 4's tiled "
            "ViT and pixel-shuffle adapter. Its weights sit on the first stage; each image's patches run through it.",
            _VIS, VISION_TOWERS, optional=True, auto="none: a text-only model"),
    _w("vision_hidden_size", "Vision hidden size", "Width of the vision tower's blocks.", _VIS, optional=True,
       auto=_NOVIS),
    _w("vision_num_layers", "Vision blocks", "ViT blocks (depth).", _VIS, hi=MAX_LAYERS, optional=True, auto=_NOVIS),
    _w("vision_num_heads", "Vision heads", "Attention heads of a ViT block.", _VIS, hi=MAX_HEADS, optional=True,
       auto=_NOVIS),
    _w("vision_intermediate_size", "Vision MLP width", "Inner width of a ViT block's MLP.", _VIS, optional=True,
       auto=_NOVIS),
    _w("vision_patch_size", "Patch size (px)", "Pixels per side of a patch.", _VIS, hi=1024, optional=True,
       auto=_NOVIS),
    _w("vision_temporal_patch_size", "Frames per patch", "Qwen2.5-VL: frames per patch (a still image is "
       "repeated).", _VIS, hi=64),
    _w("vision_spatial_merge_size", "Patch merge", "Qwen2.5-VL: the merger folds merge x merge patches into one "
       "decoder token.", _VIS, hi=64),
    _w("vision_window_size", "Vision window (px)", "Qwen2.5-VL: window attention over window x window pixels in "
       "the blocks without full attention.", _VIS, hi=2**16, optional=True, auto="none: every block attends to "
       "the whole image"),
    _w("vision_full_attention_layers", "Full-attention vision blocks", "Qwen2.5-VL: blocks that attend over the "
       "whole image (fullatt_block_indexes).", _VIS, lo=0, hi=MAX_LAYERS),
    _w("vision_image_size", "Native image size (px)", "SigLIP: every image is resized to it (its position table "
       "has (size / patch)^2 rows); Llama 4: the tile size.", _VIS, hi=2**16, optional=True, auto="none: images of any size"),
    _w("vision_tokens_per_image", "Image tokens", "Gemma 3: decoder tokens per image after the projector's "
       "average pooling (mm_tokens_per_image).", _VIS, hi=2**20, optional=True,
       auto="none: patches / merge^2"),
    _w("vision_projector_size", "Vision projector width", "Llama 4: the pixel-shuffle adapter's and the projector's "
       "width (projector_input_dim).", _VIS, optional=True, auto="none: no pixel-shuffle adapter"),
) + TRANSFORMERS_FIELDS

_A, _FT = "adapter", "Fine-tuning (adapters)"

ADAPTER_FIELDS: tuple[Field, ...] = (
    _choice("method", _A, "Adapter method", "With an adapter (training.adapter) the base weights are frozen: lora "
            "trains r x (in + out) parameters beside each adapted linear layer; qlora also stores the frozen base "
            "in NF4; dora adds a learned magnitude per output feature.", _FT, METHODS),
    _int("rank", _A, "Adapter rank (r)", "The LoRA rank: adapter parameters grow linearly with it.", _FT, hi=MAX_WIDTH,
         step=8),
    Field("alpha", _A, "float", "Adapter alpha", "LoRA's scaling numerator (alpha / r); no effect on memory.", _FT,
          min=0.0, max=1e6, step=8.0),
    Field("target_modules", _A, "choices", "Adapted modules", "Which linear layers get adapters: q, k, v, o, gate, "
          "up, down, the MoE router, the routed experts, or all-linear (every linear layer but the LM head, as "
          "PEFT's all-linear). The default, q and v, is PEFT's for Llama, Mistral, Qwen and Gemma (q_proj, v_proj) "
          "and, with one fused q, k, v linear, for GPT-2 and GPT-NeoX and Falcon (that linear); PEFT has no default "
          "for Phi-3 and other types and asks for targets. PEFT matches the names over the whole model: a "
          "vision-language model's tower gets adapters on its matching linears too (all of them under all-linear, "
          "with the projector's).", _FT, options=TARGETS + (ALL_LINEAR,)),
    Field("dropout", _A, "float", "Adapter dropout", "lora_dropout: above 0 each adapted module keeps a dropout "
          "output and a 1-byte mask.", _FT, min=0.0, max=1.0, below_max=True, step=0.05),
    _bool("trainable_embeddings", _A, "Train embeddings and LM head", "PEFT's modules_to_save: trainable copies of "
          "the embedding and the LM head beside the frozen originals.", _FT),
    _choice("base_dtype", _A, "Frozen base dtype", "How the frozen base weights are stored: 16-bit, int8 "
            "(LLM.int8), nf4 (QLoRA, double quantized) or int4 (GPTQ).", _FT, BASE_DTYPES, optional=True,
            auto="nf4 for qlora, else the weights dtype"),
    _bool("double_quant", _A, "NF4 double quantization", "NF4 with its block scales quantized again "
          "(bitsandbytes' bnb_4bit_use_double_quant): 0.5 + 1/64 B per weight and an fp32 scale per 16,384; off, an "
          "fp32 scale per 64 weights, 0.5 + 4/64 B. torchtune's torchao NF4 always double-quantizes.", _FT),
    Field("bitsandbytes_version", _A, "text", "bitsandbytes version", "QLoRA under hf or deepspeed: the "
          "bitsandbytes release. Through 0.43.1 its 4-bit layer (MatMul4Bit) keeps each linear's input for "
          "backward, whatever the frozen weight, and beyond gradient checkpointing; from 0.43.2 it keeps none.",
          _FT, pattern=BNB_VERSION_PATTERN, pattern_text="a bitsandbytes release as major.minor[.patch], 0.39.0 or "
          "later (its first 4-bit release)"),
    _bool("prepare_kbit", _A, "prepare_model_for_kbit_training", "peft's prepare_model_for_kbit_training (TRL, "
          "axolotl and most QLoRA recipes call it): every 16-bit weight that is not quantized (embeddings, norms, "
          "LM head) is cast to fp32, so the residual stream, the attention and the logits run in fp32. Only with a "
          "quantized base (int8, nf4, int4) under framework hf.", _FT),
    Field("peft_version", _A, "text", "peft version", "hf: the peft release. Through 0.11.1 a LoRA layer takes its "
          "16-bit base weight's dtype (so do its gradients and AdamW states); from 0.12.0 get_peft_model casts the "
          "adapters to fp32 (autocast_adapter_dtype). A quantized base leaves them fp32 in every release.", _FT,
          pattern=BNB_VERSION_PATTERN, pattern_text="a peft release as major.minor[.patch]"),
)

_R, _RL = "rl", "RL (colocated rollout engine)"

RL_FIELDS: tuple[Field, ...] = (
    _choice("algorithm", _R, "RL algorithm", "With training.rl the step has phases: grpo and ppo generate rollouts "
            "with an inference engine on the same GPUs, score them, then train (ppo also trains a critic); dpo "
            "trains on chosen and rejected sequences against a frozen reference.", _RL, ALGORITHMS),
    _int("rollout_batch_size", _R, "Rollout prompts per step", "Prompts generated from per step, over all GPUs.",
         _RL, hi=MAX_SAMPLES),
    _int("samples_per_prompt", _R, "Samples per prompt", "Responses per prompt (GRPO's group size).", _RL, hi=2**16),
    _int("max_prompt_len", _R, "Max prompt tokens", "Longest prompt; the trained sequence is prompt + response.",
         _RL, hi=MAX_TOKENS, step=512),
    _int("max_response_len", _R, "Max response tokens", "Longest generated response.", _RL, hi=MAX_TOKENS, step=1024),
    _choice("engine", _R, "Rollout engine", "The inference engine colocated with the trainer.", _RL, RL_ENGINES),
    Field("engine_memory_fraction", _R, "float", "Engine memory fraction", "vLLM gpu_memory_utilization / SGLang "
          "mem_fraction_static: the share of the GPU the engine takes for weights, activations and KV cache. Empty: "
          "size the KV cache by the whole rollout batch.", _RL, min=0.0, max=1.0, below_max=False, step=0.05,
          optional=True, auto="the KV cache of every rollout sequence at once"),
    _bool("reference_model", _R, "Reference model", "A frozen copy of the policy for the KL penalty (and DPO).", _RL),
    _bool("critic_model", _R, "Critic model", "PPO's value model, trained beside the policy.", _RL),
    _bool("offload_during_rollout", _R, "Offload trainer during rollout", "Move the trainer's states to host memory "
          "while the engine generates (verl param/optimizer offload).", _RL),
    _int("rollout_tp", _R, "Rollout tensor parallel", "The engine's tensor parallelism (an extension of the "
         "contract).", _RL, hi=MAX_HEADS, optional=True, auto="= TP"),
)

SETTINGS: tuple[Field, ...] = TRAINING_FIELDS + PARALLEL_FIELDS + HARDWARE_FIELDS + ADAPTER_FIELDS + RL_FIELDS
ALL: tuple[Field, ...] = SETTINGS + SERVING_FIELDS + ARCHITECTURE_FIELDS
BY_PATH: dict[str, Field] = {f.path: f for f in ALL}
SETTING_BY_NAME: dict[str, Field] = {f.key: f for f in SETTINGS + SERVING_FIELDS}  # flat names are unique across the sections
ARCHITECTURE_BY_NAME: dict[str, Field] = {f.name: f for f in ARCHITECTURE_FIELDS}


def section_fields(section: str) -> tuple[Field, ...]:
    return tuple(f for f in ALL if f.section == section)


def label(path: str) -> str:
    """A field's label from its path (``parallel.vpp`` or a bare name); the name if it has none."""
    f = BY_PATH.get(path) or SETTING_BY_NAME.get(path) or ARCHITECTURE_BY_NAME.get(path.split(".")[-1])
    return f.label if f else path
