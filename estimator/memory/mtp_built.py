"""Whether a training framework builds a checkpoint's multi-token-prediction modules (model.mtp_layers).

A DeepSeek-V3 checkpoint stores its MTP module as an extra decoder layer (model.layers.61, with its own
embedding and head copies); only some frameworks build it, and a module that is not built has no
parameters, gradients, optimizer states or activations. The one rule, per framework:

- megatron: built, `--mtp-num-layers` modules (model.mtp_layers is that flag: importers/megatron_model.py
  reads it, importers/emit_megatron.py writes it). Megatron-Core 0.16.1 and 0.19.0
  transformer/transformer_config.py `mtp_num_layers: Optional[int] = None` (none unless asked);
  Megatron-Bridge's DeepSeek-V3 recipe and the published DeepSeek-V3 runs ask for 1.
- fsdp2 (torchtitan 0.3.0 and main): not built. models/deepseek_v3/mtp.py MTPDecoder builds the modules
  only when `model_registry(..., num_mtp_layers=n)` asks, default 0; the 671B recipe
  (config_registry.py deepseek_v3_671b) and every flavor the emitted config names leave it 0, and no
  config field sets it. torchtitan 0.1.0, 0.2.0 and 2024-12 have no MTP module.
- hf, deepspeed, fsdp1 (transformers 5.23 models under the HF Trainer, DeepSpeed, FSDP1 or Accelerate):
  not built. models/deepseek_v3/modeling_deepseek_v3.py and deepseek_v32/modeling_deepseek_v32.py build
  num_hidden_layers (61) decoder layers and drop the checkpoint's MTP layer on load
  (`_keys_to_ignore_on_load_unexpected = [r"model\\.layers\\.61.*"]`).
- torchtune 0.6.1: not built (no model of it has an MTP module).

Serving is not training: vLLM and SGLang load the MTP module only as the speculative `mtp` drafter
(serving/speculative.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..spec.architecture import Architecture
from ..spec.training import Training

_NOT_BUILT = {
    "fsdp2": "torchtitan 0.3.0 builds MTP modules only when model_registry(num_mtp_layers=n) asks "
             "(models/deepseek_v3/mtp.py MTPDecoder); its recipes and config fields leave it 0",
    "hf": "transformers 5.23 DeepseekV3/DeepseekV32ForCausalLM build no MTP module: the checkpoint's "
          "layer 61 is dropped on load (_keys_to_ignore_on_load_unexpected)",
    "torchtune": "torchtune has no MTP module",
}
_NOT_BUILT["deepspeed"] = _NOT_BUILT["fsdp1"] = _NOT_BUILT["hf_fsdp2"] = _NOT_BUILT["hf"]


@dataclass(frozen=True)
class MtpBuild:
    checkpoint: int  # the modules the checkpoint stores (model.mtp_layers)
    built: int  # the modules the framework builds and trains
    reason: str  # why they are absent, "" when built


def mtp_build(arch: Architecture, training: Training) -> MtpBuild:
    """The MTP modules `training.framework` builds (module docstring)."""
    reason = "" if not arch.mtp_layers else _NOT_BUILT.get(training.framework, "")
    return MtpBuild(arch.mtp_layers, 0 if reason else arch.mtp_layers, reason)


def as_built(arch: Architecture, training: Training) -> Architecture:
    """The architecture the framework builds: without the MTP modules it does not build (one object per
    architecture, so the estimate's memos are shared by every configuration that resolves to it)."""
    if not mtp_build(arch, training).reason:
        return arch
    return arch.cached(("without mtp",), lambda: replace(arch, mtp_layers=0))


def mtp_note(build: MtpBuild) -> str | None:
    """The breakdown's line on MTP modules the checkpoint has and the run does not build."""
    if not build.reason:
        return None
    return (f"the checkpoint's {build.checkpoint} multi-token-prediction module(s) are not built, and the estimate "
            f"counts nothing for them (parameters, gradients, optimizer states, activations): {build.reason}")
