"""The mixture-of-experts block: routed and shared experts' saved tensors, the dispatchers' buffers
and the backward moments of the combine and the grouped experts (Megatron-Core).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, tokens_per_gpu


# --- Megatron's all-to-all dispatcher: the moments inside an MoE layer ---------------------------------

MEGATRON_ALLTOALL = (
    "Megatron-Core 0.16.1 transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher (drop-and-pad): "
    "dispatch_preprocess permutes the tokens (moe_utils.permute), token_dispatch sends them (all_to_all), "
    "dispatch_postprocess gathers them over expert-TP and sorts them by local expert (a contiguous copy); "
    "combine_preprocess unsorts the experts' outputs (a copy) and reduce-scatters them over expert-TP in the "
    "probabilities' dtype, token_combine sends them back; moe_layer.py MoELayer.forward holds the permuted tokens "
    "until it returns; experts.py SequentialMLP runs its local experts one after another and concatenates their "
    "outputs; measured, tests/data/measured/megatron")


def _routed(arch: Architecture, training: Training, par: Parallel) -> tuple[float, int]:
    """k*phi*s*b/cp, the routed tokens of this rank's tokens before the sequence-parallel division, and the
    local experts per rank."""
    return (tokens_per_gpu(training, par) * arch.num_experts_per_token * training.moe_capacity_factor,
            max(1, arch.num_experts // par.ep))


def _router_dtype_bytes(training: Training) -> float:
    return 8 if training.moe_router_dtype == "fp64" else bytes_per_element(training.moe_router_dtype)


def moe_combine_moment(arch: Architecture, training: Training, par: Parallel, send_bytes: float) -> list[Entry]:
    """The last moment of an MoE layer's forward (MEGATRON_ALLTOALL), beside the tensors the layer keeps: the
    permuted tokens it sent (`send_bytes` per element), the experts' concatenated outputs and their copy
    unsorted by local expert, while the expert-TP reduce-scatter and the returning all-to-all allocate their
    outputs. With --moe-router-dtype the outputs are cast to that dtype before the reduce-scatter, whose output is
    in it too (the largest moment then: the bf16 copy and the all-to-all come after both are freed)."""
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    h = arch.hidden_size
    out = []
    if par.ep > 1:
        out.append(Entry("permuted tokens sent by the all-to-all (held by MoELayer.forward)", n * h, send_bytes, "sp",
                         f"{send_bytes:g}*phi*k*s*b*h"))
    out.append(Entry("experts' outputs, concatenated", n * h * par.etp, B, "sp", "B*phi*k*s*b*h*etp"))
    if local > 1 and par.ep * par.etp > 1:  # [etp*ep, E_local, ...].transpose(0, 1).contiguous(): no copy for 1
        out.append(Entry("experts' outputs unsorted by local expert (a copy)", n * h * par.etp, B, "sp",
                         "B*phi*k*s*b*h*etp"))
    if par.etp > 1 and training.moe_router_dtype:
        R, dt = _router_dtype_bytes(training), training.moe_router_dtype
        out.append(Entry(f"experts' outputs cast to the router dtype ({dt}) for the expert-TP reduce-scatter",
                         n * h * par.etp, R, "sp", "R*phi*k*s*b*h*etp"))
        out.append(Entry(f"expert-TP reduce-scatter output ({dt})", n * h, R, "sp", "R*phi*k*s*b*h"))
        return out
    if par.etp > 1:
        out.append(Entry("expert-TP reduce-scatter output", n * h, B, "sp", "B*phi*k*s*b*h"))
    if par.ep > 1:
        out.append(Entry("all-to-all output (the tokens back on their rank)", n * h, B, "sp", "B*phi*k*s*b*h"))
    return out


def moe_expert_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The largest moment of an MoE layer's backward in its experts (MEGATRON_ALLTOALL), beside the kept tensors:
    the gradient of the experts' outputs sorted by local expert (the backward of combine_preprocess's unsort
    copy, or the gradient arriving in its place), and for the expert being differentiated (SequentialMLP: one at
    a time, each with 1/E_local of the tokens) the gradient of its fc2 input and the weighted SwiGLU's backward
    output, its fc1 output's gradient (twice the width; without a gated MLP the activation's gradient, as wide).
    GroupedMLP (--moe-grouped-gemm) differentiates all local experts at once: `grouped_mlp_backward_moment`."""
    if training.moe_grouped_gemm:
        return grouped_mlp_backward_moment(arch, training, par)
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    f = arch.moe_intermediate_size
    one = n * f / local  # one expert's n*etp/E_local tokens x its f_e/etp columns on this rank
    return [Entry("gradient of the experts' outputs (sorted by local expert)", n * arch.hidden_size * par.etp, B,
                  "sp", "B*phi*k*s*b*h*etp"),
            Entry("one expert's gradient of its fc2 input", one, B, "sp", "B*phi*k*s*b*f_e/E_local"),
            Entry("one expert's gradient of its fc1 output" + (" (gate and up)" if arch.gated_mlp else ""),
                  one * (2 if arch.gated_mlp else 1), B, "sp",
                  ("2*" if arch.gated_mlp else "") + "B*phi*k*s*b*f_e/E_local")]


