"""CUDA's softmax-backward temporary, and the moment it joins where attention runs torch's softmax on the scores.

PyTorch's CUDA kernel for the softmax's backward (SOFTMAX_BACKWARD_SOURCE) first makes `tmp = grad * output`, a
copy of the output gradient's size and dtype, alive until the kernel has written the input's gradient; the CPU
and meta kernels make none. Where a layer's attention runs torch's softmax over its b x a x s x s scores
(transformers' eager attention; Megatron-Core's FusedScaleMaskSoftmax when its fused kernel is off or does not
apply), its backward holds one score tensor more than the ledger of a CPU run says:
- beside a recomputed layer (full recompute): the layer's backward runs inside that moment
  (`softmax_backward_temporary`; the HF harness's records of Llama-3.1-8B, Gemma-2-9B and Mixtral with
  recompute and eager attention grew by exactly this when it counted the temporary), alone where the recomputed
  layer's whole softmax backward (below) comes to nothing (short sequences: the tensors the layer's backward has
  freed by then outweigh the scores' three);
- without recompute, the last layer's softmax backward beside every kept activation (`softmax_backward_moment`):
  in Megatron's unfused path (the harness record gpt3-175b-tp8-pp8-first-s2048-b1-unfused peaks there) and in
  transformers' eager attention, beside the gradients made before it under HF (the records of
  llama-3.2-1b-bf16-adamw-norecompute-eager-s8192-b1 peak there; at shorter sequences, or with a larger
  vocabulary per head, the loss's moment is larger: qwen2.5-0.5b's at s8192); under FSDP1 beside the same
  gradients in the param dtype, held by the FlatParameter's split, and the last layer's own unit
  (fsdp1.softmax_moment_parts; the records fsdp1-llama-3.2-1b-*-s8192-b1-*eager peak there). Under DeepSpeed
  no harness has measured it: its gradients go to the reduction buckets, and none is modelled beside it.
  Inside the layer, the tensors its MLP, post-attention norm, output projection and scores x V kept are freed by
  then (autograd releases a node's saved tensors once it has run: AUTOGRAD_RELEASE_SOURCE) and two hidden-sized
  gradients are alive (`_layer_parts`; Megatron's and transformers' full fine-tuning, as both harnesses' traces show;
  an adapter run's, of its own ledger, with the adapters of o_proj and the MLP: the PEFT harness's records
  llama-3.2-1b-lora-r16-{qv,all7}-norecompute-drop00-s8192-b1-eager peak there).
- with full recompute in Megatron's unfused path and transformers' eager attention, the recomputed layer's whole
  softmax backward beside it (`softmax_backward_moment(recomputed=True)`; the harness records
  llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused and peft/llama-3.2-1b-lora-r16-qv-recompute-drop00-
  s4096-b1-eager peak there: an adapter run's small gradients leave it the largest moment, 21% over the
  temporary beside the layer's ledger at s4096; the HF Trainer's first layer recomputed at backward's end too,
  trainer_backward_end: llama-3.1-8b-bf16-adamw-recompute-eager-s2048-b1 to 0.2%, 0.63% under with the
  temporary alone); with selective recompute of the core
  attention, the last layer's recomputed core attention at its softmax backward beside every kept tensor
  (megatron_softmax_moment.selective_core_softmax_moment; the record ...-sel-core_attn-unfused peaks there).
Not here: DSA (sparse.py, sparse_hf.py count it in their moments) and SDPA's math backend (kbit.py, from its GPU
record).
"""

from __future__ import annotations

from .activations.entries import Entry, compiled, eager_softmax_16_bit, fused_kernels
from .activations.attention import megatron_fused_softmax
from .activations.llama4 import TRANSFORMERS_FRAMEWORKS
from .components import Component, component
from .dsa_hf_moments import LAST_FORMULA
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.hybrid import attends
from ..spec.parallel import Parallel
from ..spec.training import Training

SOFTMAX_BACKWARD_SOURCE = (
    "PyTorch aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out (torch 2.x, read at pytorch/pytorch "
    "000cace5): `Tensor tmp = grad * output` before the kernel, freed when it returns (the CPU and meta kernels "
    "make none); H200 runs on torch 2.11 (tests/data/measured/gpu/*-eager-*) allocated it: 4*b*a*s^2 over the fake "
    "peak before the harness counted it (validation/core/emulation.py)")
