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
from .choices import TWO_CHUNK_SCHEDULES
from .values import check_section
from .field import record
from .memo import hash_once, not_owned



def tp_following_defaults(tp: int) -> dict[str, object]:
    """The layout fields that follow TP unless given (their one owner): sequence parallelism on
    whenever TP > 1 (Korthikanti et al. 2022; Megatron-Core requires it for MoE with TP), and
    expert TP equal to TP (Megatron-Core's ``--expert-tensor-parallel-size`` default)."""
    return {"sequence_parallel": tp > 1, "etp": tp}


@record("parallel")
@not_owned
@hash_once
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
    # Megatron-LM's --cp-comm-type: how TransformerEngine's attention exchanges the sequence (choices.CP_COMM_TYPES)
    cp_comm_type: str = "p2p"
    ep: int = 1
    etp: int | None = None
    zero_stage: int | None = None
    world_size: int | None = None  # optional check: must equal tp x pp x cp x dp
    # Share of data-parallel (DP/FSDP gradient and parameter) and pipeline communication hidden
    # behind compute (roofline.py); 1.0 = Megatron --overlap-grad-reduce/--overlap-param-gather,
    # FSDP2 prefetching and DDP bucketing, 0.0 = none overlapped.
    comm_overlap: float = 1.0
    pp_schedule: str = "1f1b"
    # Megatron-Core's --account-for-embedding/loss-in-pipeline-split: the embedding (the loss)
    # counts as one layer of the split, so the first (last) virtual stage holds one layer fewer
    pp_account_for_embedding: bool = False
    pp_account_for_loss: bool = False
    # Megatron-Core's --pipeline-model-parallel-layout, e.g. "Et*4|(t*4|)*14tmL" (sharding.parse_layout)
    pp_layout: str | None = None
    # fsdp1: Accelerate's fsdp_sharding_strategy, and HYBRID_SHARD's shard group (None = 8, a node's GPUs)
    fsdp_sharding_strategy: str = "FULL_SHARD"
    fsdp_shard_group_size: int | None = None

    def __post_init__(self) -> None:
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
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        """The schedule and the split options together (each as Megatron-Core's TransformerConfig or
        the DualPipe repository asserts it)."""
        s, split = self.pp_schedule, ("parallel.pp_first_stage_layers", "parallel.pp_last_stage_layers")
        if s != "1f1b" and self.pp == 1:
            raise ConfigError("parallel.pp_schedule", s, "'1f1b' when pp is 1", "a schedule needs pipeline stages",
                              related=("parallel.pp",))
        if s == "interleaved" and self.vpp == 1:
            raise ConfigError("parallel.pp_schedule", s, "'1f1b' when vpp is 1, or vpp > 1",
                              "interleaving runs vpp model chunks per rank", related=("parallel.vpp",))
        if s in ("zero_bubble",) + TWO_CHUNK_SCHEDULES and self.vpp > 1:
            raise ConfigError("parallel.pp_schedule", s, "'interleaved' when vpp > 1, or vpp = 1",
                              "ZB-H1 runs one chunk per rank and DualPipe(V) its own two", related=("parallel.vpp",))
        if s == "dualpipe" and self.pp % 2:
            raise ConfigError("parallel.pp", self.pp, "an even number with pp_schedule 'dualpipe'",
                              "DualPipe pairs rank r with rank pp - 1 - r (deepseek-ai/DualPipe asserts it)",
                              related=("parallel.pp_schedule",))
        uneven = self.pp_first_stage_layers is not None or self.pp_last_stage_layers is not None
        accounted = self.pp_account_for_embedding or self.pp_account_for_loss
        name = "parallel.pp_account_for_embedding" if self.pp_account_for_embedding else "parallel.pp_account_for_loss"
        if accounted and (self.pp == 1 or uneven or self.pp_layout is not None):
            raise ConfigError(name, True, "false when pp is 1, with pp_first/last_stage_layers or with pp_layout",
                              "Megatron-Core takes one way of splitting the layers",
                              related=("parallel.pp", "parallel.pp_layout") + split)
        if self.pp_layout is not None and (self.pp == 1 or uneven):
            raise ConfigError("parallel.pp_layout", self.pp_layout, "unset when pp is 1 or with "
                              "pp_first/last_stage_layers", "Megatron-Core takes one way of splitting the layers",
                              related=("parallel.pp",) + split)
        if s == "dualpipev" and uneven:
            raise ConfigError(split[0] if self.pp_first_stage_layers is not None else split[1],
                              self.pp_first_stage_layers or self.pp_last_stage_layers,
                              "unset with pp_schedule 'dualpipev' (use pp_layout or the account flags)",
                              "DualPipeV's first and last stages are both on rank 0", related=("parallel.pp_schedule",))

    @property
    def schedule(self) -> str:
        """The schedule that runs: 'interleaved' whenever vpp > 1 (Megatron-Core), else pp_schedule."""
        return "interleaved" if self.vpp > 1 else self.pp_schedule

    @property
    def virtual_stages(self) -> int:
        """Model chunks the layers are split into: pp x vpp; 2 pp under DualPipeV (its 'cut-in-half'),
        pp under DualPipe, whose ranks each hold two of the pp stages."""
        return 2 * self.pp if self.pp_schedule == "dualpipev" else self.pp * self.vpp

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

