"""Measuring Megatron-Core 0.16.1's own training code, one rank at a time (issue #13)."""
