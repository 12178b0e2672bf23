"""Activations: what autograd keeps per layer and per micro-batch, tensor by tensor.

One module per block kind: `entries` (the ledger's entry and what every block shares),
`attention` (with MLA), `mlp`, `moe`, `loss`, then `recompute` (what recomputation drops) and
`layer` (a whole layer and the embedding).

The ledger follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, section 4): every tensor a layer saves for its backward
pass is one entry, with its size in bytes and whether tensor parallelism divides it. With their
GPT layer (LayerNorm, 4h GELU MLP, dropout, attention that materialises the scores) the entries
add up to their Table 2, s*b*h*(34 + 5*a*s/h). Modern layers change the entries, not the method:
flash attention keeps no s^2 scores, only a log-sum-exp of 4 bytes per query and head (Dao et
al. 2022); GQA keeps K and V at g/a of the query width; a gated MLP keeps two fc1 outputs.

Notation: s = sequence length, b = micro-batch, h = hidden, a = query heads, g = KV heads, f =
MLP width, t = TP, cp = CP, B = bytes of the compute dtype. An entry marked "sp" is divided by t
only with sequence parallelism (Korthikanti section 4.2.2); "tp" is divided by t always; "none" by
neither. Context parallelism splits every tensor that holds tokens along the sequence (Megatron-Core
context parallel docs). A formula is written before these divisions and shown with them, "/cp" and
"/t", exactly where this layout applies them (`Entry.shown_formula`). The framework decides which
kernels run:

- megatron: fused kernels (TransformerEngine/Apex norms save their input; the fused SwiGLU
  ``bias_swiglu_impl`` saves only fc1's output and recomputes the product; softmax in the
  compute dtype).
- hf / fsdp2 / deepspeed: the model's own PyTorch modules (transformers, torchtitan): norms
  upcast to fp32 and keep the fp32 copy; the gated MLP keeps gate, up, act(gate) and their
  product.

With fused kernels, the norms' per-token statistics (8 bytes per token per norm) are left out,
as Korthikanti do (below 0.01% of a layer); with PyTorch modules the fp32 rsqrt per token is
kept, as measured (tests/data/measured).
"""
