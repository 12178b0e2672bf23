"""DeepSpeed ZeRO-2/3 on one GPU: the caching allocator (allocator.py) replayed over DeepSpeed v0.19.5's own order of
allocations, its initialisation and two steps, for the reserved memory (reserved.py's rule 1, for this stack).

The order, from DeepSpeed v0.19.5's source (runtime/zero/stage3.py, stage_1_and_2.py, utils.py):
- ZeRO-3 (DeepSpeedZeroOptimizer_Stage3.__init__): `defragment` moves every partition to the host, empties the
  cache and copies them back as one flat 16-bit buffer; `_create_fp32_partitions` makes each sub-group's fp32 copy
  as `converted = flat.to(fp32)` then `converted.clone()` (the previous sub-group's `converted` freed only as the
  name is rebound, after the next one is made); `initialize_optimizer_states` makes one fp32 buffer of the
  largest sub-group and frees it; then the reduce bucket (contiguous_gradients) and the flat gradient partitions.
- ZeRO-2 (DeepSpeedZeroOptimizer.__init__): each parameter group emptied from the cache and flattened on the GPU
  (the model's own tensors freed, their segments released by the next group's empty_cache), its fp32 partition
  cast from a clone (released likewise); `initialize_optimizer_states` makes every group's fp32 gradient buffer
  at once and frees them.
- Then the cuBLAS workspaces at the first matrix product, and per step the HF replay's forward and backward
  (reserved.py: the ledger's tensors in their order) with every parameter's gradient made and freed (ZeRO copies
  it into its bucket); ZeRO-2's buckets in backward and its flat gradient partitions from the first layer's
  backward to the step's end; the step sub-group by sub-group (ZeRO-3: the flat 16-bit copy, its fp32 cast, the
  copy freed; ZeRO-2: the same of the partition), the two moments at the first step, foreach AdamW's sqrt(v),
  the fp32 gradient freed.
Held to the four H200 runs (tests/data/measured/gpu/deepspeed): their segments, to the segment, and
max_memory_reserved (tests/test_gpu_deepspeed.py).

ZeRO-3 over several data-parallel ranks runs the same order at the rank's sizes: each parameter's partition
ceil(numel / ranks) (the flat 16-bit buffer, the fp32 partitions and sub-groups, the gradient partitions, the norms'
fp64 copies), with the gathered parameters made and released by the coordinator at the layers' hooks on the
all-gather stream, a pool the default stream's requests never reuse (deepspeed_gathers.py); the step releases them
first. Each parameter's whole gradient is made and freed as on one GPU (copied into the IPG bucket); the bucket's
reduce-scatter (comm/coalesced_collectives.py reduce_scatter_coalesced, on the reduction stream) is left out as on
one GPU. ZeRO-2 over several ranks runs the one-GPU order at the busiest rank's sizes (`_zero2_ranks`): each group's
flat 16-bit buffer whole, its equal share in fp32, the share's gradient pieces stepped and normed, the rank's
grads_in_partition; its reductions' buffers are the one-GPU replay's, the same sizes at any number of ranks
(stage_1_and_2.py average_tensor -> allreduce_and_scatter -> allreduce_bucket flattens the bucket, l. 1814, one rank or
several). Not measured on a GPU over several ranks: the one-GPU replay's rules at the rank's sizes. ZeRO-1 is not
replayed.

Before v0.13.2 (training.framework_version 0.12.3; spec/versions.py DEEPSPEED_NO_INIT_STEP) ZeRO-3's initialisation
ran in another order (v0.12.3, 6ea44d02, runtime/zero/stage3.py): `_create_fp32_partitions` made each fp32
partition as `flat.to(device).clone().float()` (l. 853-854: a 16-bit clone, its fp32 cast kept, the clone freed as
the statement ends), and `initialize_optimizer_states` stepped the optimizer on each sub-group with the zeroed
gradient buffer as its gradient (l. 1006-1008 `self._optimizer_step(i)`), so FusedAdam made both moments there
(ops/adam/fused_adam.py l. 155-157 `torch.zeros_like`), before the IPG bucket and the gradient partitions; the
steps then make none. ZeRO-2's initialisation of then (stage_1_and_2.py l. 309-374: each group flattened on the
host, an optimizer step over every group at once) is not replayed.
"""

