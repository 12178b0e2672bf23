"""The parallel layout: how many GPUs, and how the model and the batch are split over them.

World size = TP x PP x CP x DP (Megatron-Core ``parallel_state``: expert parallelism is carved
out of DP x CP x TP for the expert layers, so it does not multiply the world size). ``zero_stage``
means, per framework: megatron 1 = the distributed optimizer (2/3 = Megatron-FSDP's
optim_grads / optim_grads_params); fsdp2 3 = ``fully_shard``, 2 = ``reshard_after_forward=False``
(shard-grad-op), 0 = no sharding; deepspeed = its ZeRO stage; hf (DDP) = 0 only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    sequence_parallel: bool | None = None
    pp: int = 1
    vpp: int = 1
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    zero_stage: int | None = None
    world_size: int | None = None  # optional check: must equal tp x pp x cp x dp
    # Share of data-parallel (DP/FSDP gradient and parameter) and pipeline communication hidden
    # behind compute (roofline.py); 1.0 = Megatron --overlap-grad-reduce/--overlap-param-gather,
    # FSDP2 prefetching and DDP bucketing, 0.0 = none overlapped.
    comm_overlap: float = 1.0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "dp", "cp", "ep"):
            _positive(name, getattr(self, name))
        for name in ("pp_first_stage_layers", "pp_last_stage_layers", "etp", "world_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if (isinstance(self.comm_overlap, bool) or not isinstance(self.comm_overlap, (int, float))
                or not 0 <= self.comm_overlap <= 1):
            raise ConfigError("parallel.comm_overlap", self.comm_overlap, "a number from 0.0 to 1.0")
        if self.sequence_parallel is not None and not isinstance(self.sequence_parallel, bool):
            raise ConfigError("parallel.sequence_parallel", self.sequence_parallel, "true or false")
        if self.zero_stage is not None and (isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3)):
            raise ConfigError("parallel.zero_stage", self.zero_stage, "0, 1, 2 or 3")
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if self.world_size is not None and self.world_size != self.gpus:
            raise ConfigError("parallel.world_size", self.world_size,
                              f"tp x pp x cp x dp = {self.tp} x {self.pp} x {self.cp} x {self.dp} = {self.gpus}")
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError("parallel.vpp", self.vpp, "1 when pp is 1", "interleaving needs pipeline stages")
        if (self.pp_first_stage_layers or self.pp_last_stage_layers) and self.pp == 1:
            raise ConfigError("parallel.pp_first_stage_layers", self.pp_first_stage_layers or self.pp_last_stage_layers,
                              "unset when pp is 1")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert shard in a stage: (TP x CP x DP) / (EP x ETP)."""
        return self.gpus_per_stage // (self.ep * self.etp)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"parallel.{name}", value, "a positive integer")

