"""The output layer and the loss: logits, the softmax, fused/chunked/compiled cross-entropy, and
the deferred output-layer weight gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from ..titan_releases import SOURCES as TITAN_SOURCES, titan_rules
from .chunked_head import chunked_head_backward
from .trl_loss import SOURCE as TRL_SOURCE, chunked_loss as trl_chunked_loss, trl_chunked
from .entries import Entry, _norm, _norm_output, autocast, compiled, fused_kernels, tokens_per_gpu


@dataclass(frozen=True)
class LossMemory:
    saved: list[Entry]  # kept from the forward pass to the backward pass
    forward: list[Entry]  # alive only while the loss is computed (the forward pass's last moment)
    backward: list[Entry]  # alive only while the loss is differentiated (the backward pass's first)
    source: str
    # torchtune's chunked head, after the loss's backward: (made, freed) beside `saved` (chunked_head.py)
    head_backward: tuple[list[Entry], list[Entry]] | None = None


DEFER_WGRAD_SOURCE = (
    "Megatron-Core 0.16.1 tensor_parallel/layers.py ColumnParallelLinear.forward appends the output layer's "
    "input_parallel to embedding_activation_buffer and LinearWithGradAccumulationAndAsyncCommunication.backward "
    "appends its grad_output to grad_output_buffer instead of running the weight-gradient GEMM, while fewer than "
    "wgrad_deferral_limit (0: no limit) are held; pipeline_parallel/schedules.py finish_embedding_wgrad_compute "
    "drains both (utils.py drain_embedding_wgrad_compute) after the last micro-batch's backward")


def deferred_wgrad_entries(arch: Architecture, training: Training, par: Parallel, vocab: int) -> list[Entry]:
    """One micro-batch's pair held by --defer-embedding-wgrad-compute on the last stage (DEFER_WGRAD_SOURCE):
    the output layer's input, [s/cp, b, h] in the compute dtype (sequence-parallel: this rank's s/t share, the
    tensor that was gathered), and the gradient of its output, the logits' gradient [s/cp, b, V/t]."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    return [Entry("output layer input (embedding_activation_buffer)", T * arch.hidden_size, B, "sp", "B*s*b*h"),
            Entry("output layer output gradient (grad_output_buffer)", T * vocab, B, "tp", "B*s*b*V")]


def deferred_wgrad_microbatches(training: Training, microbatches: int) -> int:
    """Micro-batches whose deferred pair is held at the last micro-batch's forward and backward on the last
    stage: those before it whose backward ran (1F1B's last stage runs each micro-batch's backward right after its
    forward), at most wgrad_deferral_limit (the buffer stops growing there; later ones compute at once). The
    current micro-batch's own pair is its saved head input and its loss gradient, counted with the loss."""
    if not training.defer_embedding_wgrad_compute:
        return 0
    earlier = microbatches - 1
    return min(earlier, training.wgrad_deferral_limit) if training.wgrad_deferral_limit else earlier


