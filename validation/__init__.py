"""Measuring harness: real transformers training steps measured under FakeTensorMode with a CUDA
emulation, recorded as tests/data/measured/<case>.json. Run `python -m validation --help`."""
