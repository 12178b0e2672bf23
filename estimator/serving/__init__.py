"""Serving capacity on an inference engine (vLLM V1, SGLang): how many sequences of what length fit.

Each module is one job, after vLLM's own split of its start-up accounting:

- `vllm_versions`: one record per vLLM release where a rule changed.
- `checkpoint`: the weight format and context length a checkpoint's config gives.
- `weights`: the weights as loaded, per format, TP rank and PP stage.
- `weight_blocks`: those weights as vLLM measures them, in torch's caching allocator's blocks.
- `marlin_blocks`: the same for MXFP4 experts repacked for Marlin (vLLM 0.11), the repack replayed.
- `activations`: the profiling run's torch activation peak.
- `sort_sampler`: the sort sampler's part of it (vLLM 0.11-0.16), in the caching allocator's blocks.
- `overheads`: non-torch memory and CUDA graphs.
- `kv_cache`: KV cache specs per layer, layer groups, blocks, capacity, the longest max_model_len.
- `vllm_engine`: the budget and the terms together, for the rank that limits capacity.

The config's ``serving`` object is a record of the spec layer (`estimator.spec.serving`). This package
imports `memory`, `models` and `spec`; only the command line, the importers and the app import it;
importing it does no I/O.
"""
