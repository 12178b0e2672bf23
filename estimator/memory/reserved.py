"""The allocator's cache at a stage's peak: reserved minus allocated memory (`max_memory_reserved` -
`max_memory_allocated`), the `fragmentation` component, by one of two rules that the component names.

1. Replay (the HF Trainer's step, where the ledger knows its allocation order): the estimate's own
   ledger turned into the sequence of allocations and frees of two training steps and replayed
   through PyTorch's caching allocator (allocator.py, c10/cuda/CUDACachingAllocator.cpp of torch 2.11
   to 2.13); the cache is the replay's reserved peak less its allocated peak. On the 30 real H200 full
   fine-tuning runs it applies to (tests/data/measured/gpu) its median error is 1.0% against the flat
   share's 3.4%, the largest 6.4% against 21.7%, one run under by more than 5% against seven; on the 23
   PEFT adapter runs (LoRA, DoRA, QLoRA; frozen tensors get no gradient and no state:
   reserved_tensors.py; three of them MoE) 1.6% against 4.8%, none under by more than 5% against two
   (tests/test_allocator.py).
   With expandable segments (hardware.expandable_segments) the same sequence is replayed through the allocator's
   expandable rules (allocator.py: one segment per pool growing in 2 MiB / 20 MiB pages, blocks split down to
   512 bytes, best fit passing over the segment's free end): on the three real H200 runs with them
   (tests/data/measured/gpu/*-expandable.json) -0.14% to -0.01% against the flat 5% share's -11.6% to +3.5%
   (11.6% under where a full-recompute run keeps 3.9 GB cached, 18.8% of its allocated peak).
   DeepSpeed ZeRO-2/3 full fine-tuning on one GPU replays DeepSpeed's own order of allocations instead
   (deepspeed_replay.py: its initialisation and two steps; the four real H200 runs' segments, size for size), and
   ZeRO-2/3 over data-parallel ranks the same at the rank's sizes, ZeRO-3 with its all-gathers (deepspeed_gathers.py);
   Megatron-Core's layouts (PP under 1F1B too; MoE under the all-to-all dispatcher; dense layers under CP by
   TransformerEngine's all-to-all) replay Megatron-Core's (megatron_replay.py, megatron_moe_replay.py,
   megatron_cp_a2a.py: the three real H200 runs within 1.4%, SimuMax's eight such dense B200 runs 1.2% under to 0.9%
   over, its four DeepSeek MoE runs 1.0% to 2.3% over, its seven CP runs 2.8% under to 0.03% over).
2. Flat share (everything else: other frameworks, pipelines and sharding (DeepSpeed ZeRO-1 over several ranks
   included), DeepSpeed and Megatron with expandable
   segments, paged
   optimizers, offload, torch.compile, MoE full fine-tunes and hybrid models on their fused kernels or with a
   Mamba-1 or Gated DeltaNet mixer, a chunked or fused loss other
   than Liger's fused linear cross-entropy (replayed on full fine-tunes: reserved_liger.py; on the five real
   H200 runs with it -7.6% to +0.5%, median 0.5%, against the flat share's -0.7% to +7.85%, median 6.6%),
   inference, RL):
   a measured share of the allocated peak (components.fragmentation), where the ledger cannot give
   the order of allocations or the replay was never measured.

The replay is made for the reported estimate only: a layout search judges layouts by
`memory.device_total` with the flat share, which is monotone in the micro-batch and the recompute
setting (the planner's pruning rules rely on it); the replayed cache is not (nor is a real GPU's).
One replay costs milliseconds (bench/bench_reserved.py) and is remembered per configuration.

The sequence, as the Trainer runs it (transformers 5.x Trainer.training_step, torch.autograd, torch.optim):
1. the model's parameters, one tensor each in module order (embedding, the layers, final norm, head):
   a gated MLP's gate and up projections are two Linear layers (transformers modeling_llama.py
   LlamaMLP), a layer's norms one module each, an adapter run's A and B after their layer's weights
   (reserved_tensors.py); the cuBLAS workspaces; DDP's gradient buckets;
2. per micro-batch, the forward: each layer's saved tensors (the activation ledger, an entry of
   several like tensors as that many requests, eager attention's scores made as transformers makes
   them, reserved_layers.py, and a partial rotary embedding's temporaries before the rotated q and k, GPT-NeoX's:
   reserved_layers.rotation; under full recompute the layer's input kept and the rest computed and
   dropped; a Mamba-2 scan on transformers 5.17's torch fallback makes and frees its broadcast products among
   its tensors, reserved_mamba.py), its forward transients made and freed, the autocast copies of its weights kept for
   backward (transformers' multi-query Falcon full fine-tuned in the compute dtype: its layer request by request as
   transformers and torch make it, reserved_falcon.py, its H200 runs +5.5% to +13.9% -> -0.7% to +3.9%, one
   with recompute +9.3%); then the loss: the final norm's saved tensors, the logits and their
   fp32 copies, the log-softmax made from them (kept), the copies freed; under Liger's fused linear
   cross-entropy its own order instead (reserved_liger.py: the head's input and weight gradients made in the
   forward and kept, one chunk of logits at a time, the weight gradient becoming the head's .grad);
3. the backward from the loss: the loss's gradients in autograd's chain (each freed once the next
   exists), then the head's and layer by layer in reverse: the layer recomputed (full recompute), its
   backward transients (a 5.17 Mamba-2 scan's products' operand gradients, two at a time), its trainable
   parameters' gradients from the last (the first micro-batch creates
   them, later ones add in place), its tensors freed in reverse order of making as backward passes the
   weights that used them (autograd frees a node's saved tensors once it has run); through eager attention,
   the tensors the ledger frees before its softmax's backward, then that backward node by node (scores x V's,
   the dropout's, the casts', the softmax's with CUDA's temporary, QK^T's), then the rest (reserved_layers.py:
   LoRA on Llama-3.2-1B with recompute and attention dropout -12.8% -> -0.7%); a tied embedding's
   gradient from the head held until the lookup's, then their sum made out of place (`_tied_sum`);
4. the optimizer step: its states created at the first step (per trainable parameter, in order, in its
   dtype; fused AdamW's 0-dim step counters after them), its temporaries per tensor (torch's foreach
   kernels allocate one result per tensor) made and freed; zero_grad frees the gradients.
Two steps are replayed (segments are never given back: the second step's reserved memory holds the
first's). The segments take ascending addresses (allocator.py `descending`: which of two free blocks of one size a
request takes). The H200 gave them descending ones, with which the fake harness's recorded sequences replay its
reserved peaks (tests/test_segment_order.py: LoRA on Llama-3.2-1B with recompute and eager attention to the byte,
12.1% under ascending). This sequence is not the recorded one (a recomputed layer's kept input is made before its
tensors, which go at the layer's end, where transformers frees most as they are used; the cuBLAS workspaces follow
the parameters instead of each thread's first matrix product), and replayed descending it moves as much either
way on the 103 GPU runs it applies to (median |error| 1.17% -> 1.06%, the largest 13.9% -> 24.3%, that LoRA run
-12.5% -> -24.3%), so it keeps ascending addresses until its order is the recorded one.
"""

