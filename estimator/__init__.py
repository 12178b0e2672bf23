"""LLM GPU-memory estimator: what each GPU holds at the peak of a training step.

Plain Python: no Streamlit, no pandas, no I/O at import. Start from `estimate()` (architecture,
training, parallel, hardware) or `estimate_config()` (the contract's JSON as a dict).
"""

from .architecture import Architecture, parameter_counts
from .config import Config, estimate_config, load_config
from .errors import ConfigError
from .hardware import GPUS, Hardware, get_gpu
from .memory import Component, Estimate, Fit, StageEstimate, estimate
from .parallel import Parallel
from .training import Training

__all__ = [
    "Architecture", "Component", "Config", "ConfigError", "Estimate", "Fit", "GPUS", "Hardware", "Parallel",
    "StageEstimate", "Training", "estimate", "estimate_config", "get_gpu", "load_config", "parameter_counts",
]
