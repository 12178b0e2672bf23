"""The estimate as returned: per stage, per phase, component by component, the fit verdict, and its
JSON (CONTRACT.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .components import OUTSIDE_ALLOCATOR, StageEstimate
from ..spec.gpus import GPU, GPUS
from .resolved import Resolved
from .stage_shared import _Shared, LedgerLine

TIGHT_FRACTION = 0.8  # Fujii et al. 2024 (arXiv 2411.06465): no OOM below 80% in 454 runs



@dataclass(frozen=True)
class Fit:
    gpu: str
    capacity_bytes: int
    utilization: float
    verdict: str  # "fits", "tight", "oom"


def fit_on(device_total_bytes: int, gpu: GPU) -> Fit:
    utilization = device_total_bytes / gpu.capacity_bytes
    verdict = "oom" if utilization > 1 else "tight" if utilization > TIGHT_FRACTION else "fits"
    return Fit(gpu=gpu.id, capacity_bytes=gpu.capacity_bytes, utilization=utilization, verdict=verdict)


@dataclass(frozen=True)
class Estimate:
    config: Resolved  # what was estimated, every default decided
    parameters_total: int
    parameters_active: int
    parameters_trainable: int  # what gets gradients: all in training, an adapter run's adapters, none in inference
    stages: tuple[StageEstimate, ...]
    peak_stage: int
    allocated_peak_bytes: int
    device_total_bytes: int
    fit: Fit
    notes: tuple[str, ...] = field(default_factory=tuple)
    _shared: "_Shared | None" = field(default=None, repr=False, compare=False)
    rl_phases: tuple = ()  # RL with a colocated engine (rl.py): rollout, scoring, training; the totals are the largest

    # the resolved configuration's values, read where an estimate is shown
    architecture = property(lambda self: self.config.architecture)
    training = property(lambda self: self.config.training)
    parallel = property(lambda self: self.config.parallel)
    hardware = property(lambda self: self.config.hardware)
    recipe = property(lambda self: self.config.recipe)
    zero_stage = property(lambda self: self.config.zero_stage)
    microbatches = property(lambda self: self.config.microbatches)

    @cached_property
    def activation_ledger(self) -> tuple[LedgerLine, ...]:
        """What one layer keeps for one micro-batch on one GPU, tensor by tensor, by layer kind."""
        return self._shared.ledger() if self._shared else ()

    @property
    def host_stage(self) -> StageEstimate:
        """The stage whose process needs the most host memory (offload)."""
        return max(self.stages, key=lambda s: (s.host_bytes + s.nvme_bytes, -s.stage))

    def host_memory_json(self) -> dict:
        s = self.host_stage
        return {"stage": s.stage, "cpu_bytes_per_gpu": s.host_bytes, "nvme_bytes_per_gpu": s.nvme_bytes,
                "cpu": {c.label: c.bytes for c in s.host}, "nvme": {c.label: c.bytes for c in s.nvme}}

    @property
    def reserved_peak_bytes(self) -> int:
        """`torch.cuda.max_memory_reserved()` of the peak stage (or RL phase): the device total less what
        lies outside the allocator."""
        if self.rl_phases:
            peak = max(self.rl_phases, key=lambda p: p.device_total_bytes)
            return peak.device_total_bytes - sum(c.bytes for c in peak.components if c.key in OUTSIDE_ALLOCATOR)
        return next(s for s in self.stages if s.stage == self.peak_stage).reserved_peak_bytes

    def fits(self) -> list[Fit]:
        """The verdict on every GPU of the catalog (the estimate does not depend on the GPU, but
        for its CUDA context, which is the same for all catalogued GPUs)."""
        return [fit_on(self.device_total_bytes, gpu) for gpu in GPUS.values()]

    def framework_release_json(self) -> dict:
        """The release whose rules the estimate applied (estimator/spec/versions.py): its version, and
        the release and commit in words; null for a framework without versioned rules."""
        from ..spec.versions import release
        r = release(self.training.framework, self.training.framework_version)
        return {"framework_version": r.version if r else None, "framework_release": r.cited if r else None}

    def to_json(self) -> dict:
        return {
            "parameters": {"total": self.parameters_total, "active": self.parameters_active,
                           "trainable": self.parameters_trainable},
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "components": _by_key(s.components, "bytes"),
                    "allocated_peak_bytes": s.allocated_peak_bytes,
                    "reserved_peak_bytes": s.reserved_peak_bytes,
                    "device_total_bytes": s.device_total_bytes,
                    "outside_allocator": {c.key: c.bytes for c in s.outside_allocator},
                    "peak_phase": s.peak_phase,
                    "parameters_per_gpu": s.parameters_per_gpu,
                    "in_flight_microbatches": s.in_flight_microbatches,
                    "phases": dict(s.phase_totals),
                    "formulas": _by_key(s.components, "formula"),
                    "sources": _by_key(s.components, "source"),
                }
                for s in self.stages
            ],
            "peak_stage": self.peak_stage,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "device_total_bytes": self.device_total_bytes,
            "fit": {"gpu": self.fit.gpu, "capacity_bytes": self.fit.capacity_bytes,
                    "utilization": round(self.fit.utilization, 6), "verdict": self.fit.verdict},
            "zero_stage": self.zero_stage,
            "microbatches": self.microbatches,
            **self.framework_release_json(),
            "host_memory": self.host_memory_json(),
            "notes": list(self.notes),
            **({"rl_phases": [_rl_phase_json(p) for p in self.rl_phases]} if self.rl_phases else {}),
        }


def _by_key(components, field: str) -> dict:
    """The contract's map of a stage's components by key: the bytes of components that share a key (a pipeline's
    buffers beside the global buffer or RoPE caches) summed, so that the tensor components sum to the allocated peak;
    their formulas (" + ") and sources ("; ") joined, each once."""
    if field == "bytes":
        out: dict = {}
        for c in components:
            out[c.key] = out.get(c.key, 0) + c.bytes
        return out
    texts: dict = {}
    for c in components:
        texts.setdefault(c.key, {})[getattr(c, field)] = None  # an ordered set of the texts
    return {key: (" + " if field == "formula" else "; ").join(t) for key, t in texts.items()}


def _rl_phase_json(phase) -> dict:
    components: dict[str, int] = {}
    for c in phase.components:
        components[c.key] = components.get(c.key, 0) + c.bytes
    return {"phase": phase.name, "allocated_bytes": phase.allocated_bytes,
            "device_total_bytes": phase.device_total_bytes, "components": components,
            "formulas": {c.key: c.formula for c in phase.components}}


# --- pieces of a stage ----------------------------------------------------------------------------