from __future__ import annotations

from .allocator import CachingAllocator
from .components import Component, component, total_bytes
from ..spec.dtypes import bytes_per_element
from .adapters import FUSED_ADAMW_FRAMEWORKS, STEP_COUNTER_BYTES
from .reserved_layers import backward as eager_backward, gradient as _gradient, layers_by_kind, made as _made
from .reserved_tensors import Tensors, tensors as parameter_tensors
from . import reserved_liger
from .reserved_falcon import backward as falcon_backward, forward as falcon_forward, program as falcon_program
from .reserved_mamba import SOURCE as SCAN_SOURCE, backward as scan_backward
from .activations.mamba_torch import BROADCAST

REPLAY_SOURCE = ("PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.11-2.13) replayed over "
                 "the HF Trainer's allocations built from the activation ledger (estimator/memory/reserved.py); "
                 "on 30 real H200 full fine-tuning runs (tests/data/measured/gpu) median error 1.0%, at most 6.4% "
                 "(the flat share: 3.4%, at most 21.7%); on 23 PEFT adapter runs 1.6%, at most 10.0% (the flat "
                 "share: 4.8%, at most 13.8%)")


REPLAY_SOURCE_EXPANDABLE = (
    "PyTorch's caching allocator with expandable segments (c10/cuda/CUDACachingAllocator.cpp: ExpandableSegment, "
    "try_allocate_expandable_block, should_split, get_free_block; 2 MiB / 20 MiB pages) replayed over the HF "
    "Trainer's allocations built from the activation ledger (estimator/memory/reserved.py, allocator.py); on the 3 "
    "real H200 runs with expandable segments (tests/data/measured/gpu/*-expandable.json) -0.14% to -0.01% (the flat "
    "5% share: -11.6% to +3.5%)")


