"""What an adapter run saves for backward: the adapters' own tensors (LoRA's dropout and low-rank
inputs, DoRA's norms), what the frozen base no longer keeps, and bitsandbytes' 4-bit inputs.
"""

from __future__ import annotations

from ..spec.adapter import Adapter, bnb_keeps_input
from .adapters import Module, adapted, adapted_modules, adapter_dtype, layer_modules


# --- activations --------------------------------------------------------------------------------

def reads_input_directly(training) -> bool:
    """``lora_A`` reads the module's own input (no fp32 cast, no dropout), which then stays saved
    for it: adapters in the compute dtype (torchtune's bf16 LoRA) without dropout."""
    from ..spec.dtypes import bytes_per_element
    from ..spec.training import resolve_recipe
    A = adapter_dtype(training, resolve_recipe(training))
    return bytes_per_element(A) == bytes_per_element(training.compute_dtype) and not training.adapter.dropout


def trainable_weights(training, arch) -> frozenset[str]:
    """The weights whose gradients an adapter run computes, by the names `activations.Entry.for_weights`
    uses: the embedding and head copies when trained, and the adapted modules when their adapters
    read the module's input as it is."""
    adapter = training.adapter
    names = {"embedding", "head"} if adapter.trainable_embeddings else set()
    if reads_input_directly(training):
        names |= {m.name for k in arch.kinds for m in adapted_modules(adapter, arch, k)}
    from .fsdp1 import frozen_weights_train
    if frozen_weights_train(training):  # a layer's weights share its FSDP1 FlatParameter with adapters (fsdp1.py)
        names |= {m.name for k in arch.kinds for m in layer_modules(arch, k)} | {"norm"}
    return frozenset(names)


def kept(entries: list, training, arch, inputs_kept: frozenset[str] = frozenset()) -> list:
    """The tensors a run keeps: without an adapter, all; with one, not those saved only for the
    gradients of frozen weights, unless the frozen layer keeps its input itself (`inputs_kept`)."""
    if training.adapter is None:
        return entries
    trainable = trainable_weights(training, arch) | inputs_kept
    return [e for e in entries if not e.for_weights or any(w in trainable for w in e.for_weights)]


# the order of a layer's linears: an input needs a gradient when an adapted module comes before it
_LAYER_ORDER = (("q", "k", "v"), ("o",), ("gate", "up", "router"), ("down",))


def bnb_kept_inputs(training, arch, kind: str, first: bool) -> frozenset[str]:
    """The 4-bit linears of a layer whose MatMul4Bit keeps its input (bitsandbytes through 0.43.1,
    `bnb_keeps_input`): every one whose input or weight needs a gradient (``any(needs_input_grad[:2])``).
    The weights are frozen, so in the first layer of a run whose embeddings need no gradient
    (`first`), only those after an adapted module of the layer."""
    if not bnb_keeps_input(training):
        return frozenset()
    adapter = training.adapter
    names = {m.name for m in layer_modules(arch, kind) if m.name != "experts"}  # fused experts stay 16-bit
    if not first:
        return frozenset(names)
    out: set[str] = set()
    upstream = False
    for group in _LAYER_ORDER:
        if upstream:
            out |= names & set(group)
        upstream = upstream or any(adapted(adapter, n) for n in group if n in names)
    return frozenset(out)


def first_layer_input_frozen(training) -> bool:
    """The first layer's input needs no gradient: the embeddings are frozen and nothing makes them
    require grad (the HF Trainer calls enable_input_require_grads when it checkpoints)."""
    adapter = training.adapter
    return (adapter is not None and not adapter.trainable_embeddings and training.recompute == "none"
            and training.mode == "training")


def attention_input_adapted(adapter: Adapter, arch) -> bool:
    return any(adapted(adapter, name) for name in ("q", "k", "v"))


MATMUL_SAVES_SOURCE = ("torch 2.13 tools/autograd/derivatives.yaml, bmm: self's gradient reads mat2, mat2's reads "
                       "self, and the generated node saves each only where that gradient is computed "
                       "(should_compute_output); transformers 5.23 eager_attention_forward: "
                       "matmul(query, key_states^T), then matmul(attn_weights, value_states); measured: "
                       "tests/data/measured/peft/llama-3.2-1b-lora-r16-qv-norecompute-drop00-s8192-b1-eager")


