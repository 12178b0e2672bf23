"""Megatron-Core's layouts (context parallelism by TransformerEngine's all-to-all among them): the caching
allocator (allocator.py) replayed over Megatron-Core 0.16.1's own order of allocations, its initialisation and two
steps, for the reserved memory (reserved.py's rule 1, this stack).

The order, from Megatron-Core 0.16.1's source (megatron/core/...):
- the model built on the GPU, one tensor per parameter in module order (the embedding, each layer's norms, fused
  QKV, output projection, fused fc1 and fc2, the final norm, the output layer), each TP rank's shard;
- DDP (distributed/param_and_grad_buffer.py `_ParamAndGradBuffer.__init__`): with the distributed optimizer one
  contiguous parameter buffer (`param_data`, torch.zeros), then the gradient buffer (`grad_data`); each parameter's
  data copied into its view of `param_data` and its own storage freed (`del old_param_data`); without it the
  parameters stay where they are;
- the optimizer (optimizer/distrib_optimizer.py `_build_model_and_main_param_groups`; optimizer.py
  `Float16OptimizerWithFloat16Params` alike): per parameter, its shard `clone().float()`: a 16-bit copy, its fp32
  main parameter kept, the copy freed;
- the cuBLAS and TransformerEngine workspaces; the global memory buffer where the first layer asks for it;
- per micro-batch the forward (the activation ledger's tensors in their order; Megatron's unfused softmax,
  fusions/fused_softmax.py `forward_torch_softmax` under dot_product_attention.py: the scores made by `baddbmm` in
  the compute dtype, their fp32 copy (`input.float()`), the fp32 softmax and its cast back kept, the fp32 copy freed
  as the softmax returns, the scores as the attention returns), the loss (reserved.py's: the logits, then what the
  loss keeps, the logits freed);
- the backward: the logits' gradient alive through the output layer's backward; layer by layer in reverse, the
  layer's tensors freed in reverse order of making as backward passes its weights (reserved.py `_backward`'s rule),
  the unfused softmax's backward where its output is reached (the probabilities' gradient, its fp32 cast, CUDA's
  `grad * output` temporary and the input gradient, masked_fill's and `float()`'s gradients, each freeing the one
  before); each weight's gradient made and added into `main_grad` by DDP's hook, then freed
  (distributed_data_parallel.py `_make_backward_post_hook`), where gradient-accumulation fusion does not write it
  there directly (tensor_parallel/layers.py; TE `fuse_wgrad_accumulation`: TE's dummy gradient of the weight's shape
  made where the first backward first reaches it, and kept: wgrad_cache.py): the embedding's and the norms' always;
- with a pipeline, the micro-batches in 1F1B's order (`_one_f_one_b`), a stage's output sent and freed, the
  gradient it receives for it held to its backward;
- the step (torch.optim.Adam `_init_group`, TE FusedAdam alike): the two moments per main parameter at the first
  step, interleaved; torch's foreach AdamW's sqrt(v), one per tensor, made and freed together (the norms' small
  no-decay group taken with the rest); nothing else
  (the gradients are views of `grad_data`, the parameters copied back in place);
- MoE layers under the all-to-all dispatcher and MLA: megatron_moe_replay.py (the expert parameters' own buffers and
  optimizer; the layer's order of allocations, the ledger's tensors and MoE moments).
Two steps are replayed; segments are never given back. With context parallelism (the all-to-all) a dense layer's
order is TransformerEngine's, its attention on two streams, its linears' sequence-parallel gathers and the backward's
activation gradients with it (megatron_cp_a2a.py, megatron_te_linears.py: the residual's gradient made by the final
norm's backward and held to the embedding's); CP's other exchanges (p2p's ring, the all-gather) keep the flat
share. Under the distributed optimizer each rank of DP x CP makes its own cut of the main parameters, in the buffer's
order (the last parameter's first): the replay runs every rank (up to MAX_RANKS, fewer with many micro-batches:
_ranks) and keeps the largest cache, as a run's measured reserved memory is its largest rank's.
"""

from __future__ import annotations

from . import megatron_cp_a2a, megatron_moe_replay, megatron_te_linears
from .activations.attention import SOFTMAX_CAST, UNFUSED_SOFTMAX_FP32
from .activations.entries import ATTENTION_OUTPUT
from .allocator import SMALL_SIZE
from .components import Component
from .one_f_one_b_replay import Schedule
from ..spec.dtypes import bytes_per_element
from ..spec.tensors import COLUMN, REPLICATED, ROW, VOCAB

