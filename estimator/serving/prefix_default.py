"""Whether prefix caching is on: the user's ``serving.prefix_caching``, else the engine's own default for this
release and model, with the source that says so (one record per release where the default changed).

vLLM (V1 engine), read in the releases' source:
- 0.11.0 engine/arg_utils.py ``_set_default_args``: on for every generative (non-pooling) model; then
  model_executor/models/config.py ``MambaModelConfig.verify_and_update_config`` (run for Mamba models and, through
  ``HybridAttentionMambaModelConfig``, for every hybrid) sets it off whatever was asked ("not yet supported").
- 0.15.0, 0.19.0, 0.20.0, 0.21.0 and 0.25.0 engine/arg_utils.py ``_set_default_chunked_prefill_and_prefix_caching_
  args``: the default is config/model.py ``is_prefix_caching_supported``: a decoder on; a hybrid and an
  attention-free model off ("the feature is still experimental"), which --enable-prefix-caching may override.
- 0.33.0 (the same function): "Generative hybrid models support prefix caching": a hybrid on; attention-free off.
The releases between 0.11 and 0.15 and between 0.25 and 0.33 were not read: they follow the older record.

SGLang 0.5.23: the radix cache is on (arg_groups/fields/memory.py ``disable_radix_cache = False``) unless a model
hook turns it off (arg_groups/model_hook.py ``_handle_model_capability_adjustments``; model_overrides/minicpm.py;
attention_hook.py for Whisper): the checks below read the checkpoint's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import hybrid
from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.serving import Serving, version_tuple


@dataclass(frozen=True)
class PrefixCaching:
    on: bool
    asked: bool | None  # serving.prefix_caching; None: the engine's default applies
    reason: str  # why, with the engine source

    @property
    def engine_default(self) -> bool:
        return self.asked is None

    @property
    def note(self) -> str:
        state = "on" if self.on else "off"
        if self.asked is None:
            return f"Prefix caching {state}: the engine's default, not set in the config ({self.reason})."
        if self.asked != self.on:
            asked = "on" if self.asked else "off"
            return f"Prefix caching {state} although the config sets it {asked} ({self.reason})."
        return f"Prefix caching {state}: set in the config ({self.reason})."


@dataclass(frozen=True)
class VllmPrefixRule:
    version: tuple[int, int]
    hybrid_default: bool  # the default for a model with recurrent (Mamba / linear-attention) layers
    hybrid_forced_off: bool  # the model hook turns it off for hybrids whatever was asked
    source: str


VLLM_RULES = (
    VllmPrefixRule((0, 11), hybrid_default=False, hybrid_forced_off=True,
                   source="vLLM 0.11.0 engine/arg_utils.py _set_default_args: on for non-pooling models; "
                          "model_executor/models/config.py MambaModelConfig: off for hybrid and Mamba models"),
    VllmPrefixRule((0, 15), hybrid_default=False, hybrid_forced_off=False,
                   source="vLLM 0.15.0 (same in 0.19.0, 0.20.0, 0.21.0, 0.25.0) config/model.py "
                          "is_prefix_caching_supported: decoder on; hybrid and attention-free off by default"),
    VllmPrefixRule((0, 33), hybrid_default=True, hybrid_forced_off=False,
                   source="vLLM 0.33.0 config/model.py is_prefix_caching_supported: decoder and hybrid on, "
                          "attention-free off"),
)
SGLANG_SOURCE = "SGLang 0.5.23 arg_groups/fields/memory.py: disable_radix_cache defaults to False"


def vllm_rule(version: str | None) -> VllmPrefixRule:
    """The newest record at or below `version` (None: the newest); vllm_versions.rules_for refuses older ones."""
    if version is None:
        return VLLM_RULES[-1]
    major, minor, _ = version_tuple(version)
    eligible = [r for r in VLLM_RULES if r.version <= (major, minor)]
    return eligible[-1] if eligible else VLLM_RULES[0]


def _attention_free(arch: Architecture) -> bool:
    return arch.is_hybrid and not any(hybrid.attends(kind) for kind in arch.kinds)


def vllm_prefix_caching(arch: Architecture, serving: Serving) -> PrefixCaching:
    rule = vllm_rule(serving.engine_version)
    asked = serving.prefix_caching
    if arch.is_hybrid and rule.hybrid_forced_off:
        return PrefixCaching(False, asked, f"{rule.source}, whatever the flag")
    if asked is not None:
        return PrefixCaching(asked, asked, "--enable-prefix-caching" if asked else "--no-enable-prefix-caching")
    if _attention_free(arch):
        return PrefixCaching(False, None, f"an attention-free model; {rule.source}")
    if arch.is_hybrid:
        return PrefixCaching(rule.hybrid_default, None, f"a hybrid model; {rule.source}")
    return PrefixCaching(True, None, f"a decoder; {rule.source}")


def _sglang_hook(checkpoint: dict | None) -> str | None:
    """The SGLang 0.5.23 hook that turns the radix cache off for this checkpoint, or None."""
    if not checkpoint:
        return None
    configs = [checkpoint] + ([checkpoint["text_config"]] if isinstance(checkpoint.get("text_config"), dict) else [])
    archs = set(checkpoint.get("architectures") or ())
    if any(c.get("model_type") == "gemma3_text" and c.get("use_bidirectional_attention") for c in configs):
        return "EmbeddingGemma (gemma3_text with use_bidirectional_attention): configs/embedding_model_spec.py " \
               "safe_disable_radix_cache, applied by arg_groups/model_hook.py"
    if "EmbeddingGemma2Model" in archs:
        return "EmbeddingGemma2: arg_groups/model_overrides/embedding_gemma2.py"
    if archs & {"MiniCPMForCausalLM", "MiniCPMSALAForCausalLM"} and (
            checkpoint.get("has_minicpm_sparse_attention") or checkpoint.get("has_lightning_layers")):
        return "MiniCPM SALA's sparse or lightning layers: arg_groups/model_overrides/minicpm.py"
    if (checkpoint.get("model_type") == "hrm_text" or "HrmTextForCausalLM" in archs) and \
            checkpoint.get("prefix_lm", True):
        return "HRM-Text's bidirectional prompt (prefix_lm): arg_groups/model_hook.py"
    if "WhisperForConditionalGeneration" in archs:
        return "Whisper: arg_groups/attention_hook.py"
    return None


def sglang_prefix_caching(serving: Serving, checkpoint: dict | None) -> PrefixCaching:
    asked = serving.prefix_caching
    if asked is not None:
        return PrefixCaching(asked, asked, "SGLang's radix cache" if asked else "--disable-radix-cache")
    hook = _sglang_hook(checkpoint)
    if hook is not None:
        return PrefixCaching(False, None, f"SGLang 0.5.23 turns the radix cache off for {hook}")
    return PrefixCaching(True, None, f"the radix cache; {SGLANG_SOURCE}")


def resolve(arch: Architecture, serving: Serving, checkpoint: dict | None) -> PrefixCaching:
    """The prefix caching the engine runs with; a shared prefix without it is refused."""
    pc = vllm_prefix_caching(arch, serving) if serving.engine == "vllm" else sglang_prefix_caching(serving, checkpoint)
    if serving.shared_prefix_tokens and not pc.on:
        raise ConfigError("serving.shared_prefix_tokens", serving.shared_prefix_tokens, "empty without prefix caching",
                          f"prefix caching is off here ({pc.reason})", ("serving.prefix_caching",))
    return pc