FLAT_FOR_SEARCH = ("a layout search's total (monotone in the micro-batch and recompute; the replay is the reported "
                   "estimate's)")


# the most layers a stage's replay walks: each layer's requests are replayed in Python, about 1 ms a layer for the HF
# Trainer's two steps and up to 3 ms under DeepSpeed's ZeRO-3, and one estimate is answered inline by the public
# server; the deepest published decoders have under 130 layers (Llama 3.1 405B 126)
MAX_REPLAYED_LAYERS = 1024


def stage_layers(cfg) -> int:
    """The most layers a pipeline stage holds (the length of a replay's walk)."""
    return max((len(sp.layer_indices) for sp in cfg.stages), default=cfg.architecture.num_layers)


def too_deep(cfg) -> str | None:
    """Why a stage is too deep for any replay (None: it is not; replays.replay_rule asks it first)."""
    layers = stage_layers(cfg)
    return (f"a stage of {layers:,} layers (the replay walks at most {MAX_REPLAYED_LAYERS:,})"
            if layers > MAX_REPLAYED_LAYERS else None)


def replay_rule(cfg) -> str | None:
    """Why the replay does not apply to this configuration (None: it does). The replay builds the HF
    Trainer's order of allocations, on one GPU's full set of weights, with default or expandable segments."""
    training, par, arch = cfg.training, cfg.parallel, cfg.architecture
    checks = (
        (training.mode != "training" or training.rl is not None, "not a training step"),
        (training.framework != "hf", f"{training.framework}'s order of allocations is not modelled"),
        (par.pp > 1 or par.tp > 1 or par.cp > 1 or cfg.zero_stage > 0, "a sharded or pipelined layout"),
        (training.optimizer.startswith("paged"), "a paged optimizer (cudaMallocManaged states)"),
        (training.compile, "torch.compile"),
        (arch.is_hybrid and not torch_mamba2(arch, training),
         "a hybrid model on its fused kernels, or a Mamba-1 or Gated DeltaNet mixer (the replay is measured on "
         "Mamba-2 hybrids on transformers' torch fallback)"),
        (arch.is_moe and training.adapter is None,
         "an MoE full fine-tune (the replay is measured on dense decoders and MoE adapter runs)"),
        (training.loss != "standard" and not reserved_liger.applies(training),
         f"the {training.loss} loss (the replay is measured with the standard one and Liger's fused linear "
         "cross-entropy)"),
        (reserved_liger.applies(training) and training.adapter is not None,
         "Liger's fused linear cross-entropy under an adapter (the replay is measured on full fine-tunes with it)"),
        (training.offload_optimizer != "none" or training.offload_parameters != "none"
         or training.offload_activations or training.optimizer_in_backward, "offload or an optimizer in backward"),
    )
    return next((why for failed, why in checks if failed), None)


def torch_mamba2(arch, training) -> bool:
    """A hybrid whose recurrent mixers are all Mamba-2 (Falcon-H1, Nemotron-H) on transformers' torch fallback
    (ssm_kernels "torch" or "torch_5.17"): its order of allocations is the ledger's, the scan's broadcast products
    of 5.17 put in (reserved_mamba.py); the four real H200 runs of Falcon-H1-0.5B replay within 2%
    (tests/test_allocator.py). The fused kernels' own temporaries, and the other mixers' fallbacks, are not
    modelled in the replay."""
    from ..spec import hybrid
    from .activations.mamba_torch import mamba2_mixers

    mixers = {hybrid.MIXER[kind] for kind in arch.layer_kinds()} - {"attention", None}
    return training.ssm_kernels != "fused" and mamba2_mixers(arch) > 0 and mixers <= {"mamba", "attention_mamba"}


