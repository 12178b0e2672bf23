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


def tp_following_defaults(tp: int) -> dict[str, object]:
    """The layout fields that follow TP unless given (their one owner): sequence parallelism on
    whenever TP > 1 (Korthikanti et al. 2022; Megatron-Core requires it for MoE with TP), and
    expert TP equal to TP (Megatron-Core's ``--expert-tensor-parallel-size`` default)."""
    return {"sequence_parallel": tp > 1, "etp": tp}


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
        from .fields import check_section  # each field's type and range; the registry reads this module
        check_section("parallel", self)
        for name, value in tp_following_defaults(self.tp).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.world_size is not None and self.world_size != self.gpus:
            raise ConfigError("parallel.world_size", self.world_size,
                              f"tp x pp x cp x dp = {self.tp} x {self.pp} x {self.cp} x {self.dp} = {self.gpus}",
                              related=("parallel.tp", "parallel.pp", "parallel.cp", "parallel.dp"))
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError("parallel.vpp", self.vpp, "1 when pp is 1", "interleaving needs pipeline stages",
                              related=("parallel.pp",))
        if (self.pp_first_stage_layers or self.pp_last_stage_layers) and self.pp == 1:
            raise ConfigError("parallel.pp_first_stage_layers", self.pp_first_stage_layers or self.pp_last_stage_layers,
                              "unset when pp is 1", related=("parallel.pp",))

    def follows_tp(self, name: str) -> bool:
        """Whether a TP-following field holds the value TP gives it (not worth writing back)."""
        return getattr(self, name) == tp_following_defaults(self.tp)[name]

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

