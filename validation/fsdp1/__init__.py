"""PyTorch FSDP1 (FullyShardedDataParallel) as the HF Trainer with Accelerate runs it, measured under fake tensors."""
