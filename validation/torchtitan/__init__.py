"""Measuring harness for torchtitan 0.3.0: its own model definitions, parallelize functions (FSDP2,
TP, CP, activation checkpointing, float8) and Trainer step, rank 0 of a fake process group under
FakeTensorMode, recorded as tests/data/measured/torchtitan/<case>.json."""
