"""The Hugging Face transformers harness: real transformers training steps, the way the HF Trainer
runs them, measured under FakeTensorMode with the CUDA emulation of validation/core/, recorded as
tests/data/measured/<case>.json. `summary` and `readme` read every harness's records."""
