"""What a process holds outside PyTorch's caching allocator: the CUDA context and the kernel modules
loaded into it, by module loading mode (CUDA_MODULE_LOADING) and by the libraries a run touches.

Under LAZY a kernel's module is loaded at its first launch; under EAGER every module of a library is
loaded when the library's CUDA runtime starts (NVIDIA CUDA Programming Guide, "Lazy Loading" and
"CUDA_MODULE_LOADING": "EAGER: fully loads CUDA modules and kernels at program initialization").
So the parts below are what each stage of a run adds to `torch.cuda.mem_get_info` used minus
`torch.cuda.memory_reserved`, measured stage by stage on one software stack
(validation/gpu/context.py; tests/data/measured/gpu/experiments/cuda-context-h200.json) and, for
a whole training step, on the training records (tests/data/measured/gpu/*.json). A stack's parts
belong to its PyTorch build, CUDA release and GPU architecture: module sizes follow the kernels a
build compiles for that architecture, so no other stack's parts are derived from them.

What an unset CUDA_MODULE_LOADING means (`default_loading`):
- CUDA before 11.7 has no lazy loading; 11.7 introduced it off by default, 12.2 made LAZY the
  default on Linux (the Lazy Loading guide's change history, 11.7 / 12.2 / 12.3 for Windows).
- PyTorch 1.13 to 2.7 set CUDA_MODULE_LOADING=LAZY where it is unset when it initializes CUDA
  (aten/src/ATen/cuda/detail/CUDAHooks.cpp initCUDA `maybe_set_cuda_module_loading("LAZY")`,
  pytorch/pytorch#85692, backported to 1.13 as #86509); from 2.8 only where the driver predates
  CUDA 12.2, whose own default is LAZY (pytorch/pytorch#152695, merged 2025-05-20). The H200 record
  shows torch 2.11.0+cu130 on driver 580 (CUDA 13.0) leaving it unset, and the unset runs equal the
  LAZY runs byte for byte.
- Not modelled: PyTorch sets the variable when it initializes CUDA, which can come after something
  has counted the devices (torch.cuda.is_available, as the HF TrainingArguments do) and so
  initialized the driver; pytorch/pytorch#113326 (torch 2.2+cu118, driver 515) shows a process
  holding 2.06 GB of host memory instead of 0.44 when the count came first, as eager loading would.
  Whether such a process loads eagerly on a driver before CUDA 12.2 is not measured here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .choices import LOADING_MODES  # noqa: F401  (the modes, with the other allowed values)

MiB = 1024**2

RECORD = "tests/data/measured/gpu/experiments/cuda-context-h200.json"
TRAINING_RECORDS = "tests/data/measured/gpu (the H200 training records)"


@dataclass(frozen=True)
class LoadedModules:
    """One loading mode on one stack: what each part of a run adds outside the allocator (bytes)."""

    context: int  # the primary context, with every module EAGER loads up front
    first_kernels: int  # the modules of the first kernels PyTorch launches (elementwise)
    cublas: int  # cuBLAS/cuBLASLt at the first GEMM (its modules; the handle)
    step_kernels: int  # the rest of a training step's kernels, without FlashAttention's
    flash_kernels: int  # FlashAttention's kernels (SDPA's flash backend)
    source: str

    def parts(self, flash: bool) -> tuple[tuple[str, int], ...]:
        """(what, bytes) for a run, FlashAttention's kernels where it runs them; parts of 0 left out."""
        named = (("context", self.context), ("first kernels", self.first_kernels), ("cuBLAS", self.cublas),
                 ("other kernels of a step", self.step_kernels),
                 ("FlashAttention kernels", self.flash_kernels if flash else 0))
        return tuple((what, b) for what, b in named if b)

    def total(self, flash: bool) -> int:
        return sum(b for _, b in self.parts(flash))


