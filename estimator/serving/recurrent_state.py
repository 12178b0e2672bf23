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
- Prefix caching, by release (serving/vllm_versions.py VllmRules.mamba_cache_modes, model_executor/models/config.py
  MambaModelConfig): 0.11 turns it off for every hybrid. 0.15 keeps it when asked (it is off by default for hybrids
  until 0.33: config/model.py is_prefix_caching_supported) and sets mamba_cache_mode "all" for the models with
  SupportsMambaPrefixCaching (the Mamba-based hybrids: falcon_h1.py, jamba.py, nemotron_h.py) and "align" for the
  others (Qwen3-Next). "all" keeps a state page per block of the sequence (MambaSpec.max_memory_usage_bytes:
  cdiv(max_model_len, block) pages), the block the smallest multiple of lcm(the Mamba chunk, the alignment) whose
  attention page holds a state (HybridAttentionMambaModelConfig; Jamba's Mamba-1 has no chunk: 2048,
  config/model.py get_mamba_chunk_size). "align" holds two pages (the running state and the last block
  boundary's). 0.33 sets "align" for every hybrid.
- The block's alignment: 16 tokens until 0.19, the requested block only a floor; 0.15.0 and 0.17.0 align to 32 for
  head size 256 on a capability-100 GPU (B200, GB200, B300), whose first attention backend is FlashInfer
  (platforms/cuda.py _get_backend_priorities; flashinfer issue 1993: its block 16 with head 256 fails there), 0.18.0
  drops it. 0.20 moves the alignment to platforms/interface.py _align_hybrid_block_size: multiples of max(the
  backend's smallest kernel block, the requested block), the smallest kernel block 16 for FlashAttention
  (MultipleOf(16)) and FlashInfer ([16, 32, 64], still the sm100 default through 0.33.0): so Qwen3-Next on a B200
  takes Hopper's rule from 0.18 on (0.33.0 FlashAttention's FA4 fixed hd256 page of 128 applies only where FLASH_ATTN
  is chosen on sm100). 0.33 adds the state checkpoints' alignment in "align" mode and rounds to the
  backends' 16.
- Speculative decoding (MambaSpec.num_speculative_blocks = num_speculative_tokens): a request holds that many state
  pages more ("none": 1 + k, "align": 2 + k; "all": + k from 0.25.0). 0.11.0's max_memory_usage_bytes counts one
  page whatever the drafter (its MambaManager allocates the 1 + k at run time: the printed capacity ignores them).
  0.11.0 and 0.15.0 run it on Qwen3-Next only (gpu_model_runner.py / layers/mamba/abstract.py); 0.15.0 refuses it
  in "align" mode (MambaModelConfig's assert); 0.20.0 and 0.21.0 give a SupportsMambaPrefixCaching model "align"
  rather than "all" under it, 0.25.0 "all" again. The convolution state also grows by k rows (speculative_conv_rows),
  which can raise the block.
- 0.33 align mode: prefill checkpoint pages (MambaSpec.num_prefill_checkpoint_blocks): one for Gated DeltaNet layers
  on FlashInfer's prefill kernel, whose block also aligns to its 64-token checkpoints (qwen_gdn_linear_attn.py
  get_kv_cache_spec, v1/attention/backends/gdn_attn.py), and one for every Mamba-2 layer (mamba_mixer2.py
  MambaMixer2.get_kv_cache_spec, alignment 1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..spec import hybrid
from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.serving import Speculative
from .vllm_versions import VllmRules

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


MAMBA1_CHUNK = 2048  # config/model.py get_mamba_chunk_size: a config without a chunk size (Mamba-1), 0.15.0-0.25.0
SM100_FAMILY = ("b200", "gb200", "b300")  # is_device_capability_family(100): sm100 and sm103


@dataclass(frozen=True)
class HybridPlan:
    """How vLLM lays out a hybrid's cache: its mamba_cache_mode, the attention block, and the state pages a request
    holds in each recurrent group (`state_pages`, plus one per `state_every` tokens in "all" mode)."""

    mode: str
    block_size: int
    state_pages: int
    state_every: int | None = None
    notes: tuple[str, ...] = ()  # what the release does that the numbers alone do not say


def _mixers(arch: Architecture) -> set[str]:
    return {hybrid.MIXER[kind] for kind in arch.kinds}


def gdn_checkpoints(arch: Architecture, gpu_id: str) -> bool:
    """Whether 0.33's align mode exports Gated DeltaNet prefill checkpoints (FlashInfer's GDN prefill kernel)."""
    if "linear_attention" not in _mixers(arch):
        return False
    return gpu_id in FLASHINFER_GDN_SM90 or (gpu_id in FLASHINFER_GDN_SM100_120 and arch.linear_key_head_dim == 128)


def mamba_based(arch: Architecture) -> bool:
    """The model class has SupportsMambaPrefixCaching (0.15.0-0.25.0 falcon_h1.py, jamba.py, nemotron_h.py; not
    qwen3_next.py): its recurrent layers are Mamba-1 or Mamba-2."""
    return bool(_mixers(arch) & {"mamba", "mamba1", "attention_mamba"})


def cache_mode(arch: Architecture, rules: VllmRules, prefix_caching: bool, speculative: Speculative | None) -> str:
    """MambaModelConfig's mamba_cache_mode for this release (module docstring); refuses what the release refuses."""
    if speculative is not None and rules.hybrid_speculative == "qwen3_next" and mamba_based(arch):
        raise ConfigError("serving.speculative.method", speculative.method, "no speculative decoding for this model "
                          "on this release, or vLLM 0.17 on", f"vLLM {rules.label} runs speculative decoding on no "
                          "hybrid but Qwen3-Next ('Mamba with speculative decoding is not supported yet')",
                          ("serving.engine_version",))
    if not prefix_caching or rules.mamba_cache_modes == "off":
        return "none"
    mode = "all" if rules.mamba_cache_modes == "all_or_align" and mamba_based(arch) else "align"
    if speculative is not None and mode == "all" and rules.speculative_cache_mode == "all_to_align":
        return "align"
    if speculative is not None and mode == "align" and rules.speculative_cache_mode == "align_refused":
        raise ConfigError("serving.prefix_caching", prefix_caching, "false with speculative decoding on this "
                          "release, or vLLM 0.17 on", f"vLLM {rules.label} asserts that Mamba cache mode 'align' is "
                          "not compatible with speculative decoding", ("serving.speculative.method",))
    return mode


def block_alignment(arch: Architecture, rules: VllmRules, gpu_id: str, requested: int | None) -> int:
    if rules.hybrid_block_alignment == "requested":
        return max(KERNEL_BLOCK_ALIGNMENT, requested or 0)
    if rules.blackwell_hd256_block and gpu_id in SM100_FAMILY and arch.head_dim == 256:
        return rules.blackwell_hd256_block
    return KERNEL_BLOCK_ALIGNMENT


def state_pages(arch: Architecture, rules: VllmRules, mode: str, gpu_id: str, speculative_tokens: int) -> int:
    """The state pages a request holds in a recurrent group besides "all" mode's per-block ones."""
    k = speculative_tokens if rules.speculative_state_pages else 0
    if mode == "all":
        return k if rules.all_mode_speculative_pages else 0
    if mode == "none":
        return 1 + k
    mamba2 = bool(_mixers(arch) & {"mamba", "attention_mamba"})
    checkpoint = rules.version >= (0, 33) and (gdn_checkpoints(arch, gpu_id) or mamba2)
    return 2 + k + checkpoint


def speculative_conv_rows(arch: Architecture, rules: VllmRules, tokens: int) -> int:
    """Rows the convolution state grows by under speculative decoding (MambaStateShapeCalculator's num_spec:
    conv_kernel - 1 + num_spec rows): Gated DeltaNet from 0.11.0 (qwen3_next.py get_mamba_state_shape_from_config),
    Nemotron-H's Mamba-2 from 0.17.0 (nemotron_h.py; absent in 0.15.0), Falcon-H1's from 0.33.0 (falcon_h1.py;
    absent in 0.25.0), never Jamba's Mamba-1 (jamba.py)."""
    mixers = _mixers(arch)
    grows = ("linear_attention" in mixers or ("mamba" in mixers and rules.version >= (0, 17))
             or ("attention_mamba" in mixers and rules.version >= (0, 33)))
    return tokens if grows else 0


def plan(arch: Architecture, rules: VllmRules, gpu_id: str, tp: int, kv_bytes: int, model_bytes: int,
         requested: int | None, prefix_caching: bool, speculative: Speculative | None) -> HybridPlan:
    mode = cache_mode(arch, rules, prefix_caching, speculative)
    rows = speculative_conv_rows(arch, rules, speculative.num_speculative_tokens if speculative else 0)
    arch = dataclasses.replace(arch, linear_conv_kernel_dim=arch.linear_conv_kernel_dim + rows,
                               mamba_conv_kernel=arch.mamba_conv_kernel + rows)
    one_token = 2 * max(1, arch.num_kv_heads // tp) * arch.head_dim * kv_bytes  # kv_cache.attention_page_per_token
    align = block_alignment(arch, rules, gpu_id, requested)
    pages = state_pages(arch, rules, mode, gpu_id, speculative.num_speculative_tokens if speculative else 0)
    notes = _notes(rules, mode, speculative)
    if mode == "all":  # HybridAttentionMambaModelConfig / _align_hybrid_block_size, mamba_cache_mode "all"
        chunk = MAMBA1_CHUNK if "mamba1" in _mixers(arch) else arch.mamba_chunk_size
        unit = math.lcm(chunk, align)
        block = unit * cdiv(cdiv(state_page(arch, tp, model_bytes), one_token), unit)
        return HybridPlan(mode, max(requested or 0, block), pages, state_every=block, notes=notes)
    checkpoint_tokens = GDN_CHECKPOINT_TOKENS if mode == "align" and gdn_checkpoints(arch, gpu_id) else 1
    block = hybrid_block_size(arch, tp, kv_bytes, model_bytes, requested, one_token, rules.version, checkpoint_tokens,
                              align)
    return HybridPlan(mode, block, pages, notes=notes)


def _notes(rules: VllmRules, mode: str, speculative: Speculative | None) -> tuple[str, ...]:
    notes = ()  # 0.11's turning prefix caching off for hybrids is said by serving/prefix_default.py's note
    if speculative is not None and not rules.speculative_state_pages:
        notes += (f"vLLM {rules.label} counts one recurrent state page a request in its printed capacity, as here, "
                  f"but allocates 1 + {speculative.num_speculative_tokens} at run time (v1/core/"
                  "single_type_kv_cache_manager.py MambaManager): fewer sequences fit than it prints.",)
    if mode == "all":
        notes += (f"vLLM {rules.label} keeps a recurrent state for every block under prefix caching "
                  "(mamba_cache_mode 'all'): a hybrid's state memory grows with the context.",)
    return notes


def hybrid_block_size(arch: Architecture, tp: int, kv_bytes: int, model_bytes: int, requested: int | None,
                      attention_page_per_token: int, version: tuple[int, int] = (0, 11),
                      checkpoint_tokens: int = 1, align: int = KERNEL_BLOCK_ALIGNMENT) -> int:
    """The attention block size vLLM sets so that one attention page holds a state page (module docstring).
    `align`: block_alignment's; `checkpoint_tokens`: 0.33's align mode aligns the block to the state checkpoints (64
    for Gated DeltaNet on FlashInfer, else 1)."""
    page = state_page(arch, tp, model_bytes)
    if version < (0, 33):
        return max(requested or 0, align * cdiv(page, align * attention_page_per_token))
    align = math.lcm(max(KERNEL_BLOCK_ALIGNMENT, requested or 0), checkpoint_tokens)
    needed = align * cdiv(page, align * attention_page_per_token)
    return max(requested or 0, KERNEL_BLOCK_ALIGNMENT * cdiv(needed, KERNEL_BLOCK_ALIGNMENT))