MEGATRON_SOFTMAX_SOURCE = (
    "Megatron-Core 0.16.1 fusions/fused_softmax.py FusedScaleMaskSoftmax.forward_torch_softmax (fp32 softmax, cast "
    "back for scores x V); measured: tests/data/measured/megatron/gpt3-175b-tp8-pp8-first-s2048-b1-unfused (the "
    "backward peak in the last layer's softmax backward: 446.7 MB over the kept activations, 503.3 MB modelled, the "
    "layer's MLP tensors freed by then and the small gradients beside it left out)")
HF_SOFTMAX_SOURCE = (
    "transformers 5.23 models/llama/modeling_llama.py eager_attention_forward (`softmax(attn_weights, dim=-1, "
    "dtype=torch.float32).to(query.dtype)`, the copy kept for `matmul(attn_weights, value_states)`); measured: "
    "tests/data/measured/llama-3.2-1b-bf16-adamw-norecompute-eager-s8192-b1 (the backward peak in the last layer's "
    "softmax backward: the fp32 gradient of the probabilities and _softmax_backward_data's two fp32 tensors beside "
    "the kept activations less the layer's bf16 probabilities, its MLP's tensors and the attention output, freed "
    "by then, and beside the head's and the layer's post-attention gradients)")


def _softmax_bytes(arch: Architecture, training: Training, par: Parallel) -> float | None:
    """The bytes per score element of the softmax's output gradient where the layer's attention runs torch's
    softmax over the scores: transformers' eager attention softmaxes in fp32 (`softmax(..., dtype=float32)
    .to(dtype)`: the cast's backward hands it an fp32 gradient), Llama 4's in the compute dtype; Megatron's
    unfused path in fp32 (attention_softmax_in_fp32, as its ledger: activations/attention.py). None where none
    runs, where the path counts it itself (module docstring), and under torchtitan and torchtune, whose models
    attend through SDPA (their eager ledger is transformers'; no run of theirs measured it)."""
    from .kbit import math_attention
    if training.attention == "flash" or arch.uses_sparse_attention or compiled(training) \
            or math_attention(arch, training) or training.mode != "training":
        return None
    if fused_kernels(training):
        return None if megatron_fused_softmax(arch, training, par) else 4
    if training.framework not in TRANSFORMERS_FRAMEWORKS:  # torchtitan and torchtune attend through SDPA
        return None
    return bytes_per_element(training.compute_dtype) if eager_softmax_16_bit(arch, training) else 4


def _scores(arch: Architecture, training: Training) -> float:
    """b*a*s^2 before TP: one layer's attention scores (context parallelism needs flash, so s is whole)."""
    return training.micro_batch_size * arch.num_attention_heads * training.seq_len ** 2


def temporary_entry(arch: Architecture, training: Training, par: Parallel) -> Entry | None:
    """CUDA's `tmp = grad * output` of the layer's softmax backward, or None (see `_softmax_bytes`)."""
    size = _softmax_bytes(arch, training, par)
    if size is None:
        return None
    return Entry("CUDA softmax backward's temporary (tmp = grad * output)",
                 _scores(arch, training), size, "tp",
                 "4*a*s^2*b" if size == 4 else "B*a*s^2*b")


def softmax_backward_temporary(arch: Architecture, training: Training, par: Parallel,
                               kinds: list[str]) -> list[Component]:
    """The temporary beside a recomputed layer of one of `kinds` that attends (module docstring)."""
    entry = temporary_entry(arch, training, par) if any(map(attends, kinds)) else None
    return [component("transient", entry.name, entry.bytes(par), entry.shown_formula(par), SOFTMAX_BACKWARD_SOURCE)] \
        if entry else []


