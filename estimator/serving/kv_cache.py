"""The KV cache as vLLM's V1 engine sizes it: one spec per attention layer, layer groups, blocks.

Each attention layer has a spec (v1/kv_cache_interface.py): full attention and MLA keep every token,
a sliding-window layer at most its window plus the tokens in flight. The page of one layer holds
`block_size` tokens: 2 x KV heads on this rank x head_size x dtype bytes (AttentionSpec), or
block_size x (kv_lora_rank + rope dim) x dtype bytes for MLA (MLAAttentionSpec: one latent shared by
all heads, replicated on every TP rank). Layers are grouped (v1/core/kv_cache_utils.py
get_kv_cache_groups): one group when every layer has the same spec; else, with equal page sizes
(the hybrid allocator, e.g. Gemma-3's sliding and full layers), each kind is cut into groups of
`group_size` layers and a block holds one page of every layer of the largest group. The block
count is the KV memory over the bytes of one block, the smallest over the pipeline stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.architecture import Architecture


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerSpec:
    kind: str  # "full", "sliding_window", "chunked_local" (Llama 4), "mla" or "recurrent" (a hybrid's state);
    # "dsa": MLA's latent and DeepSeek-V3.2's index keys, two specs per layer in one group (sparse_cache.py)
    page_bytes: int  # one block of one layer on one rank
    block_size: int
    sliding_window: int | None = None
    state_pages: int = 1  # a recurrent layer's pages per request (recurrent_state.HybridPlan)
    state_every: int | None = None  # "all" mode: a recurrent layer also keeps one page per this many tokens

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """One request of max_model_len tokens (FullAttentionSpec / SlidingWindowSpec
        .max_memory_usage_bytes): a window keeps window - 1 + in-flight tokens and one block more,
        because the window need not start at a block boundary."""
        if self.kind == "recurrent":  # MambaSpec: a state per sequence ("none"), two or more ("align"), one a block
            per_block = cdiv(max_model_len, self.state_every) if self.state_every else 0  # ("all", 0.15-0.25)
            return self.page_bytes * (per_block + self.state_pages)
        if self.kind == "sliding_window":
            tokens = min(self.sliding_window - 1 + in_flight_tokens, max_model_len)
            return (cdiv(tokens, self.block_size) + 1) * self.page_bytes
        if self.kind == "chunked_local":  # ChunkedLocalAttentionSpec: one chunk and the tokens in flight, no extra block
            return cdiv(min(self.sliding_window + in_flight_tokens, max_model_len), self.block_size) * self.page_bytes
        return cdiv(max_model_len, self.block_size) * self.page_bytes


def kv_heads_per_rank(arch: Architecture, tp: int) -> int:
    """vLLM's attention layers hold max(1, kv_heads // tp) KV heads (models/llama.py: KV heads are
    replicated when TP exceeds them)."""
    return max(1, arch.num_kv_heads // tp)


Specs = tuple[LayerSpec | tuple[LayerSpec, ...] | None, ...]


def layer_specs(arch: Architecture, tp: int, block_size: int, kv_bytes: int, model_bytes: int = 2,
                state_pages: int = 1, state_every: int | None = None) -> Specs:
    """The spec of every layer of the model, in order (gpu_model_runner.get_kv_cache_spec); None for a
    layer that keeps nothing (a hybrid pattern's MLP or MoE block), a tuple for a layer with two caches.
    `state_pages`, `state_every`: a hybrid's state pages per request (recurrent_state.HybridPlan)."""
    if arch.is_hybrid:
        return _hybrid_specs(arch, tp, block_size, kv_bytes, model_bytes, state_pages, state_every)
    if arch.uses_mla:  # DeepSeek Sparse Attention adds the indexer's keys to the page (sparse_cache.py)
        from .sparse_cache import mla_token_bytes
        page = block_size * mla_token_bytes(arch, kv_bytes)
        return (LayerSpec("dsa" if arch.uses_sparse_attention else "mla", page, block_size),) * arch.num_layers
    page = 2 * block_size * kv_heads_per_rank(arch, tp) * arch.head_dim * kv_bytes
    full = LayerSpec("full", page, block_size)
    window = LayerSpec("sliding_window", page, block_size, arch.sliding_window) if arch.sliding_window else full
    if arch.attention_chunk_size:  # Llama 4's RoPE layers (models/llama4.py: ChunkedLocalAttention unless NoPE)
        window = LayerSpec("chunked_local", page, block_size, arch.attention_chunk_size)
    return tuple(full if arch.global_attention_layers_in(i, i + 1) else window for i in range(arch.num_layers))


def without_hybrid_allocator(specs: tuple[LayerSpec | tuple[LayerSpec, ...] | None, ...], version: tuple[int, int],
                             eagle: bool) -> tuple[LayerSpec | tuple[LayerSpec, ...] | None, ...]:
    """vLLM turns the hybrid KV cache manager off for chunked local attention in 0.11 (its default
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0, config/__init__.py __post_init__, "a latency
    regression"), and in every release with an EAGLE drafter; 0.15 on turn the variable on by default (envs.py).
    Without the manager unify_hybrid_kv_cache_specs (v1/core/kv_cache_utils.py) makes every chunked layer a
    full-attention one: it keeps every token."""
    if not any(isinstance(spec, LayerSpec) and spec.kind == "chunked_local" for spec in specs):
        return specs  # a layer with two caches (a tuple: Falcon-H1, DSA) is never a chunked one
    if version >= (0, 15) and not eagle:
        return specs
    return tuple(LayerSpec("full", spec.page_bytes, spec.block_size)
                 if isinstance(spec, LayerSpec) and spec.kind == "chunked_local"
                 else spec for spec in specs)


def attention_page_per_token(arch: Architecture, tp: int, kv_bytes: int) -> int:
    return 2 * kv_heads_per_rank(arch, tp) * arch.head_dim * kv_bytes


def _hybrid_specs(arch: Architecture, tp: int, block_size: int, kv_bytes: int,
                  model_bytes: int, state_pages: int, state_every: int | None) -> tuple[LayerSpec | None, ...]:
    """A hybrid model: full attention for its attention layers, one state page per sequence for its
    recurrent layers, padded to the attention page (serving/recurrent_state.py); nothing for its MLP and MoE
    blocks (vLLM registers no cache for them)."""
    from ..spec import hybrid

    full = LayerSpec("full", block_size * attention_page_per_token(arch, tp, kv_bytes), block_size)
    state = LayerSpec("recurrent", full.page_bytes, block_size, state_pages=state_pages, state_every=state_every)
    # Falcon-H1's layer registers an attention layer and a Mamba-2 layer (vLLM falcon_h1.py FalconH1ParallelHybrid:
    # the mixer's prefix takes index num_layers + i), so both a full-attention and a state spec at index i
    specs = {None: None, "attention": full, "linear_attention": state, "mamba": state, "mamba1": state,
             "attention_mamba": (full, state)}
    return tuple(specs[hybrid.MIXER[arch.layer_kind(i)]] for i in range(arch.num_layers))


@dataclass(frozen=True)
class Groups:
    """The KV cache groups of the whole model: each a spec and the indices of its layers."""

    members: tuple[tuple[LayerSpec, tuple[int, ...]], ...]
    # One group of full-attention layers whose pages differ (a draft model's layers beside the target's):
    # vLLM's UniformTypeKVCacheSpecs, where a block holds one page of every layer
    uniform_type: bool = False
    # vLLM 0.11's UniformTypeKVCacheSpecs (DeepSeek-V3.2's two specs per layer) is built over the whole model
    # (get_kv_cache_configs merges every stage's specs first), and get_kv_cache_config_from_groups divides each
    # stage's memory by its page_size_bytes, the sum over all the model's layers, not the stage's (0.33.0
    # divides by the stage's own: both recorded, tests/data/serving/dsa)
    whole_model_page: bool = False

    @property
    def count(self) -> int:
        return 1 if self.uniform_type else len(self.members)

    def layers_per_group_on(self, layers: range) -> int:
        """The largest group's layers on one pipeline stage (the pages one block holds there)."""
        return max(sum(1 for i in idx if i in layers) for _, idx in self.members)

    def block_bytes_on(self, layers: range) -> int:
        """What one block costs a stage: its memory over this is its block count."""
        if self.whole_model_page:
            return sum(spec.page_bytes * len(idx) for spec, idx in self.members)
        return self.held_bytes_on(layers)

    def held_bytes_on(self, layers: range) -> int:
        """What one block holds on a stage: the pages of its layers."""
        if self.uniform_type or self.whole_model_page:
            return sum(spec.page_bytes * sum(1 for i in idx if i in layers) for spec, idx in self.members)
        return self.members[0][0].page_bytes * self.layers_per_group_on(layers)

    def blocks_per_request(self, max_model_len: int, in_flight: int) -> int:
        members = self.members[:1] if self.uniform_type else self.members
        return sum(cdiv(spec.max_memory_usage_bytes(max_model_len, in_flight), spec.page_bytes) for spec, _ in members)


def kv_groups(specs: tuple[LayerSpec, ...], version: tuple[int, int]) -> Groups:
    """get_kv_cache_groups: one group when all specs are equal; else (equal page sizes) each kind's
    layers split into cdiv(n, group_size) groups, layers[i::num_groups] in the i-th. group_size is the
    smallest kind's layer count; from 0.33 the largest when it is under 1.5 x the smallest
    (kv_cache_planning.py _get_kv_cache_groups_uniform_page_size)."""
    by_spec: dict[LayerSpec, list[int]] = {}
    for i, layer in enumerate(specs):
        for spec in layer if isinstance(layer, tuple) else (layer,):  # a parallel hybrid's layer has two
            if spec is not None:  # a block without cache (a hybrid's MLP)
                by_spec.setdefault(spec, []).append(i)
    if len(by_spec) == 1:
        spec, idx = next(iter(by_spec.items()))
        return Groups(((spec, tuple(idx)),), whole_model_page=spec.kind == "dsa" and version < (0, 33))
    if all(spec.kind == "full" for spec in by_spec) or all(spec.kind in ("mla", "dsa") for spec in by_spec):
        # UniformTypeKVCacheSpecs.from_specs: every layer needs the same token slots, pages differ
        return Groups(tuple((spec, tuple(idx)) for spec, idx in by_spec.items()), uniform_type=True)
    sizes = [len(idx) for idx in by_spec.values()]
    group_size = min(sizes)
    if version >= (0, 33) and max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    members = []
    for spec, idx in by_spec.items():
        n_groups = cdiv(len(idx), group_size)
        members += [(spec, tuple(idx[g::n_groups])) for g in range(n_groups)]
    return Groups(tuple(members))


def in_flight_tokens(max_num_batched_tokens: int, pp: int, version: tuple[int, int]) -> int:
    """Tokens scheduled but not yet settled, which a sliding window keeps beyond itself: one batch in
    0.11 (SlidingWindowSpec uses max_num_batched_tokens); in 0.33 VllmConfig.max_in_flight_tokens =
    max_concurrent_batches x max_num_batched_tokens, 2 batches with async scheduling (on by default)
    and PP batches under pipeline parallelism (config/vllm.py)."""
    if version < (0, 33):
        return max_num_batched_tokens
    return (2 if pp == 1 else pp) * max_num_batched_tokens


@dataclass(frozen=True)
class KvCapacity:
    num_blocks: int
    kv_cache_bytes: int  # the blocks' bytes on the limiting rank
    tokens: int  # as the engine reports "GPU KV cache size: N tokens"
    max_concurrency: float
    blocks_per_request: int


def capacity(groups: Groups, stage_layers: tuple[range, ...], available: tuple[int, ...], max_model_len: int,
             in_flight: int, tokens_rule: str) -> KvCapacity:
    """num_blocks per stage = its KV memory // its block bytes; every stage takes the smallest
    (get_kv_cache_configs). Blocks per request = the sum over groups of cdiv(max memory of one request,
    page); concurrency = num_blocks / that (get_max_concurrency_for_kv_cache_config)."""
    blocks = [max(avail, 0) // groups.block_bytes_on(r) for avail, r in zip(available, stage_layers)]
    limiting = min(range(len(blocks)), key=lambda s: blocks[s])
    num_blocks = blocks[limiting]
    per_request = groups.blocks_per_request(max_model_len, in_flight)
    concurrency = num_blocks / per_request
    block_size = groups.members[0][0].block_size
    if tokens_rule == "blocks":
        tokens = num_blocks // groups.count * block_size
    else:
        tokens = int(concurrency * max_model_len)
    return KvCapacity(num_blocks, num_blocks * groups.held_bytes_on(stage_layers[limiting]), tokens, concurrency,
                      per_request)


def effective_concurrency(groups: Groups, capacity_: KvCapacity, shared_prefix: int) -> float:
    """Sequences of max_model_len that fit when all share a prefix of `shared_prefix` tokens under prefix
    caching: its full blocks (block_pool.py caches full blocks only) are stored once per full-attention
    or MLA group, and per recurrent group in "all" mode (a state a block); a sliding-window group keeps only its
    window and shares nothing here, nor does a recurrent group's running state."""
    block_size = groups.members[0][0].block_size
    local = ("sliding_window", "chunked_local", "recurrent")
    full_groups = 1 if groups.uniform_type else sum(1 for spec, _ in groups.members
                                                    if spec.kind not in local or spec.state_every)
    shared = shared_prefix // block_size * full_groups
    if not shared or shared >= capacity_.blocks_per_request:
        return capacity_.max_concurrency
    return (capacity_.num_blocks - shared) / (capacity_.blocks_per_request - shared)


def longest_model_len(groups: Groups, stage_layers: tuple[range, ...], available: tuple[int, ...],
                      in_flight: int, ceiling: int, version: tuple[int, int]) -> int:
    """The longest max_model_len whose one request fits every stage's KV memory (a binary search over
    1 .. ceiling; 0 when not even one token fits). 0.11 (kv_cache_utils.estimate_max_model_len): the sum
    over the stage's layers of one request's bytes. 0.33 (kv_cache_planning
    _estimate_max_model_len_from_groups): the stage's block bytes x the sum over groups of the blocks one
    request takes (padding layers included), against the memory less the null block the block pool holds
    back. (Releases between use group-based rules that were not recorded; they get 0.11's here.)"""
    by_group = [[sum(1 for i in idx if i in layers) for _, idx in groups.members] for layers in stage_layers]

    def fits(length: int) -> bool:
        for avail, layers, counts in zip(available, stage_layers, by_group):
            if version >= (0, 33):
                block = groups.block_bytes_on(layers)
                blocks = groups.blocks_per_request(length, in_flight)
                if block * blocks > avail - block:
                    return False
            elif sum(spec.max_memory_usage_bytes(length, in_flight) * n
                     for (spec, _), n in zip(groups.members, counts)) > avail:
                return False
        return True

    if not fits(1):
        return 0
    lo, hi = 1, ceiling
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
