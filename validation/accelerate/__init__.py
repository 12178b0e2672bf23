"""The HF Trainer's step as it runs through Accelerate: the model's forward wrapped by the real
`Accelerator.prepare` (autocast and `convert_outputs_to_fp32`), measured under fake tensors."""
