"""vLLM's own KV cache accounting run on CPU (no GPU, no model weights): see `kv_records.py`."""
