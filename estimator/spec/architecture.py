"""Model architecture and its parameters, tensor by tensor.

A decoder-only transformer is a stack of identical layers between an embedding and an LM head.
Every weight is listed here as a `ParameterTensor` with its shape and how tensor parallelism
splits it, following Megatron-Core's layer specs (column-parallel QKV and fc1, row-parallel
output projection and fc2, replicated norms and routers, vocabulary-parallel embedding and
head). Per-GPU and per-stage counts (`sharding.py`) and optimizer states (`states.py`) are sums
over this list, so there is one place where a weight is described.

Layer kinds: a layer is ``dense`` (one MLP) or ``moe`` (router, routed experts, optional shared
experts). Attention is multi-head/grouped-query, or multi-head latent attention (DeepSeek-V2/V3)
when ``kv_lora_rank`` is set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields

from . import memo as _memo
from .architecture_checks import check_architecture
from .field import record
from .memo import not_owned

from . import hybrid as _hybrid
from . import vision as _vision
from . import sparse as _sparse
from .residues import congruent_in, congruent_in_both
from .tensors import COLUMN, EXPERT_COLUMN, EXPERT_ROW, REPLICATED, ROW, VOCAB, ParameterTensor  # noqa: F401


_TOKENS = itertools.count()  # each architecture object's name in the memo (estimator/spec/memo.py)

@record("model")
@not_owned
@dataclass(frozen=True)
class Architecture:
    """The canonical architecture of ``../shared/CONTRACT.md``; defaults are resolved on creation."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    vocab_size: int
    intermediate_size: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    tie_embeddings: bool = False
    gated_mlp: bool = True
    norm: str = "rmsnorm"
    linear_bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    position_embedding: str = "rope"
    max_position_embeddings: int | None = None
    # Mixture of experts
    num_experts: int = 0
    num_experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    first_dense_layers: int = 0
    moe_layer_frequency: int = 1
    # which v4 names peft converts to this model type's fused experts (spec/choices.py PEFT_MOE_CONVERSIONS; set by
    # the Hugging Face reader from model_type; memory/adapters.py adapted_modules) and whether its router is an
    # nn.Linear ("all-linear" takes it unconverted: transformers 5.23 modeling_llama4.py Llama4Router(nn.Linear))
    peft_moe_conversion: str = "mixtral"
    router_is_linear: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    mtp_layers: int = 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer per MLA layer (estimator/spec/sparse.py)
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    # Details some families need for exact counts (optional fields beyond the contract's table)
    name: str = "custom"
    norms_per_layer: int = 2  # Gemma-2/3 and OLMo-2 differ from the usual two pre-norms
    qk_norm_full_width: bool = False  # OLMo-2 normalises all of q and k, not each head
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate on the shared expert
    sliding_window: int | None = None  # local attention window, in tokens
    sliding_window_pattern: int = 0  # 0: every layer is local (window or chunk); N: every N-th layer is global
    # Llama 4 (estimator/models/hf_llama4.py): a local layer's query sees the earlier tokens of its own chunk
    attention_chunk_size: int | None = None
    qk_l2_norm: bool = False  # the RoPE (local) layers L2-normalise q and k per head, without a weight
    moe_dense_experts: bool = False  # transformers' Llama4TextMoe: every token through every routed expert
    eager_softmax_in_compute_dtype: bool = False  # transformers' Llama 4 eager softmax: no fp32 upcast
    attention_logit_softcapping: float | None = None  # Gemma-2: cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # Gemma-2: cap * tanh(logits / cap)
    norm_unit_offset: bool = False  # Gemma: RMSNorm scales by (1 + w), in fp32
    norm_fp32_scale: bool = False  # Nemotron-H: RMSNorm multiplies its scale in fp32, then casts
    logits_fp32: bool = False  # Nemotron-H: the model's forward casts its logits to fp32 (lm_head(...).float())
    # Qwen-1's remote modeling_qwen.py, lit-gpt: the model's own loss runs cross_entropy on the 16-bit logits, no
    # .float(); outside autocast its log-softmax and gradients stay 16-bit (memory/activations/loss.py)
    loss_in_logits_dtype: bool = False
    # Linear-attention hybrids (Qwen3-Next): Gated DeltaNet layers, every full_attention_interval-th one
    # softmax attention (estimator/spec/hybrid.py)
    full_attention_interval: int = 0  # 0: no linear attention
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int = 4
    attention_output_gate: bool = False  # Qwen3-Next: q_proj also gives a sigmoid gate on the attention output
    # the model config's own dropouts besides the attention probabilities', which transformers' modelling code
    # applies (read by estimator/models/hf_dropout.py; charged under the transformers frameworks,
    # memory/activations/entries.py `config_dropout`): Phi-3's and GPT-2's resid_pdrop, GPT-NeoX's hidden_dropout,
    # StarCoder2's residual_dropout on both residual branches; Falcon's hidden_dropout after the MLP
    attention_residual_dropout: float = 0.0
    mlp_residual_dropout: float = 0.0
    embedding_dropout: float = 0.0  # GPT-2's embd_pdrop, GPT-NeoX's hidden_dropout, StarCoder2's embedding_dropout
    # q, k and v are one nn.Linear (transformers' Phi-3 qkv_proj and GPT-NeoX query_key_value, Qwen-1's c_attn):
    # an adapter on it is one lora_A and one lora_B (memory/adapters.py layer_modules); v stays a view of its output
    # while the rotary embedding makes new q and k (memory/activations/attention.py `_fused_qkv_flash_entries`)
    fused_qkv: bool = False
    # transformers' Falcon, multi-query or new decoder architecture (modeling_falcon.py FalconAttention._split_heads):
    # k and v leave the fused output by index lists (fused_qkv[..., [-2], :]) and the new architecture's q by a
    # flatten of a strided view, copies all, so the fused output is not kept through v: the fused-QKV activation
    # rule does not apply (its adapter rule does)
    qkv_split_copies: bool = False
    # transformers' Falcon with the new decoder architecture (modeling_falcon.py 5.23 lines 254-263 and 442):
    # _split_heads broadcasts each group's k and v to its query heads and flattens them into copies, and forward
    # takes num_kv_heads = num_heads, so attention sees (and flash keeps) k and v a heads wide
    qkv_split_expands_kv: bool = False
    # attention and MLP both read the layer input, whose output is input + attention + MLP (GPT-NeoX
    # use_parallel_residual, Falcon parallel_attn / new_decoder_architecture)
    parallel_attention: bool = False
    # the share of each head's dimensions the rotary embedding turns (transformers' GPT-NeoX rotary_pct, 0.25 by
    # default: modeling_gpt_neox.py apply_rotary_pos_emb rotates q[..., :rotary_dim] and concatenates the rest back);
    # only the allocator replay reads it (memory/reserved_layers.py: the rotation's temporaries)
    partial_rotary_factor: float = 1.0
    # transformers' NewGELUActivation (activation "gelu_new", GPT-2's default): the tanh GELU in PyTorch ops
    composite_gelu: bool = False
    # transformers' Falcon (multi-query): eager attention broadcasts the one k and v head in its matmuls, no copies
    eager_kv_broadcast: bool = False
    # transformers' Falcon (modeling_falcon.py 5.23 lines 755-761): the model always builds a 4-D mask and hands it
    # to SDPA, so under the transformers frameworks' "flash" (SDPA) a multi-query Falcon runs SDPA's math backend
    # and the others a fused kernel with the mask as a bias (memory/activations/sdpa_math.py, sdpa_mask.py); off,
    # "flash" is flash_attention_2 for it (flash-attn's kernel; the measured Falcon flash records)
    sdpa_mask_always: bool = False
    # State-space hybrids (Nemotron-H): one block per character of the pattern
    hybrid_override_pattern: str | None = None
    mamba_num_heads: int | None = None
    mamba_head_dim: int | None = None
    mamba_state_size: int | None = None
    mamba_num_groups: int | None = None
    mamba_conv_kernel: int = 4
    mamba_conv_bias: bool = True
    mamba_chunk_size: int = 128
    mamba_gated_norm: bool = True  # the Mamba-2 mixer's gated RMSNorm (Falcon-H1's mamba_rms_norm; Nemotron-H: always)
    parallel_mamba: bool = False  # Falcon-H1: every layer runs attention and a Mamba-2 mixer side by side, then an MLP
    # Mamba-1 hybrids (Jamba): attention where i % attention_layer_period == attention_layer_offset, Mamba-1 elsewhere
    attention_layer_period: int = 0  # 0: no Mamba-1 layers
    attention_layer_offset: int = 0
    mamba_expand: int | None = None  # Mamba-1 inner width = mamba_expand x hidden_size
    mamba_dt_rank: int | None = None  # rank of Mamba-1's time-step projection
    # Vision-language models: the vision tower before the decoder (estimator/spec/vision.py)
    vision_tower: str | None = None  # "qwen2_5_vl", "siglip" or "llama4"; None: a text-only model
    vision_hidden_size: int | None = None
    vision_num_layers: int | None = None
    vision_num_heads: int | None = None
    vision_intermediate_size: int | None = None
    vision_patch_size: int | None = None
    vision_temporal_patch_size: int = 1  # Qwen2.5-VL: 2 frames per patch (a still image repeated)
    vision_spatial_merge_size: int = 1  # Qwen2.5-VL: 2 x 2 patches per decoder token
    vision_window_size: int | None = None  # Qwen2.5-VL: window attention over window x window pixels
    vision_full_attention_layers: int = 0  # Qwen2.5-VL: blocks attending over the whole image (fullatt_block_indexes)
    vision_image_size: int | None = None  # SigLIP: the size every image is resized to (its position table)
    vision_tokens_per_image: int | None = None  # Gemma 3: decoder tokens per image after the projector's pooling
    vision_projector_size: int | None = None  # Llama 4: the pixel-shuffle adapter's and the projector's width

    def __post_init__(self) -> None:
        check_architecture(self)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_experts and self.shared_expert_intermediate_size is None:
            object.__setattr__(self, "shared_expert_intermediate_size", self.moe_intermediate_size)

    # --- layer pattern -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def uses_sparse_attention(self) -> bool:
        """DeepSeek Sparse Attention: a lightning indexer picks index_topk keys per query."""
        return self.index_n_heads is not None

    @property
    def is_hybrid(self) -> bool:
        """Some layers' token mixer is not softmax attention (estimator/spec/hybrid.py)."""
        return self.hybrid_override_pattern is not None or self.full_attention_interval > 1 \
            or self.attention_layer_period > 0 or self.parallel_mamba

    def is_moe_layer(self, index: int) -> bool:
        """DeepSeek's ``first_k_dense_replace`` then every ``moe_layer_frequency``-th layer
        (Megatron's ``--moe-layer-freq``: layer i is MoE when i % freq == 0); an E block of a pattern."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern[index] == "E"
        if not self.is_moe or index < self.first_dense_layers:
            return False
        return (index - self.first_dense_layers) % self.moe_layer_frequency == 0

    def is_full_attention_layer(self, index: int) -> bool:
        """Qwen3-Next's layer_types (layer i attends when (i + 1) % interval == 0), Jamba's attention period."""
        residue = _hybrid.attention_residue(self)
        return residue is None or index % residue[1] == residue[0]

    def layer_kind(self, index: int) -> str:
        """The kind of one layer (see `kind_counts`)."""
        if self.hybrid_override_pattern is not None:
            return _hybrid.BLOCK_OF_SYMBOL[self.hybrid_override_pattern[index]]
        if self.parallel_mamba:
            return _hybrid.PARALLEL_DENSE
        ffn = "moe" if self.is_moe_layer(index) else "dense"
        return ffn if self.is_full_attention_layer(index) else _hybrid.recurrent_kinds(self)[ffn == "moe"]

    # The pattern is periodic, so how many layers of a kind a range [start, stop) holds is a count
    # of residues, in closed form: an estimate never walks the layers one by one, and its cost does
    # not grow with num_layers (a stage is a few ranges, sharding.stage_layer_chunks).

    def moe_layers_in(self, start: int, stop: int) -> int:
        """MoE layers among layers start .. stop - 1: those >= first_dense_layers and congruent to
        it modulo moe_layer_frequency."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern[start:stop].count("E")
        if not self.is_moe:
            return 0
        return congruent_in(max(start, self.first_dense_layers), stop,
                            self.first_dense_layers, self.moe_layer_frequency)

    def full_attention_layers_in(self, start: int, stop: int) -> int:
        """Softmax-attention layers among start .. stop - 1 of a decoder-layer hybrid."""
        residue = _hybrid.attention_residue(self)
        if residue is None:
            return max(stop - start, 0)
        return congruent_in(start, stop, *residue)

    def kind_counts(self, start: int = 0, stop: int | None = None) -> tuple[tuple[str, int], ...]:
        """(kind, layers) of layers start .. stop - 1 (all of them by default), kinds in sorted order,
        each kind with at least one layer."""
        stop = self.num_layers if stop is None else stop
        if self.hybrid_override_pattern is not None:
            return _hybrid.pattern_counts(self.hybrid_override_pattern, start, stop)
        if self.parallel_mamba:
            return ((_hybrid.PARALLEL_DENSE, stop - start),) if stop > start else ()
        moe = self.moe_layers_in(start, stop)
        residue = _hybrid.attention_residue(self)
        if residue is None:
            return tuple((kind, n) for kind, n in (("dense", stop - start - moe), ("moe", moe)) if n > 0)
        # Linear-attention or Mamba-1 hybrid: the attention layers that are MoE are in both residue classes
        full = self.full_attention_layers_in(start, stop)
        if not self.is_moe:
            moe_full = 0
        elif self.first_dense_layers == 0 and self.moe_layer_frequency == 1:
            moe_full = full
        else:
            moe_full = congruent_in_both(max(start, self.first_dense_layers), stop,
                                         (self.first_dense_layers, self.moe_layer_frequency),
                                         residue)
        other_dense, other_moe = _hybrid.recurrent_kinds(self)
        counts = {"dense": full - moe_full, "moe": moe_full, other_dense: stop - start - moe - (full - moe_full),
                  other_moe: moe - moe_full}
        return tuple(sorted((kind, n) for kind, n in counts.items() if n > 0))

    @property
    def kinds(self) -> tuple[str, ...]:
        """The layer kinds the model has, sorted."""
        return tuple(kind for kind, _ in self.kind_counts())

    @property
    def local_attention(self) -> int | None:
        """The span of the local layers: the sliding window, or Llama 4's attention chunk; None: all global."""
        return self.sliding_window or self.attention_chunk_size

    def global_attention_layers_in(self, start: int, stop: int) -> int:
        """Layers among start .. stop - 1 that attend to the whole sequence: all of them without a
        sliding window or chunk, none with pattern 0, else every pattern-th (layer i when (i + 1) % pattern
        == 0, Gemma's ``sliding_window_pattern``, Llama 4's NoPE layers)."""
        if not self.local_attention:
            return max(stop - start, 0)
        if self.sliding_window_pattern == 0:
            return 0
        pattern = self.sliding_window_pattern
        return congruent_in(start, stop, pattern - 1, pattern)

    def variant_counts(self, start: int = 0, stop: int | None = None) -> dict[tuple[str, bool], int]:
        """Layers start .. stop - 1 by (kind, local: a sliding window or an attention chunk), the variants with
        at least one layer. The
        MoE layers that are global are those in both residue classes (Chinese remainder theorem),
        the other three variants follow by subtraction."""
        stop = self.num_layers if stop is None else stop
        if self.is_hybrid:  # no sliding window (validated): every kind is unwindowed
            return {(kind, False): n for kind, n in self.kind_counts(start, stop)}
        moe = self.moe_layers_in(start, stop)
        full = self.global_attention_layers_in(start, stop)
        if not self.is_moe or not self.local_attention or self.sliding_window_pattern == 0:
            moe_full = moe if full == stop - start else 0
        else:
            moe_full = congruent_in_both(max(start, self.first_dense_layers), stop,
                                         (self.first_dense_layers, self.moe_layer_frequency),
                                         (self.sliding_window_pattern - 1, self.sliding_window_pattern))
        counts = {("dense", False): full - moe_full, ("dense", True): stop - start - moe - (full - moe_full),
                  ("moe", False): moe_full, ("moe", True): moe - moe_full}
        return {variant: n for variant, n in counts.items() if n > 0}

    def layer_kinds(self) -> tuple[str, ...]:
        """The kind of every layer, first to last. One entry per layer, so for display and tests:
        estimates count kinds with `kind_counts`."""
        return self.cached(("layer kinds",), lambda: tuple(self.layer_kind(i) for i in range(self.num_layers)))

    def cached(self, key: tuple, compute, per_layout: bool = False):
        """Remember a value derived from this architecture alone (and the sharding named in `key`):
        a search over layouts, or an app rerun, asks for the same per-layer buckets again and again.
        The architecture is immutable, so a remembered value can never go stale. The values live in
        the process's memo (estimator/spec/memo.py), bounded in bytes over every architecture, least
        recently used first out: a preset's architecture lives as long as the app's server, and every
        model and configuration its users try would otherwise stay in memory. Values of one whole
        configuration (`per_layout`: an app rerun reads them back, a search never does) have a pool
        of their own, so that a search's hundreds of thousands of them never push out the values
        its layouts share."""
        pool = _memo.PER_LAYOUT if per_layout else _memo.SHARED
        token = self.__dict__.get("_token")
        if token is None:
            token = self.memo_token
        return pool.get((token, key), compute, key[0] if key and isinstance(key[0], str) else "")

    @property
    def memo_token(self) -> int:
        """This architecture object's name in the memo (estimator/spec/memo.py); memory._StageMemo keys its
        entries by it."""
        token = self.__dict__.get("_token")
        if token is None:  # frozen: set once, through the instance dict
            token = self.__dict__["_token"] = next(_TOKENS)
        return token

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # --- widths ------------------------------------------------------------------------------
    @property
    def q_width(self) -> int:
        """Width of all query heads together (a x d_head)."""
        if self.uses_mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the keys (= of the values) of all KV heads together (g x d_head)."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_output_width(self) -> int:
        if self.uses_mla:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    # --- parameters ----------------------------------------------------------------------------
    def attention_tensors(self) -> list[ParameterTensor]:
        h, b = self.hidden_size, self.linear_bias
        out: list[ParameterTensor] = []
        if self.uses_mla:
            # DeepSeek-V2 (arXiv 2405.04434) section 2.1.2; Megatron-Core MLA keeps the two
            # down-projections and their norms duplicated across TP.
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            a = self.num_attention_heads
            if self.q_lora_rank:
                out.append(ParameterTensor("q_down_proj", (self.q_lora_rank, h), REPLICATED, "hidden_matrix"))
                out.append(ParameterTensor("q_down_norm", (self.q_lora_rank,), REPLICATED, "vector"))
                out.append(ParameterTensor("q_up_proj", (a * qk_head, self.q_lora_rank), COLUMN, "hidden_matrix"))
            else:
                out.append(ParameterTensor("q_proj", (a * qk_head, h), COLUMN, "hidden_matrix"))
            out.append(ParameterTensor("kv_down_proj", (self.kv_lora_rank + self.qk_rope_head_dim, h), REPLICATED, "hidden_matrix"))
            out.append(ParameterTensor("kv_down_norm", (self.kv_lora_rank,), REPLICATED, "vector"))
            out.append(ParameterTensor(
                "kv_up_proj", (a * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank), COLUMN, "hidden_matrix"))
        else:
            # Qwen3-Next's gated attention: q_proj also gives the output gate (Qwen3NextAttention.__init__)
            gate = 2 if self.attention_output_gate else 1
            out.append(ParameterTensor("q_proj", (gate * self.q_width, h), COLUMN, "hidden_matrix"))
            out.append(ParameterTensor("k_proj", (self.kv_width, h), COLUMN, "hidden_matrix"))
            out.append(ParameterTensor("v_proj", (self.kv_width, h), COLUMN, "hidden_matrix"))
            if b or self.qkv_bias:
                out.append(ParameterTensor("qkv_bias", (self.q_width + 2 * self.kv_width,), COLUMN, "vector"))
            if self.qk_norm:
                if self.qk_norm_full_width:  # OLMo-2: RMSNorm over all of q and all of k
                    out.append(ParameterTensor("q_norm", (self.q_width,), COLUMN, "vector"))
                    out.append(ParameterTensor("k_norm", (self.kv_width,), COLUMN, "vector"))
                else:  # Qwen3/Gemma-3: one RMSNorm of width d_head shared by all heads
                    out.append(ParameterTensor("qk_norm", (2 * self.head_dim,), REPLICATED, "vector"))
        out.append(ParameterTensor("o_proj", (h, self.attention_output_width), ROW, "hidden_matrix"))
        if self.uses_sparse_attention:
            out += _sparse.indexer_tensors(self)
        if b:
            out.append(ParameterTensor("o_bias", (h,), REPLICATED, "vector"))
        if self.attention_sinks:
            out.append(ParameterTensor("attention_sinks", (self.num_attention_heads,), COLUMN, "vector"))
        return out

    def _mlp_tensors(self, width: int, prefix: str, column: str, row: str, copies: int = 1) -> list[ParameterTensor]:
        """A gated MLP has gate and up (fc1, 2 x width) and down (fc2); a plain one fc1 and fc2."""
        h = self.hidden_size
        fc1_rows = 2 * width if self.gated_mlp else width
        out = [
            ParameterTensor(f"{prefix}fc1", (fc1_rows, h), column, "hidden_matrix", copies),
            ParameterTensor(f"{prefix}fc2", (h, width), row, "hidden_matrix", copies),
        ]
        if self.linear_bias:
            out.append(ParameterTensor(f"{prefix}fc1_bias", (fc1_rows,), column, "vector", copies))
            out.append(ParameterTensor(f"{prefix}fc2_bias", (h,), REPLICATED if row == ROW else row, "vector", copies))
        return out

    def norm_tensors(self, count: int, prefix: str = "") -> list[ParameterTensor]:
        per_norm = 2 if self.norm == "layernorm" else 1  # LayerNorm has a bias, RMSNorm does not
        return [ParameterTensor(f"{prefix}norm", (self.hidden_size,), REPLICATED, "vector", count * per_norm)]

    def layer_tensors(self, kind: str) -> list[ParameterTensor]:
        """The weights of one layer of the given kind (`kind_counts`): its token mixer, its norms (a
        pattern's block has one), its MLP or MoE."""
        out = self.mixer_tensors(_hybrid.MIXER[kind])
        out += self.norm_tensors(1 if _hybrid.is_block(kind) else self.norms_per_layer)
        ffn = _hybrid.FFN[kind]
        if ffn == "dense":
            out += self._mlp_tensors(self.intermediate_size, "", COLUMN, ROW)
        elif ffn == "moe":
            out += self.moe_tensors()
        return out

    def mixer_tensors(self, mixer: str | None) -> list[ParameterTensor]:
        if mixer == "attention":
            return self.attention_tensors()
        if mixer == "linear_attention":
            return _hybrid.gated_delta_net_tensors(self.hidden_size, self.linear_num_key_heads,
                                                   self.linear_num_value_heads, self.linear_key_head_dim,
                                                   self.linear_value_head_dim, self.linear_conv_kernel_dim)
        if mixer == "attention_mamba":  # Falcon-H1: both mixers in one layer
            return self.attention_tensors() + self.mixer_tensors("mamba")
        if mixer == "mamba":
            return _hybrid.mamba_tensors(self.hidden_size, self.mamba_num_heads, self.mamba_head_dim,
                                         self.mamba_state_size, self.mamba_num_groups, self.mamba_conv_kernel,
                                         self.mamba_conv_bias, self.mamba_gated_norm)
        if mixer == "mamba1":
            return _hybrid.mamba1_tensors(self.hidden_size, self.mamba_expand * self.hidden_size, self.mamba_state_size,
                                          self.mamba_dt_rank, self.mamba_conv_kernel, self.mamba_conv_bias)
        return []

    def moe_tensors(self) -> list[ParameterTensor]:
        """Router, routed experts and shared experts of one MoE layer."""
        out: list[ParameterTensor] = []
        e, h = self.num_experts, self.hidden_size
        out.append(ParameterTensor("router", (e, h), REPLICATED, "hidden_matrix"))
        if self.linear_bias or self.router_bias:
            out.append(ParameterTensor("router_bias", (e,), REPLICATED, "vector"))
        out += self._mlp_tensors(self.moe_intermediate_size, "expert_", EXPERT_COLUMN, EXPERT_ROW, copies=e)
        if self.num_shared_experts:
            width = self.shared_expert_intermediate_size * self.num_shared_experts
            out += self._mlp_tensors(width, "shared_expert_", COLUMN, ROW)
            if self.shared_expert_gate:
                out.append(ParameterTensor("shared_expert_gate", (1, h), REPLICATED, "hidden_matrix"))
        return out

    def vision_tensors(self) -> list[ParameterTensor]:
        """The vision tower and its projector (none for a text-only model), on the first stage."""
        return _vision.vision_tensors(self)

    def embedding_tensors(self, padded_vocab: int | None = None) -> list[ParameterTensor]:
        v = padded_vocab or self.vocab_size
        out = [ParameterTensor("embedding", (v, self.hidden_size), VOCAB, "embedding")]
        if self.position_embedding == "learned":
            # Megatron keeps the learned position table replicated across TP
            out.append(ParameterTensor("position_embedding", (self.max_position_embeddings, self.hidden_size), REPLICATED, "embedding"))
        return out

    def head_tensors(self, padded_vocab: int | None = None) -> list[ParameterTensor]:
        """Final norm and, unless tied, the LM head."""
        out = self.norm_tensors(1, "final_")
        if not self.tie_embeddings:
            out.append(ParameterTensor("lm_head", (padded_vocab or self.vocab_size, self.hidden_size), VOCAB, "head"))
        return out

    def mtp_tensors(self) -> list[ParameterTensor]:
        """One multi-token-prediction module (DeepSeek-V3, arXiv 2412.19437 section 2.2): two
        norms, a 2h -> h projection and a transformer layer of the last layer's kind. The
        embedding and head are shared with the main model in training."""
        h = self.hidden_size
        kind = self.layer_kind(self.num_layers - 1)
        return (self.norm_tensors(3, "mtp_")
                + [ParameterTensor("mtp_proj", (h, 2 * h), REPLICATED, "hidden_matrix")]
                + self.layer_tensors(kind))


