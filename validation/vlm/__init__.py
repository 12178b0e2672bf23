"""Vision-language models (issue 28) under the HF harness: the vision tower's inputs and its
flash-attention path emulated for a CPU measurement (validation/vlm/vision.py)."""