def softmax_backward_moment(arch: Architecture, training: Training, par: Parallel,
                            gradients: float = 0.0, freed_copies: float = 0.0,
                            recomputed: bool = False, stage: StageParameters | None = None,
                            kinds: tuple[str, ...] = ()) -> list[Component]:
    """Without recompute, the last layer's softmax backward beside every kept activation (Megatron's unfused
    softmax, transformers' eager attention): the gradient of the probabilities (fp32 from the cast's backward),
    CUDA's tmp and the gradient of the scores, 3 x 4*a*s^2*b, less the 16-bit tensor scores x V kept (the
    probabilities' copy, or the dropout's output), freed by its backward: B*a*s^2*b (none where the softmax's
    own output is what scores x V takes: fp32 compute without dropout, Llama 4's softmax in the compute dtype,
    whose three tensors are B each). `gradients`: the bytes of the gradients made before it (HF: head and the
    last layer's after its core attention; `last_layer_gradients`); `freed_copies`: the autocast copies of those
    weights, freed by their matmuls' backward by then (HF under autocast). Megatron and transformers' full
    or adapter fine-tuning: less the layer's tensors made after its softmax (its MLP's, the attention output) and v, freed by
    their backward by then (autograd releases a node's saved tensors once it has run), plus two hidden-sized
    gradients alive at the moment (`_layer_parts`, of the `stage`'s last layer, or of any of its layers where it
    is a recomputed one). With full recompute (`recomputed`): the recomputed layer's, beside its own kept tensors
    (the harness records llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused, Megatron's unfused softmax, and
    peft/llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager, transformers' eager attention)."""
    if training.offload_activations or (training.recompute != "none") != recomputed:
        return []
    if training.framework != "megatron" and training.framework not in TRANSFORMERS_FRAMEWORKS:
        return []
    entry = temporary_entry(arch, training, par)
    if entry is None:
        return []
    source = MEGATRON_SOFTMAX_SOURCE if training.framework == "megatron" else HF_SOFTMAX_SOURCE
    parts = softmax_parts(entry, training, par, source) + _hf_parts(gradients, freed_copies)
    if stage is not None and not kinds:
        kinds = tuple(k for k, n in stage.kind_counts if n) if recomputed else \
            (arch.layer_kind(stage.chunks[-1].stop - 1),)
    if kinds:
        parts += _layer_parts(arch, training, par, kinds)
    if sum(p.bytes for p in parts) <= 0:  # short sequences: the layer's freed tensors outweigh the scores' three
        return []
    label = "unfused softmax" if training.framework == "megatron" else "eager attention"
    which = "The recomputed layer's" if recomputed else "The last layer's"
    return [Component("transient", f"{which} softmax backward ({label}{'' if recomputed else ', no recompute'})",
                      sum(p.bytes for p in parts), " + ".join(p.formula for p in parts),
                      source + "; " + SOFTMAX_BACKWARD_SOURCE, parts)]


def softmax_parts(entry: Entry, training: Training, par: Parallel, source: str) -> tuple[Component, ...]:
    """The softmax's three gradient-sized tensors and the 16-bit tensor scores x V frees (`softmax_backward_moment`)."""
    B = bytes_per_element(training.compute_dtype)
    fp32 = entry.bytes_per_element == 4
    freed = B if (fp32 and B < 4) or training.dropout else 0
    t = "/t" if par.tp > 1 else ""
    size, formula = entry.bytes(par), entry.shown_formula(par)
    parts = (component("transient", "fp32 gradient of the probabilities (the cast's backward)" if fp32
                       else "gradient of the probabilities", size, formula, source),
             component("transient", entry.name, size, formula, SOFTMAX_BACKWARD_SOURCE),
             component("transient", f"{'fp32 ' if fp32 else ''}gradient of the scores (the softmax's backward output)",
                       size, formula, source))
    if freed:
        parts += (component("transient", "The 16-bit tensor scores x V kept, freed by its backward",
                            -entry.elements * freed / par.tp, f"-{freed:g}*a*s^2*b{t}", source),)
    return parts


def _hf_parts(gradients: float, freed_copies: float) -> tuple[Component, ...]:
    """The gradients made before the moment and the autocast copies freed by then (`softmax_backward_moment`)."""
    parts: tuple[Component, ...] = ()
    if gradients:
        parts += (component("transient", "Gradients made before the last layer's attention backward (HF: none "
                            "before backward)", gradients, LAST_FORMULA,
                            HF_SOFTMAX_SOURCE + "; torch.optim.Optimizer.zero_grad(set_to_none=True)"),)
    if freed_copies:
        parts += (component("transient", "Autocast copies of the head's and the last layer's weights after its "
                            "attention, freed by their backward", -freed_copies,
                            "-B x (the same weights)", HF_SOFTMAX_SOURCE + "; PyTorch autocast's weight casts, "
                            "kept by the matmul for its backward"),)
    return parts


AUTOGRAD_RELEASE_SOURCE = (
    "PyTorch torch/csrc/autograd/engine.cpp Engine::evaluate_function (torch 2.13): after a node's backward runs, "
    "`fn.release_variables()` drops its saved tensors unless retain_graph, so a layer's MLP, its post-attention norm "
    "and its output projection, whose backward runs before its attention's, have freed what they kept when the "
    "softmax's backward runs")
