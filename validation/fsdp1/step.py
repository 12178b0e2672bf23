"""One measured training step of PyTorch FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`) as
the HF Trainer runs it through Accelerate (accelerate 1.15 `FullyShardedDataParallelPlugin`,
transformers 5.x `Trainer`), rank 0 of a fake world.

The wrapping (accelerate's defaults with `mixed_precision="bf16"` and the Trainer's `fsdp_config`):
the model built in fp32 (the Trainer loads fp32 weights unless told otherwise), every decoder
layer its own FSDP unit (TRANSFORMER_BASED_WRAP), the root unit holding the embedding, the final
norm and the LM head; FULL_SHARD; `MixedPrecision(param_dtype=bf16, reduce_dtype=bf16,
buffer_dtype=bf16)` (accelerate `set_mixed_precision`); `use_orig_params=True` (the Trainer's
default); `limit_all_gathers=True`; `backward_prefetch=BACKWARD_PRE` (FSDP's default);
no forward prefetch. Accelerate also runs the forward under bf16 autocast (`native_amp`).
Gradient checkpointing (the Trainer's `gradient_checkpointing=True`): non-reentrant, every layer,
turned on before wrapping. LoRA: peft's `get_peft_model` before wrapping, adapters inside their
decoder layer's unit, so a unit's FlatParameter holds frozen and trainable weights together
(`use_orig_params=True` allows it).

The step (`Trainer.training_step` over `gradient_accumulation_steps` micro-batches; accelerate's
`accumulate` runs all but the last under `model.no_sync()`):
    for each micro-batch:  with no_sync (but the last), autocast: loss = model(...).loss / m
                           loss.backward()
    model.clip_grad_norm_(1.0); optimizer.step(); optimizer.zero_grad(set_to_none=True)
The optimizer is fused AdamW (the Trainer's default, `adamw_torch_fused`) over the parameters that
require grad (the sharded fp32 views). Step 1 creates the optimizer states; step 2 is measured.
Phases: "accumulate" (the micro-batches before the last, forward and backward), "forward",
"backward" (the last micro-batch) and "optimizer".

What a CPU run cannot show is emulated as for the HF records (validation/core/emulation.py:
FlashAttention-2's allocations for SDPA, the packed-sequence check); FSDP1 runs on the CPU
device handle (`device_id=torch.device("cpu")`), whose streams and events are no-ops: the
allocations are those of the order the CPU issues them in, without a GPU stream's delayed reuse.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..core.emulation import cuda_emulation, fsdp1_storage
from ..core.meta import materialize
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import StorageTracker, phase_summary
from ..core.world import fake_world
from ..hf.meta_build import lora_on_all_seven, meta_causal_lm

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


@dataclass(frozen=True)
class Run:
    model: str  # a key of validation.models.MODELS
    world: int  # ranks (FSDP degree)
    seq_len: int
    micro_batch_size: int = 1
    accumulation: int = 1  # micro-batches per step, all but the last under no_sync()
    recompute: str = "none"  # "none" or "full"
    lora_rank: int = 0  # 0: full fine-tuning; else LoRA on q, k, v, o, gate, up, down
    layers: int | None = None  # keep only the first N decoder layers (tiny self-test models)
    # Accelerate's fsdp_sharding_strategy: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD (validation/fsdp1/
    # strategies.py); HYBRID_SHARD shards over `shard_group` ranks (a node's GPUs) and replicates across them
    strategy: str = "FULL_SHARD"
    shard_group: int | None = None
    attention: str = "sdpa"  # transformers' attn_implementation: "sdpa" (FlashAttention-2 emulated) or "eager"


def meta_model(run: Run):
    """The model (and its adapters), parameters on meta, buffers real, as validation/peft/build.py
    builds it: built outside FakeTensorMode, then given storage inside it (`materialize`)."""
    model = meta_causal_lm(run.model, run.attention, run.layers, torch.float32)
    if run.recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run.lora_rank:
        model = lora_on_all_seven(model, run.lora_rank)
    model.train()
    return model


def wrap(model, run: Run | None = None):
    """What accelerate's FSDP1 plugin makes of the model (module docstring), with the run's sharding strategy."""
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from .strategies import process_groups

    layer = type(next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")))
    bf16 = torch.bfloat16
    strategy = run.strategy if run else "FULL_SHARD"
    return FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer}),
                sharding_strategy=ShardingStrategy[strategy], **process_groups(run),
                mixed_precision=MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
                use_orig_params=True, limit_all_gathers=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                forward_prefetch=False, device_id=torch.device("cpu"))


@contextmanager
def storage_identity():
    """FSDP1 tells whether two tensors share memory by their data pointers (torch 2.13 fsdp/_flat_param.py
    `_same_storage`; `_runtime_utils._catch_all_reshard`'s already-resharded check), which fake tensors
    do not have (all 0): a frozen unit (no post-backward hook) would never be resharded after backward.
    The same question asked of the storages themselves, in fake and real runs alike."""
    import torch.distributed.fsdp._flat_param as flat
    import torch.distributed.fsdp._runtime_utils as runtime

    same, catch_all = flat._same_storage, runtime._catch_all_reshard

    def same_storage(a, b):
        local = [t._local_tensor if hasattr(t, "_local_tensor") else t for t in (a, b)]
        return local[0].untyped_storage()._cdata == local[1].untyped_storage()._cdata

    def catch_all_reshard(state):
        handle = state._handle
        if handle and same_storage(handle.flat_param, handle.flat_param._local_shard) \
                and not handle._skipped_use_sharded_views:
            return
        catch_all(state) if not handle else runtime._reshard(state, handle,
                                                              runtime._should_free_in_backward(state, handle))

    # SHARD_GRAD_OP's check that the unsharded FlatParameter kept from the forward is still allocated
    # (`_writeback_orig_params`: `_data_ptr_allocated`), asked of the storage's size
    allocated = flat._data_ptr_allocated
    flat._same_storage, runtime._catch_all_reshard = same_storage, catch_all_reshard
    flat._data_ptr_allocated = lambda tensor: tensor.untyped_storage().nbytes() > 0
    try:
        yield
    finally:
        flat._same_storage, runtime._catch_all_reshard = same, catch_all
        flat._data_ptr_allocated = allocated


def train_step(model, opt, input_ids, run: Run, phase=lambda name: nullcontext()):
    m = run.accumulation
    for i in range(m):
        last = i == m - 1
        if last or i == 0:
            phase("forward" if last else "accumulate").__enter__()  # a mark: nothing to close
        with nullcontext() if last else model.no_sync():
            with torch.autocast(input_ids.device.type, dtype=torch.bfloat16):
                loss = model(input_ids=input_ids, labels=input_ids).loss / m
            if last:
                phase("backward").__enter__()
            loss.backward()
            del loss
    phase("optimizer").__enter__()
    model.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def traced_step(run: Run, fake: bool = True, seed: int = 0):
    tracker = StorageTracker()
    torch.manual_seed(seed)
    fake_world(run.world)
    model = meta_model(run)
    with fake_mode(fake), cuda_emulation(tracker), fsdp1_storage(tracker), storage_identity():
        materialize(model)
        model = wrap(model, run)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=True)
        input_ids = torch.randint(0, model.config.vocab_size if hasattr(model, "config") else 1000,
                                  (run.micro_batch_size, run.seq_len))
        flat = []  # each unit's FlatParameter, once step 1 has run

        def owners():
            # each unit's sharded FlatParameter: its local fp32 shard, `_local_shard` (torch 2.13
            # fsdp/_flat_param.py; the original parameters are views into it). Not `flat_param` itself: under
            # FakeTensorMode a frozen unit's `flat_param.data = _local_shard` leaves it on the unsharded storage.
            flat.extend(m._handle.flat_param for m in FSDP.fsdp_modules(model) if m._handle is not None)
            keys = {tracker.adopt(p._local_shard) for p in flat}
            for t in (*model.buffers(), input_ids):
                tracker.adopt(t)
            return keys, {tracker.adopt(t) for s in opt.state.values() for t in s.values() if torch.is_tensor(t)}

        category = log_second_step(
            tracker, lambda phase: train_step(model, opt, input_ids, run, phase), owners,
            lambda: {tracker.key(p.grad) for p in [*model.parameters(), *flat] if p.grad is not None})
    return tracker, category


def measure(run: Run, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second training step."""
    return phase_summary(*traced_step(run, fake, seed))