def first_layer_matmul_inputs(entries: list, training, arch) -> list:
    """The unfused attention core of the first layer with a frozen input (MATMUL_SAVES_SOURCE): a matmul
    keeps each input only for the other's gradient, and there q, k and v need one only where their own
    projection is adapted. So QK^T keeps q only where k is adapted and k only where q is; where neither
    is, the scores need no gradient: scores x V keeps no v, and the ops between (the soft-capping tanh, the
    fp32 softmax beside its 16-bit copy, the dropout's mask) keep nothing for their own backward. Only
    where transformers' eager attention or SDPA's math backend (a composite of matmuls) runs: the SDPA
    kernels' nodes save q, k and v together whenever any of them needs a gradient (torch 2.13, checked:
    BmmBackward0's saved self is None where mat2 needs no gradient; ScaledDotProductFlashAttentionForCpuBackward0
    saves query, key and value with only q needing one; the SDPA record peft/llama-3.1-8b-lora-r16-qv-
    norecompute-drop00-s4096-b1 holds with the first layer's q kept)."""
    from .activations.attention import QK_T_INPUTS
    from .activations.entries import compiled
    from .activations.llama4 import TRANSFORMERS_FRAMEWORKS
    if training.framework not in TRANSFORMERS_FRAMEWORKS or compiled(training):
        return entries
    q, k = (adapted(training.adapter, name) for name in ("q", "k"))
    if q and k:
        return entries
    if not (q or k):
        gone = _scores_gradient_only(entries)
        return [e for e in entries if e.name not in gone]
    kept_one = "k (keys expanded to all heads)" if q else "q"
    return [e._replace(name=f"{kept_one} for QK^T (the other input needs no gradient)", elements=e.elements / 2,
                       formula="B*s*b*a*d_head", tensors=1) if e.name == QK_T_INPUTS else e for e in entries]


def _scores_gradient_only(entries: list) -> set[str]:
    """The core's tensors kept only for the gradient of the QK^T scores: its inputs, v (read by the
    probabilities' gradient), the tanh's output, the dropout's mask, and the eager fp32 softmax output
    where a 16-bit copy of it feeds scores x V (else that one tensor is scores x V's input)."""
    from .activations.attention import (DROPOUT_MASK, EAGER_SOFTMAX_FP32, QK_T_INPUTS, SCORES_V_INPUT,
                                        SOFTCAP_OUTPUT, SOFTMAX_CAST)
    names = {e.name for e in entries}
    return {QK_T_INPUTS, SCORES_V_INPUT, SOFTCAP_OUTPUT, DROPOUT_MASK} | (
        {EAGER_SOFTMAX_FP32} if SOFTMAX_CAST in names else set())


FIRST_LAYER_SOURCE = ("torch 2.13 autograd: an op none of whose inputs requires grad records no node and keeps nothing "
                      "(a frozen weight, a frozen embedding's output); transformers 5.23 LlamaDecoderLayer.forward: "
                      "norm, q/k/v, core, o, residual add, norm, gate/up, act x up, down, residual add; peft 0.21 "
                      "tuners/lora/layer.py Linear.forward: base_layer(x) + lora_B(lora_A(dropout(x))) x scaling; "
                      "measured: tests/data/measured/peft/llama-3.2-1b-lora-r16-gateupdown-norecompute-*")


def first_layer_kept(entries: list, arch, training, par, kind: str) -> list:
    """The first layer with a frozen input (FIRST_LAYER_SOURCE): a tensor is kept only where an adapted module
    upstream in the layer makes an op's input need a gradient. Its attention norm keeps nothing; with q, k or v
    adapted the unfused core keeps the inputs some gradient reads (`first_layer_matmul_inputs`); with all three
    frozen the core keeps nothing, nor o's input unless o's adapter reads it as it is; with the whole attention
    frozen the residual stream after it needs no gradient, so the MLP norm keeps nothing, and a dense MLP's
    activation tensors are kept only where gate or up is adapted (a MoE block's are counted as in any layer:
    not measured); a post-MLP norm and the residual dropout mask only where something in the layer is adapted.
    Entries saved for a weight (`Entry.for_weights`) are `kept`'s to decide. A hybrid layer drops its attention
    norm and matmul inputs only, where q, k or v is adapted."""
    from .activations.attention import (RESIDUAL_DROPOUT_MASK, attention_entries, attention_output_entries)
    from .activations.entries import ATTENTION_OUTPUT, _norm, tokens_per_gpu
    from .activations.mlp import mlp_entries, mlp_tail_entries
    adapter, T = training.adapter, tokens_per_gpu(training, par)
    qkv, o = attention_input_adapted(adapter, arch), adapted(adapter, "o")
    gone = _names(_norm("attention norm input", T, arch, training))
    if qkv or arch.is_hybrid:
        out = [e for e in entries if e.name not in gone]
        return first_layer_matmul_inputs(out, training, arch) if qkv else entries
    after_core = _names(attention_output_entries(arch, training, par))
    spared = (_names(_norm("post-attention norm input", T, arch, training)) | {RESIDUAL_DROPOUT_MASK}) if o else set()
    if o and reads_input_directly(training):
        spared.add(ATTENTION_OUTPUT)
    gone |= (_names(attention_entries(arch, training, par)) - after_core) | (after_core - spared)
    tail = _names(mlp_tail_entries(arch, training, T))
    if not o:
        gone |= _names(_norm("MLP norm input", T, arch, training))
        if kind == "dense" and not (adapted(adapter, "gate") or adapted(adapter, "up")):
            gone |= {e.name for e in mlp_entries(arch, training, par, kind) if not e.for_weights} - tail
        if not any(adapted(adapter, m.name) for m in layer_modules(arch, kind)):
            gone |= tail
    return [e for e in entries if e.name not in gone]


