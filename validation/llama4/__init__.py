"""Llama 4 (issue 28) in the HF harness: the text model of Llama-4-Scout-17B-16E built from its published
config.json (validation/llama4/models.py)."""