def replayed_cache(cfg, shared, sp, static) -> Component:
    """The stage's `fragmentation` component by the replay (`replay_rule(cfg)` is None), remembered per
    configuration and stage."""
    source = REPLAY_SOURCE_EXPANDABLE if cfg.hardware.expandable_segments else REPLAY_SOURCE
    if reserved_liger.applies(cfg.training):
        source += "; " + reserved_liger.SOURCE
    if cfg.architecture.is_hybrid and cfg.training.ssm_kernels == BROADCAST:  # the scan's products put in
        source += "; " + SCAN_SOURCE
    return replay_component(cfg, sp, "reserved replay", lambda: _replayed(cfg, shared, sp, static),
                            "two HF Trainer steps", source)


def replay_component(cfg, sp, name: str, replay, over: str, source: str) -> Component:
    """A replay's `fragmentation` component: `replay()` gives (reserved peak - allocated peak, segments), remembered
    per configuration and stage under `name`; `over`: what it replays (this module's and deepspeed_replay.py's)."""
    key = (name, cfg.training, cfg.parallel, cfg.hardware, sp.stage)
    cache, segments = cfg.architecture.cached(key, replay, per_layout=True)
    kind = "expandable segments, their mapped pages" if cfg.hardware.expandable_segments else "segments"
    return component("fragmentation", "Allocator cache and fragmentation (reserved, unused)", cache,
                     f"caching allocator replayed over {over}: reserved ({segments} {kind}) less "
                     "allocated, at their peaks", source)


def _replayed(cfg, shared, sp, static) -> tuple[int, int]:
    from .transients import transients
    from .adapters import inventory
    inv = inventory(cfg.architecture, cfg.training, cfg.recipe, sp) if cfg.training.adapter else None
    tr = transients(cfg.architecture, cfg.training, cfg.recipe, cfg.parallel, sp, cfg.zero_stage, inv)
    parts = static.parts()
    workspaces = [c for c in parts.kept if c.key == "workspace"]
    states = sum(c.bytes for c in parts.kept if c.key == "optimizer_states")
    program = _Program(cfg.hardware.expandable_segments)
    _build(program, cfg, sp, shared, tr, workspaces, states)
    allocator = program.allocator
    return max(0, allocator.reserved_peak - allocator.allocated_peak), allocator.segments


LOGITS_COMPUTE_DTYPE = "logits in the compute dtype"  # activations/loss.py's entry


class _Program:
    """The step's allocations and frees, each replayed through the caching allocator as it is made
    (a block is its address; None stands for an empty request)."""

    def __init__(self, expandable: bool = False):
        self.allocator = CachingAllocator(expandable)
        self._malloc, self._free = self.allocator.malloc, self.allocator.free

    def alloc(self, nbytes: float, stream: int = 0) -> int | None:
        size = int(nbytes + 0.5)  # the ledger's bytes are whole or halves: rounded half up
        if size <= 0:
            return None
        return self._malloc(size, stream)

    def free(self, *blocks) -> None:
        release = self._free
        for block in blocks:
            if block is not None:
                release(block)

    def transient(self, sizes) -> None:
        self.free(*[self.alloc(s) for s in sizes])

    def many(self, sizes: list[int]) -> list[int]:
        """Requests of whole, positive bytes (reserved_layers.requests), one after another: a layer's hot path."""
        malloc = self._malloc
        return [malloc(size) for size in sizes]

    def release(self, blocks: list[int]) -> None:
        free = self._free
        for block in blocks:
            free(block)

    def state(self) -> tuple:
        """What the next requests' fate depends on: the free blocks (size, address) of both pools and
        the totals. Two equal states with the same blocks alive answer the same requests alike."""
        a = self.allocator
        return a.allocated, a.reserved, a.pools()


def _sizes(entries, par) -> list[float]:
    """An entry's bytes as the requests the allocator sees: one per tensor it stands for."""
    return [e.bytes(par) / e.tensors for e in entries for _ in range(e.tensors)]


