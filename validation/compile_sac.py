"""What a torch.compile'd torchtitan block saves for backward under each activation-checkpointing
mode, against the same block run eagerly (GitHub issue #22: "torch.compile under selective AC").

torchtitan applies activation checkpointing to every TransformerBlock and then compiles each block
whole, checkpoint wrapper included (torchtitan 0.3.0 models/llama3/parallelize.py: ``apply_ac``
before ``apply_compile``; distributed/compile.py ``transformer_block.compile(fullgraph=True)``).
Dynamo turns the checkpoint into a ``tag_activation_checkpoint`` region; AOTAutograd traces the
joint forward-backward graph with the SAC policy tagging every node ``MUST_SAVE`` or
``PREFER_RECOMPUTE`` (torch/utils/checkpoint.py ``_CachingTorchDispatchMode`` under compile), and
Inductor's min-cut partitioner (torch/_functorch/partitioners.py
``min_cut_rematerialization_partition``) cuts the graph: a node tagged recompute may not be saved,
one tagged MUST_SAVE may not be recomputed, and what crosses the cut is what the backward needs.

Here one block of a tiny torchtitan 0.3.0 llama3 model (its own TransformerBlock, RMSNorm, fused
wqkv, SwiGLU FFN; SDPA attention) is wrapped by torchtitan's own ``SelectiveAC`` / ``FullAC``
``_wrap_block`` (or left alone), then:

* compiled with ``backend="inductor"`` on CPU, with Inductor's own call of the partitioner wrapped
  to list the backward graph's inputs that are not gradients: the saved tensors (shape, dtype);
* run eagerly (SDPA) to list what eager checkpointing keeps from forward to backward: the
  checkpoint's input and the SAC cache of every MUST_SAVE op's output (without checkpointing, what
  autograd saves), each storage once, weights and buffers aside (`eager_saved`).

The policies of earlier torchtitan releases are measured too, written here from their source (the
same count-every-mm rule with the save list of the release): 2024-12 (9dec370, version.txt 0.0.2,
torchtitan/parallelisms/parallelize_llama.py ``_save_list``) and 0.1.0 (e7c0cae,
models/llama3/parallelize_llama.py), which split q, k and v into three linears.

    python -m validation.compile_sac      # writes tests/data/measured/compile/<RECORD_ID>.json
"""

from __future__ import annotations

from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "compile"
RECORD_ID = "torchtitan-llama3-block-sac-bf16-b2-s24"

# the tiny block: every width distinct so each saved tensor names itself by its shape
DIM, HEADS, KV_HEADS, HIDDEN, BATCH, SEQ = 64, 8, 2, 160, 2, 24
MODES = ("none", "full", "op")


def _repeat_kv_sdpa():
    """torchtitan 2024-12 / 0.1.0's attention after RoPE, as an inner attention of the 0.3.0 block:
    repeat_kv expands k and v to every query head, then F.scaled_dot_product_attention(is_causal=True)
    on (B, N, L, H) (9dec370 torchtitan/models/llama/model.py Attention.forward; e7c0cae
    models/llama3/model.py)."""
    import torch
    import torch.nn.functional as F

    class Inner(torch.nn.Module):
        def forward(self, q, k, v, *, attention_masks=None, scale=None, enable_gqa=False, **_):
            n_rep = q.shape[2] // k.shape[2]
            k, v = (t.repeat_interleave(n_rep, dim=2) if n_rep > 1 else t for t in (k, v))
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True)
            return out.transpose(1, 2)

    return Inner()


