"""SGLang's own start-up accounting run on CPU: the server arguments its resolution pipeline settles
(mem_fraction_static, chunked_prefill_size, CUDA graph sizes, page size) and the pools its configurators
size (pool_records.py)."""