def _build(prog: _Program, cfg, sp, shared, tr, workspaces, states_bytes: float) -> None:
    arch, training, recipe = cfg.architecture, cfg.training, cfg.recipe
    w = parameter_tensors(cfg, sp)
    order = w.order()
    for t in order:
        prog.alloc(t.stored)
    for block in tr.persistent + workspaces:  # DDP's buckets, the cuBLAS workspaces
        prog.alloc(block.bytes)
    prog.alloc(8 * training.seq_len * training.micro_batch_size)  # the token ids (and labels)
    per_tensor = 2 if "adam" in training.optimizer else 1
    # the optimizer's tensors; its states and temporaries take each tensor's dtype (torch.optim: zeros_like),
    # shared out by the gradients' bytes (a gradient takes its tensor's dtype, or the gradients' dtype in all)
    trained = [t.grad for t in order if t.grad]
    weight = sum(trained)
    counters = _step_counters(training, len(trained))
    states_bytes -= STEP_COUNTER_BYTES * counters
    state_bytes = states_bytes / max(1.0, weight) / per_tensor  # per gradient byte, of one state tensor
    copy = bytes_per_element(recipe.compute_dtype) if recipe.autocast_weight_copies else 0
    step = total_bytes(tr.optimizer)
    states = None
    layer_sizes = layers_by_kind(cfg, shared, [arch.layer_kinds()[i] for i in sp.layer_indices])
    falcon = falcon_program(cfg)  # Falcon's layer request by request (reserved_falcon.py), else None
    for _ in range(2):
        grads: dict[int, int | None] = {}
        previous = None
        for _ in range(cfg.microbatches):
            kept = _forward(prog, cfg, shared, sp, w, tr, copy, layer_sizes, falcon)
            _backward(prog, cfg, shared, sp, w, order, kept, tr, grads, layer_sizes, falcon)
            # from the second micro-batch on, one frees all it allocates (the gradients exist): once one
            # leaves the allocator as it found it, every later one does the same and reaches the same
            # peaks (the replay is deterministic), so the rest of the accumulation is skipped
            now = prog.state()
            if now == previous:
                break
            previous = now
        if states is None:
            states = [prog.alloc(n * state_bytes) for n in trained for _ in range(per_tensor)]
            states += [prog.alloc(STEP_COUNTER_BYTES) for _ in range(counters)]
        if step:
            prog.transient([n * step / weight for n in trained])
        prog.free(*grads.values())


def _step_counters(training, tensors: int) -> int:
    """The 0-dim fp32 `step` tensors torch's fused AdamW keeps per parameter on the device, each a request of
    its own, where the adapter run's states count them (adapters.adapter_states)."""
    fused = training.framework in FUSED_ADAMW_FRAMEWORKS and training.optimizer == "adamw"
    return tensors if training.adapter is not None and fused else 0


def _no_copies(components) -> list[float]:
    return [c.bytes for c in components if c.label != "Autocast copies of the weights"]


def _forward(prog, cfg, shared, sp, w: Tensors, tr, copy: float, layer_sizes, falcon) -> list[list]:
    kinds, full = cfg.architecture.layer_kinds(), cfg.training.recompute == "full"
    kept = [[prog.alloc(b) for b in _sizes(shared.embedding, shared.parallel)]]
    forward = _no_copies(tr.forward)
    if falcon is not None:  # Falcon's layer request by request (reserved_falcon.py)
        return _falcon_forward(prog, cfg, shared, sp, falcon, kept)
    for i, tensors in zip(sp.layer_indices, w.layers):
        layer = layer_sizes[kinds[i]]
        if full:
            kept.append([prog.alloc(shared.kept_input)])
            prog.release(_made(prog, layer))
        else:
            kept.append(_made(prog, layer))
        prog.transient(forward)
        if copy:  # autocast's 16-bit copies of the layer's matrices, kept for its backward
            kept[-1] += [prog.alloc(t.elements * copy) for t in tensors if t.matrix]
    if sp.last and shared.loss and reserved_liger.applies(cfg.training):
        head = w.embedding[0] if cfg.architecture.tie_embeddings else w.head[-1]
        kept.append(reserved_liger.forward(prog, cfg, shared, lambda e: _sizes(e, shared.parallel), head))
    else:
        # no head gradient yet (the head's backward makes it; Liger's is made in the forward)
        kept.append((*_loss_forward(prog, shared), None) if sp.last and shared.loss else ([], [], None))
    return kept