def _names(entries: list) -> set[str]:
    return {e.name for e in entries}


def module_entries(arch, training, par, m: Module, first: bool) -> list:
    """What one adapted module keeps for its backward: ``lora_A``'s input (the fp32 cast, or the
    dropout output and its mask) and ``lora_B``'s input, the r-wide output of ``lora_A``."""
    from .activations.entries import Entry, tokens_per_gpu
    from ..spec.dtypes import bytes_per_element
    from ..spec.training import resolve_recipe
    from .trainer_loop import adapter_entries, autocast_adapters
    adapter = training.adapter
    if autocast_adapters(training):  # the HF Trainer's autocast over fp32 adapters (trainer_loop.py)
        out = adapter_entries(training, par, m, first)
        C = bytes_per_element(training.compute_dtype)
        return out + (dora_entries(training, m, C, tokens_per_gpu(training, par), first)
                      if adapter.method == "dora" else [])
    dtype = adapter_dtype(training, resolve_recipe(training))
    A, T, n = bytes_per_element(dtype), tokens_per_gpu(training, par), m.copies
    width = f"in_{m.name}" + (f"*{n}" if n > 1 else "")
    out = []
    if adapter.dropout:
        out.append(Entry(f"{m.name} adapter: dropout output ({dtype}, lora_A input)", T * m.in_features * n, A, "none",
                         f"{A:g}*s*b*{width}"))
        # no mask where the input needs no gradient: the first layer's q, k, v with frozen embeddings
        if not (first and m.name in ("q", "k", "v")):
            out.append(Entry(f"{m.name} adapter: dropout mask", T * m.in_features * n, 1, "none", f"s*b*{width}"))
    elif not reads_input_directly(training):
        out.append(Entry(f"{m.name} adapter: input cast to {dtype} (lora_A input)", T * m.in_features * n, A, "none",
                         f"{A:g}*s*b*{width}"))
    r = adapter.rank * m.rank_factor
    out.append(Entry(f"{m.name} adapter: lora_A output (lora_B input)", T * r * n, A, "none",
                     f"{A:g}*s*b*r" + (f"*{n}" if n > 1 else "")))
    if adapter.method == "dora":
        out += dora_entries(training, m, A, T, first)
    return out


DORA_SOURCE = ("Liu et al. 2024 (DoRA); peft 0.21 tuners/lora/dora.py DoraLinearLayer.forward: (m/||W + BA|| - 1) x "
               "base_result + m/||W + BA|| x lora_B(lora_A(x)) x scaling, the norm detached; measured in "
               "tests/data/measured/peft")


