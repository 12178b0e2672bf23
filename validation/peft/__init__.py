"""Measuring harness for PEFT LoRA and QLoRA fine-tuning steps: the real transformers model code
with the real peft adapters, one HF-Trainer-style step measured under FakeTensorMode with the CUDA
emulation of validation/, recorded as tests/data/measured/peft/<case>.json.
Run `python -m validation.peft --help`."""
