"""Hybrid models under the HF harness (issue 28): linear-attention hybrids (Qwen3-Next's Gated
DeltaNet) and state-space hybrids (Nemotron-H's Mamba-2, Jamba's Mamba-1, Falcon-H1's attention and Mamba-2 side
by side), with their CUDA-only kernels emulated (kernels.py, mamba1.py). Records go to tests/data/measured/hybrid/."""
