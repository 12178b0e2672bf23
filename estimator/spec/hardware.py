"""The `hardware` section of the config: the GPU a run is checked against (from the catalog,
`gpus`) and the allocator setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .gpus import GPU, GPUS
from .values import check_section
from .field import record
from .memo import not_owned


@record("hardware")
@not_owned
@dataclass(frozen=True)
class Hardware:
    gpu: str = "h100-80"
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    cublas_workspace_config: str | None = None  # CUBLAS_WORKSPACE_CONFIG; None = PyTorch's default for the GPU
    cuda_module_loading: str | None = None  # CUDA_MODULE_LOADING, lowercase; None = the stack's default (lazy)

    def __post_init__(self) -> None:
        check_section("hardware", self)
        _check_module_loading(self)

    @property
    def device(self) -> GPU:
        return GPUS[self.gpu]


def _check_module_loading(hw: Hardware) -> None:
    """EAGER loads whole libraries, whose size follows the kernels built for the GPU's architecture: offered
    where it was measured (spec/cuda_modules.py)."""
    if hw.cuda_module_loading != "eager":
        return
    modules = GPUS[hw.gpu].runtime.modules
    if modules is None or "eager" not in modules.measured():
        measured = ", ".join(g.id for g in GPUS.values() if g.runtime.modules
                             and "eager" in g.runtime.modules.measured())
        raise ConfigError("hardware.cuda_module_loading", "eager", f"'lazy' or empty on {hw.gpu}; 'eager' on "
                          f"{measured}", f"eager module loading was measured on Hopper only "
                          f"({GPUS['h200'].runtime.modules.stack}), not on {GPUS[hw.gpu].runtime.architecture}",
                          related=("hardware.gpu",))


def get_gpu(gpu_id: str) -> GPU:
    if gpu_id not in GPUS:
        raise ConfigError("hardware.gpu", gpu_id, ", ".join(GPUS))
    return GPUS[gpu_id]
