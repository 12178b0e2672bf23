"""The parameter tensors the allocator replay (reserved.py) allocates, one per module parameter in module
order, with what each costs: its stored bytes, its gradient's bytes (none for a frozen one) and the
elements the optimizer keeps state for.

A full fine-tune trains every tensor in the weights' dtype. An adapter fine-tune (peft's LoRA, DoRA, and
QLoRA over bitsandbytes' 4-bit layers, under the HF Trainer) keeps the base frozen: no gradient, no state;
each adapted linear gets its A and B (and DoRA's magnitude) beside it, as peft's tuner layer holds them
(peft tuners/lora/layer.py: `base_layer`, then `lora_A`, `lora_B`, `lora_magnitude_vector`), in the
adapters' dtype (adapters.adapter_dtype), with gradients of that dtype (torch: a gradient takes its
tensor's dtype); trainable copies of the embedding and head (peft's `modules_to_save`) sit beside their
frozen originals (ModulesToSaveWrapper keeps both).
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.dtypes import bytes_per_element


class Tensor(NamedTuple):
    elements: float
    stored: float  # bytes on the device
    grad: float  # bytes of its gradient; 0: frozen (no gradient, no optimizer state)
    matrix: bool = False  # a layer's weight matrix (autocast copies it for the compute)
    # used before the attention's core (q, k, v, their biases and norms, the attention's input norm, their
    # adapters): its gradient comes after the core's backward (reserved_layers.backward)
    before_core: bool = False


class Tensors(NamedTuple):
    """The stage's parameter tensors: the embedding's, each layer's, the head's (final norm included)."""

    embedding: list[Tensor]
    layers: list[list[Tensor]]
    head: list[Tensor]

    def order(self) -> list[Tensor]:
        return self.embedding + [t for layer in self.layers for t in layer] + self.head


def _split(t, gated: bool) -> list[tuple[float, bool]]:
    """One `ParameterTensor` as the module's parameters: a gated MLP's fc1 is transformers' gate_proj and
    up_proj (LlamaMLP), a norm count one scale per norm module; experts stay one fused tensor
    (transformers 5's MoE experts hold 3-D parameters)."""
    matrix = t.role == "hidden_matrix"
    if gated and t.name.endswith("fc1") and not t.is_expert and t.copies == 1:
        half = t.numel / 2
        return [(half, matrix), (half, matrix)]
    if t.role == "vector" and t.copies > 1:
        return [(t.numel / t.copies, False)] * t.copies
    return [(float(t.numel), matrix)]


# q, k and v as one module parameter where the model has one fused linear (architecture.fused_qkv): transformers
# 5.17.0's Phi3Attention.qkv_proj, GPTNeoXAttention.query_key_value, FalconAttention.query_key_value, GPT-2's
# c_attn (Conv1D of 3 x hidden), Qwen-1's c_attn: one weight, one gradient, one AdamW state of each (the H200 run of
# 2026-11-27: Pythia-1.4B's replayed reserved peak -10.7% with three tensors, -0.5% with one)
_QKV = ("q_proj", "k_proj", "v_proj")


def _layer_pieces(arch, kind: str) -> list[tuple[float, bool, bool]]:
    """A layer's parameters as `_split` gives them, q, k and v joined where the model fuses them, each with
    whether it is used before the attention's core (`Tensor.before_core`): the attention's tensors listed before
    its output projection (Architecture.attention_tensors) and the layer's first norm (its input norm)."""
    out, fused, core = [], 0.0, False
    for t in arch.layer_tensors(kind):
        core = core or t.name == "o_proj"
        if arch.fused_qkv and t.name in _QKV:
            fused += t.numel
            if t.name == _QKV[-1]:
                out.append((fused, True, True))
            continue
        pieces = _split(t, arch.gated_mlp)
        first_norm = t.role == "vector" and t.name == "norm"
        out += [(n, matrix, not core or (first_norm and k == 0)) for k, (n, matrix) in enumerate(pieces)]
    return out


def tensors(cfg, sp) -> Tensors:
    """The parameter tensors of stage `sp` under the resolved configuration `cfg`."""
    arch = cfg.architecture
    kinds = arch.layer_kinds()
    rule = _Full(cfg) if cfg.training.adapter is None else _Adapter(cfg, sp)
    by_kind = {kind: rule.layer(kind, _layer_pieces(arch, kind)) for kind in {kinds[i] for i in sp.layer_indices}}
    embedding = rule.ends(arch.embedding_tensors()) if sp.first else []
    head = rule.ends(arch.head_tensors()) if sp.last else []
    return Tensors(embedding, [by_kind[kinds[i]] for i in sp.layer_indices], head)


class _Full:
    """Every tensor trained, in the weights' dtype, its gradient in the gradients'."""

    def __init__(self, cfg):
        self.P = bytes_per_element(cfg.recipe.param_dtype)
        self.G = bytes_per_element(cfg.recipe.grad_dtype)
        self.gated = cfg.architecture.gated_mlp

    def layer(self, kind: str, pieces) -> list[Tensor]:
        return [Tensor(n, n * self.P, n * self.G, matrix, before) for n, matrix, before in pieces]

    def ends(self, params) -> list[Tensor]:
        return self.layer("", [(n, matrix, False) for t in params for n, matrix in _split(t, self.gated)])


class _Adapter:
    """The base frozen in its storage dtype (a quantized matrix: its storage with its scales, spread over
    its elements, as adapters.inventory counts them; the rest in the weights' dtype, fp32 after
    prepare_model_for_kbit_training), each layer's adapters after its weights, a trainable copy after the
    embedding and the head where they are trained (modules_to_save)."""

    def __init__(self, cfg, sp):
        from ..spec.adapter import base_dtype
        from ..spec.choices import QUANTIZED
        from .adapters import adapter_dtype, inventory, saved_copy_bytes
        arch, training, recipe = cfg.architecture, cfg.training, cfg.recipe
        self.arch, self.adapter = arch, training.adapter
        base = base_dtype(self.adapter, recipe.param_dtype)
        self.rest = 4.0 if self.adapter.prepare_kbit else bytes_per_element(
            recipe.param_dtype if base in QUANTIZED else base)
        inv = inventory(arch, training, recipe, sp)
        quantized = inv.frozen_bytes - self.rest * (inv.frozen - inv.quantized)
        self.quantized = quantized / inv.quantized if inv.quantized else self.rest
        self.dequantized = bool(inv.quantized)  # its matrices dequantized by their own layers
        self.A = bytes_per_element(adapter_dtype(training, recipe))
        self.S = saved_copy_bytes(training, recipe)

    def layer(self, kind: str, pieces) -> list[Tensor]:
        from .adapters import adapted_modules, module_matrices
        # a quantized matrix is dequantized by its own layer: no autocast copy of it is kept
        copied = not self.dequantized
        frozen = [Tensor(n, (self.quantized if matrix else self.rest) * n, 0.0, matrix and copied, before)
                  for n, matrix, before in pieces]
        A = self.A
        return frozen + [Tensor(rows * cols, A * rows * cols, A * rows * cols, before_core=m.name in ("q", "k", "v"))
                         for m in adapted_modules(self.adapter, self.arch, kind)
                         for rows, cols in module_matrices(self.adapter, m)]

    def ends(self, params) -> list[Tensor]:
        out = []
        for t in params:
            out += [Tensor(n, self.rest * n, 0.0) for n, _ in _split(t, self.arch.gated_mlp)]
            if self.adapter.trainable_embeddings and t.role in ("embedding", "head"):
                out.append(Tensor(t.numel, self.S * t.numel, self.S * t.numel))
        return out
