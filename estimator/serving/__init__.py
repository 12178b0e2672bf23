"""Serving capacity on an inference engine (vLLM V1, SGLang): how many sequences of what length fit.

Each module is one job, after vLLM's own split of its start-up accounting:

- `settings`: the config's ``serving`` object (the field registry reads it).
- `vllm_versions`: one record per vLLM release where a rule changed.
- `checkpoint`: the weight format and context length a checkpoint's config gives.
- `weights`: the weights as loaded, per format, TP rank and PP stage.
- `activations`: the profiling run's torch activation peak.
- `overheads`: non-torch memory and CUDA graphs.
- `kv_cache`: KV cache specs per layer, layer groups, blocks, capacity, the longest max_model_len.
- `vllm_engine`: the budget and the terms together, for the rank that limits capacity.

Nothing in the rest of `estimator` imports this package except the field registry (its settings) and
the command line; importing it does no I/O. (This file imports nothing: the registry reads
`settings` while it is itself being imported.)
"""
