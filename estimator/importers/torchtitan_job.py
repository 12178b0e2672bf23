"""A torchtitan job: its TOML flattened to dotted keys over torchtitan's defaults, each key read
remembered; the release whose settings these are."""

from __future__ import annotations

VERSION = "torchtitan v0.2.2"
# v0.2.2 job_config.py defaults of the keys that decide memory
_DEFAULTS = {
    "training.local_batch_size": 8, "training.global_batch_size": -1, "training.seq_len": 2048,
    "training.dtype": "float32", "training.mixed_precision_param": "bfloat16",
    "training.mixed_precision_reduce": "float32", "training.enable_cpu_offload": False,
    "parallelism.data_parallel_replicate_degree": 1, "parallelism.data_parallel_shard_degree": -1,
    "parallelism.fsdp_reshard_after_forward": "default", "parallelism.tensor_parallel_degree": 1,
    "parallelism.pipeline_parallel_degree": 1, "parallelism.context_parallel_degree": 1,
    "parallelism.expert_parallel_degree": 1, "parallelism.expert_tensor_parallel_degree": 1,
    "parallelism.pipeline_parallel_schedule": "1F1B", "parallelism.pipeline_parallel_microbatch_size": 1,
    "parallelism.pipeline_parallel_first_stage_less_layers": 1,
    "parallelism.pipeline_parallel_last_stage_less_layers": 1, "parallelism.pipeline_parallel_layers_per_stage": None,
    "activation_checkpoint.mode": "selective", "activation_checkpoint.selective_ac_option": "2",
    "compile.enable": False, "compile.components": ["model", "loss"], "model.converters": [],
    "optimizer.name": "AdamW", "optimizer.early_step_in_backward": False, "model.name": "llama3",
    "model.flavor": "debugmodel",
}
# pipeline schedules: torchtitan name -> (our pp_schedule, stages per rank)
_SCHEDULES = {"1f1b": ("1f1b", 1), "interleaved1f1b": ("interleaved", 2), "dualpipev": ("dualpipev", 2)}


class _Job:
    """The TOML flattened to dotted keys; each key read is remembered."""

    def __init__(self, flat: dict[str, object]):
        self.flat = flat
        self.used: set[str] = set()

    def get(self, key: str) -> object:
        self.used.add(key)
        return self.flat.get(key, _DEFAULTS.get(key))

    def given(self, key: str) -> bool:
        return key in self.flat