SOURCE = ("Megatron-Core 0.16.1 distributed/param_and_grad_buffer.py (_ParamAndGradBuffer.__init__), "
          "optimizer/distrib_optimizer.py (_build_model_and_main_param_groups), transformer/dot_product_attention.py "
          "and fusions/fused_softmax.py (forward_torch_softmax), tensor_parallel/layers.py; torch.optim.Adam "
          "(_init_group, _multi_tensor_adam); PyTorch's caching allocator (allocator.py) replayed over them "
          "(estimator/memory/megatron_replay.py); measured: tests/data/measured/gpu/megatron, "
          "tests/data/measured/published/simumax_b200")


def replay_rule(cfg) -> str | None:
    """Why the Megatron replay does not apply (None: it does): a decoder (dense, or MoE under the all-to-all dispatcher:
    megatron_moe_replay.moe_rule; its attention MHA, GQA or MLA) on TP x DP x EP, PP under 1F1B, dense layers also
    under context parallelism by TransformerEngine's all-to-all (megatron_cp_a2a.cp_rule), the distributed optimizer
    or DDP's buffers, default segments, nothing offloaded (as measured: the H200 records and the B200 runs of
    tests/data/measured)."""
    from .reserved import stage_layers
    training, par, arch = cfg.training, cfg.parallel, cfg.architecture
    layers = stage_layers(cfg)
    moe = megatron_moe_replay.moe_rule(cfg)
    cp = megatron_cp_a2a.cp_rule(cfg)
    checks = (
        (training.mode != "training" or training.rl is not None, "not a training step"),
        (par.vpp > 1 or par.pp_schedule != "1f1b", f"the {par.pp_schedule} pipeline schedule (1F1B is replayed)"),
        (par.cp > 1 and cp is not None, cp),
        (cfg.zero_stage > 1, f"Megatron FSDP (ZeRO-{cfg.zero_stage}: its gathers are not replayed)"),
        (arch.is_hybrid, "a hybrid model (its state-space layers are not replayed)"),
        (moe is not None, moe),
        (arch.uses_sparse_attention, "sparse attention (not replayed)"),
        (arch.vision_tower is not None or arch.mtp_layers > 0, "a vision tower or MTP modules (not replayed)"),
        (training.optimizer not in ("adam", "adamw"), f"the {training.optimizer} optimizer (the replay steps Adam)"),
        (cfg.hardware.expandable_segments, "expandable segments"),
        (training.recompute == "selective", "selective recompute (not replayed)"),
        (training.offload_optimizer != "none" or training.offload_parameters != "none"
         or training.offload_activations, "offload"),
        (training.fp8, "FP8 (its scaling buffers are not replayed)"),
        (layers * cfg.microbatches > MAX_LAYER_WALKS,
         f"{layers:,} layers x {cfg.microbatches:,} micro-batches a stage: more than the replay walks "
         f"({MAX_LAYER_WALKS:,})"),
    )
    return next((why for failed, why in checks if failed), None)


def replayed_cache(cfg, shared, sp, static) -> Component:
    from .reserved import replay_component

    arch = cfg.architecture
    source = f"{SOURCE}; {megatron_moe_replay.SOURCE}" if arch.is_moe or arch.uses_mla else SOURCE
    if cfg.parallel.cp > 1:
        source = f"{source}; {megatron_te_linears.SOURCE}"
    return replay_component(cfg, sp, "megatron reserved replay", lambda: replayed(cfg, shared, sp, static),
                            "Megatron-Core's initialisation and two steps", source)


