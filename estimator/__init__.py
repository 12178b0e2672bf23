"""LLM GPU-memory estimator: what each GPU holds at the peak of a training step.

Plain Python: no Streamlit, no pandas, no I/O at import. Start from `estimate()` (architecture,
training, parallel, hardware) or `estimate_config()` (the contract's JSON as a dict).
"""

from .spec.architecture import Architecture, parameter_counts
from .spec.config import Config
from .memory.memory import estimate_config, estimate
from .models.loading import load_config
from .spec.errors import ConfigError
from .spec.gpus import GPUS
from .spec.hardware import Hardware, get_gpu
from .memory.components import Component, StageEstimate
from .memory.result import Estimate, Fit
from .spec.parallel import Parallel
from .spec.training import Training

__all__ = [
    "Architecture", "Component", "Config", "ConfigError", "Estimate", "Fit", "GPUS", "Hardware", "Parallel",
    "StageEstimate", "Training", "check", "estimate", "estimate_config", "get_gpu", "load_config", "parameter_counts",
]


def check(path_or_text: str, kind: str | None = None, gpu: str | None = None, gpus: int | None = None) -> Estimate:
    """The estimate of a launch configuration (a file path, or its text): a Megatron-LM command line
    or script, a torchtitan TOML, ... (`estimator.importers`). ``result.fit.verdict`` is "fits",
    "tight" or "oom"; bad input raises `ConfigError`. `kind` is guessed when not given; `gpus` is
    the world size where the file leaves it to the launcher."""
    from .importers import check as check_launch  # loaded on first use: no importer at package import
    return check_launch(path_or_text, kind=kind, gpu=gpu, gpus=gpus)
