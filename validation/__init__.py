"""Measuring harnesses: real framework code (HF transformers, PEFT, torchtitan, torchtune,
Megatron-Core, PyTorch FSDP1) run under FakeTensorMode with a CUDA emulation, one training step
recorded as tests/data/measured/[<framework>/]<case>.json. `core/` is what every harness shares;
each other folder with a plugin.py is one framework's harness (validation/README.md).
Run `python -m validation --help`."""
