"""The registry's entries for details of transformers' modelling code that the Hugging Face reader sets
(estimator/models/hf_config.py): a model config's own dropout probabilities (Architecture's
attention_residual_dropout, mlp_residual_dropout, embedding_dropout: what the code drops out besides the attention
probabilities, which is training.dropout's), a fused q, k, v projection (fused_qkv), parallel attention and MLP
(parallel_attention), a GELU written in PyTorch ops (composite_gelu) and Falcon's broadcast keys and values
(eager_kv_broadcast), split copies (qkv_split_copies) and SDPA mask (sdpa_mask_always)."""

from __future__ import annotations

from .choices import PEFT_MOE_CONVERSIONS
from .field import Field

_WHERE = " Counted under hf, deepspeed, fsdp1 and hf_fsdp2 (transformers' modelling code); elsewhere training.dropout rules."
_MORE = "More"


def _p(name: str, label: str, help: str) -> Field:
    return Field(name, "model", "float", label, help + _WHERE, _MORE, min=0.0, max=1.0, below_max=True, step=0.05,
                 widget=False)


TRANSFORMERS_FIELDS: tuple[Field, ...] = (
    _p("attention_residual_dropout", "Attention residual dropout", "The model config's dropout on the attention "
       "output before its residual add (Phi-3 and GPT-2 resid_pdrop, GPT-NeoX hidden_dropout, StarCoder2 "
       "residual_dropout, Falcon without parallel attention attention_dropout); above 0 each layer keeps a bool mask "
       "per token and hidden unit."),
    _p("mlp_residual_dropout", "MLP residual dropout", "The model config's dropout on the MLP output before its "
       "residual add (the same keys; Falcon's hidden_dropout, once per layer); above 0 each layer keeps a bool mask."),
    Field("fused_qkv", "model", "bool", "Fused QKV", "One linear gives q, k and v: transformers' Phi-3 (qkv_proj), "
          "GPT-NeoX and Falcon (query_key_value), GPT-2 (c_attn, a Conv1D), Qwen-1's remote code (c_attn). A LoRA "
          "adapter on it is one lora_A (rank x hidden) and one lora_B ((q + 2 kv) x rank); q, k or v in the targets "
          "name it (peft's default targets for gpt2, gpt_neox and falcon). Under hf, deepspeed, fsdp1 and hf_fsdp2 with flash "
          "attention and RoPE v stays a view of its output and the rotary embedding makes new q and k, so the "
          "whole output is kept beside them (GPT-2's learned positions leave q, k and v views of it: the bytes of "
          "three projections; Falcon's split copies: qkv_split_copies), and the attention output, laid out as q, is "
          "copied for the output projection (transformers' layout; Qwen-1's remote code keeps (b, s, heads, d) and needs no copy: one "
          "layer's tokens x hidden more with recompute, not told apart).", _MORE, widget=False),
    Field("qkv_split_copies", "model", "bool", "Fused QKV split by copies", "transformers' Falcon, multi-query or "
          "new decoder architecture: k and v leave the fused QKV output by index lists (and the new architecture's q "
          "by a flatten), copies, so the output is not kept through v and the fused QKV's flash-attention rule (the "
          "whole output kept, the attention output copied) does not apply; its adapter rule does.", _MORE,
          widget=False),
    Field("qkv_split_expands_kv", "model", "bool", "Fused QKV split expands k, v", "transformers' Falcon with the "
          "new decoder architecture (Falcon-40B, -180B): the split copies k and v out to every query head, so "
          "flash attention (flash_attention_2; measured) keeps q, k and v a heads wide, 3 x tokens x heads x head "
          "dim, not the key/value groups' width, and eager attention multiplies by the copies.", _MORE,
          widget=False),
    Field("parallel_attention", "model", "bool", "Parallel attention and MLP", "GPT-NeoX (use_parallel_residual) "
          "and Falcon (parallel_attn, new_decoder_architecture): attention and MLP both read the layer input and the "
          "layer adds both to it, so the MLP's norm reads the tensor the attention's norm keeps (with one norm a layer, "
          "Falcon-7B's, the MLP reads the attention norm's output).", _MORE, widget=False),
    Field("partial_rotary_factor", "model", "float", "Rotary share of a head", "The share of each attention "
          "head's dimensions the rotary embedding turns: transformers' GPT-NeoX (rotary_pct, 0.25 by default) rotates "
          "that part of q and k and concatenates the rest back, its temporaries a quarter of q's and k's. Read by the "
          "allocator replay of the HF Trainer's step with a fused QKV projection (its forward's temporaries); the "
          "allocated peak does not depend on it.", _MORE, min=0.0, max=1.0, step=0.05,
          widget=False),
    Field("composite_gelu", "model", "bool", "GELU in PyTorch ops (gelu_new)", "transformers' NewGELUActivation "
          "(activation gelu_new, GPT-2's default): 0.5 x (1 + tanh(...)) written in PyTorch ops, whose autograd keeps "
          "three more MLP-wide tensors than one GELU kernel. Counted under hf, deepspeed, fsdp1 and hf_fsdp2.", _MORE,
          widget=False),
    Field("eager_kv_broadcast", "model", "bool", "Eager K/V broadcast", "transformers' multi-query Falcon: eager "
          "attention multiplies by the one key and value head through matmul's broadcasting, so it keeps them as they "
          "are, not copies expanded to every query head (repeat_kv). Counted under hf, deepspeed, fsdp1 and hf_fsdp2.", _MORE,
          widget=False),
    Field("sdpa_mask_always", "model", "bool", "Falcon's SDPA mask", "transformers' Falcon always builds a 4-D "
          "mask and hands it to SDPA (to add alibi), so under hf, deepspeed, fsdp1 and hf_fsdp2 its flash is transformers' "
          "SDPA with that mask: with one key/value head for many query heads (Falcon-7B's multi-query) no fused "
          "kernel takes the call and SDPA's math backend keeps fp32 q, k, v and the fp32 softmax (b x heads x s^2 x "
          "4 B a layer; measured); with equal head counts a fused kernel keeps the mask as a bias. Off: Falcon's "
          "flash is flash_attention_2 (flash-attn's kernel). Set for Falcon by the Hugging Face reader.", _MORE,
          widget=False),
    _p("embedding_dropout", "Embedding dropout", "The model config's dropout on the embeddings (GPT-2 embd_pdrop, "
       "GPT-NeoX hidden_dropout, StarCoder2 embedding_dropout); above 0 the first stage keeps a bool mask."),
    Field("peft_moe_conversion", "model", "choice", "peft's MoE conversion", "How peft 0.21.2 maps transformers "
          "v4 expert names onto transformers 5's fused expert parameters for this model type "
          "(utils/transformers_weight_conversion.py _convert_peft_config_moe): mixtral (Mixtral: w1, w2, w3; "
          "\"all-linear\" adapts the router and the fused experts), qwen2_moe (Qwen3-MoE, Qwen3-Next, DeepSeek: "
          "gate, up and down name the fused routed experts and leave the shared experts and dense MLPs unadapted, "
          "\"all-linear\" too), none (Llama 4, gpt-oss, Jamba, Qwen2-MoE: \"all-linear\" takes nn.Linear only, not "
          "the fused experts). Set from model_type by the Hugging Face reader.", _MORE, options=PEFT_MOE_CONVERSIONS,
          widget=False),
    Field("router_is_linear", "model", "bool", "Router is an nn.Linear", "The MoE router is an nn.Linear "
          "(transformers 5.23 Llama4Router), so \"all-linear\" adapts it without peft's MoE conversion.", _MORE,
          widget=False),
)
