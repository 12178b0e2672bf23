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
  cdiv(state page, 16 x one token's attention page), or the user's block size when larger). Read in 0.11's
  source; applied to the later releases the estimator keys (their planning moved into the KV-cache
  manager, not re-read).
"""

from __future__ import annotations

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


def hybrid_block_size(arch: Architecture, tp: int, kv_bytes: int, model_bytes: int, requested: int | None,
                      attention_page_per_token: int) -> int:
    """The attention block size vLLM sets so that one attention page holds a state page (module docstring)."""
    page = state_page(arch, tp, model_bytes)
    needed = KERNEL_BLOCK_ALIGNMENT * cdiv(page, KERNEL_BLOCK_ALIGNMENT * attention_page_per_token)
    return max(requested or 0, needed)