def dora_entries(training, m: Module, A: float, T: float, first: bool) -> list:
    """DoRA scales the base output and the adapter output by m / ||W + BA||: both products keep
    their out-wide input for the magnitude's gradient, with the norm, the scale and scale - 1 (fp32
    vectors). With adapter dropout PEFT recomputes the base output from the dropped-out fp32 input,
    F.linear(x, W.to(fp32)), which keeps that fp32 copy of the weight for the input's gradient
    (none where the input needs no gradient)."""
    from .activations.entries import Entry
    from ..spec.dtypes import bytes_per_element
    n, o = m.copies, m.out_features
    B = A if training.adapter.dropout else bytes_per_element(training.compute_dtype)
    out = [Entry(f"{m.name} DoRA: base output (magnitude gradient)", T * o * n, B, "none", f"{B:g}*s*b*out"),
           Entry(f"{m.name} DoRA: adapter output (magnitude gradient)", T * o * n, A, "none", f"{A:g}*s*b*out"),
           Entry(f"{m.name} DoRA: norm, scale and scale - 1 (fp32)", 3 * o * n, 4, "none", "3*4*out",
                 split_by_cp=False)]
    if training.adapter.dropout and not (first and m.name in ("q", "k", "v")):
        out.append(Entry(f"{m.name} DoRA: fp32 copy of the base weight (F.linear input gradient)",
                         o * m.in_features * n, A, "none", f"{A:g}*out*in", split_by_cp=False))
    return out


def bnb_held_entries(entries: list, training, arch, kind: str) -> list:
    """What a layer's 4-bit linears keep outside its checkpoint: bitsandbytes through 0.43.1 holds
    MatMul4Bit's input A in ``ctx.tensors``, an attribute of the autograd node rather than a tensor
    saved with ``save_for_backward``, so non-reentrant checkpointing (the HF Trainer's
    gradient_checkpointing) cannot drop it: each checkpointed layer keeps the inputs of its 4-bit
    linears from forward until its backward (measured, tests/data/measured/peft/*-bnb0.43.1)."""
    from .activations.entries import ATTENTION_OUTPUT
    if training.recompute != "full" or not bnb_keeps_input(training):
        return []
    names = bnb_kept_inputs(training, arch, kind, first=False)
    return [e for e in entries if set(e.for_weights) & names or (e.name == ATTENTION_OUTPUT and "o" in names)]


def adapted_layer_entries(entries: list, arch, training, par, kind: str, first: bool = False) -> list:
    """A layer's full-fine-tuning ledger as an adapter run keeps it: without what frozen weights'
    gradients alone would read, with what each adapted module keeps. `first`: the first layer with
    a frozen input (`first_layer_input_frozen`), which keeps only what follows an adapted module
    (`first_layer_kept`)."""
    from .fsdp1 import frozen_weights_train
    first = first and not frozen_weights_train(training)  # FSDP1: every weight of the layer takes a gradient
    out = kept(entries, training, arch, bnb_kept_inputs(training, arch, kind, first))
    if first:
        out = first_layer_kept(out, arch, training, par, kind)
    for m in adapted_modules(training.adapter, arch, kind):
        out += module_entries(arch, training, par, m, first)
    return out + gptq_dequantized(arch, training, par, kind, first)


GPTQ_SOURCE = ("auto-gptq v0.4.2 and v0.5.1 nn_modules/qlinear/qlinear_cuda_old.py QuantLinear.forward (the QuantLinear "
               "of desc_act False with the exllama kernels disabled: import_utils dynamically_import_QuantLinear): from "
               "kernel_switch_threshold (128) rows on, qweight and qzeros are unpacked in torch ops and the product is "
               "torch.matmul(x, weight) on the fp16 weight (v0.4.2 l. 269, v0.5.1 l. 273), which autograd keeps for the "
               "input's gradient")
GPTQ_ROWS = 128  # qlinear_cuda_old.py QuantLinear(kernel_switch_threshold=128)


def gptq_dequantized(arch, training, par, kind: str, first: bool) -> list:
    """A GPTQ int4 base (adapter base_dtype int4) under auto-gptq's cuda-old QuantLinear (GPTQ_SOURCE): each linear of
    the layer keeps its weight dequantized to fp16 (in x out x 2 B, whatever the tokens) from its forward to its
    backward, where its input needs a gradient (not the first layer's q, k, v under frozen embeddings). Below 128 rows
    the CUDA kernel runs instead (no autograd node through the base)."""
    from ..spec.adapter import base_dtype
    from .activations.entries import Entry, tokens_per_gpu
    adapter = training.adapter
    if base_dtype(adapter, training.param_dtype) != "int4" or tokens_per_gpu(training, par) < GPTQ_ROWS:
        return []
    return [Entry(f"{m.name}: GPTQ weight dequantized to fp16, kept by torch.matmul for the input's gradient",
                  m.in_features * m.out_features * m.copies, 2, "none", "2*in*out", split_by_cp=False)
            for m in layer_modules(arch, kind) if m.name != "experts" and not (first and m.name in ("q", "k", "v"))]