def rank_tensors(cfg, sp) -> tuple[list[float], list[list[float]], list[float]]:
    """Elements of the rank's parameters: the embedding's, each layer's (q, k and v fused as Megatron's linear_qkv,
    a gated fc1 one tensor), the head's (final norm, output layer); TP shards split by tp."""
    from .activations.moe import legacy_grouped_mlp

    arch, tp = cfg.architecture, cfg.parallel.tp
    legacy = legacy_grouped_mlp(cfg.training)

    def local(params) -> list[float]:
        out: list[float] = []
        for t in params:
            n = t.numel / (tp if t.split in (COLUMN, ROW, VOCAB) else 1)
            if t.is_expert:
                out += megatron_moe_replay.expert_shards(t, cfg.parallel, legacy)
            elif t.split == REPLICATED and t.role == "vector" and t.copies > 1:
                out += [n / t.copies] * t.copies  # one scale per norm module
            elif t.name in ("k_proj", "v_proj") and out:
                out[-1] += n  # linear_qkv
            else:
                out.append(n)
        return out

    kinds = arch.layer_kinds()
    layers = [local(arch.layer_tensors(kinds[i])) for i in sp.layer_indices]
    embedding = local(arch.embedding_tensors(cfg.padded_vocab)) if sp.first else []
    head = local(arch.head_tensors(cfg.padded_vocab)) if sp.last else []
    if sp.last and not sp.first and arch.tie_embeddings:  # GPTModel: the last stage's own output weight
        head += local(arch.embedding_tensors(cfg.padded_vocab))[:1]
    return embedding, layers, head


MAX_RANKS = 8  # the data-parallel ranks replayed at most (_ranks)
MAX_WALKED = 64  # micro-batches a stage's replays walk at most over its ranks (each walks up to 2 steps of them)
# a stage's layers x micro-batches walked over its ranks at most: a layer's forward and backward cost about 0.2 ms
# of Python a micro-batch, so this keeps one estimate's replay within about 2 s (the public server answers it
# inline); a stage whose layers x micro-batches alone pass it takes the flat share (replay_rule)
MAX_LAYER_WALKS = 8192


def replayed(cfg, shared, sp, static) -> tuple[int, int]:
    """(reserved peak - allocated peak, segments) of the replay of the initialisation and two steps, on the rank of
    the optimizer's data-parallel group that leaves the largest cache: under the distributed optimizer each rank
    makes its own cut of the buffer's main parameters (`_shards`), and a run's measured reserved memory is its
    largest rank's (tests/data/measured/published/simumax_b200: the max over the ranks)."""
    return max(_replayed_rank(cfg, shared, sp, static, rank) for rank in _ranks(cfg))


