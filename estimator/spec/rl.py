"""`training.rl` of the config: the RL algorithm, its rollout engine and models, checked as it is
built and against the training setup it runs with.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .values import check_section
from .field import record


# the rollout's own settings (DPO has none)
ROLLOUT_FIELDS = ("rollout_batch_size", "samples_per_prompt", "engine", "engine_memory_fraction",
                  "offload_during_rollout", "rollout_tp")


@record("rl")
@dataclass(frozen=True)
class Rl:
    """`training.rl` of the contract. ``engine_memory_fraction`` None: the KV cache holds the whole
    rollout batch at once. ``rollout_tp`` (an extension): the engine's tensor parallelism, None =
    the trainer's TP."""

    algorithm: str = "grpo"
    rollout_batch_size: int = 32
    samples_per_prompt: int = 8
    max_prompt_len: int = 1024
    max_response_len: int = 8192
    engine: str = "vllm"
    engine_memory_fraction: float | None = 0.5
    reference_model: bool = True
    critic_model: bool = False
    offload_during_rollout: bool = True
    rollout_tp: int | None = None

    def __post_init__(self) -> None:
        check_section("rl", self)
        if self.algorithm == "ppo" and not self.critic_model:
            raise ConfigError("training.rl.critic_model", False, "true with algorithm 'ppo'",
                              "PPO trains a value model beside the policy", related=("training.rl.algorithm",))
        if self.algorithm != "ppo" and self.critic_model:
            raise ConfigError("training.rl.critic_model", True, "false unless algorithm is 'ppo'",
                              f"{self.algorithm.upper()} has no value model", related=("training.rl.algorithm",))
        if self.algorithm == "dpo" and not self.reference_model:
            raise ConfigError("training.rl.reference_model", False, "true with algorithm 'dpo'",
                              "DPO's loss compares the policy with the frozen reference")
        if self.algorithm == "dpo":  # no rollout: its settings would be silently unused
            for name in ROLLOUT_FIELDS:
                if getattr(self, name) != Rl.__dataclass_fields__[name].default:
                    raise ConfigError(f"training.rl.{name}", getattr(self, name),
                                      "its default with algorithm 'dpo'", "DPO trains on given pairs: no rollout",
                                      related=("training.rl.algorithm",))

    @property
    def sequence_len(self) -> int:
        return self.max_prompt_len + self.max_response_len

    def to_dict(self) -> dict:
        out = {"algorithm": self.algorithm}
        for name in Rl.__dataclass_fields__:
            value = getattr(self, name)
            if name != "algorithm" and value != getattr(Rl(), name):
                out[name] = value
        return out


def rl_from(value: object) -> Rl | None:
    if value is None or isinstance(value, Rl):
        return value
    if not isinstance(value, dict):
        raise ConfigError("training.rl", value, "an object with algorithm, rollout_batch_size, samples_per_prompt, ...")
    known = list(Rl.__dataclass_fields__)
    for key in value:
        if key not in known:
            raise ConfigError(f"training.rl.{key}", value[key], f"fields of rl: {', '.join(known)}", "unknown field")
    return Rl(**value)


def check_rl(rl: Rl, training, par) -> None:
    """The trained sequence is the prompt and the response: `training.seq_len` follows it."""
    left_alone = type(training).__dataclass_fields__["seq_len"].default  # the field's default
    if training.seq_len not in (rl.sequence_len, left_alone):
        raise ConfigError("training.seq_len", training.seq_len,
                          f"{rl.sequence_len} (max_prompt_len + max_response_len) or left at its default",
                          "the trainer learns from prompt + response sequences", related=("training.rl",))
    if training.mode != "training":
        raise ConfigError("training.rl", rl.algorithm, "absent in inference mode", related=("training.mode",))
    if par.pp > 1:
        raise ConfigError("parallel.pp", par.pp, "1 with RL", "the colocated RL phases are modelled without a "
                          "pipeline", related=("training.rl",))
    tp = rl.rollout_tp or par.tp
    if par.gpus % tp:
        raise ConfigError("training.rl.rollout_tp", tp, f"a divisor of the {par.gpus} GPUs",
                          "every engine replica spans rollout_tp GPUs")
