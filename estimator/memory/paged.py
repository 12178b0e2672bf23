"""Paged optimizers: bitsandbytes' `PagedAdamW` and `PagedAdamW8bit` (the HF Trainer's
`optim="paged_adamw_32bit"` / `"paged_adamw_8bit"`, QLoRA's default), as `training.optimizer`
"paged_adamw" and "paged_adamw8bit".

bitsandbytes 0.48 `optim/optimizer.py` `Optimizer8bit.get_state_buffer`: a state of a parameter with at
least 1e5 elements is allocated by `functional.get_paged` (`cget_managed_ptr`: cudaMallocManaged, unified
memory), outside PyTorch's caching allocator; smaller ones, and the 8-bit optimizer's block-wise absmax
and quantization maps, are ordinary tensors. Managed pages stay on the GPU while it has room: the device
holds them (the device's used memory, `torch.cuda.mem_get_info`, counts them; `max_memory_allocated`,
`max_memory_reserved` and nvidia-smi's per-process used memory do not: measured on an H200,
tests/data/measured/gpu/*paged*), and the driver migrates them to host memory when the GPU runs short,
instead of an out-of-memory error (the QLoRA paper, Dettmers et al. 2023, section 2: "paged
optimizers"). So they are shown as their own component outside the allocator, and as the host memory
they need once paged out.

What is paged, per tensor: `PagedAdamW` keeps two fp32 states (exp_avg, exp_avg_sq) whatever the
parameter's dtype (`Optimizer2State.init_state`, optim_bits 32); `PagedAdamW8bit` two uint8 states (1
byte each) for tensors of at least 4096 elements (`min_8bit_size`), with an fp32 absmax per
256-element block beside them (not paged).
"""

from __future__ import annotations

from .components import Component, component

PAGED_OPTIMIZERS = {"paged_adamw": "adamw", "paged_adamw8bit": "adam8bit"}
PAGE_MIN_ELEMENTS = 100_000  # get_state_buffer: `if not self.is_paged or p.numel() < 1e5: torch.zeros_like(...)`
FRAMEWORKS = ("hf", "fsdp1", "torchtune")  # the stacks that build bitsandbytes optimizers
SOURCE = ("bitsandbytes 0.48 optim/optimizer.py Optimizer8bit.get_state_buffer (states of tensors with >= 1e5 "
          "elements from functional.get_paged: cudaMallocManaged), optim/adamw.py PagedAdamW, PagedAdamW8bit; "
          "Dettmers et al. 2023 (QLoRA) section 2, paged optimizers")


def is_paged(training) -> bool:
    return training.optimizer in PAGED_OPTIMIZERS


def _tensor_sizes(arch, training, sp, inv) -> list[float]:
    """The element count of each trainable tensor of the stage (before any sharding)."""
    if inv is not None:  # an adapter run: the adapters' A and B (and the trainable embedding/head copies)
        from .adapters import adapted_modules, module_matrices
        sizes = [float(rows * cols) for kind, layers in sp.kind_counts for _ in range(layers)
                 for m in adapted_modules(training.adapter, arch, kind)
                 for rows, cols in module_matrices(training.adapter, m)]
        if training.adapter.trainable_embeddings:
            sizes += [float(t.numel) for t in arch.embedding_tensors() + arch.head_tensors()
                      if t.role in ("embedding", "head")]
        return sizes
    tensors = [t for kind, layers in sp.kind_counts for _ in range(layers) for t in arch.layer_tensors(kind)]
    if sp.first:
        tensors += arch.embedding_tensors()
    if sp.last:
        tensors += arch.head_tensors()
    return [float(t.numel) for t in tensors]


def paged_bytes(arch, training, sp, inv, shards: int) -> tuple[float, float]:
    """(bytes of optimizer state in managed memory on one GPU, elements paged), the states divided
    over `shards` GPUs as the optimizer's are; the 1e5 threshold applies to the tensor a GPU's
    optimizer holds (its shard under FSDP)."""
    elements = sum(n for n in _tensor_sizes(arch, training, sp, inv) if n / shards >= PAGE_MIN_ELEMENTS)
    per_element = 2 * 4.0 if training.optimizer == "paged_adamw" else 2 * 1.0  # fp32 (optim_bits 32) or uint8
    return per_element * elements / shards, elements / shards


def components(bytes_on_gpu: float, elements: float, training) -> tuple[Component, Component]:
    """The managed states on the GPU (outside the allocator) and the host memory they need when paged out."""
    bits = "32-bit" if training.optimizer == "paged_adamw" else "8-bit"
    each = bytes_on_gpu / max(elements, 1.0) / 2
    formula = (f"2 {bits} AdamW states ({each:g} B each) x {elements:,.0f} trainable elements on this GPU in tensors "
               f"of >= 1e5 elements")
    on_gpu = component("managed", "Paged optimizer states (cudaMallocManaged, outside the allocator)", bytes_on_gpu,
                       formula + "; on the GPU while it has room, paged to the host when it runs short", SOURCE)
    on_host = component("managed", "Paged optimizer states, when paged out to the host", bytes_on_gpu,
                        formula + "; host memory the driver migrates them to under GPU memory pressure", SOURCE)
    return on_gpu, on_host


def check(training) -> None:
    from ..spec.errors import ConfigError
    if training.framework not in FRAMEWORKS:
        raise ConfigError("training.optimizer", training.optimizer,
                          f"a paged optimizer only with framework {', '.join(map(repr, FRAMEWORKS))}",
                          "bitsandbytes' paged optimizers are built by the HF Trainer (optim paged_adamw_*), "
                          "torchtune's recipes and Accelerate's FSDP1", related=("training.framework",))
    if training.offload_optimizer != "none":
        raise ConfigError("training.offload_optimizer", training.offload_optimizer, "'none' with a paged optimizer",
                          "paged states already move to the host when the GPU runs short",
                          related=("training.optimizer",))
