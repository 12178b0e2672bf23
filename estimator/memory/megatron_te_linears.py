"""TransformerEngine's linear layers in a Megatron-Core layer as the Megatron replay's requests (megatron_cp_a2a.py's
layers): what their forward and backward allocate beyond the tensors they keep, with and without sequence
parallelism.

Megatron-Core's TE spec (gpt_layer_specs.py) runs a layer's QKV and fc1 as TELayerNormColumnParallelLinear (TE
LayerNormLinear: the norm fused in) and its output projection and fc2 as TERowParallelLinear (TE Linear). In
TransformerEngine v2.11 (transformer_engine/pytorch/module/layernorm_linear.py, linear.py, base.py), bf16, no
userbuffers, gradient-accumulation fusion (the weight gradient written into main_grad):
- LayerNormLinear forward: the norm's output (kept, this rank's tokens), under sequence parallelism all-gathered over
  TP into a new [s, h] tensor (`gather_along_first_dim`), the GEMM's output, the gathered input dropped as forward
  returns;
- Linear (row-parallel) forward: the GEMM's [s, h] output, under sequence parallelism reduce-scattered into a new
  [s/t, h] tensor and dropped; Megatron's bias-dropout-add (dropout 0: the tensor itself) adds the residual into a new
  tensor, and the row output dies;
- Linear backward (`_Linear.backward`): the output gradient all-gathered under sequence parallelism
  (`grad_output_preprocess`, row-parallel), the input gradient's GEMM, the weight gradient into main_grad, the
  gathered gradient freed (`clear_tensor_data(grad_output)`); the node's saved input freed by autograd as it returns;
- LayerNormLinear backward (`_LayerNormLinear.backward`): the kept norm output all-gathered (async), the input
  gradient's GEMM ([s, h], `gemm_out`), under sequence parallelism its reduce-scatter (a new [s/t, h]); the weight
  gradient; the norm output and its gathered copy freed (`clear_tensor_data`); the norm's backward (`rmsnorm_bwd`)
  makes the layer input's gradient, the reduce-scatter's output dropped as `dgrad` is rebound, `gemm_out` as backward
  returns; autograd then frees the output gradient it was given and the saved norm input.
The residual's gradient, made by the final norm's backward, feeds both branches of every residual add (AddBackward
hands the same tensor to both); the LayerNormLinear's input gradient is then added into it in place (torch
csrc/autograd/input_buffer.cpp `accumulate`: `old_var.add_(var)` once the buffer holds the last reference), so one
such tensor lives from the head's backward to the embedding's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.dtypes import bytes_per_element
from .activations.entries import tokens_per_gpu

SOURCE = ("TransformerEngine v2.11 transformer_engine/pytorch/module/layernorm_linear.py (_LayerNormLinear forward, "
          "backward), linear.py (_Linear), base.py (grad_output_preprocess), attention/dot_product_attention/"
          "context_parallel.py (AttnFuncWithCPAndQKVOA2A); Megatron-Core 0.16.1 models/gpt/gpt_layer_specs.py (TE "
          "spec), transformer/attention.py, transformer/transformer_layer.py (bias-dropout-add); torch "
          "csrc/autograd/input_buffer.cpp (estimator/memory/megatron_cp_a2a.py, megatron_te_linears.py)")


@dataclass(frozen=True)
class Linears:
    """The bytes of a layer's hidden states on this GPU: `full`, the CP rank's whole sequence ([s, h], what TP's
    GEMMs read or write), and `local`, what a rank keeps between them (`full` / tp under sequence parallelism);
    `tp`, the TP ranks; `gathers`: sequence parallelism over more than one of them."""
    full: float
    local: float
    tp: int
    gathers: bool


def linears(cfg) -> Linears:
    par, training = cfg.parallel, cfg.training
    full = tokens_per_gpu(training, par) * cfg.architecture.hidden_size * bytes_per_element(training.compute_dtype)
    gathers = par.sequence_parallel and par.tp > 1
    return Linears(full, full / par.tp if gathers else full, par.tp, gathers)


def column_forward(program, lin: Linears, norm_output: float, output: float) -> tuple:
    """LayerNormLinear's forward: (the norm's output, the GEMM's output), both kept."""
    kept = program.alloc(norm_output)
    gathered = program.alloc(lin.full) if lin.gathers else None
    out = program.alloc(output)
    program.free(gathered)
    return kept, out


def row_forward(program, lin: Linears):
    """The row-parallel Linear's forward: its output (reduce-scattered under sequence parallelism), which the
    residual add consumes (the caller frees it once the sum exists)."""
    out = program.alloc(lin.full)
    if not lin.gathers:
        return out
    scattered = program.alloc(lin.local)
    program.free(out)
    return scattered


def row_backward(program, lin: Linears, input_bytes: float, weight_gradient):
    """The row-parallel Linear's backward up to its return: the input's gradient (`input_bytes`), returned."""
    gathered = program.alloc(lin.full) if lin.gathers else None
    grad = program.alloc(input_bytes)
    weight_gradient()
    program.free(gathered)
    return grad


def column_backward(program, lin: Linears, norm_output, norm_input, output_grad, weight_gradient,
                    norm_gradient) -> None:
    """LayerNormLinear's backward: frees its kept norm output, the saved norm input and the output gradient it was
    given; the layer input's gradient it makes is added into the residual's in place (autograd's input buffer) and
    freed."""
    gathered = program.alloc(lin.full) if lin.gathers else None
    gemm_out = program.alloc(lin.full)
    scattered = program.alloc(lin.local) if lin.gathers else None
    weight_gradient()
    program.free(norm_output, gathered)
    grad = program.alloc(lin.local)  # rmsnorm_bwd
    program.free(scattered)
    norm_gradient()
    program.free(gemm_out, output_grad, norm_input, grad)


def embedding_forward(program, lin: Linears):
    """Megatron's embedding under sequence parallelism (tensor_parallel/layers.py VocabParallelEmbedding with
    reduce_scatter_embeddings; models/common/embeddings/language_model_embedding.py): the lookup over the CP rank's
    whole sequence, reduce-scattered into a new tensor, the lookup dropped; the embedding then clones it (the first
    layer's input). Returns the scattered tensor (freed once the clone exists), or None without the scatter (the
    lookup is the first layer's input)."""
    if not lin.gathers:
        return None
    lookup = program.alloc(lin.full)
    scattered = program.alloc(lin.local)
    program.free(lookup)
    return scattered


def embedding_backward(program, lin: Linears, weight_gradient) -> None:
    """The embedding's backward from the first layer's input gradient: under sequence parallelism that gradient
    all-gathered over TP (the reduce-scatter's backward, a new tensor); with TP the masked lookup's backward
    (`output_parallel[input_mask, :] = 0.0`: index_put's gradient, a new tensor); then the weight's gradient."""
    gathered = program.alloc(lin.full) if lin.gathers else None
    masked = program.alloc(lin.full) if lin.tp > 1 else None
    program.free(gathered)
    weight_gradient()
    program.free(masked)