def tiny_block(release: str = "0.3.0", attention: str = "sdpa", float8: bool = False):
    """One torchtitan 0.3.0 Llama3TransformerBlock of the tiny shape, in bf16, weights filled. 0.3.0:
    fused wqkv, and flex attention (model_registry's default attn_backend) or torchtitan's own
    ScaledDotProductAttention (native GQA; CUDA's flash kernel saves what flex saves: q, k, v, the
    output and its log-sum-exp); 2024-12 / 0.1.0: separate wq, wk, wv and `_repeat_kv_sdpa`. `float8`:
    torchao's Float8Linear (tensorwise recipe) in place of every linear, as torchtitan's converter
    makes them."""
    import torch
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers

    current = release == "0.3.0"
    (cfg,) = _build_llama3_layers(
        n_layers=1, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, hidden_dim=HIDDEN, fuse_qkv=current,
        rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ, theta=500000, scaling="llama"),
        attn_backend="flex")
    torch.manual_seed(0)
    with torch.device("cpu"):
        block = cfg.build()
    if not current:
        block.attention.inner_attention = _repeat_kv_sdpa()
    elif attention == "sdpa":
        block.attention.inner_attention = ScaledDotProductAttention(None)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    block.attention.rope._init_self_buffers(buffer_device=torch.device("cpu"))
    block = block.to(torch.bfloat16)
    if float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(block, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    return block


def block_inputs(attention: str = "sdpa"):
    """The block's input (bf16, requiring grad) and its attention masks: flex's causal BlockMask
    (one document per sample, as positions = arange give), none for SDPA."""
    import torch

    torch.manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    if attention != "flex":
        return x, None
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common.attention import get_causal_mask_mod

    return x, create_block_mask(get_causal_mask_mod(), BATCH, None, SEQ, SEQ, device="cpu")


# --- the activation-checkpointing policies ------------------------------------------------------------

def _cpu_flash():
    """CPU SDPA's kernel stands in for CUDA's flash kernel: every policy here saves CUDA's
    (aten._scaled_dot_product_flash_attention is in each release's save list), so the CPU op joins
    the save list of each policy measured here."""
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _counting_policy(save_ops: set, mm_ops: tuple):
    """The op-level policy every torchtitan release uses: save the outputs of `save_ops`, except
    every second mm call of the block (counted apart in forward and in recompute), recompute the
    rest. torchtitan 0.3.0 distributed/activation_checkpoint.py SelectiveAC._wrap_block; 2024-12
    (9dec370) and 0.1.0 parallelize_llama.py _apply_ac_to_transformer_block (mm_ops = (aten.mm,))."""
    from torch.utils.checkpoint import CheckpointPolicy

    meta = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            meta[mode] += 1
        if func in save_ops and not (func in mm_ops and meta[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def save_list_2024_12() -> set:
    """torchtitan 2024-12: 9dec370 (version.txt 0.0.2) torchtitan/parallelisms/parallelize_llama.py `_save_list`."""
    import torch

    aten = torch.ops.aten
    return {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.abs.default, aten.max.default}


def wrap(block, mode: str, release: str = "0.3.0"):
    """The block as `release` wraps it for activation-checkpointing `mode`."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode == "none":
        return block
    if release == "0.3.0":
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

        if mode == "full":
            return FullAC(FullAC.Config())._wrap_block(block, base_fqn="layers.0")

        class CudaFlashSelectiveAC(SelectiveAC):
            def get_save_ops(self) -> set:
                return super().get_save_ops() | {_cpu_flash()}

        return CudaFlashSelectiveAC(SelectiveAC.Config())._wrap_block(block, base_fqn="layers.0")
    # 2024-12 / 0.1.0: ptd_checkpoint_wrapper(preserve_rng_state=False), the op policy by context_fn
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    save = save_list_2024_12() | {_cpu_flash()}
    if release == "0.1.0":  # e7c0cae: the same list without aten.abs
        save.discard(torch.ops.aten.abs.default)
    return checkpoint_wrapper(block, preserve_rng_state=False, context_fn=lambda: create_selective_checkpoint_contexts(
        _counting_policy(save, (torch.ops.aten.mm.default,))))


# --- what the compiled block saves ------------------------------------------------------------------

def _tensor_row(name: str, val) -> dict:
    return {"name": name, "shape": list(val.shape), "dtype": str(val.dtype)[6:],
            "bytes": val.numel() * val.element_size()}


def _is_block_input(val) -> bool:
    import torch

    return tuple(val.shape) == (BATCH, SEQ, DIM) and val.dtype == torch.bfloat16


def compiled_saved(mode: str, release: str = "0.3.0", attention: str = "sdpa", float8: bool = False) -> list[dict]:
    """The tensors Inductor's partitioner hands from the compiled block's forward to its backward:
    the backward graph's inputs that are not gradients. Of the graph's own inputs (the block's
    input, weights, RoPE cache, the mask's index tensors) only the block input is listed, as
    "input": the others are held by the step whatever the block saves."""
    import torch
    import torch._inductor.compile_fx as compile_fx

    torch._dynamo.reset()
    block = wrap(tiny_block(release, attention, float8), mode, release)
    found: list[dict] = []
    original = compile_fx.min_cut_rematerialization_partition

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = original(joint, joint_inputs, **kwargs)
        for node in bw.graph.nodes:
            val = node.meta.get("val")
            if node.op != "placeholder" or node.name.startswith("tangents") or not isinstance(val, torch.Tensor):
                continue
            if node.name.startswith("primals"):
                if _is_block_input(val):
                    found.append(_tensor_row("input", val))
                continue
            if node.name.startswith("rng_state"):
                continue  # the generator state a checkpoint keeps (a host tensor on a GPU run too)
            found.append(_tensor_row(node.name, val))
        return fw, bw

    # torchtitan 0.3.0 distributed/compile.py apply_compile's dynamo settings
    torch._dynamo.config.capture_scalar_outputs = True
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    import torch.nn.attention.flex_attention as flex

    # flex_attention refuses a CPU input that requires grad (its backward has no CPU kernel); the
    # partition is made when the forward compiles, so the check is lifted for the forward alone and
    # no backward is run (the saved set is the backward graph's inputs, known by then)
    validate = flex._validate_device
    compile_fx.min_cut_rematerialization_partition = partition
    flex._validate_device = lambda *args: None
    try:
        block.compile(backend="inductor", fullgraph=True)
        x, masks = block_inputs(attention)
        try:
            block(x, masks)
        except torch._inductor.exc.InductorError:
            # Inductor's CPU code generation of flex attention for a graph that needs its backward
            # fails after the partition; the partition (what the GPU run saves) is what is measured
            if not found:
                raise
    finally:
        compile_fx.min_cut_rematerialization_partition = original
        flex._validate_device = validate
    return found


# --- what the eager block keeps -----------------------------------------------------------------------

def eager_saved(mode: str, release: str = "0.3.0", float8: bool = False) -> list[dict]:
    """The storages the eager block keeps from its forward for its backward (SDPA attention), each
    once: without checkpointing, what autograd saves (torch.autograd.graph.saved_tensors_hooks sees
    every tensor an op saves); under a checkpoint, its input and the SAC cache (every MUST_SAVE op's
    outputs, torch/utils/checkpoint.py _CachingTorchDispatchMode.storage), which is all a
    non-reentrant checkpoint holds. Weights and buffers are left out, the block input is "input"."""
    import torch
    import torch.utils.checkpoint as checkpoint
    import torchtitan.distributed.activation_checkpoint as titan_ac
    from torch.utils._pytree import tree_leaves

    caches: list = []
    real = checkpoint.create_selective_checkpoint_contexts

    def recording(*args, **kwargs):
        modes = real(*args, **kwargs)
        caches.append(modes[0].storage)
        return modes

    checkpoint.create_selective_checkpoint_contexts = titan_ac.create_selective_checkpoint_contexts = recording
    try:
        block = wrap(tiny_block(release, "sdpa", float8), mode, release)
        x, _ = block_inputs("sdpa")
        kept: list = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            out = block(x, None)
    finally:
        checkpoint.create_selective_checkpoint_contexts = titan_ac.create_selective_checkpoint_contexts = real
    if mode != "none":
        kept = [x] + [getattr(v, "val", v) for cache in caches for entry in cache.values()
                      for v in tree_leaves(entry)]
    weights = {t.untyped_storage().data_ptr() for t in list(block.parameters()) + list(block.buffers())}
    rows, seen = [], set()
    for t in kept:
        if not isinstance(t, torch.Tensor):
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in weights or ptr in seen:
            continue
        seen.add(ptr)
        name = "input" if ptr == x.untyped_storage().data_ptr() else "output" if \
            ptr == out.untyped_storage().data_ptr() else "saved"
        rows.append({"name": name, "shape": list(t.shape), "dtype": str(t.dtype)[6:],
                     "bytes": t.untyped_storage().nbytes()})
    return rows


# --- the record ---------------------------------------------------------------------------------------

# case -> (release, attention, float8, the modes measured, eager too)
CASES = {
    "0.3.0-sdpa": ("0.3.0", "sdpa", False, MODES, True),
    "0.3.0-flex": ("0.3.0", "flex", False, MODES, False),  # flex has no CPU backward: compiled only
    "2024-12-sdpa": ("2024-12", "sdpa", False, MODES, True),
    "0.1.0-sdpa": ("0.1.0", "sdpa", False, ("op",), True),
    "0.3.0-sdpa-float8-tensorwise": ("0.3.0", "sdpa", True, ("op",), True),
}


def _total(rows: list[dict]) -> int:
    return sum(r["bytes"] for r in rows)


def measure_case(release: str, attention: str, float8: bool, modes: tuple, eager: bool) -> dict:
    out = {}
    for mode in modes:
        compiled = compiled_saved(mode, release, attention, float8)
        entry = {"compiled": compiled, "compiled_bytes": _total(compiled)}
        if eager:
            kept = eager_saved(mode, release, float8)
            entry |= {"eager": kept, "eager_bytes": _total(kept)}
        out[mode] = entry
    return out


def record() -> dict:
    from .core.record import package_versions

    kv = 2 * KV_HEADS * (DIM // HEADS)
    return {"id": RECORD_ID,
            "block": {"dim": DIM, "heads": HEADS, "kv_heads": KV_HEADS, "ffn_hidden": HIDDEN, "batch": BATCH,
                      "seq": SEQ, "dtype": "bfloat16",
                      "bf16_bytes": {"T*h": 2 * BATCH * SEQ * DIM, "T*(q+k+v)": 2 * BATCH * SEQ * (DIM + kv),
                                     "T*f": 2 * BATCH * SEQ * HIDDEN}},
            "cases": {name: measure_case(*spec) for name, spec in CASES.items()},
            "versions": package_versions("torch", "torchtitan", "torchao"),
            "command": "python -m validation.compile_sac"}


if __name__ == "__main__":
    from .core.record import write_record

    print(write_record(record(), RECORDS))