from __future__ import annotations

from .allocator import CachingAllocator
from .components import Component
from .deepspeed_step import _decay_partitions, deepspeed_settings, foreach_temporaries, runs_foreach, sub_groups
from ..spec.dtypes import bytes_per_element
from ..spec.versions import DEEPSPEED_NO_INIT_STEP, release

GATHERED = "Gathered parameters"  # transients.py's label of ZeRO-3's gathered parameters (their sum, the ledger's)

SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage3.py (__init__, defragment, _create_fp32_partitions, "
          "initialize_optimizer_states, step), stage_1_and_2.py (__init__, initialize_optimizer_states, "
          "copy_grads_in_partition, step); over several ranks the rank's partitions and ZeRO-3's all-gathers "
          "(deepspeed_gathers.py); "
          "PyTorch's caching allocator (allocator.py) replayed over them "
          "(estimator/memory/deepspeed_replay.py); measured: tests/data/measured/gpu/deepspeed")


def replay_rule(cfg) -> str | None:
    """Why the DeepSpeed replay does not apply (None: it does): ZeRO-2 or 3 over data-parallel ranks alone (one
    or several), full fine-tuning with AdamW and master weights, as measured on one GPU."""
    training, par, arch = cfg.training, cfg.parallel, cfg.architecture
    checks = (
        (training.mode != "training" or training.rl is not None, "not a training step"),
        (cfg.zero_stage not in (2, 3), f"ZeRO-{cfg.zero_stage} (the replay is measured on ZeRO-2 and ZeRO-3)"),
        (par.tp * par.pp * par.cp * par.ep > 1, "tensor, pipeline, context or expert parallelism (their "
                                                "collectives not replayed)"),
        (training.adapter is not None, "an adapter run (the replay is measured on full fine-tuning)"),
        (training.optimizer != "adamw" or not cfg.recipe.master_weights, "not AdamW with fp32 master weights"),
        (cfg.hardware.expandable_segments, "expandable segments (DeepSpeed's empty_cache calls unmap their free pages "
                                           "amid live tensors: not replayed, not measured)"),
        (training.compile, "torch.compile"),
        (arch.is_hybrid or arch.is_moe, "an MoE or hybrid model"),
        (training.loss != "standard", f"the {training.loss} loss"),
        (training.offload_optimizer != "none" or training.offload_parameters != "none"
         or training.offload_activations, "offload"),
        (cfg.zero_stage == 2 and init_step(training), "DeepSpeed before 0.13.2's ZeRO-2 initialisation (each group "
                                                       "flattened on the host, one optimizer step over all groups)"),
    )
    return next((why for failed, why in checks if failed), None)


def init_step(training) -> bool:
    """Whether the DeepSpeed release steps the optimizer while building ZeRO's optimizer (before v0.13.2)."""
    return release("deepspeed", training.framework_version).number < DEEPSPEED_NO_INIT_STEP


def replayed_cache(cfg, shared, sp, static) -> Component:
    """The stage's `fragmentation` component by the replay (`replay_rule(cfg)` is None), remembered per
    configuration and stage."""
    from .reserved import replay_component

    return replay_component(cfg, sp, "deepspeed reserved replay", lambda: replayed(cfg, shared, sp, static),
                            "DeepSpeed's initialisation and two steps", SOURCE)


