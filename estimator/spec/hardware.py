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

    def __post_init__(self) -> None:
        check_section("hardware", self)

    @property
    def device(self) -> GPU:
        return GPUS[self.gpu]


def get_gpu(gpu_id: str) -> GPU:
    if gpu_id not in GPUS:
        raise ConfigError("hardware.gpu", gpu_id, ", ".join(GPUS))
    return GPUS[gpu_id]
