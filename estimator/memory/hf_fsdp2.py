"""PyTorch FSDP2 as the HF Trainer runs it through Accelerate (`training.framework` "hf_fsdp2": accelerate 1.15.0's
`fsdp_version: 2`, transformers 5.23.0, torch 2.13).

What differs from torchtitan's FSDP2 (`fsdp2`), read in the sources and measured by validation/hf_fsdp2:

- the model is transformers' (its modelling code's activations, `spec.choices.TRANSFORMERS_FRAMEWORKS`), loaded in
  the checkpoint's dtype (transformers 5 `from_pretrained` dtype="auto"); `fsdp2_prepare_model`
  (accelerate/utils/fsdp_utils.py) upcasts the trainable parameters to fp32 under mixed precision, so full
  fine-tuning keeps fp32 shards (the master copy) and a LoRA run its frozen base in the loaded dtype beside fp32
  adapters;
- `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)` (utils/dataclasses.py
  `set_mixed_precision`, fsdp_version 2): the parameters are gathered and the gradients reduced in bf16;
- no autocast: `Accelerator._prepare_fsdp2` shards the model without `prepare_model`, whose `native_amp` branch
  wraps the forward of every other stack in autocast and `convert_outputs_to_fp32` (accelerator.py). The forward
  is that of a 16-bit model: the logits stay bf16 until transformers' loss upcasts them;
- units: each decoder layer (`_no_split_modules`), the input embedding (untied), and the tail
  `[final norm, LM head]` (tied: with the embedding) with reshard_after_forward=False, then the root;
- gradient accumulation: the Trainer runs every micro-batch but the last under `accelerator.no_sync`, which for
  FSDP2 is `model.set_requires_gradient_sync(False)` (accelerator.py `no_sync`): each unit keeps its unsharded
  gradients until the last micro-batch's backward reduce-scatters them.

Data parallelism alone is modelled (Accelerate's ParallelismConfig TP and CP are not), with the Trainer's own
optimizers (bitsandbytes' paged ones and QLoRA's Params4bit, which Accelerate leaves unsharded, are refused).
"""

from __future__ import annotations

from ..spec.errors import ConfigError

FRAMEWORK = "hf_fsdp2"
SOURCE = ("accelerate 1.15.0 accelerator.py _prepare_fsdp2 / no_sync and utils/fsdp_utils.py fsdp2_prepare_model; "
          "transformers 5.23.0 trainer.py; measured: tests/data/measured/hf_fsdp2")


def check(training, par) -> None:
    """Refuse what the HF Trainer over FSDP2 is not modelled with (module docstring)."""
    from ..spec.adapter import base_dtype
    from ..spec.choices import QUANTIZED
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, f"1 with framework {FRAMEWORK!r}",
                              "the HF Trainer over FSDP2 is modelled with data parallelism only (Accelerate's "
                              "ParallelismConfig TP and CP are not)", related=("training.framework",))
    if par.zero_stage not in (None, 2, 3):
        raise ConfigError("parallel.zero_stage", par.zero_stage, f"2 or 3 (or empty) with framework {FRAMEWORK!r}",
                          "Accelerate's FSDP2 plugin shards every unit: reshard_after_forward True is 3, False is 2",
                          related=("training.framework",))
    if training.fp8:
        raise ConfigError("training.fp8", True, f"false with framework {FRAMEWORK!r}",
                          "Accelerate's FP8 backends are not modelled under FSDP2", related=("training.framework",))
    adapter = training.adapter
    if adapter is not None and base_dtype(adapter, training.param_dtype) in QUANTIZED:
        field, value = ("training.adapter.base_dtype", adapter.base_dtype) if adapter.base_dtype else \
            ("training.adapter.method", adapter.method)
        raise ConfigError(field, value, f"'lora' or 'dora' over a 16-bit base with "
                          f"framework {FRAMEWORK!r}", "Accelerate leaves bitsandbytes' quantized weights out of "
                          "FSDP2's sharding (fsdp2_prepare_model: non-floating Params4bit are ignored_params); "
                          "not modelled", related=("training.framework",))