@dataclass(frozen=True)
class ModuleStack:
    """A software stack whose parts were measured: what each loading mode holds on it."""

    stack: str  # PyTorch build, CUDA, driver, GPU
    torch: tuple[int, int]
    cuda: tuple[int, int]  # the runtime PyTorch was built on
    driver: tuple[int, int]  # the CUDA release of the driver
    modes: tuple[tuple[str, LoadedModules], ...]  # (loading mode, its parts); the modes measured

    @property
    def default(self) -> str:
        """What an unset CUDA_MODULE_LOADING gives on this stack."""
        return default_loading(self.torch, self.cuda, self.driver)

    def measured(self) -> tuple[str, ...]:
        return tuple(mode for mode, _ in self.modes)

    def loaded(self, mode: str | None) -> LoadedModules:
        """The parts of `mode` (None: the stack's default)."""
        return dict(self.modes)[mode or self.default]

# The H200 record (driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130), per stage, used minus reserved:
# LAZY: context 552,402,944; the first fill_/add_ 96,468,992; the first bf16 GEMM 69,206,016; flash SDPA forward and
# backward and a foreach AdamW step 0. EAGER: context 1,319,960,576; elementwise 0; the first GEMM 517,996,544 (cuBLAS
# is loaded, all its modules with it, at its first use); flash SDPA and AdamW 0.
# The training records (same stack; validation/gpu/measure.py: used minus reserved after two steps, 60 runs) hold
# 787,283,968 with eager attention and 804,061,184 with FlashAttention-2 under SDPA: the step's other kernels are
# 787,283,968 - (552,402,944 + 96,468,992 + 69,206,016) = 69,206,016 and FlashAttention's 16,777,216 more (the
# record's flash stage, one small causal call, fitted in what the context had mapped).
_H200_LAZY = LoadedModules(
    552_402_944, 96_468_992, 69_206_016, 69_206_016, 16_777_216,
    f"measured on an H200, torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04, CUDA_MODULE_LOADING=LAZY (and unset): "
    f"the context, the first elementwise kernels and the first bf16 GEMM stage by stage ({RECORD}); the training "
    f"step's other kernels and FlashAttention's from the training records ({TRAINING_RECORDS}: 750.8 MiB outside "
    f"the allocator with eager attention, 766.8 MiB with FlashAttention)")
# Under EAGER the context holds all of PyTorch's own modules (the record's elementwise, SDPA and AdamW stages add
# nothing) and cuBLAS brings all of its at the first GEMM; a training step's further kernels are PyTorch's and
# cuBLAS's, so nothing is left to load (not measured over a whole training step under EAGER).
_H200_EAGER = LoadedModules(
    1_319_960_576, 0, 517_996_544, 0, 0,
    f"measured on an H200, torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04, CUDA_MODULE_LOADING=EAGER: the "
    f"context with every PyTorch module, and cuBLAS's modules at the first GEMM ({RECORD}); a training step's "
    f"other kernels are in these libraries, already loaded (EAGER loads whole libraries; the record's elementwise, "
    f"flash SDPA and AdamW stages add nothing)")

H200_STACK = ModuleStack("torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04, H200 (sm90)", (2, 11), (13, 0), (13, 0),
                         (("lazy", _H200_LAZY), ("eager", _H200_EAGER)))

LOADING_SOURCE = ("NVIDIA CUDA Programming Guide, Lazy Loading (change history: introduced in 11.7, off by default; "
                  "default on Linux from 12.2); PyTorch CUDAHooks.cpp initCUDA sets CUDA_MODULE_LOADING=LAZY where "
                  "unset from 1.13 (pytorch/pytorch#85692, #86509), from 2.8 only on drivers before CUDA 12.2 "
                  "(pytorch/pytorch#152695)")


def default_loading(torch: tuple[int, int], cuda: tuple[int, int], driver: tuple[int, int]) -> str:
    """The module loading an unset CUDA_MODULE_LOADING gives a PyTorch release (major, minor) built on a CUDA
    runtime (major, minor) under a driver of a CUDA release (major, minor) (LOADING_SOURCE)."""
    if cuda < (11, 7):
        return "eager"  # the runtime has no lazy loading
    if torch >= (1, 13):
        return "lazy"  # PyTorch sets it (before 2.8 always, from 2.8 where the driver's default is not LAZY)
    return "lazy" if driver >= (12, 2) else "eager"  # CUDA's own default
