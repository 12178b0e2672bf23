"""PyTorch FSDP2 (fully_shard) as the HF Trainer with Accelerate (`fsdp_version: 2`) runs it, measured under fake tensors."""
