"""Measuring harness for torchtune 0.6.1 full fine-tuning: torchtune's own model builders and the
single-device recipe's step with its memory savers, measured under FakeTensorMode with the CUDA
emulation of validation/, recorded as tests/data/measured/torchtune/<case>.json.
torchtune 0.6.1 needs torchao 0.10.0, so it runs from its own environment,
/work/main/.venv/torchtune (`python -m validation.torchtune --help`)."""
