"""vLLM's state of a hybrid model's recurrent layers (issue 28, estimator/spec/hybrid.py): a Gated DeltaNet
or Mamba-2 layer keeps one fixed-size state per sequence, a convolution window and a recurrent matrix,
whatever the context length, not a key and a value per token.

- The state's shapes per rank (vLLM model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator,
  read at vllm-project/vllm@02d7108): Mamba-2 `mamba2_state_shape`: conv (conv_kernel - 1) x (H p + 2 g n) / tp
  (groups replicated up to tp when tp does not divide them: extra_groups_for_head_shards), temporal
  (H / tp) x p x n; Gated DeltaNet `gated_delta_net_state_shape`: conv (kernel - 1) x (2 Hk K + Hv V) / tp,
  temporal (Hv / tp) x V x K.
- Their dtypes (MambaStateDtypeCalculator): the conv state in mamba_cache_dtype ("auto": the model's dtype),
  the temporal state in mamba_ssm_cache_dtype ("auto": the conv state's dtype), except Nemotron-H, whose
  model hook (model_executor/models/config.py NemotronHForCausalLMConfig) sets it from the HF config's
  mamba_ssm_cache_dtype, "float32" (transformers NemotronHConfig's default and the hook's own).
- One page of a layer holds one sequence's state (v1/kv_cache_interface.py MambaSpec.page_size_bytes: the sum
  of the shapes' bytes); a request takes one page per recurrent layer group without prefix caching
  (MambaSpec.max_memory_usage_bytes, mamba_cache_mode "none").
- The attention layers' block is enlarged until one attention page holds a state page, and the state page is
  padded to the attention page, so that both share the block pool (vLLM 0.11 model_executor/models/config.py
  HybridAttentionMambaModelConfig.verify_and_update_config, without prefix caching: block_size = 16 x
  cdiv(state page, 16 x one token's attention page), or the user's block size when larger).
- vLLM 0.33 (the rules' `mamba_prefix_caching`): the same alignment moved to platforms/interface.py
  _align_hybrid_block_size, with the requested block as the alignment unit (max(16, block_size)); prefix caching,
  which 0.11 turned off for every hybrid (MambaModelConfig), now keeps the states in "align" mode
  (MambaModelConfig sets mamba_cache_mode "align"): a request holds two state pages per recurrent group
  (MambaSpec.max_memory_usage_bytes: 2 + prefill checkpoint blocks), and Gated DeltaNet layers on FlashInfer's
  prefill kernel add one checkpoint page and align the block to its 64-token checkpoints
  (qwen_gdn_linear_attn.py get_kv_cache_spec, v1/attention/backends/gdn_attn.py). The releases between were not
  read: they get 0.11's rule.
"""

from __future__ import annotations

import math

from ..spec import hybrid
from ..spec.architecture import Architecture

KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention's block multiple (HybridAttentionMambaModelConfig)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def state_page_bytes(arch: Architecture, kind: str, tp: int, model_bytes: int) -> int:
    """One sequence's state of one recurrent layer on one rank (spec/hybrid.py state_bytes)."""
    return hybrid.state_bytes(arch, kind, tp, model_bytes)


def state_page(arch: Architecture, tp: int, model_bytes: int) -> int:
    """The largest recurrent layer's page (every recurrent layer of one model has the same)."""
    return max((state_page_bytes(arch, kind, tp, model_bytes) for kind in arch.kinds), default=0)


# Gated DeltaNet's FlashInfer prefill runs on sm90, and on sm100 / sm120 with 128-wide key heads under the CUDA 13
# wheel 0.33.0 ships (qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend; METADATA: the cu13 extras)
FLASHINFER_GDN_SM90 = ("h100-80", "h100-nvl", "h100-pcie", "h800", "h100-96-500w", "h200", "gh200")
FLASHINFER_GDN_SM100_120 = ("b200", "gb200", "b300", "rtx-5090")
GDN_CHECKPOINT_TOKENS = 64  # v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (0.33.0)


def gdn_checkpoints(arch: Architecture, gpu_id: str) -> bool:
    """Whether 0.33's align mode exports Gated DeltaNet prefill checkpoints (FlashInfer's GDN prefill kernel)."""
    if not any(hybrid.MIXER[kind] == "linear_attention" for kind in arch.kinds):
        return False
    return gpu_id in FLASHINFER_GDN_SM90 or (gpu_id in FLASHINFER_GDN_SM100_120 and arch.linear_key_head_dim == 128)


def states_per_request(align_mode: bool, checkpoints: bool) -> int:
    """State pages one request holds in a recurrent group (MambaSpec.max_memory_usage_bytes, 0.33.0): one without
    prefix caching, two in align mode (the running state and the last block boundary's) and a prefill checkpoint."""
    return (2 + checkpoints) if align_mode else 1


def hybrid_block_size(arch: Architecture, tp: int, kv_bytes: int, model_bytes: int, requested: int | None,
                      attention_page_per_token: int, version: tuple[int, int] = (0, 11),
                      checkpoint_tokens: int = 1) -> int:
    """The attention block size vLLM sets so that one attention page holds a state page (module docstring).
    `checkpoint_tokens`: 0.33's align mode aligns the block to the state checkpoints (64 for Gated DeltaNet on
    FlashInfer, else 1)."""
    page = state_page(arch, tp, model_bytes)
    if version < (0, 33):
        return max(requested or 0, KERNEL_BLOCK_ALIGNMENT * cdiv(page, KERNEL_BLOCK_ALIGNMENT * attention_page_per_token))
    align = math.lcm(max(KERNEL_BLOCK_ALIGNMENT, requested or 0), checkpoint_tokens)
    needed = align * cdiv(page, align * attention_page_per_token)
    return max(requested or 0, KERNEL_BLOCK_ALIGNMENT * cdiv(needed, KERNEL_BLOCK_ALIGNMENT))