def _falcon_forward(prog, cfg, shared, sp, z, kept: list) -> list:
    """The layers' forward by Falcon's own sequence (reserved_falcon.forward); under full recompute each layer keeps
    its input alone, the rest made and freed (and made again in backward). The last layer's output is the loss's
    first kept tensor (the final norm's input), which `_loss_forward` makes."""
    full, layers = cfg.training.recompute == "full", len(sp.layer_indices)
    previous = None
    for n in range(layers):
        saved, output = falcon_forward(prog, z, previous)
        if full:
            prog.free(*saved.norm, *saved.attention, saved.dense_input, *saved.mlp, saved.mask)
            saved = saved._replace(norm=[], attention=[], dense_input=None, mlp=[], mask=None)
        if n == layers - 1:
            prog.free(output)
        kept.append([saved])
        previous = output
    kept.append((*_loss_forward(prog, shared), None) if sp.last and shared.loss else ([], [], None))
    return kept


def _loss_forward(prog, shared) -> tuple[list, list]:
    """The final norm's tensors, then the logits and their fp32 copies, then what the loss keeps made
    from them (the log-softmax), then the copies freed, the last made first (transformers
    ForCausalLMLoss: logits.float(), cross_entropy; as recorded, tests/data/measured/allocator).
    Returns what the loss keeps: before the logits, and made from them."""
    par = shared.parallel
    working = _sizes(shared.loss.forward, par)
    smallest = min(working, default=float("inf"))
    saved = _sizes(shared.loss.saved, par)
    before = [prog.alloc(b) for b in saved if b < smallest]
    copies = [prog.alloc(b) for b in working]
    made = [prog.alloc(b) for b in saved if b >= smallest]
    prog.free(*reversed(copies))
    return before, made


def _backward(prog, cfg, shared, sp, w: Tensors, order, kept, tr, grads, layer_sizes, falcon) -> None:
    full = cfg.training.recompute == "full"
    index, from_head = _head_backward(prog, cfg, shared, sp, w, order, kept, grads)
    if falcon is not None:  # Falcon's layer request by request (reserved_falcon.py)
        index = _falcon_backward(prog, full, falcon, kept, w, index, grads)
    else:
        index = _layers_backward(prog, cfg, sp, w, order, kept, tr, grads, layer_sizes, index)
    for t in reversed(order[:index]):
        index -= 1
        if index == 0 and from_head is not None:
            _tied_sum(prog, grads, from_head, t.grad)
        else:
            _gradient(prog, grads, index, t.grad)
    prog.free(*kept.pop())


def _head_backward(prog, cfg, shared, sp, w: Tensors, order, kept, grads) -> tuple[int, object]:
    """The loss's backward and the head's gradients; returns the index of the last layer's last parameter and a
    tied weight's gradient from the head (None untied), which waits in autograd's input buffer (_tied_sum)."""
    arch = cfg.architecture
    before, made, head_grad = kept.pop()  # head_grad: Liger's grad_weight, the head's gradient (reserved_liger)
    cast = None
    if sp.last and shared.loss:
        cast, made = _loss_backward(prog, shared, made), []
    index = len(order)
    for t in reversed(w.head):
        index -= 1
        if head_grad is not None and not arch.tie_embeddings and t is w.head[-1]:
            _given_gradient(prog, grads, index, head_grad)
        else:
            _gradient(prog, grads, index, t.grad)
    tied = arch.tie_embeddings and sp.first and sp.last and bool(order) and order[0].grad
    from_head = (head_grad if head_grad is not None else prog.alloc(order[0].grad)) if tied else None
    prog.free(*[b for b in (cast,) if b], *made, *before)
    return index, from_head