MEGATRON_FREED_SOURCE = (
    "Megatron-Core 0.16.1 transformer/transformer_layer.py (the MLP after the attention, each freeing what it kept "
    "in its backward), transformer/dot_product_attention.py DotProductAttention.forward (v repeat_interleave'd for "
    "`torch.bmm(attention_probs, value)`, whose backward frees it before the softmax's backward runs); measured on "
    "an H200 (tests/data/measured/gpu/megatron/*-s4096-b1-*: the blocks live at the peak, peak_blocks: the last "
    "layer's fc1 output, SwiGLU output, fc1 input, MLP norm input, attention output and v absent, two hidden-sized "
    "16-bit gradients beside the softmax's three fp32 tensors); " + AUTOGRAD_RELEASE_SOURCE)
HF_FREED_SOURCE = (
    "transformers 5.23 models/llama/modeling_llama.py LlamaDecoderLayer.forward (the MLP and its norm after the "
    "attention), eager_attention_forward (repeat_kv's v for `matmul(attn_weights, value_states)`, the attention "
    "output made contiguous for o_proj); measured under fake tensors (python -m validation explain --case "
    "llama-3.2-1b-bf16-adamw-norecompute-eager-s8192-b1, and validation.fsdp1's of "
    "fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-eager): at the backward peak the last layer's gate and up "
    "outputs, SiLU output, down_proj input, post-attention norm's three tensors, expanded v and o_proj input are "
    "gone, its output's gradient (B*s*b*h) and scores x V's v gradient (B*s*b*a*d_head) alive; " + AUTOGRAD_RELEASE_SOURCE)
# what a layer keeps that is made after its softmax, or used only by scores x V, and freed by their backward before
# the softmax's backward: the attention output, its post-attention norm (Gemma-2's; transformers' names its three
# tensors after it) and residual dropout, the dropout's mask, v (attention.py `_output_entries`, `_unfused_entries`);
# the scores x V input (probabilities or dropout output) is `softmax_parts`' own
_FREED_ATTENTION = ("attention output (output projection input)", "attention dropout mask", "post-attention norm input",
                    "attention residual dropout mask", "v (expanded to all heads) for scores x V")
_V = "v (expanded to all heads) for scores x V"


def freed_after_softmax(arch: Architecture, training: Training, par: Parallel, kind: str,
                        v_freed: bool = True) -> float:
    """The bytes of a `kind` layer's kept tensors its backward has freed when its softmax's backward runs
    (`freed_entries`)."""
    return sum(e.bytes(par) for e in freed_entries(arch, training, par, kind, v_freed))


def freed_entries(arch: Architecture, training: Training, par: Parallel, kind: str,
                  v_freed: bool = True) -> list[Entry]:
    """A `kind` layer's kept tensors its backward has freed when its softmax's backward runs (autograd releases a
    node's saved tensors once it has run: AUTOGRAD_RELEASE_SOURCE): its MLP's (with transformers' MLP norm), its
    attention output's and what follows it, and v (`v_freed`; not where v is the input of a checkpointed core
    attention, kept until its whole backward has run). The allocator replay frees the same ones
    (reserved_layers.py)."""
    from .activations.attention import attention_entries
    from .activations.mlp import mlp_entries
    names = tuple(n for n in _FREED_ATTENTION if v_freed or n != _V)
    after = [e for e in attention_entries(arch, training, par) if e.name.startswith(names)]
    after += mlp_entries(arch, training, par, kind)
    if training.adapter is not None:
        return _adapter_freed(arch, training, par, kind, frozenset(e.name for e in after))
    return after


# the adapted modules whose backward runs before the attention core's: their adapters' tensors (adapter_activations.py
# names them "<module> adapter: ..." and "<module> DoRA: ...") are freed by the softmax's backward
_AFTER_CORE = tuple(f"{m} {what}:" for m in ("o", "gate", "up", "down", "router", "experts")
                    for what in ("adapter", "DoRA"))
PEFT_FREED_SOURCE = (
    "peft 0.21 tuners/lora/layer.py Linear.forward (lora_B(lora_A(dropout(x))) beside the frozen base layer's "
    "output, each module's tensors saved by its own autograd nodes); measured under fake tensors (python -m "
    "validation.peft explain llama-3.2-1b-lora-r16-qv-norecompute-drop00-s8192-b1-eager and ...-all7-...): at the "
    "backward peak the last layer's gate and up outputs, SiLU output, post-attention norm's fp32 upcast and rsqrt, "
    "expanded v and the fp32 inputs of the o, gate, up and down adapters are gone, the frozen base's unkept inputs "
    "never were; its output's gradient and v's alive")