def _ranks(cfg) -> list[int]:
    """The ranks replayed: every one of DP x CP under the distributed optimizer, up to MAX_RANKS and MAX_WALKED over
    the micro-batches (a replay costs tens of milliseconds at a few micro-batches, seconds at a hundred when the
    allocator's state finds no cycle to skip); beyond, that many evenly spaced, the first and the last among them;
    without the distributed optimizer one (the ranks alike)."""
    n = cfg.parallel.dp * cfg.parallel.cp if cfg.zero_stage == 1 else 1
    from .reserved import stage_layers
    walks = max(1, cfg.microbatches) * stage_layers(cfg)
    most = max(1, min(MAX_RANKS, MAX_WALKED // max(1, cfg.microbatches), MAX_LAYER_WALKS // walks))
    if n <= most:
        return list(range(n))
    if most == 1:
        return [0]
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def _replayed_rank(cfg, shared, sp, static, rank: int) -> tuple[int, int]:
    """The replay of one rank of the optimizer's data-parallel group (its cut of the main parameters)."""
    from .reserved import _Program
    from .transients import transients

    training, recipe = cfg.training, cfg.recipe
    tr = transients(cfg.architecture, training, recipe, cfg.parallel, sp, cfg.zero_stage, None)
    embedding, layers, head = rank_tensors(cfg, sp)
    order = embedding + [n for layer in layers for n in layer] + head
    P, G = bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    program = _Program()
    kept = static.parts().kept
    mains = _initialise(program, cfg, order, P, G, _bytes(kept, "master_weights"), rank)
    program.many(_workspaces(cfg, sum(c.bytes for c in kept if c.key == "workspace")))
    walk = _Walk(program, cfg, shared, sp, static, embedding, layers, head, P)
    # the global memory buffer, made where the first layer first asks for it (utils.py GlobalMemoryBuffer.get_tensor)
    walk.pending = [c.bytes for c in kept if c.key == "buffers"]
    moments: list = []
    schedule = Schedule(walk)  # its records serve both steps
    for _ in range(2):
        if cfg.parallel.pp > 1:
            _one_f_one_b(schedule, cfg.parallel.pp, sp.stage, cfg.microbatches)
        else:
            _accumulate(program, walk, cfg.microbatches)
        moments = _step(program, mains, moments, tr, _bytes(kept, "optimizer_states"))
    allocator = program.allocator
    return max(0, allocator.reserved_peak - allocator.allocated_peak), allocator.segments


def _accumulate(program, walk, microbatches: int) -> None:
    """The micro-batches one after another; one that leaves the allocator as it found it: so do the rest."""
    previous = None
    for _ in range(microbatches):
        walk.micro_batch()
        now = program.state()
        if now == previous:
            break
        previous = now


def _one_f_one_b(schedule: Schedule, pp: int, rank: int, microbatches: int) -> None:
    """Megatron-Core's 1F1B (pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving):
    pp - rank - 1 warm-up forwards, then a forward and the oldest micro-batch's backward by turns, then the
    cool-down backwards (one_f_one_b_replay.py: what it records and skips)."""
    warmup = min(pp - rank - 1, microbatches)
    waiting = [schedule.forward() for _ in range(warmup)]
    schedule.steady(waiting, microbatches - warmup, _held)
    for batch in waiting:
        schedule.backward(batch)


def _held(waiting: list) -> tuple:
    """The blocks a queue of micro-batches holds, in order (`_Walk.forward`'s states, or a record's blocks)."""
    return tuple(_addresses([b.state]) if b.state is not None else tuple(b.blocks) for b in waiting)


def _addresses(waiting: list) -> tuple:
    """The blocks a queue of micro-batches holds, in order (`_Walk.forward`'s states)."""
    return tuple((batch, tuple(map(tuple, kept)), tuple(map(tuple, loss)), received)
                 for batch, kept, loss, received in waiting)


def _workspaces(cfg, total: float) -> list[int]:
    """The library workspaces as their requests (workspaces.library_workspaces: one cuBLAS workspace per thread
    that runs a matrix product, TE's own after them)."""
    from .workspaces import TORCH_THREADS, cublas_workspace_bytes

    hardware = cfg.hardware
    config = hardware.cublas_workspace_config
    each = cublas_workspace_bytes(config) if config else hardware.device.runtime.blas_workspace_bytes
    threads = TORCH_THREADS["training"]
    rest = int(total - threads * each + 0.5)
    return [each] * threads + ([rest] if rest > 0 else [])


def _bytes(kept, key: str) -> float:
    return sum(c.bytes for c in kept if c.key == key)


def _initialise(program, cfg, order: list[float], P: float, G: float, masters: float, rank: int) -> list[float]:
    """The model, DDP's buffers, the optimizer's main parameters (`masters`: their bytes in the ledger, none
    without master weights); returns the elements the optimizer steps. MoE's expert parameters take buffers and an
    optimizer of their own, after the dense ones' (megatron_moe_replay.groups)."""
    distributed = cfg.zero_stage == 1
    own = [program.alloc(P * n) for n in order]
    groups = megatron_moe_replay.groups(cfg, order)
    for members, _ in groups:
        total = sum(order[i] for i in members)
        if distributed:
            program.alloc(P * total)  # param_data
        program.alloc(G * total)  # grad_data
        if distributed:  # `for param in params[::-1]`: each copied into param_data, its storage freed
            program.free(*[own[i] for i in reversed(members)])
    # the distributed optimizer shards over the data-parallel group with context parallelism (states.py), the experts'
    # over the expert-data-parallel group (the rank taken modulo its size: the B200 MoE runs' is 1); without it
    # Float16OptimizerWithFloat16Params makes every main parameter in the param groups' (module) order
    mains = [n for members, over in groups for n in _shards([order[i] for i in members], over, rank % over)] \
        if distributed else list(order)
    M = masters / max(1.0, sum(mains))  # bytes per element of a main parameter (fp32)
    for n in mains if M else ():
        copy = program.alloc(P * n)  # shard_model_param.clone()
        program.alloc(M * n)  # .float(): the main parameter
        program.free(copy)
    return mains


def _shards(order: list[float], dp: int, rank: int = 0) -> list[float]:
    """The main parameters of rank `rank` of the `dp` sharing the optimizer, in the order Megatron-Core makes them:
    its 1/dp of the buffer (one bucket: Megatron-LM's DDP without overlap_grad_reduce, distributed_data_parallel.py
    `bucket_size = None`), which lays the parameters out from the last (param_and_grad_buffer.py `for param in
    params[::-1]`, `param_index_map`); rank r owns [r/dp, (r+1)/dp) of it. distrib_optimizer.py walks the buffer's
    `param_index_map` (`_build_model_gbuf_param_range_map`, `_build_optimizer_group_ranges`), so
    `_build_model_and_main_param_groups` makes the main parameters, and Adam its moments, in the buffer's order."""
    room = sum(order) / dp
    low, high, at, out = rank * room, (rank + 1) * room, 0.0, []
    for n in reversed(order):
        cut = min(high, at + n) - max(low, at)
        if cut > 0:
            out.append(cut)
        at += n
    return out


def _step(program, mains: list[float], moments: list, tr, states: float) -> list:
    """The optimizer step: Adam's two moments at the first, interleaved per main parameter (`states`: their bytes
    in the ledger); foreach AdamW's sqrt(v), one result per tensor, made and freed."""
    elements = max(1.0, sum(mains))
    if not moments:
        S = states / 2 / elements
        moments = [program.alloc(S * n) for n in mains for _ in range(2)]
    if tr.optimizer:
        T = sum(c.bytes for c in tr.optimizer) / elements
        program.free(*[program.alloc(T * n) for n in mains])
    return moments


class _Walk:
    """One micro-batch's forward and backward over the ledger's tensors."""

    def __init__(self, program, cfg, shared, sp, static, embedding, layers, head, P: float):
        from .activations.moe import legacy_grouped_mlp
        from .activations.recompute import recomputed_layer_count
        from .reserved_layers import layers_by_kind

        training, arch = cfg.training, cfg.architecture
        self.program, self.shared, self.sp, self.P = program, shared, sp, P
        self.embedding, self.layers, self.head = embedding, layers, head
        self.kinds = [arch.layer_kinds()[i] for i in sp.layer_indices]
        self.sizes = layers_by_kind(cfg, shared, self.kinds)
        self.scores = {kind: _scores_at(shared, kind) for kind in set(self.kinds)}  # (at, attention's end) or None
        self.a2a = {kind: megatron_cp_a2a.plan(cfg, shared, kind) for kind in set(self.kinds)}  # CP's all-to-all
        if cfg.parallel.cp > 1 and not all(self.a2a.values()):  # unreachable: cp_rule refuses these (unplanned)
            raise ValueError(f"the Megatron replay under CP found layers without TE's all-to-all: {sorted(self.kinds)}")
        # CP's layers: TE's linears (megatron_te_linears.py) and the residual's gradient through backward
        self.lin = megatron_te_linears.linears(cfg) if any(self.a2a.values()) else None
        self.carried = None  # a layer's output, until the next residual sum
        # full recompute checkpoints the stage's first layers (Megatron's block method), or all of them
        self.checkpointed = recomputed_layer_count(training, len(self.kinds))
        self.fused_wgrad = training.gradient_accumulation_fusion
        # the legacy GroupedMLP's gmm returns its weights' gradients to autograd whatever the fusion says
        self.legacy_experts = legacy_grouped_mlp(training)
        self.tied = arch.tie_embeddings
        self.ids = 8 * training.seq_len * training.micro_batch_size / cfg.parallel.cp
        self.pending: list[float] = []
        self.plans = megatron_moe_replay.plans(cfg, shared, sp)  # MLA's and MoE's order
        self.dummies = _dummies(cfg, sp) if any(c.key == "wgrad_cache" for c in static.parts().kept) else {}

    def micro_batch(self) -> None:
        self.backward(self.forward())

    def forward(self) -> tuple:
        """One micro-batch's forward; what its backward needs. A stage before the last sends its output and frees
        it (Megatron-LM's deallocate_pipeline_outputs: schedules.py `deallocate_output_tensor`), then receives the
        output's gradient (p2p_communication.py: `torch.empty`), held to its backward."""
        prog = self.program
        batch = prog.alloc(self.ids)
        if self.lin and self.sp.first:
            self.carried = megatron_te_linears.embedding_forward(prog, self.lin)
        kept = [self._layer_forward(kind, j < self.checkpointed) for j, kind in enumerate(self.kinds)]
        prog.free(self.carried)  # the final norm's input made (the loss's first request): the last layer's output
        self.carried = None
        loss = self._loss_forward()
        received = None
        if not self.sp.last:
            prog.transient([self.shared.kept_input])
            received = prog.alloc(self.shared.kept_input)
        return batch, kept, loss, received

    def backward(self, state: tuple) -> None:
        """One micro-batch's backward; a stage after the first sends its input's gradient and frees it."""
        prog = self.program
        batch, kept, loss, received = state
        residual = self._loss_backward(loss)  # with CP's layers, the residual's gradient (a later stage: received)
        for j in reversed(range(len(self.kinds))):
            self._layer_backward(self.kinds[j], self.layers[j], kept[j], j < self.checkpointed)
        if self.lin and self.sp.first:
            megatron_te_linears.embedding_backward(prog, self.lin, self._embedding_gradients)
        else:
            self._embedding_gradients()
        prog.free(residual, received, batch)
        if not self.sp.first:
            prog.transient([self.shared.kept_input])

    def _embedding_gradients(self) -> None:
        for n in reversed(self.embedding):
            self._gradient(n, always=True)  # embedding_dense_backward, added into main_grad

    # --- forward ----------------------------------------------------------------------------------------------
    def _made(self, kind: str) -> list:
        prog, sizes, scores = self.program, self.sizes[kind].sizes, self.scores[kind]
        if scores is None:
            self._buffers()  # the all-gather's buffer (sequence parallelism), at the layer's first projection
            a2a = self.a2a[kind]
            if not a2a:
                return self._planned(kind, sizes, 0)
            kept, self.carried = megatron_cp_a2a.forward(prog, sizes, a2a, self.carried)
            return kept
        at, ends = scores
        fp32, cast = sizes[at], sizes[at + 1]
        out = prog.many(sizes[:at])
        self._buffers()  # the baddbmm's input buffer
        raw = prog.alloc(cast)  # baddbmm's scores
        copy = prog.alloc(fp32)  # input.float()
        out += [prog.alloc(fp32), prog.alloc(cast)]  # the softmax, its cast back
        prog.free(copy)
        rest = sizes[at + 2:]
        out += prog.many(rest[:ends])
        prog.free(raw)
        return out + self._planned(kind, rest[ends:], at + 2 + ends)

    def _planned(self, kind: str, sizes: list, offset: int) -> list:
        """The layer's requests from `offset` on, in MLA's and MoE's order where it has a plan (megatron_moe_replay)."""
        plan = self.plans.get(kind)
        return megatron_moe_replay.made(self.program, plan, sizes, offset) if plan else self.program.many(sizes)

    def _buffers(self) -> None:
        while self.pending:
            self.program.alloc(self.pending.pop())

    def _layer_forward(self, kind: str, full: bool) -> list:
        if full:  # the checkpointed layer keeps its input; what it makes is dropped as it goes
            kept = [self.program.alloc(self.shared.kept_input)]
            self.program.release(self._made(kind))
            return kept
        return self._made(kind)

    def _loss_forward(self):
        from .reserved import _loss_forward

        return _loss_forward(self.program, self.shared) if self.sp.last and self.shared.loss else ([], [])

    # --- backward ---------------------------------------------------------------------------------------------
    def _loss_backward(self, loss):
        """The loss's and the head's backward; with CP's layers, returns the residual's gradient it makes."""
        from .reserved import _sizes

        prog, (before, made) = self.program, loss
        grads = [prog.alloc(b) for b in _sizes(self.shared.loss.backward, self.shared.parallel)] \
            if self.sp.last and self.shared.loss else []
        if self.lin and self.sp.last:
            return self._head_backward(grads, made, before)
        prog.free(*made)
        for n in reversed(self.head):
            self._gradient(n)
        if self.sp.last and self.sp.first and self.tied:  # the output layer's gradient of the shared weight
            self._gradient(self.embedding[0])
        prog.free(*grads, *before)
        return None

    def _head_backward(self, grads: list, made: list, before: list):
        """The output layer's and the final norm's backward (Megatron's ColumnParallelLinear,
        tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward: its input all-gathered
        into the global memory buffer, the input gradient [s, h], under sequence parallelism reduce-scattered into a
        new tensor; TENorm's backward then makes the residual's gradient, held to the embedding's backward)."""
        prog, lin = self.program, self.lin
        gemm_out = prog.alloc(lin.full)
        scattered = prog.alloc(lin.local) if lin.gathers else None
        head = list(reversed(self.head))
        self._gradient(head.pop(0))  # the output layer's weight
        if self.sp.first and self.tied:
            self._gradient(self.embedding[0])
        prog.free(gemm_out if lin.gathers else None, *made, *grads)
        residual = prog.alloc(lin.local)  # rmsnorm_bwd
        prog.free(scattered, None if lin.gathers else gemm_out)
        for n in head:
            self._gradient(n)  # the final norm's weight
        prog.free(*before)
        return residual

    def _gradient(self, n: float, always: bool = False) -> None:
        """A weight's gradient: made, added into main_grad by DDP's hook, freed; a matrix under gradient-accumulation
        fusion writes into main_grad itself (a norm scale is small: always made)."""
        size = self.P * n
        if always or size <= SMALL_SIZE or not self.fused_wgrad:
            self.program.transient([size])
        elif self.dummies.get(round(n)):  # TE's dummy gradient of this shape, made at its first backward and kept
            self.program.alloc(self.dummies[round(n)].pop())

    def _layer_backward(self, kind: str, weights: list[float], saved: list, full: bool) -> None:
        prog = self.program
        held = self._made(kind) if full else list(saved)
        a2a = self.a2a[kind]
        if a2a:
            prog.free(self.carried)  # a recomputed layer's output, dropped
            self.carried = None
            megatron_cp_a2a.backward(prog, held, self.sizes[kind].sizes, a2a, weights, self._gradient)
            prog.free(*(saved if full else ()))
            return
        at = self.scores[kind] and self.scores[kind][0]
        count, n = len(held), len(weights)
        experts = kind in self.plans
        for j, w in enumerate(reversed(weights)):
            if experts and isinstance(w, megatron_moe_replay.ExpertShard):  # the experts' backward
                self.program.transient(self.plans[kind].backward)
                experts = False
            self._gradient(w, always=self.legacy_experts and isinstance(w, megatron_moe_replay.ExpertShard))
            while len(held) > count * (n - 1 - j) // n:
                if at is not None and len(held) == at + 2:  # the softmax's output reached: its backward
                    self._softmax_backward(kind, held, at)
                else:
                    prog.free(held.pop())
        prog.free(*(saved if full else ()))

    def _softmax_backward(self, kind: str, held: list, at: int) -> None:
        sizes = self.sizes[kind].sizes
        prog, fp32, cast = self.program, sizes[at], sizes[at + 1]
        probs_grad = prog.alloc(cast)  # bmm's backward: the probabilities' gradient
        prog.free(held.pop())  # the cast probabilities
        grad = prog.alloc(fp32)  # the cast's backward
        prog.free(probs_grad)
        tmp = prog.alloc(fp32)  # SoftMax.cu: tmp = grad * output
        made = prog.alloc(fp32)
        prog.free(tmp, held.pop(), grad)  # the fp32 softmax released by its node
        masked = prog.alloc(fp32)  # masked_fill's backward
        prog.free(made)
        scores = prog.alloc(cast)  # float()'s backward
        prog.free(masked, scores)


def _dummies(cfg, sp) -> dict[int, list[float]]:
    """TE's dummy weight gradients (wgrad_cache.py), by the weight's elements: their bytes, one per shape (an MoE
    layer's expert fc1, 3072 x 5120, and shared experts' fc2, 5120 x 3072, have as many elements)."""
    from .activations.moe import legacy_grouped_mlp
    from .wgrad_cache import dummy_shapes

    B = bytes_per_element(cfg.training.compute_dtype)
    out: dict[int, list[float]] = {}
    legacy = legacy_grouped_mlp(cfg.training)  # no dummy for the legacy GroupedMLP's experts
    for rows, cols in dummy_shapes(cfg.architecture, cfg.parallel, sp, cfg.padded_vocab, legacy):
        out.setdefault(rows * cols, []).append(B * rows * cols)
    return out


def _scores_at(shared, kind: str) -> tuple[int, int] | None:
    """Where the layer's unfused softmax is among its requests: the index of its fp32 output and how many requests
    after its cast the attention makes before it returns (through its output); None: no such softmax."""
    from .activations.recompute import dropped
    from .reserved_layers import requests

    entries = [e for e in shared.entries[kind] if not dropped(e, shared.recomputed)]
    names = [e.name for e in entries]
    at = next((k for k in range(len(names) - 1) if (names[k], names[k + 1]) == (UNFUSED_SOFTMAX_FP32, SOFTMAX_CAST)), None)
    if at is None:
        return None
    end = next((k + 1 for k in range(at + 2, len(names)) if names[k] == ATTENTION_OUTPUT), at + 2)
    before, within = (len(requests(part, shared.parallel)) for part in (entries[:at], entries[at + 2:end]))
    return before, within