def loss_memory(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """Final norm, LM head and cross-entropy on the last stage, per loss implementation: the head's input,
    then the loss's own tensors (`_cross_entropy_memory`); the chunked losses of torchtitan and torchtune
    run the head inside the loss and keep their own."""
    if training.loss == "chunked" and training.framework == "fsdp2":
        return _torchtitan_chunked_loss(arch, training, par, vocab)
    if training.loss == "chunked" and training.framework == "torchtune":
        return _torchtune_chunked_loss(arch, training, par, vocab)
    T = tokens_per_gpu(training, par)
    if trl_chunked(training):  # TRL's chunked_nll: the head on the targets, 256 at a time (trl_loss.py)
        from ..adapter_activations import kept
        saved, forward, backward = trl_chunked_loss(arch, training, par, vocab)
        return LossMemory(saved=kept(_norm("final norm input", T, arch, training) + saved, training, arch),
                          forward=forward, backward=kept(backward, training, arch), source=TRL_SOURCE)
    if training.loss == "chunked":  # Liger's fused linear cross-entropy keeps no head input (its own gradients)
        loss = _liger_chunked_loss(arch, training, par, vocab)
        from ..adapter_activations import kept  # a frozen head gets no weight gradient
        return LossMemory(saved=kept(_norm("final norm input", T, arch, training) + loss.saved, training, arch),
                          forward=loss.forward, backward=loss.backward, source=loss.source)
    saved = _norm("final norm input", T, arch, training)
    saved += _norm_output("LM head input", T, arch, training, 1, (), gemm=False, weights=("head",))
    loss = _cross_entropy_memory(arch, training, par, vocab)
    from ..adapter_activations import kept  # a frozen head keeps no input for its weight's gradient
    return LossMemory(saved=kept(saved + loss.saved, training, arch), forward=loss.forward, backward=loss.backward,
                      source=loss.source)


def _cross_entropy_memory(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """The cross-entropy's tensors beside the head's input, by the implementation that runs it (the first
    that applies)."""
    if training.loss == "fused" and fused_kernels(training) and training.cross_entropy_impl == "te":
        return _te_cross_entropy(training, par, vocab)
    if training.loss in ("standard", "fused") and fused_kernels(training):
        return _megatron_cross_entropy(training, par, vocab)
    T = tokens_per_gpu(training, par)
    if training.loss == "standard" and compiled_loss(arch, training, par):  # torchtitan's compiled CrossEntropyLoss
        kept_logits, backward = compiled_cross_entropy(T, 1, vocab, training)
        return LossMemory(saved=kept_logits, forward=[], backward=backward, source=TORCHTITAN_COMPILED_LOSS_SOURCE)
    if training.loss == "standard" and logits_dtype_loss(arch, training):
        kept, forward, backward = logits_dtype_loss_entries(T, vocab, bytes_per_element(training.compute_dtype))
        return LossMemory(saved=kept, forward=forward, backward=backward, source=LOGITS_DTYPE_LOSS_SOURCE)
    if training.loss == "standard":
        return _pytorch_cross_entropy(arch, training, par, vocab)
    if training.loss == "fused":
        return _in_place_cross_entropy(training, par, vocab)
    return _liger_chunked_loss(arch, training, par, vocab)


def _te_cross_entropy(training: Training, par: Parallel, vocab: int) -> LossMemory:
    """TE's CrossEntropyFunction (TE 2.x pytorch/cross_entropy.py, pytorch/triton/cross_entropy.py): the forward
    writes the loss's gradient into the 16-bit logits and saves only them; it allocates an fp32 loss and an fp32
    (max, sum, label logit) triple per token, gathered over TP; the backward scales the logits in place
    (element_mul_kernel) and returns them."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    gathered = 12 * par.tp if par.tp > 1 else 0
    saved = [Entry("logits, holding their gradient (TE cross-entropy, in place)", T * vocab, B, "tp", "B*s*b*V")]
    forward = [Entry("TE cross-entropy fp32 loss and (max, sum, label logit) per token"
                     + (", gathered over TP" if gathered else ""), T * (16 + gathered), 1, "none",
                     "(4 + 12 + 12*t)*s*b" if gathered else "(4 + 12)*s*b")]
    return LossMemory(saved=saved, forward=forward, backward=[],
                      source="TransformerEngine 2.x pytorch/cross_entropy.py CrossEntropyFunction and pytorch/triton/"
                             "cross_entropy.py cross_entropy_forward/backward; Megatron-Core language_module.py "
                             "(--cross-entropy-fusion-impl te)")


def _megatron_cross_entropy(training: Training, par: Parallel, vocab: int) -> LossMemory:
    """standard, fused kernels (Megatron's vocab-parallel cross-entropy): the logits are upcast to fp32 and the
    softmax is kept for backward, 4sbV/t (Korthikanti section 4.3: 4sbh(1 + V/h)/t with the two h-sized inputs);
    the compute-dtype logits sit beside it while it is made, and the compute-dtype gradient of the logits beside
    it in backward (stas00: "practically 6 bytes per logit").
    fused: Megatron's --cross-entropy-loss-fusion runs its default native implementation
    (fusions/fused_cross_entropy.py), which upcasts the logits and keeps the fp32 softmax as the unfused one
    does, and whose compiled backward holds one more fp32 copy of it (Inductor's index_put): 4 more bytes per
    logit than standard at the start of backward (measured, tests/data/measured/megatron)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    saved = [Entry("fp32 softmax of the logits", T * vocab, 4, "tp", "4*s*b*V")]
    forward = [Entry("logits in the compute dtype, before the fp32 upcast", T * vocab, B, "tp", "B*s*b*V")]
    backward = [Entry("gradient of the logits in the compute dtype", T * vocab, B, "tp", "B*s*b*V")]
    source = ("Korthikanti et al. 2022 section 4.3; stas00 ml-engineering (logits ~6 bytes each); Megatron-Core "
              "fusions/fused_cross_entropy.py (native fusion: the same fp32 softmax)")
    if training.loss == "fused":
        # the native fusion's compiled forward is not in place: calculate_logits_max returns the fp32
        # logits and calculate_predicted_logits their exponentials beside them (the unfused loss exponentiates
        # in place); measured on an H200: 8*s*b*V above the logits (tests/data/measured/gpu/kernels)
        forward.append(Entry("fp32 logits beside their exponentials (the compiled forward is not in place)",
                             T * vocab, 4, "tp", "4*s*b*V"))
        # the native fusion's compiled backward (jit_fuser = torch.compile) copies the softmax before its
        # index_put (Inductor lowers index_put as a scatter into clone(x)); the unfused loss writes into it
        backward.append(Entry("fp32 copy of the softmax (the compiled backward's index_put)", T * vocab, 4, "tp",
                              "4*s*b*V"))
        source += f"; {MEGATRON_NATIVE_CE_SOURCE}"
    return LossMemory(saved=saved, forward=forward, backward=backward, source=source)


def _pytorch_cross_entropy(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """standard, PyTorch modules (transformers' ``ForCausalLMLoss``, the Trainer's compute_loss): forward holds
    the compute-dtype logits, their fp32 upcast and the fp32 log-softmax (kept for backward) at once; the
    Trainer returns only the loss, so the logits are gone before backward, whose first step holds the
    log-softmax and two fp32 gradients (nll_loss and log_softmax backward), as measured (tests/data/measured)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    saved = [Entry("fp32 log-softmax of the logits", T * vocab, 4, "tp", "4*s*b*V")]
    if arch.final_logit_softcapping:  # cap * tanh(logits / cap): tanh keeps its output
        saved.append(Entry("soft-capped logits (tanh output)", T * vocab, B, "tp", "B*s*b*V"))
    forward, source = _pytorch_logits(arch, training, par, vocab)
    backward = [Entry("fp32 gradients of the log-softmax output and input", 2 * T * vocab, 4, "tp",
                      "2*4*s*b*V", tensors=2)]
    rules = titan_rules(training)
    if par.tp > 1 and rules is not None and rules.tp_loss_parallel_dtensor:
        forward_extra, backward_extra = dtensor_loss_parallel_entries(T, vocab)
        forward += forward_extra
        backward += backward_extra
        source += "; " + TITAN_SOURCES["loss_parallel"]
    return LossMemory(saved=saved, forward=forward, backward=backward, source=source)


def _pytorch_logits(arch: Architecture, training: Training, par: Parallel, vocab: int) -> tuple[list[Entry], str]:
    """(the logits alive at the PyTorch loss's forward moment, their source): the head's output and the loss's
    fp32 upcast of it, unless the logits are fp32 already or Accelerate's fp32 copy stands for the upcast."""
    from ..kbit import AUTOCAST_HEAD_SOURCE, prepared, under_autocast
    from ..trainer_loop import LOGITS_ENTRY, SOURCE as TRAINER_SOURCE, through_accelerate
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    source = "transformers ForCausalLMLoss (logits.float(), cross_entropy); measured in tests/data/measured"
    fp32_logits = arch.logits_fp32 and B < 4
    forward: list[Entry] = []
    if under_autocast(training):
        # the prepared fp32 head's matmul runs in the autocast dtype (the weights' 16-bit dtype; this ledger
        # is fp32, kbit.ledger_training): 16-bit logits, then Accelerate's fp32 copy ties the loss's upcast
        W = bytes_per_element(training.param_dtype)
        forward.append(Entry("logits in the autocast dtype (the fp32 head's matmul)", T * vocab, W, "tp",
                             "B*s*b*V"))
        forward.append(Entry(LOGITS_ENTRY, T * vocab, 4, "tp", "4*s*b*V"))
        source += f"; {TRAINER_SOURCE}; {AUTOCAST_HEAD_SOURCE}"
    elif fp32_logits:
        # the model returns lm_head(x).float() (transformers 5.23 NemotronHForCausalLM.forward): the
        # compute-dtype logits die with the cast, and the loss's own logits.float() is no copy (measured)
        forward.append(Entry("fp32 logits (cast in the model's forward)", T * vocab, 4, "tp", "4*s*b*V"))
    else:
        forward.append(Entry("logits in the compute dtype", T * vocab, B, "tp", "B*s*b*V"))
    if prepared(training) or fp32_logits:  # fp32 logits (kbit.py, or the model's own cast): no copy
        pass  # (under the Trainer's autocast the copy is above)
    elif through_accelerate(training):  # Accelerate's fp32 copy of the output ties the upcast (trainer_loop.py)
        forward.append(Entry(LOGITS_ENTRY, T * vocab, 4, "tp", "4*s*b*V"))
        source += f"; {TRAINER_SOURCE}"
    else:
        forward.append(Entry("fp32 upcast of the logits (log-softmax input)", T * vocab, 4, "tp", "4*s*b*V"))
    return forward, source


def _in_place_cross_entropy(training: Training, par: Parallel, vocab: int) -> LossMemory:
    """fused: a fused cross-entropy kernel (Apex/TE, Liger's cross-entropy) works on the compute-dtype logits
    in place: B*s*b*V/t."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    return LossMemory(saved=[Entry("logits (softmax and gradient computed in place)", T * vocab, B, "tp", "B*s*b*V")],
                      forward=[], backward=[],
                      source="Megatron-Core cross_entropy_loss_fusion; Apex/TE fused cross-entropy")


def _liger_chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """chunked: Liger's fused linear cross-entropy (LIGER_FLCE_SOURCE; the HF Trainer's use_liger_kernel, Cut
    Cross-Entropy alike). Its autograd Function computes the head's input and weight gradients during forward,
    chunk by chunk, and saves only them (not the head's input): the input's gradient like the input (fp32 under
    autocast, the residual stream's dtype), the weight's like the weight (accum_dtype None), only where the weight
    requires grad (not under a frozen-head adapter). During forward the head's input (the final norm's output)
    is alive beside one chunk of logits in the compute dtype, whose cross-entropy kernel writes the gradient in
    place, and the per-token fp32 loss. (Under fsdp2 it is torchtitan's ChunkedLossWrapper,
    `_torchtitan_chunked_loss`; under torchtune its CEWithChunkedOutputLoss, `_torchtune_chunked_loss`.)"""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    h = arch.hidden_size
    I = 4 if autocast(training) else B  # the head's input: the final norm's output, in the residual's dtype
    chunk = liger_chunk_tokens(T, h, vocab)
    saved = [Entry("gradient of the LM head input (computed in forward)", T * h, I, "sp", f"{I:g}*s*b*h")]
    P = bytes_per_element(training.param_dtype)
    saved.append(Entry("gradient of the LM head weight (computed in forward)", vocab * h, P, "tp", "P*V*h",
                       split_by_cp=False, for_weights=("head",)))
    forward = [Entry("LM head input (final norm output, alive while the loss runs)", T * h, I, "sp", f"{I:g}*s*b*h"),
               Entry(f"one chunk of logits, their gradient written in place ({chunk:g} tokens)", chunk * vocab, B,
                     "tp", "B*chunk*V"),
               Entry("per-token fp32 loss and target mask", T, 5, "sp", "(4 + 1)*s*b")]
    return LossMemory(saved=saved, forward=forward, backward=[], source=LIGER_FLCE_SOURCE)


LIGER_FLCE_SOURCE = (
    "liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward (chunk = "
    "min(next_power_of_2(cdiv(BT, cdiv(V, H))), BT); grad_input = zeros_like(_input); grad_weight = zeros_like(weight) "
    "when weight.requires_grad; logits_storage [chunk, V] in the input's dtype; liger_cross_entropy_kernel writes "
    "the gradient into the logits) and LigerFusedLinearCrossEntropyFunction.forward (save_for_backward(grad_input, "
    "grad_weight, grad_bias))")


def liger_chunk_tokens(tokens: float, hidden: int, vocab: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (LIGER_FLCE_SOURCE, chunk_mem_const 1):
    next_power_of_2(cdiv(BT, cdiv(V, H))), at most BT."""
    bt = int(tokens)
    per_chunk = -(-bt // -(-vocab // hidden))
    return min(1 << max(per_chunk - 1, 0).bit_length(), bt)


MEGATRON_NATIVE_CE_SOURCE = (
    "Megatron-Core 0.16.1 = 0.19.0 fusions/fused_cross_entropy.py calculate_gradients under torch.compile (core/jit.py); "
    "torch 2.13 torch/_inductor/lowering.py index_put -> index_put_impl_(clone(x)); Inductor's generated code: "
    "tests/data/measured/compile/megatron-fused-cross-entropy-bf16-s16-b2-v512.json")

LOGITS_DTYPE_LOSS_SOURCE = (
    "Qwen-1 modeling_qwen.py QWenLMHeadModel.forward (CrossEntropyLoss on lm_head's output, no .float(); as in "
    "Qwen/Qwen-72B, mirrored in mapengAdam/qianwen-72B@3334bfe); lit-gpt 8641822 lit_gpt/utils.py "
    "chunked_cross_entropy (cross_entropy on each bf16 logit chunk); torch aten log_softmax returns its input's "
    "dtype, autocast alone would run it in fp32 (torch/csrc/autograd autocast fp32 list: log_softmax, nll_loss)")


def logits_dtype_loss(arch: Architecture, training: Training) -> bool:
    """The model's own loss runs on its 16-bit logits with no autocast around it (arch.loss_in_logits_dtype):
    not under the Trainer's autocast (trainer_loop.through_accelerate) nor AMP over fp32 weights, and not with
    prepare_model_for_kbit_training's fp32 head (kbit.py)."""
    from ..kbit import prepared
    from ..trainer_loop import through_accelerate
    return (arch.loss_in_logits_dtype and bytes_per_element(training.compute_dtype) < 4
            and not through_accelerate(training) and not autocast(training) and not prepared(training))


def logits_dtype_loss_entries(tokens: float, vocab: int, B: int) -> tuple[list[Entry], list[Entry], list[Entry]]:
    """cross_entropy on 16-bit logits (LOGITS_DTYPE_LOSS_SOURCE): log_softmax keeps its 16-bit output for
    backward; the forward's moment holds the logits beside it; backward's first step holds nll_loss's and
    log_softmax's gradients, both in the logits' dtype. (saved, forward, backward)"""
    return ([Entry("log-softmax of the logits, in their 16-bit dtype", tokens * vocab, B, "tp", "B*s*b*V")],
            [Entry("logits in the compute dtype", tokens * vocab, B, "tp", "B*s*b*V")],
            [Entry("16-bit gradients of the log-softmax output and input", 2 * tokens * vocab, B, "tp",
                   "2*B*s*b*V")])


TORCHTUNE_LOSS_CHUNKS = 8  # CEWithChunkedOutputLoss.num_output_chunks


def dtensor_loss_parallel_entries(tokens: float, vocab: int) -> tuple[list[Entry], list[Entry]]:
    """What torch's loss_parallel() allocates beyond the fused CUDA kernels' ledger, per vocabulary-sharded
    logit (TITAN_SOURCES["loss_parallel"]). `_log_softmax` works op by op on the fp32 upcast x: it holds
    x - max (kept until it returns) beside exp(x - max) and then beside the result, one fp32 tensor more
    than the kernel's input and output. `_nll_loss_and_log_softmax_backward` builds zeros_like(x) with -1
    at the labels, exp(log_softmax), their sum and the product with the incoming gradient: beside the
    kept log-softmax, three fp32 tensors where the kernels hold two."""
    forward = [Entry("x - max of the fp32 logits (loss_parallel's log-softmax)", tokens * vocab, 4, "tp", "4*s*b*V")]
    backward = [Entry("third fp32 logits-sized tensor of loss_parallel's backward", tokens * vocab, 4, "tp",
                      "4*s*b*V")]
    return forward, backward


def compiled_loss(arch: Architecture, training: Training, par: Parallel) -> bool:
    """The cross-entropy runs under torch.compile: torchtitan compiles its loss whenever compile is on
    (CompileConfig.components defaults to ["model", "loss"]: 0.3.0 config/configs.py, the same on main
    and since v0.1.0's components/loss.py; training.compile_loss false is components ["model"]; the
    December 2024 main never compiles it: titan_releases.py), the standard CrossEntropyLoss and the chunked
    wrapper's per-chunk loss alike; torchtune's recipes call training.compile_loss whenever compile=True
    (0.6.1 recipes/*.py), which compiles CEWithChunkedOutputLoss.compute_cross_entropy in place, while
    for another loss most recipes drop the compiled module it returns (full_finetune_distributed.py:345),
    so only the chunked loss counts. Measured without TP (the loss-parallel autograd Function and
    DTensor logits are not) and without a final logit soft-cap (no torchtitan or torchtune model has one)."""
    if not compiled(training) or par.tp > 1 or arch.final_logit_softcapping:
        return False
    rules = titan_rules(training)
    if rules is not None:  # the release's default, or compile.components (training.compile_loss)
        with_model = rules.loss_compiled if training.compile_loss is None else training.compile_loss
        return with_model and training.loss in ("standard", "chunked")
    return training.framework == "torchtune" and training.loss == "chunked"


def compiled_cross_entropy(tokens: float, chunks: int, vocab: int, training: Training) -> tuple[list[Entry], list[Entry]]:
    """(kept for backward, backward's largest moment) of a compiled cross-entropy over `tokens` tokens'
    compute-dtype logits in `chunks` compiled calls: Inductor fuses the fp32 upcast, log-softmax and NLL
    into row reductions, so the graph keeps the 16-bit logits (its input) and an fp32 max and log-sum-exp
    per token; one call's backward allocates the 16-bit gradient of its logits and an fp32 value per token
    (measured, TORCHTITAN_COMPILED_LOSS_SOURCE). The backward runs the calls one by one, latest first."""
    B = bytes_per_element(training.compute_dtype)
    part = f"/{chunks}" if chunks > 1 else ""
    kept = [Entry("logits in the compute dtype, kept by the compiled cross-entropy", tokens * vocab, B, "tp",
                  "B*s*b*V"),
            Entry("fp32 max and log-sum-exp per token (compiled cross-entropy)", tokens, 8, "none", "8*s*b")]
    backward = [Entry(("one chunk's " if chunks > 1 else "") + "gradient of the logits in the compute dtype and an "
                      "fp32 value per token (compiled backward)", tokens / chunks * vocab, B, "tp", f"B*s*b*V{part}"),
                Entry("compiled backward's fp32 value per token", tokens / chunks, 4, "none", f"4*s*b{part}")]
    return kept, backward


def _torchtune_chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """torchtune's CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py): the decoder
    projects the final hidden states chunk by chunk (8 chunks, each chunk's input copied for the head
    matmul) and hands the loss the list of bf16 logits; the loss upcasts one chunk at a time and keeps
    every chunk's fp32 log-softmax for backward. So forward ends with every chunk's bf16 logits and one
    fp32 upcast; backward starts with one chunk's two fp32 gradients (measured,
    tests/data/measured/torchtune); then, every chunk's loss backward done, the head's (chunked_head.py)."""
    B = bytes_per_element(training.compute_dtype)
    T, h, n = tokens_per_gpu(training, par), arch.hidden_size, TORCHTUNE_LOSS_CHUNKS
    saved = _norm("final norm input", T, arch, training)
    saved.append(Entry("LM head input (a copy per chunk)", T * h, B, "sp", "B*s*b*h", for_weights=("head",)))
    compiled_source = ""
    if compiled_loss(arch, training, par):  # compile_loss: every chunk's bf16 logits stay, no fp32 copy
        kept_logits, backward = compiled_cross_entropy(T, n, vocab, training)
        own = kept_logits
        forward: list[Entry] = []
        compiled_source = f"; training/_compile.py compile_loss; {TORCHTITAN_COMPILED_LOSS_SOURCE}"
    else:
        own = [Entry("fp32 log-softmax of every chunk", T * vocab, 4, "tp", "4*s*b*V")]
        forward = [Entry("bf16 logits of every chunk", T * vocab, B, "tp", "B*s*b*V"),
                   Entry("one chunk's fp32 upcast", T / n * vocab, 4, "tp", f"4*s*b*V/{n}")]
        backward = [Entry("one chunk's fp32 gradients of the log-softmax output and input", 2 * T / n * vocab, 4,
                          "tp", f"2*4*s*b*V/{n}")]
    from ..adapter_activations import kept  # a frozen head keeps no input
    return LossMemory(saved=kept(saved + own, training, arch), forward=forward, backward=backward,
                      source="torchtune v0.6.1 modules/loss/ce_chunked_output_loss.py (8 chunks); "
                             "modules/transformer.py chunked_output" + compiled_source,
                      head_backward=chunked_head_backward(arch, training, par, vocab, n, own))


TORCHTITAN_LOSS_CHUNKS = 8  # ChunkedLossWrapper.Config.num_chunks


def torchtitan_loss_moments(arch: Architecture, training: Training, par: Parallel, vocab: int) -> list[list[Entry]]:
    """The chunked loss's moments beside its two accumulators (`_torchtitan_chunked_loss`): a chunk's
    cross-entropy, a chunk's head-weight gradient, and under FSDP the last chunk's reduce-scatter."""
    B, P = bytes_per_element(training.compute_dtype), bytes_per_element(training.param_dtype)
    T, h, n = tokens_per_gpu(training, par), arch.hidden_size, TORCHTITAN_LOSS_CHUNKS
    d = par.dp * par.cp
    if compiled_loss(arch, training, par):
        # the compiled cross-entropy of one chunk, forward and backward: the chunk's logits and their gradient,
        # three fp32 values per token (`compiled_cross_entropy`); under TP the loss-parallel autograd Function
        # (vocab-sharded logits, collectives in its forward) is not measured: eager ledger
        kept_logits, backward = compiled_cross_entropy(T / n, 1, vocab, training)
        chunk = [e._replace(name="one chunk: " + e.name) for e in kept_logits + backward]
    else:
        chunk = [Entry("one chunk: logits, fp32 log-softmax and its two fp32 gradients", T / n * vocab, B + 12, "tp",
                       f"(B + 12)*s*b*V/{n}")]
    moments = [chunk,
               [Entry("one chunk's LM head weight gradient (parameter dtype)", vocab * h, P, "tp", "P*V*h",
                      split_by_cp=False),
                Entry("one chunk's logits and their gradient", 2 * T / n * vocab, B, "tp", f"2*B*s*b*V/{n}")]]
    if d > 1:
        moments.append([Entry("LM head's reduce-scatter input (fp32), after the last chunk", vocab * h, 4, "tp",
                              "4*V*h", split_by_cp=False),
                        Entry("the last chunk's logits", T / n * vocab, B, "tp", f"B*s*b*V/{n}")])
    return moments


def _torchtitan_chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """torchtitan's ChunkedLossWrapper (components/loss.py, the default of its recipes) runs the LM
    head's forward and backward chunk by chunk inside the loss call, during the forward pass: the
    head stays gathered (FSDP transients), its unsharded gradient accumulates in fp32 (FSDP2's
    reduce dtype) over the 8 chunks and is reduce-scattered after the last, and the hidden-state
    gradient accumulates in an fp32 buffer. Beside those two accumulators the loss's largest moment
    is one of: a chunk's cross-entropy (its logits, fp32 log-softmax and two fp32 gradients); a
    chunk's head-weight gradient (the parameter dtype, before FSDP2 adds it to the fp32 one) beside
    the chunk's logits and their gradient; under FSDP (d > 1) the last chunk's reduce-scatter, whose
    fp32 input (torch 2.13 FSDP2 foreach_reduce) sits beside the accumulated gradient and the last
    chunk's logits (measured, tests/data/measured/torchtitan, per-tensor breakdown). What backward
    keeps is the hidden-state gradient in the compute dtype (and the LM head's sharded gradient)."""
    B = bytes_per_element(training.compute_dtype)
    T, h, d = tokens_per_gpu(training, par), arch.hidden_size, par.dp * par.cp
    saved = _norm("final norm input", T, arch, training)
    saved.append(Entry("hidden-state gradient from the chunked loss", T * h, B, "sp", "B*s*b*h"))
    saved.append(Entry("LM head's sharded gradient (fp32, reduced inside the loss)", vocab * h / d, 4, "tp",
                       "4*V*h/d", split_by_cp=False))
    accumulators = [Entry("fp32 hidden-state gradient accumulator", T * h, 4, "sp", "4*s*b*h"),
                    Entry("LM head's unsharded fp32 gradient, accumulated over the chunks", vocab * h, 4, "tp",
                          "4*V*h", split_by_cp=False)]
    moments = torchtitan_loss_moments(arch, training, par, vocab)
    forward = accumulators + max(moments, key=lambda m: sum(e.bytes(par) for e in m))
    return LossMemory(saved=saved, forward=forward, backward=[],
                      source="torchtitan v0.3.0 components/loss.py ChunkedLossWrapper (8 chunks), GradAccumulator; "
                             "torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce"
                             + (f"; {TORCHTITAN_COMPILED_LOSS_SOURCE}" if compiled_loss(arch, training, par) else ""))


TORCHTITAN_COMPILED_LOSS_SOURCE = (
    "torchtitan v0.3.0 components/loss.py CrossEntropyLoss._maybe_compile (torch.compile of cross_entropy_loss, "
    "components default ['model', 'loss']); measured with validation/compile_saved.py loss_buffers (Inductor on CPU, "
    "torch 2.13): tests/data/measured/compile/torchtitan-cross-entropy-bf16-n64-v4096.json")
