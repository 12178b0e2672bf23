"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2-Exp): the lightning indexer's weights and checks.

Each MLA layer gains a lightning indexer that scores every earlier token for each query and keeps the
`index_topk` best; the MLA core then attends to those tokens only (DeepSeek-V3.2-Exp technical report,
section 2.1; reference code deepseek-ai/DeepSeek-V3.2-Exp inference/model.py class Indexer). Its weights,
as transformers 5.23 DeepseekV32Indexer.__init__ and the checkpoint (model.layers.N.self_attn.indexer.*)
hold them:

- wq_b (H_I x D_I, q_lora_rank): the index queries, from MLA's compressed query (hidden size when the
  model has no query compression: Megatron-Core 0.16.1 DSAIndexer.__init__);
- wk (D_I, h): one index key per token, shared by the index heads;
- k_norm: a LayerNorm of width D_I (weight and bias);
- weights_proj (H_I, h): a weight per index head and token (stored in bf16 in the checkpoint, kept in
  fp32 by the reference code and by transformers' _keep_in_fp32_modules).

Every framework replicates them over tensor parallelism (Megatron-Core 0.16.1 DSAIndexer: parallel_mode
"duplicated"; vLLM 0.11.0 models/deepseek_v2.py Indexer: ReplicatedLinear), so every rank picks the
same tokens.
"""

from __future__ import annotations

from .errors import ConfigError
from .tensors import REPLICATED, ParameterTensor

INDEXER_QUANT_BLOCK = 128  # vLLM 0.11.0 / SGLang 0.5.23: one fp32 scale per 128 fp8 index-key elements
INDEX_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


def indexer_tensors(arch) -> list[ParameterTensor]:
    """The lightning indexer of one attention layer (see the module docstring)."""
    heads, dim, h = arch.index_n_heads, arch.index_head_dim, arch.hidden_size
    q_in = arch.q_lora_rank or h
    return [ParameterTensor("indexer_wq_b", (heads * dim, q_in), REPLICATED, "hidden_matrix"),
            ParameterTensor("indexer_wk", (dim, h), REPLICATED, "hidden_matrix"),
            ParameterTensor("indexer_k_norm", (2 * dim,), REPLICATED, "vector"),
            ParameterTensor("indexer_weights_proj", (heads, h), REPLICATED, "hidden_matrix")]


def indexer_parameters(arch) -> int:
    """Parameters of one layer's indexer: H_I D_I q + D_I h + 2 D_I + H_I h."""
    return sum(t.numel for t in indexer_tensors(arch)) if arch.uses_sparse_attention else 0


def index_key_bytes(arch) -> int:
    """What the inference engines cache per token and layer for the indexer: the key in fp8 (D_I bytes)
    and one fp32 scale per 128 elements, D_I + D_I / 128 x 4 bytes (vLLM 0.11.0 models/deepseek_v2.py
    Indexer: DeepseekV32IndexerCache of head_dim index_head_dim + index_head_dim // quant_block_size * 4,
    uint8; SGLang 0.5.23 model_executor/pool_configurator.py _compute_dsa_indexer_cell_size, the same
    sum); 0 without sparse attention."""
    if not arch.uses_sparse_attention:
        return 0
    return arch.index_head_dim + arch.index_head_dim // INDEXER_QUANT_BLOCK * 4


def selected_keys(arch, seq_len: int) -> int:
    """Keys each query attends to: min(index_topk, sequence) (DSAIndexer.forward_with_scores
    topk_k = min(self.index_topk, seqlen); transformers DeepseekV32Indexer.forward the same)."""
    return min(arch.index_topk, seq_len)


def check_indexer(arch) -> None:
    """The three index fields come together, and only with MLA (the indexer reads MLA's compressed query)."""
    given = [name for name in INDEX_FIELDS if getattr(arch, name) is not None]
    if not given:
        return
    for name in INDEX_FIELDS:
        if getattr(arch, name) is None:
            raise ConfigError(f"model.{name}", None, "a positive integer",
                              f"required with sparse attention ({', '.join(given)} given)",
                              related=tuple(f"model.{g}" for g in given))
    if not arch.uses_mla:
        raise ConfigError("model.index_n_heads", arch.index_n_heads, "none without multi-head latent attention",
                          "DeepSeek Sparse Attention's indexer is built on MLA (set kv_lora_rank)",
                          related=("model.kv_lora_rank",))
    rope = arch.qk_rope_head_dim
    if arch.index_head_dim < rope or arch.index_head_dim % INDEXER_QUANT_BLOCK:
        raise ConfigError("model.index_head_dim", arch.index_head_dim,
                          f"a multiple of {INDEXER_QUANT_BLOCK} and at least qk_rope_head_dim ({rope})",
                          "the index key's first qk_rope_head_dim elements carry RoPE and the engines quantize it "
                          f"in blocks of {INDEXER_QUANT_BLOCK}", related=("model.qk_rope_head_dim",))