def _layers_backward(prog, cfg, sp, w: Tensors, order, kept, tr, grads, layer_sizes, index: int) -> int:
    """The layers' backward from the last, each layer's gradients and the frees of its tensors as autograd walks
    back through it; returns the index of the first layer's first parameter."""
    full, kinds = cfg.training.recompute == "full", cfg.architecture.layer_kinds()
    backward = _no_copies(tr.backward)
    malloc, free = prog._malloc, prog._free
    for i, tensors in zip(reversed(sp.layer_indices), reversed(w.layers)):
        saved = kept.pop()
        # what backward frees as it walks back through the layer: the recomputed tensors (full
        # recompute: the kept input waits for the layer's end) or the ones kept in forward
        layer = layer_sizes[kinds[i]]
        held = _made(prog, layer) if full else [b for b in saved if b is not None]
        prog.transient(backward)
        if layer.scan is not None:  # a Mamba-2 scan's product gradients on transformers 5.17's fallback
            scan_backward(prog, layer.scan)
        if layer.core is not None:  # eager attention's scores: its backward in autograd's order (reserved_layers)
            copies = [] if full else saved[len(layer.sizes):]
            index = eager_backward(prog, layer, held[:len(layer.sizes)], copies, tensors, index, grads)
            prog.free(*(saved if full else ()))
            continue
        count, weights = len(held), len(tensors)
        for j in range(weights):  # `_gradient`, written out: the hot path of a replay
            index -= 1
            size = int(order[index].grad + 0.5)
            if not size:  # a frozen weight: no gradient
                pass
            elif index in grads:
                free(malloc(size))
            else:
                grads[index] = malloc(size)
            # autograd frees a node's saved tensors once the node has run (Node::release_variables,
            # torch/csrc/autograd/engine.cpp), so a layer's tensors go in reverse order of making as
            # backward passes the weights that used them; the ledger does not say which operation keeps
            # which tensor, so the j-th weight from the end stands for the same share of them
            while len(held) > count * (weights - 1 - j) // weights:
                free(held.pop())
        prog.free(*(saved if full else ()))
    return index


def _falcon_backward(prog, full: bool, z, kept: list, w: Tensors, index: int, grads: dict) -> int:
    """The layers' backward by Falcon's own sequence (reserved_falcon.backward), the last first; under full recompute
    each layer made again from its kept input first (reserved_falcon.forward), the output it makes dropped.
    The gradient of the first layer's input is freed at the end (the embedding's backward reads it). Returns the
    index of the first layer's first parameter."""
    carry = None
    for tensors in reversed(w.layers):
        saved = kept.pop()[0]
        if full:
            saved, output = falcon_forward(prog, z, saved.input)
            prog.free(output)
        index, carry = falcon_backward(prog, z, saved, tensors, index, grads, carry)
    prog.free(carry)
    return index


def _loss_backward(prog, shared, made: list) -> int | None:
    """Autograd's chain through the loss (each node frees its saved tensors and the gradient it was given once
    it has made its own, torch/csrc/autograd/engine.cpp): the loss's gradients, each freeing the one before,
    then the tensors the loss kept (`made`); the logits' gradient in the compute dtype (the backward of their
    fp32 cast) is made while the last fp32 one lives, and lives until the head's gradients are made (as
    recorded: tests/data/measured/allocator). Returns that gradient's block."""
    last = None
    for b in _sizes(shared.loss.backward, shared.parallel):
        block = prog.alloc(b)
        if last is not None:
            prog.free(last)
        last = block
    prog.free(*made)
    cast = next((prog.alloc(e.bytes(shared.parallel)) for e in shared.loss.forward
                 if e.name == LOGITS_COMPUTE_DTYPE), None)
    if last is not None:
        prog.free(last)
    return cast


def _given_gradient(prog, grads: dict, index: int, block: int) -> None:
    """A gradient the backward returns without making it (Liger's grad_weight, made in the forward:
    reserved_liger.py): kept as the .grad where there is none, else added into it and freed (`gradient`)."""
    if index in grads:
        prog.free(block)
    else:
        grads[index] = block


def _tied_sum(prog, grads: dict, from_head: int, nbytes: float) -> None:
    """The tied embedding's lookup gradient meets the head's, held since the head's backward: the weight
    feeds one AccumulateGrad node twice, so the engine keeps the first gradient in the node's input buffer
    and sums the second into it (torch 2.13 torch/csrc/autograd/input_buffer.cpp, accumulate) out of place:
    the head's arrives as a transposed view whose storage is shared, so `can_accumulate_inplace` fails and
    `old_var + var` is a new tensor. The lookup's (embedding_dense_backward) is made, then the sum; the head's
    goes as the sum replaces it in the buffer, the lookup's once its node's outputs are dropped; the sum
    becomes .grad (functions/accumulate_grad.h accumulateGrad: stolen), or is added into an existing .grad in
    place and freed. Shown on the pinned torch with real tensors (tests/test_backward_end.py) and in every
    recorded sequence of a tied model (tests/data/measured/allocator: head's, lookup's, sum, head's freed,
    lookup's freed)."""
    lookup = prog.alloc(nbytes)
    total = prog.alloc(nbytes)
    prog.free(from_head, lookup)
    if 0 in grads:
        prog.free(total)
    else:
        grads[0] = total
