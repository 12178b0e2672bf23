"""Optimizers: one record each, read by the state bytes, the step's temporaries, the roofline's
update traffic, the validation and the field registry. Adding an optimizer adds one record here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .versions import TORCHTUNE_TORCHAO, release

# What an optimizer allocates while it steps, beside its states:
NO_TEMPORARIES = "none"  # fused kernels (Megatron/TE FusedAdam, DeepSpeed FusedAdam, bitsandbytes) work in place
FOREACH_SQRT = "foreach sqrt"  # torch's foreach AdamW materialises sqrt(v) for a whole group (hf)
# Frameworks whose torch AdamW runs the foreach implementation: the HF Trainer's adamw_torch. torchtitan
# builds AdamW with implementation "fused" (components/optimizer/optimizer.py, the default) and
# torchtune's recipes pass fused=True; Megatron and DeepSpeed use their own fused kernels.
FOREACH_FRAMEWORKS = ("hf",)
LARGEST_TENSOR = "largest tensor"  # per-tensor updates: two fp32 temporaries of the largest tensor
MEGATRON_TORCH_ADAMW_SOURCE = ("Megatron-Core 0.16.1 megatron/core/optimizer/__init__.py (TransformerEngine's "
                               "FusedAdam, else Apex's, else `from torch.optim import AdamW as Adam`); measured on an "
                               "H200 (tests/data/measured/gpu/megatron: the optimizer phase rises by 4 B x the decay "
                               "group's parameters)")


def megatron_torch_adamw(framework: str, te_version: str | None) -> bool:
    """Megatron-Core without TransformerEngine or Apex (training.te_version "not_installed") steps AdamW with torch's,
    foreach on CUDA: FOREACH_SQRT's temporary (MEGATRON_TORCH_ADAMW_SOURCE)."""
    from .versions import TE_NONE
    return framework == "megatron" and te_version == TE_NONE


@dataclass(frozen=True)
class Optimizer:
    """`state_bytes(n, small, hidden, factored, s)`: state bytes of `n` parameters of which `small`
    sit in tensors under 4096 elements, `hidden` in 2-D hidden matrices and `factored` is the
    Adafactor row + column size, with states of `s` bytes each."""

    name: str
    state_bytes: Callable[[float, float, float, float, float], float]
    source: str
    temporaries: str = NO_TEMPORARIES
    not_in: tuple[str, ...] = ()  # frameworks that do not offer it


def _adam8bit(n: float, small: float, hidden: float, factored: float, s: float) -> float:
    # 1 byte per state and one fp32 absmax per 256-element block; small tensors stay 32-bit
    return 2 * 4 * small + 2 * (1 + 4 / 256) * (n - small)


def _muon(n: float, small: float, hidden: float, factored: float, s: float) -> float:
    # one momentum buffer on the hidden matrices; AdamW's two moments on everything else
    return s * hidden + 2 * s * (n - hidden)


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("adamw", lambda n, small, hidden, factored, s: 2 * s * n,
              "Loshchilov & Hutter 2019: two moments per parameter", FOREACH_SQRT),
    Optimizer("adam8bit", _adam8bit,
              "Dettmers et al. 2022 (8-bit optimizers): 1 byte per state plus one fp32 absmax per 256-element "
              "block; tensors under 4096 elements stay 32-bit (bitsandbytes min_8bit_size)", not_in=("megatron",)),
    Optimizer("sgd", lambda n, small, hidden, factored, s: 0.0, "torch.optim.SGD without momentum keeps no state"),
    Optimizer("sgd_momentum", lambda n, small, hidden, factored, s: s * n,
              "torch.optim.SGD: one momentum buffer per parameter"),
    Optimizer("adafactor", lambda n, small, hidden, factored, s: s * factored,
              "Shazeer & Stern 2018: factored second moment (row and column sums) for matrices, no first moment "
              "(transformers' Adafactor default beta1=None)", LARGEST_TENSOR),
    Optimizer("lion", lambda n, small, hidden, factored, s: s * n, "Chen et al. 2023 (Lion): one momentum buffer",
              LARGEST_TENSOR),
    # bitsandbytes' paged optimizers (paged.py): the same states, those of large tensors in managed memory
    Optimizer("paged_adamw", lambda n, small, hidden, factored, s: 2 * 4.0 * n,
              "bitsandbytes PagedAdamW (optim/adamw.py; Optimizer2State with optim_bits 32 keeps fp32 states whatever "
              "the parameter's dtype): two fp32 moments per parameter, those of tensors of >= 1e5 elements in "
              "cudaMallocManaged pages (paged.py)", not_in=("megatron", "deepspeed", "fsdp2")),
    Optimizer("paged_adamw8bit", _adam8bit,
              "bitsandbytes PagedAdamW8bit (optim/adamw.py): Dettmers et al. 2022 8-bit states (1 byte each, an fp32 "
              "absmax per 256-element block, tensors under 4096 elements in 32-bit), the 8-bit states of tensors of "
              ">= 1e5 elements in cudaMallocManaged pages (paged.py)", not_in=("megatron", "deepspeed", "fsdp2")),
    Optimizer("muon", _muon, "Jordan et al. 2024 (Muon): one momentum buffer on 2-D hidden matrices; AdamW on "
              "embeddings, head, norms and biases", LARGEST_TENSOR),
)}


@dataclass(frozen=True)
class StepScratch:
    """What an optimizer's step allocates beside its states while it steps one tensor: `per_element`
    bytes per element of that tensor (the largest tensor's step is the worst moment)."""

    per_element: float
    formula: str
    source: str


# torchao's AdamW8bit steps each parameter with torch.compile(single_param_adam, fullgraph=True), in fp32
# (optim/adam.py; the same code from 0.7.0, f04aec72, to 0.10.0, 8b264ce1). Inductor fuses the step into one
# reduction kernel that updates the parameter in place and writes each 8-bit state's new uint8 codes and fp32
# block scales to scratch, copied into the state by the kernels after it; a state kept plain (a tensor under
# 4096 elements) is written in place. Read from Inductor's generated code (torch 2.13):
# validation/torchtune/inductor_scratch.py. Before 0.7.0 (pytorch/ao#1068) the step ran in the states'
# dtype, and an 8-bit state cannot take a bf16 gradient there (lerp of fp32 and bf16).
TORCHAO_COMPILED_FP32_STEP = (0, 7, 0)
TORCHAO_8BIT_SCRATCH = StepScratch(
    2 * (1 + 4 / 256), "2 states x (1 B new codes + 4 B / 256 new block scale)",
    "torchao 0.7.0-0.10.0 optim/adam.py single_param_adam compiled by Inductor (torch 2.13): the scratch of its "
    "Triton wrapper (validation/torchtune/inductor_scratch.py; "
    "tests/data/measured/compile/torchao-adamw8bit-step-scratch-128256x3072.json)")


def step_scratch(optimizer: str, framework: str, framework_version: str | None) -> StepScratch | None:
    """torchtune's 8-bit AdamW is torchao's AdamW8bit: its docs name it first ("All of our recipes support
    lower-precision optimizers from the torchao library. For single device recipes, we also support
    bitsandbytes", docs/source/tutorials/memory_optimizations.rst), keyed on the torchao its release ran
    with (versions.py TORCHTUNE_TORCHAO). bitsandbytes' kernels step in place (NO_TEMPORARIES)."""
    if optimizer != "adam8bit" or framework != "torchtune":
        return None
    torchao = TORCHTUNE_TORCHAO[release(framework, framework_version).version]
    return TORCHAO_8BIT_SCRATCH if torchao >= TORCHAO_COMPILED_FP32_STEP else None
