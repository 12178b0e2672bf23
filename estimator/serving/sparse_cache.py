"""What the inference engines cache per token for DeepSeek Sparse Attention (DeepSeek-V3.2,
estimator/spec/sparse.py): MLA's latent in the layout the sparse kernels read, and the indexer's keys.

Per token and layer, on every TP rank (both caches are replicated like MLA's latent):

- MLA's latent. A 1-byte cache is DeepSeek's fp8 layout: kv_lora_rank fp8 values, one fp32 scale per 128
  of them and the RoPE key kept in bf16, 512 + 4 x 4 + 64 x 2 = 656 bytes for DeepSeek-V3.2 (vLLM 0.11.0
  v1/kv_cache_interface.py MLAAttentionSpec.page_size_bytes: block_size x 656 for "fp8_ds_mla", the layout
  of v1/attention/backends/mla/flashmla_sparse.py; SGLang 0.5.23 mem_cache/kv_cache_configurator.py
  calculate_mla_kv_cache_dim for a float8_e4m3fn cache: kv_lora_rank + kv_lora_rank / 128 x 4 + rope dim x
  2). A 16-bit cache keeps (kv_lora_rank + rope dim) x 2 bytes, as for dense MLA.
- The indexer's key: index_head_dim fp8 values and an fp32 scale per 128, 128 + 4 = 132 bytes
  (spec/sparse.py index_key_bytes; vLLM's DeepseekV32IndexerCache is a second MLAAttentionSpec per layer,
  of head size 132 and dtype uint8, which get_kv_cache_groups puts in the same group as the latent:
  UniformTypeKVCacheSpecs, whose page is the sum of the two, so one block holds both for every layer).

The engines' defaults:
- vLLM 0.11.0 (model_executor/models/config.py DeepseekV32ForCausalLM.verify_and_update_config): a cache
  dtype "auto" or fp8 becomes "fp8_ds_mla"; the block size is forced to 64 for FlashMLA-Sparse
  (platforms/cuda.py check_and_update_config, "Forcing kv cache block size to 64"). vLLM 0.33.0 no longer
  turns "auto" into fp8 (the same hook only maps "bfloat16" to "auto"); a quantized dtype is served as
  "fp8_ds_mla" (model_executor/layers/attention/mla_attention.py _canonicalize_sparse_mla_kv_cache_dtype);
  FlashMLA-Sparse takes blocks of a multiple of 64 (flashmla_sparse.py get_supported_kernel_block_sizes).
  Releases between 0.11 and 0.33 were not read: they get 0.11's rule.
- SGLang 0.5.23 (arg_groups/overrides.py _dsa_kv_cache_dtype_default): "auto" is fp8_e4m3 on compute
  capability 10 and above (Blackwell) and bfloat16 below; pages are 64 tokens (mem_cache/memory_pool.py
  DSATokenToKVPool: "DSA requires 64-token physical pages"); the cell adds the indexer's 132 bytes per
  layer (model_executor/pool_configurator.py _compute_cell_size).
"""

from __future__ import annotations

from ..spec import sparse
from ..spec.architecture import Architecture
from ..spec.errors import ConfigError

BLOCK = 64  # the sparse MLA kernels' page (FlashMLA-Sparse in vLLM, DSATokenToKVPool in SGLang)
SGLANG_FP8_AUTO_GPUS = ("b200", "b300")  # compute capability 10.x: SGLang's "auto" is fp8_e4m3 there


def latent_bytes(arch: Architecture, kv_bytes: int) -> int:
    """MLA's cached latent per token and layer: DeepSeek's fp8 layout for a 1-byte cache of a sparse model."""
    rank, rope = arch.kv_lora_rank, arch.qk_rope_head_dim
    if arch.uses_sparse_attention and kv_bytes == 1:
        return rank + rank // sparse.INDEXER_QUANT_BLOCK * 4 + rope * 2
    return (rank + rope) * kv_bytes


def mla_token_bytes(arch: Architecture, kv_bytes: int) -> int:
    """Everything an MLA layer caches per token: the latent and, with sparse attention, the index key."""
    return latent_bytes(arch, kv_bytes) + sparse.index_key_bytes(arch)


def check_block_size(block_size: int | None) -> None:
    if block_size is not None and block_size != BLOCK:
        raise ConfigError("serving.block_size", block_size, f"{BLOCK} (or empty) for DeepSeek Sparse Attention",
                          "the sparse MLA kernels read 64-token pages: vLLM forces 64 (platforms/cuda.py) and "
                          "SGLang's DSATokenToKVPool requires it")


def vllm_kv_dtype(kv_cache_dtype: str | None, version: tuple[int, int], model_bytes: int) -> tuple[str, int]:
    """(the cache dtype vLLM uses, its bytes per element) for a sparse-attention model."""
    quantized = bool(kv_cache_dtype) and kv_cache_dtype.startswith("fp8")
    auto = kv_cache_dtype in (None, "auto")
    if quantized or auto and version < (0, 33):
        return "fp8_ds_mla", 1
    return "auto", model_bytes


def sglang_kv_dtype(kv_cache_dtype: str | None, gpu_id: str) -> tuple[str, int]:
    """(the cache dtype SGLang uses, its bytes per element) for a sparse-attention model."""
    if not kv_cache_dtype or kv_cache_dtype == "auto":
        return ("fp8_e4m3", 1) if gpu_id in SGLANG_FP8_AUTO_GPUS else ("bfloat16", 2)
    return kv_cache_dtype, 1  # the fp8 choices


def sglang_cell_per_layer(arch: Architecture, dtype: str, kv_bytes: int) -> int:
    """SGLang's bytes per token and layer: calculate_mla_kv_cache_dim x element size, the fp8 layout only
    for float8_e4m3fn ("fp8" is e4m3 there), plus the indexer's key."""
    if dtype in ("fp8", "fp8_e4m3"):  # kv_bytes is 1 there (sglang_kv_dtype)
        return mla_token_bytes(arch, 1)
    return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_bytes + sparse.index_key_bytes(arch)
