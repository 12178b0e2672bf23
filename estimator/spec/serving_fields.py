"""The serving engine's fields (the top-level ``serving`` object), a section of the registry in fields.py."""

from __future__ import annotations

from .choices import MM_LIMITS_PATTERN, MM_LIMITS_TEXT, BLOCK_SIZES, SERVING_ENGINES, SERVING_KV_CACHE_DTYPES, SPECULATIVE_METHODS, WEIGHT_FORMATS
from .field import MAX_TOKENS, Field, _bool, _choice, _int

_S, _SV = "serving", "Serving (inference engine)"

SERVING_FIELDS: tuple[Field, ...] = (
    _choice("engine", _S, "Serving engine", "The inference engine whose start-up accounting is reproduced: vLLM's V1 "
            "engine (gpu_worker.py determine_available_memory) or SGLang (model_runner.py).", _SV, SERVING_ENGINES),
    Field("engine_version", _S, "text", "Engine version", "The engine release whose rules apply, e.g. '0.11' or "
          "'0.33.0' (vLLM from 0.11). A release between two recorded rule changes follows the older one.", _SV,
          optional=True, auto="the newest release whose rules are recorded"),
    Field("gpu_memory_utilization", _S, "float", "GPU memory utilization", "vLLM --gpu-memory-utilization: the "
          "share of the GPU's total memory this engine may use for weights, activations, non-torch memory and "
          "KV cache (and, from vLLM 0.20, CUDA graphs).", _SV, min=0.01, max=1.0, step=0.01),
    Field("mem_fraction_static", _S, "float", "SGLang mem_fraction_static", "SGLang --mem-fraction-static: the "
          "share of the GPU for the weights and the KV pool; the rest is left for activations and CUDA graphs.",
          _SV, min=0.01, max=1.0, step=0.01, optional=True, auto="SGLang's choice by GPU memory and TP"),
    _int("max_model_len", _S, "Max model length (tokens)", "vLLM --max-model-len: the longest request (prompt + "
         "output). Concurrency is counted in sequences of this length.", _SV, hi=MAX_TOKENS, optional=True,
         auto="the model's context length (max_position_embeddings)", step=1024),
    _int("max_num_seqs", _S, "Max concurrent sequences", "vLLM --max-num-seqs: requests per step; the profiling "
         "run samples this many rows and CUDA graphs are captured up to twice it (at most 512). SGLang: "
         "--cuda-graph-max-bs, the largest decode batch captured.", _SV, hi=2**20,
         optional=True, auto="the engine's default for the GPU (vLLM: 1024 on >= 70 GiB GPUs other than A100, else "
         "256; SGLang: 8 to 512 by GPU memory and TP)"),
    _int("max_num_batched_tokens", _S, "Max batched tokens", "vLLM --max-num-batched-tokens: tokens per step "
         "(the chunked-prefill budget); the profiling run's forward pass has this many tokens. SGLang: "
         "--chunked-prefill-size.", _SV, hi=MAX_TOKENS,
         optional=True, auto="the engine's default for the GPU (vLLM: 8192 on >= 70 GiB GPUs other than A100, "
         "16384 on >= 160 GiB from 0.33, else 2048; SGLang: 2048 to 16384 by GPU memory)", step=1024),
    _choice("block_size", _S, "KV cache block size", "vLLM --block-size: tokens per KV cache block. SGLang: "
            "--page-size.", _SV, BLOCK_SIZES, optional=True,
            auto="vLLM: 16, MLA 64 (FlashMLA) on Hopper and 128 (CUTLASS MLA) on Blackwell; SGLang: 1"),
    _choice("kv_cache_dtype", _S, "Serving KV cache dtype", "vLLM --kv-cache-dtype: auto keeps the model's dtype; "
            "fp8 (e4m3 or e5m2) stores 1 byte per element and doubles the tokens that fit.", _SV,
            SERVING_KV_CACHE_DTYPES, optional=True, auto="the model's dtype (vLLM's auto)"),
    _choice("weight_format", _S, "Weight format", "How the weights are stored as loaded: auto reads the "
            "checkpoint's quantization_config; bf16/fp16; fp8 (1 byte + scales); int8 (w8a8, per-channel scales); "
            "gptq_int4 / awq_int4 (4 bits, group 128 scales); nvfp4 (4 bits, fp8 scale per 16); mxfp4 (gpt-oss "
            "experts, scale per 32).", _SV, WEIGHT_FORMATS, optional=True,
            auto="the checkpoint's own format (its quantization_config, else its dtype)"),
    _bool("cuda_graphs", _S, "CUDA graphs", "Off = --enforce-eager: no graphs are captured.", _SV),
    _bool("prefix_caching", _S, "Prefix caching", "vLLM --enable-prefix-caching / --no-enable-prefix-caching "
          "(SGLang: its radix cache, off with --disable-radix-cache): sequences that share a prompt prefix reuse its "
          "full KV blocks. The block count is unchanged; with a shared prefix the effective concurrency grows. A "
          "hybrid model (Mamba / Gated DeltaNet layers) under vLLM 0.33 keeps two or three state pages per sequence "
          "with it; vLLM 0.11 turns it off for hybrids whatever is asked.", _SV, optional=True,
          auto="the engine's default: vLLM on, except hybrid models before 0.33 and attention-free models; "
          "SGLang on, except models whose hook turns the radix cache off"),
    Field("limit_mm_per_prompt", _S, "text", "Multimodal items per prompt", "vLLM --limit-mm-per-prompt, written "
          "'image=1,video=0': the most items of each modality in one prompt. It sets how many items the profiling "
          "run sends through the vision encoder; 0 leaves a modality out of the profile (video=0 profiles the "
          "image instead of the larger video), and 0 for every modality skips the encoder's profile and its weights "
          "(vLLM 0.11: Qwen2.5-VL's only; from 0.33 every tower). Vision-language models only.", _SV, optional=True,
          auto="999 per modality (vLLM's default)", pattern=MM_LIMITS_PATTERN,
          pattern_text=MM_LIMITS_TEXT),
    _bool("enable_multimodal", _S, "SGLang multimodal", "SGLang --enable-multimodal: serve the vision tower's "
          "inputs. On, a vision-language model's static share is lowered by its tower's size and 100 MiB of the pool "
          "budget is held for the embedding cache (SGLANG_VLM_CACHE_SIZE_MB); the tower's weights are loaded either "
          "way. Vision-language models only.", _SV, optional=True,
          auto="SGLang's default: on, except Gemma 3 (configs/model_config.py)"),
    _choice("method", "speculative", "Speculative decoding", "serving.speculative: eagle / eagle3 (a one-layer "
            "draft head on the target's hidden states), mtp (the checkpoint's multi-token-prediction module, "
            "DeepSeek-V3), draft_model (a separate smaller model). The draft's weights and its KV cache layers take "
            "memory from the KV cache.", _SV, SPECULATIVE_METHODS),
    _int("num_speculative_tokens", "speculative", "Speculative tokens", "Tokens the draft proposes per step. It "
         "does not change this estimate: the drafter's weights and KV layers do not depend on it, and the proposed "
         "tokens' KV slots lie within max_model_len.", _SV, hi=64),
    Field("draft_model", "speculative", "text", "Draft model", "With draft_model: the draft's preset or Hugging "
          "Face id (it shares the target's tokenizer and TP).", _SV, optional=True,
          auto="none (eagle/eagle3: a head of the target's width)"),
    _int("shared_prefix_tokens", _S, "Shared prefix (tokens)", "With prefix caching: a prompt prefix (system "
         "prompt, few-shot examples) every sequence shares; its full blocks are stored once for all of them.", _SV,
         lo=0, hi=MAX_TOKENS, optional=True, auto="none", step=256),
)