def replayed(cfg, shared, sp, static) -> tuple[int, int]:
    """(reserved peak - allocated peak, segments) of the replay of two steps."""
    from .reserved import _Program
    from .reserved_layers import layers_by_kind
    from .reserved_tensors import tensors
    from .transients import transients

    arch, training, recipe = cfg.architecture, cfg.training, cfg.recipe
    tr = transients(arch, training, recipe, cfg.parallel, sp, cfg.zero_stage, None)
    w = tensors(cfg, sp)
    d = cfg.parallel.dp if cfg.zero_stage == 3 else 1
    # ZeRO-3's partitions: each parameter's ceil(numel / ranks) (partition_parameters.py _partition_param,
    # v0.12.3 l. 1469-1470, v0.19.5 l. 1771-1772: `partition_size = tensor_size // self.num_partitions`, tensor_size padded
    # up to a multiple of the ranks); on one GPU the whole tensors
    trained = sum(-(-int(t.elements) // d) for t in w.order()) if d > 1 else sum(t.elements for t in w.order())
    groups = sub_groups(arch, sp, d, trained) if cfg.zero_stage == 3 else _zero2_groups(arch, sp, trained)
    norms = arch.cached(("zero3 decay partitions", sp.layer_indices, sp.first, sp.last, d),
                        lambda: _decay_partitions(arch, sp, d))
    flats = None
    if cfg.zero_stage == 2 and cfg.parallel.dp > 1:
        groups, flats, trained, norms = _zero2_ranks(arch, sp, cfg.parallel)
    program = _Program()
    gathers = None
    if d > 1:  # the gathered parameters: allocations of their own on the all-gather stream, not the ledger's sum
        from .deepspeed_gathers import gathers as make_gathers

        gathers = make_gathers(cfg, sp, program, w)
        tr = tr._replace(forward=[c for c in tr.forward if not c.label.startswith(GATHERED)],
                         backward=[c for c in tr.backward if not c.label.startswith(GATHERED)])
    sizes = (program, groups, trained, bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype),
             deepspeed_settings(arch, training, cfg.zero_stage).reduce_bucket_size)
    moments: list = []
    if cfg.zero_stage == 2:
        _init_zero2(*sizes, flats)
    elif init_step(training):
        moments = _init_zero3_stepped(*sizes, foreach_temporaries(training) if runs_foreach(training) else 0)
    else:
        _init_zero3(*sizes)
    for block in [c for c in static.parts().kept if c.key == "workspace"]:  # at the first matrix product
        program.alloc(block.bytes)
    program.alloc(8 * training.seq_len * training.micro_batch_size)  # the token ids (and labels)
    layer_sizes = layers_by_kind(cfg, shared, [arch.layer_kinds()[i] for i in sp.layer_indices])
    side = CachingAllocator()  # the reduction stream's blocks: a pool of their own
    for _ in range(2):
        _micro_batches(program, cfg, shared, sp, w, tr, layer_sizes, trained, side, gathers)
        if gathers is not None:  # stage3.py step: _partition_all_parameters first (v0.12.3 l. 1945, v0.19.5 l. 2579)
            gathers.step()
        moments = _step(program, cfg, groups, moments, side, norms)
    main = program.allocator
    # segments are never given back: the reserved peaks are the ends, and the side stream's block is held through
    # the step, where the main stream's allocated peak is
    reserved, allocated = main.reserved_peak + side.reserved_peak, main.allocated_peak + side.allocated_peak
    return max(0, reserved - allocated), main.segments + side.segments


def _zero2_groups(arch, sp, trained: float) -> list[float]:
    """ZeRO-2's two parameter groups: the HF Trainer's weight-decay matrices, then the norms and biases."""
    from .deepspeed_step import _decay_partitions

    decay = float(sum(_decay_partitions(arch, sp, 1)))
    return [decay, trained - decay]


def _zero2_ranks(arch, sp, par) -> tuple[list[float], list[float], float, list[float]]:
    """ZeRO-2 over `par.dp` ranks, on the busiest rank (deepspeed_zero2.py, measured over gloo ranks:
    tests/test_deepspeed_partitions.py): each Trainer group's equal share (the fp32 partition, the step's flat copy
    and cast, the moments: stage_1_and_2.py __init__ l. 489 `parallel_partitioned_bit16_groups[i][partition_id]
    .detach().clone().to(fp32)`, initialize_optimizer_states l. 819 zeros of `partition_size[i]`), the group's flat
    16-bit buffer (whole, aligned to 2 x dp: l. 389-390, 436), the rank's grads_in_partition (the whole tensors
    overlapping its shares) and the pieces of the weight-decay tensors in its share (averaged_gradients: the norm's
    fp64 copies, get_grad_norm_direct)."""
    from .deepspeed_offload import partition_share, rank_overlaps
    from .deepspeed_zero2 import trainer_groups

    d = par.dp
    decay, rest = trainer_groups(arch, sp, par)
    groups = [g for g in (decay, rest) if g]
    shares = [float(partition_share(g, d)) for g in groups]
    touched = [sum(t) for t in zip(*(rank_overlaps(g, d) for g in groups))]
    rank = touched.index(max(touched))
    share = partition_share(decay, d)
    lo, hi, start, pieces = rank * share, (rank + 1) * share, 0.0, []
    for n in decay:  # get_flat_partition (l. 2092-2163): a narrow() view of each tensor's piece in the share
        piece = min(start + n, hi) - max(start, lo)
        if piece > 0:
            pieces.append(int(piece))
        start += n
    return shares, [s * d for s in shares], touched[rank], pieces


def _init_zero3(program, groups: list[float], trained: float, P: float, G: float, bucket: int) -> None:
    program.alloc(P * trained)  # defragment's flat 16-bit buffer, after its empty_cache
    converted = None
    for n in groups:  # _create_fp32_partitions
        made = program.alloc(4 * n)
        program.free(converted)
        converted = made
        program.alloc(4 * n)  # the clone kept as the sub-group's fp32 partition
    program.free(converted)
    program.free(program.alloc(4 * max(groups)))  # initialize_optimizer_states' gradient buffer
    program.alloc(P * bucket)  # the IPG bucket (contiguous_gradients)
    program.alloc(G * trained)  # grad_partitions_flat_buffer


def _init_zero3_stepped(program, groups: list[float], trained: float, P: float, G: float, bucket: int,
                        temporaries: int) -> list:
    """ZeRO-3's initialisation before v0.13.2 (the module's docstring): the moments it makes, in order;
    `temporaries`: the step's of the sub-group's size (foreach AdamW's, deepspeed_step.foreach_temporaries; 0 fused)."""
    program.alloc(P * trained)  # defragment's flat 16-bit buffer, after its empty_cache
    for n in groups:  # _create_fp32_partitions: flat.to(device).clone().float(), the 16-bit clone freed
        clone = program.alloc(P * n)
        program.alloc(4 * n)
        program.free(clone)
    gradient_buffer = program.alloc(4 * max(groups))  # initialize_optimizer_states
    moments = []
    for n in groups:  # _optimizer_step(i) with the buffer as the gradient: the moments, zeros_like
        moments += [program.alloc(4 * n), program.alloc(4 * n)]
        program.transient([4 * n] * temporaries)
    program.free(gradient_buffer)
    program.alloc(P * bucket)  # the IPG bucket (contiguous_gradients)
    program.alloc(G * trained)  # grad_partitions_flat_buffer
    return moments


def _init_zero2(program, groups: list[float], trained: float, P: float, G: float, bucket: int,
                flats: list[float] | None = None) -> None:
    """`groups`: the rank's partition of each group; `flats`: each group's flat 16-bit buffer, the whole group
    aligned (None: one GPU, the groups themselves)."""
    for n, flat in zip(groups, flats or groups):  # each group flattened after an empty_cache; its clone's segment
        program.alloc(P * flat)  # released by the next one
        program.alloc(4 * n)  # the fp32 partition
    program.free(*[program.alloc(4 * n) for n in groups])  # initialize_optimizer_states' zeros, then None


class _Hook:
    """Runs `then` at the program's first transient (the backward's first layer), once."""

    def __init__(self, program, then):
        self.program, self.then, self.done = program, then, False
        self._transient = program.transient

    def __call__(self, sizes) -> None:
        if not self.done:
            self.done = True
            self.then()
        self._transient(sizes)


def _micro_batches(program, cfg, shared, sp, w, tr, layer_sizes, trained: float, side, gathers=None) -> None:
    """The step's forward and backward passes (reserved.py's), every gradient made and freed: ZeRO copies it into
    its bucket. ZeRO-2's flat gradient partitions (copy_grads_in_partition) are made as its first bucket is reduced,
    a layer into the backward, on the reduction stream (overlap_comm: `with stream(self.reduction_stream)`), whose
    blocks the caching allocator keeps apart from the default stream's (CUDACachingAllocator.cpp: free blocks are
    looked up by stream), and kept to the step's end; each later micro-batch makes another at the same point, freed
    at its backward's end (deepspeed_accumulation.py); repeated micro-batches end where the allocator's state
    repeats (reserved.py _build). ZeRO-3 on several GPUs: `gathers` (deepspeed_gathers.Gathers) makes the
    coordinator's gathers and releases at the layers' hooks."""
    from .reserved import _backward, _forward
    from .reserved_falcon import program as falcon_program

    order = w.order()
    falcon = falcon_program(cfg)  # Falcon's layer request by request where it applies (reserved.py _build)
    G = bytes_per_element(cfg.recipe.grad_dtype)
    previous = None
    for k in range(cfg.microbatches):
        grads = dict.fromkeys(range(len(order)))
        if gathers is not None:
            gathers.forward()
        kept = _forward(program, cfg, shared, sp, w, tr, 0.0, layer_sizes, falcon)
        if gathers is not None:
            gathers.backward()
        if cfg.zero_stage == 2:  # later micro-batches: a partition of their own beside the kept one
            name = "partitions" if k == 0 else "second partitions"
            program.transient = _Hook(program, lambda name=name: setattr(program, name, side.malloc(int(G * trained))))
        _backward(program, cfg, shared, sp, w, order, kept, tr, grads, layer_sizes, falcon)
        program.__dict__.pop("transient", None)
        if gathers is not None:
            gathers.end_backward()
        second = program.__dict__.pop("second partitions", None)  # freed at the epilogue (deepspeed_accumulation)
        if second is not None:
            side.free(second)
        now = program.state()
        if now == previous:
            break
        previous = now


def _step(program, cfg, groups: list[float], moments: list, side, norms: list[int]) -> list:
    """One optimizer step: the gradient norm, then group by group; the moments made at the first (torch's AdamW:
    lazily). The norm (stage3.py _get_norm_groups -> get_grad_norm_direct, v0.19.5 l. 2255, v0.12.3 l. 1677:
    `g.to(device).double().norm(2)`; stage_1_and_2.py scaled_global_norm -> get_grad_norm_direct, v0.19.5 l. 2063:
    `vector_norm(g.data.double())`) copies each parameter's gradient partition to fp64, one at a time, before the
    first group steps: `norms`, the weight-decay group's matrices in order (the no-decay group's norms and biases,
    under 1 MiB each in fp64, left out)."""
    G, foreach = bytes_per_element(cfg.recipe.grad_dtype), runs_foreach(cfg.training)
    first = not moments
    for n in norms:
        program.transient([8 * n])
    for n in groups:
        flat = program.alloc(G * n)  # torch.cat of the sub-group's (ZeRO-3) or partition's (ZeRO-2) gradients
        grad = program.alloc(4 * n)
        program.free(flat)
        if first:
            moments += [program.alloc(4 * n), program.alloc(4 * n)]
        if foreach:  # sqrt(v), and sqrt(v) + eps beside it before torch 2.1
            program.transient([4 * n] * foreach_temporaries(cfg.training))
        program.free(grad)
    partitions = program.__dict__.pop("partitions", None)
    if partitions is not None:
        side.free(partitions)
    return moments