def count(tensors: list[ParameterTensor], experts_only: bool | None = None) -> int:
    return sum(t.numel for t in tensors if experts_only is None or t.is_expert == experts_only)


@dataclass(frozen=True)
class ParameterCounts:
    total: int  # every stored parameter, as the checkpoint counts them (no vocabulary padding)
    active: int  # parameters used per token (top-k of the routed experts)
    embedding: int
    per_layer: dict[str, int] = field(default_factory=dict)


def parameter_counts(arch: Architecture, include_mtp: bool = True) -> ParameterCounts:
    """Exact counts, computed once per architecture object."""
    return arch.cached(("parameter counts", include_mtp), lambda: _parameter_counts(arch, include_mtp))


def _parameter_counts(arch: Architecture, include_mtp: bool) -> ParameterCounts:
    """Exact counts. The MTP modules are counted as the checkpoint stores them: DeepSeek-V3's
    checkpoint gives each its own copy of the embedding and head."""
    per_kind = {kind: count(arch.layer_tensors(kind)) for kind in arch.kinds}
    layers = sum(per_kind[kind] * n for kind, n in arch.kind_counts())
    embedding = count(arch.embedding_tensors())
    head = count(arch.head_tensors())
    total = layers + embedding + head + count(arch.vision_tensors())
    inactive = 0
    if arch.is_moe:
        per_expert = count(arch.layer_tensors("moe"), experts_only=True) // arch.num_experts
        inactive = arch.num_moe_layers * per_expert * (arch.num_experts - arch.num_experts_per_token)
    if include_mtp and arch.mtp_layers:
        mtp = count(arch.mtp_tensors()) + arch.vocab_size * arch.hidden_size * 2
        total += arch.mtp_layers * mtp
        if arch.is_moe_layer(arch.num_layers - 1):  # an MTP module's layer routes to top-k experts too
            inactive += arch.mtp_layers * per_expert * (arch.num_experts - arch.num_experts_per_token)
    return ParameterCounts(total=total, active=total - inactive, embedding=embedding, per_layer=per_kind)


ARCHITECTURE_FIELDS = tuple(f.name for f in fields(Architecture))