MEGATRON_GROUPED_MLP = (
    "Megatron-Core 0.16.1 transformer/moe/experts.py GroupedMLP.forward (--moe-grouped-gemm): fc1 and fc2 are one "
    "grouped GEMM each over all local experts (grouped_gemm ops.py GroupedGemm: forward saves (a, b, batch_sizes); "
    "backward returns agrad = gmm(grad, b, trans_b=not trans_b) [tokens, k] and bgrad = gmm(a, grad, trans_a=True) "
    "[experts, k, n], b's shape), between them the weighted activation (activation_func_with_probs; with moe_act "
    "recompute under tensor_parallel.CheckpointWithoutOutput, whose backward holds the recomputed output until it "
    "returns); the weight gradients flow through the views of weight1/weight2 to the DDP hooks; "
    "measured, tests/data/measured/megatron (emulated gmm, validation/megatron/kernels.py)")


TE_GROUPED_LINEAR = (
    "Megatron-Core 0.16.1 extensions/transformer_engine_spec_provider.py grouped_mlp_modules (--moe-grouped-gemm "
    "under --transformer-impl transformer_engine, without --moe-use-legacy-grouped-gemm: TEGroupedMLP over "
    "TEGroupedLinear, fuse_wgrad_accumulation=config.gradient_accumulation_fusion); TransformerEngine "
    "pytorch/module/grouped_linear.py _GroupedLinear.backward (v2.12, 5671fd36, the release Megatron-Core 0.16.1 "
    "pins; v2.11, c188b533, alike; since v1.9): under fuse_wgrad_accumulation the weight-gradient grouped GEMM "
    "writes into the experts' main_grad (`wgrad_list = main_grads`) and autograd gets TE's cached dummy gradient "
    "(wgrad_cache.py); without it one new weight-sized gradient per local expert (`torch.empty(w.size())`)")


LEGACY_GROUPED_MLP = (
    "Megatron-Core 0.16.1 extensions/transformer_engine_spec_provider.py grouped_mlp_modules (GroupedMLP where "
    "--moe-use-legacy-grouped-gemm is set), models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec (GroupedMLP for "
    "--moe-grouped-gemm), transformer/moe/experts.py GroupedMLP: weight1 and weight2 one parameter each for all "
    "local experts, differentiated by grouped_gemm's gmm, whatever gradient_accumulation_fusion says")


def legacy_grouped_mlp(training: Training) -> bool:
    """Whether Megatron builds the legacy GroupedMLP (LEGACY_GROUPED_MLP): --moe-grouped-gemm on the local spec, or
    under the TransformerEngine spec with --moe-use-legacy-grouped-gemm."""
    return (training.framework == "megatron" and training.moe_grouped_gemm
            and (training.transformer_impl == "local" or training.moe_use_legacy_grouped_gemm))


def te_grouped_wgrad_in_main_grad(training: Training) -> bool:
    """Whether the experts' weight gradients go straight into main_grad (TE_GROUPED_LINEAR): TransformerEngine's
    GroupedLinear (Megatron's default transformer_impl with --moe-grouped-gemm, unless the legacy GroupedMLP is asked
    for) under gradient-accumulation fusion (Megatron-LM's default). The legacy GroupedMLP (grouped_gemm's gmm,
    `legacy_grouped_mlp`) always returns them, to the DDP hooks that add them into main_grad: the Megatron harness
    builds it (validation/megatron/harness.py), as its records say."""
    return (training.framework == "megatron" and training.moe_grouped_gemm
            and training.transformer_impl == "transformer_engine" and not legacy_grouped_mlp(training)
            and training.gradient_accumulation_fusion)