BNB_HELD_SOURCE = (
    "bitsandbytes 0.43.1 autograd/_functions.py MatMul4Bit.forward (`ctx.tensors = (A, B)`, never cleared by its "
    "backward) and validation/peft/bnb.py's emulation of it; the node lives until the graph does (the loss's "
    "grad_fn reaches it), so A stays: measured (python -m validation.peft explain "
    "llama-3.2-1b-qlora-r16-all7-norecompute-drop00-s8192-b1-bnb0.43.1-eager)")


def _adapter_freed(arch: Architecture, training: Training, par: Parallel, kind: str,
                   names: frozenset[str]) -> list[Entry]:
    """An adapter run's `freed_entries`: of the layer's ledger as the run keeps it (adapter_activations.py:
    without what only frozen weights' gradients read, with the adapters' own tensors), the full fine-tuning
    tensors named in `names` and the tensors of the adapters after the core (`_AFTER_CORE`), but not the inputs
    kept for frozen weights alone: bitsandbytes through 0.43.1 holds its 4-bit linears' in `ctx.tensors`, an
    attribute of the node that autograd's release of its saved tensors leaves alone (BNB_HELD_SOURCE). The last
    layer is the first one (whose input is frozen) only in a one-layer stack, whose first layer's ledger differs
    only before the core (its attention norm, q, k and v's masks)."""
    from .activations.layer import layer_entries
    from .adapter_activations import trainable_weights
    trained = trainable_weights(training, arch)

    def freed(e) -> bool:
        return e.name.startswith(_AFTER_CORE) or e.name in names and (
            not e.for_weights or any(w in trained for w in e.for_weights))
    return [e for e in layer_entries(arch, training, par, kind) if freed(e)]


def frees_layer_tensors(arch: Architecture, training: Training) -> bool:
    """Whether the layer ledger the moment sits beside is `freed_after_softmax`'s: Megatron's, and transformers'
    fine-tuning of a dense or MoE stack, full or through adapters (`_adapter_freed`; a hybrid stack keeps a ledger
    of its own, activations/hybrid.py, not modelled here)."""
    return training.framework == "megatron" or not arch.is_hybrid


def _layer_parts(arch: Architecture, training: Training, par: Parallel,
                 kinds: tuple[str, ...]) -> tuple[Component, ...]:
    """The softmax-backward moment inside a layer: less the layer's tensors freed by then (`freed_after_softmax`),
    of the kind among `kinds` that frees the least, plus two hidden-sized 16-bit gradients alive then (Megatron: the
    residual stream's and the output projection's input gradient; transformers: the residual stream's and v's,
    the same sizes; measured). Nothing where no kind is given, none is a dense or MoE layer, or the ledger is not
    `freed_after_softmax`'s (`frees_layer_tensors`)."""
    from .activations.entries import tokens_per_gpu
    kinds = tuple(k for k in kinds if k in ("dense", "moe"))
    if not kinds or not frees_layer_tensors(arch, training):
        return ()
    freed = {k: freed_after_softmax(arch, training, par, k) for k in kinds}
    kind = min(kinds, key=freed.get)
    source = MEGATRON_FREED_SOURCE if training.framework == "megatron" else \
        PEFT_FREED_SOURCE + "; " + HF_FREED_SOURCE if training.adapter else HF_FREED_SOURCE
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    sp, tp = ("/t", par.tp) if par.tp > 1 and par.sequence_parallel else ("", 1)
    t = "/t" if par.tp > 1 else ""
    residual = T * arch.hidden_size * B / tp  # the sequence-parallel region splits the sequence
    if training.framework == "megatron":  # the output projection's input gradient, a/t heads' outputs
        second, width, formula = "output projection input", arch.attention_output_width, "B*s*b*a*d_v"
    else:  # scores x V's gradient of the expanded v, summed over the group by repeat_kv's backward after the softmax's
        second, width, formula = "expanded v", arch.num_attention_heads * arch.head_dim, "B*s*b*a*d_head"
    projection = T * width * B / par.tp
    return (component("transient", f"The layer's MLP ({kind}), attention output and v, freed by their backward",
                      -freed[kind], "-(the kept MLP, o_proj and post-core adapter tensors + B*s*b*a*d_head)"
                      if training.adapter else "-(MLP tensors + B*s*b*a*d_v + B*s*b*a*d_head)", source),
            component("transient", f"Gradients alive at the moment (residual stream, {second})",
                      residual + projection, f"B*s*b*h{sp} + {formula}{t}", source))