def grouped_mlp_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The largest moment of GroupedMLP's backward (MEGATRON_GROUPED_MLP), beside the kept tensors, every local
    expert's tokens at once; the larger of two:
    - fc2's grouped GEMM backward returning: the gradient of the experts' outputs (sorted by local expert) it reads,
      its input gradient (the activation's output gradient, [phi*k*s*b*etp, f_e/etp]) and its weight gradient
      ([E_local, f_e/etp, h], b's shape), which TransformerEngine's GroupedLinear under gradient-accumulation
      fusion writes into main_grad instead (TE_GROUPED_LINEAR: none here);
    - the weighted activation's backward writing fc1's output gradient (gate and up for a gated MLP: twice f_e/etp
      wide): the outputs' gradient and fc2's saved input (the activation's output) are freed by then; the weight
      gradient is not yet handed to the DDP hook (the activation's backward node, created later in forward, runs
      first). The activation's output gradient takes the place of the freed kept output, so it adds nothing.
    With moe_act recomputed the activation's output is not kept: before fc2's backward the checkpoint recomputes
    it (held by the checkpoint until its backward returns) and copies it into the discarded output's storage (fc2's
    saved input, freed after fc2's backward), so both moments hold the recomputed output and the first its copy
    too, and the activation's output gradient adds to the second."""
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    f, h = arch.moe_intermediate_size, arch.hidden_size
    gated = arch.gated_mlp
    act_recomputed = training.recompute == "selective" and "moe_act" in training.recompute_modules
    wgrad = Entry("experts' fc2 weight gradient (all local experts, grouped GEMM)", local * f * h / par.etp, B, "none",
                  "B*E_local*f_e*h/etp", split_by_cp=False)
    act_grad = Entry("gradient of the experts' activation output (fc2's input), all local experts", n * f, B, "sp",
                     "B*phi*k*s*b*f_e")
    recomputed = Entry("experts' activation output recomputed (held by the moe_act checkpoint)", n * f, B, "sp",
                       "B*phi*k*s*b*f_e")
    wgrads = [] if te_grouped_wgrad_in_main_grad(training) else [wgrad]
    fc2 = [Entry("gradient of the experts' outputs (sorted by local expert)", n * h * par.etp, B, "sp",
                 "B*phi*k*s*b*h*etp"), act_grad] + wgrads
    if act_recomputed:
        fc2 += [recomputed, recomputed._replace(name="its copy in the discarded output's storage (fc2's saved input)")]
    fc1_grad = Entry("gradient of the experts' fc1 output, all local experts" + (" (gate and up)" if gated else ""),
                     n * f * (2 if gated else 1), B, "sp", ("2*" if gated else "") + "B*phi*k*s*b*f_e")
    activation = wgrads + [fc1_grad]
    if act_recomputed:
        activation += [act_grad, recomputed]
    return max(fc2, activation, key=lambda moment: sum(e.bytes(par) for e in moment))


def moe_router_dtype_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """--moe-router-dtype under expert-TP: in backward the gradient of the reduce-scatter's output is cast to the
    router dtype and all-gathered in it (the backward of combine_preprocess's cast and reduce-scatter)."""
    if not (training.moe_router_dtype and par.etp > 1):
        return []
    n, _ = _routed(arch, training, par)
    R, dt, h = _router_dtype_bytes(training), training.moe_router_dtype, arch.hidden_size
    return [Entry(f"gradient cast to the router dtype ({dt}) before the expert-TP all-gather", n * h, R, "sp",
                  "R*phi*k*s*b*h"),
            Entry(f"expert-TP all-gather of that gradient ({dt})", n * h * par.etp, R, "sp", "R*phi*k*s*b*h*etp")]


MEGATRON_ALLGATHER = (
    "Megatron-Core 0.16.1 transformer/moe/token_dispatcher.py MoEAllGatherTokenDispatcher: token_dispatch "
    "all-gathers the hidden states over the EP x expert-TP group into the global memory buffer 'mpu' "
    "(tensor_parallel/mappings.py _gather_along_first_dim use_global_buffer=True; utils.py GlobalMemoryBuffer, "
    "allocated once and kept), dispatch_postprocess permutes this rank's local experts' tokens out of it "
    "(moe_utils.permute: index_select), combine_preprocess unpermutes the experts' outputs into zeros over every "
    "gathered token (moe_utils.unpermute: scatter_add) and token_combine reduce-scatters them back; in backward "
    "the reduce-scatter's gradient is all-gathered (a new tensor) and gathered per routed token; "
    "measured, tests/data/measured/megatron")


def _gathered(training: Training, par: Parallel) -> float:
    """s*b/cp*ep*etp: the tokens every rank of the EP x expert-TP group gathers, before the sequence-parallel
    division (with it each rank contributes s*b/(cp*t))."""
    return tokens_per_gpu(training, par) * par.ep * par.etp


MEGATRON_GLOBAL_BUFFER = ("Megatron-Core 0.16.1 utils.py GlobalMemoryBuffer.get_tensor (one buffer per name and dtype, "
                          "grown to the largest request, never freed): 'mpu' holds tensor_parallel/layers.py's "
                          "sequence-parallel all-gather of a column-parallel linear's input, "
                          "MoEAllGatherTokenDispatcher's all-gather of the hidden states and "
                          "transformer/dot_product_attention.py's baddbmm input [b*a/t, s, s]")


def global_memory_buffer(arch: Architecture, training: Training, par: Parallel, moe_stage: bool) -> list[Entry]:
    """Megatron's global memory buffer 'mpu' (MEGATRON_GLOBAL_BUFFER): one per rank, as large as its largest
    request, kept from the first step on. Sequence parallelism gathers every column-parallel linear's input
    into it (s*b*h over the TP group); the all-gather dispatcher gathers the hidden states over the EP x
    expert-TP group into the same buffer; the local spec's attention asks it for its scores' shape."""
    gathers = [par.tp] if par.sequence_parallel and par.tp > 1 else []
    if moe_stage and training.moe_dispatcher == "allgather" and par.ep * par.etp > 1:
        gathers.append(par.ep * par.etp)
    B = bytes_per_element(training.compute_dtype)
    requests = [Entry("global memory buffer 'mpu' (the all-gathered hidden states; allocated once, kept)",
                      tokens_per_gpu(training, par) * max(gathers) * arch.hidden_size, B, "sp",
                      f"B*s*b*h*{max(gathers)}")] if gathers else []
    if training.transformer_impl == "local" and not arch.uses_sparse_attention:
        # the local spec's core attention, Megatron's unfused DotProductAttention, asks the buffer for its baddbmm
        # input (beta=0: never read), as large as the scores; TransformerEngine's unfused attention makes its own
        scores = training.micro_batch_size * arch.num_attention_heads * (training.seq_len / par.cp) * training.seq_len
        requests.append(Entry("global memory buffer 'mpu' (the unfused attention's baddbmm input; allocated once, "
                              "kept)", scores, B, "tp", "B*a*s^2*b"))
    return [max(requests, key=lambda e: e.bytes(par))] if requests else []


def moe_allgather_combine_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The last moment of an MoE layer's forward under the all-gather dispatcher (MEGATRON_ALLGATHER), beside
    the tensors the layer keeps: the experts' concatenated outputs while the unpermute's zeros over every
    gathered token are filled; both are freed before the reduce-scatter's output (s*b*h/t) is allocated."""
    B = bytes_per_element(training.compute_dtype)
    n, _ = _routed(arch, training, par)
    h = arch.hidden_size
    return [Entry("experts' outputs, concatenated", n * h * par.etp, B, "sp", "B*phi*k*s*b*h*etp"),
            Entry("experts' outputs unpermuted over the gathered tokens (zeros, scatter_add)",
                  _gathered(training, par) * h, B, "sp", "B*s*b*h*ep*etp")]


def moe_allgather_combine_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The first moment of an MoE layer's backward under the all-gather dispatcher (MEGATRON_ALLGATHER): the
    reduce-scatter's gradient all-gathered over the EP x expert-TP group (a new tensor, not the global buffer)
    while the unpermute's backward gathers it per routed token (the gradient of the experts' outputs)."""
    B = bytes_per_element(training.compute_dtype)
    n, _ = _routed(arch, training, par)
    h = arch.hidden_size
    out = []
    if par.ep * par.etp > 1:
        out.append(Entry("gradient of the combine all-gathered over EP x expert-TP", _gathered(training, par) * h,
                         B, "sp", "B*s*b*h*ep*etp"))
    out.append(Entry("gradient of the experts' outputs (gathered per routed token)", n * h * par.etp, B, "sp",
                     "B*phi*k*s*b*h*etp"))
    return out
