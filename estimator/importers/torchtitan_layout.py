"""The parallel layout a torchtitan job describes: its parallel degrees, FSDP sharding, the
pipeline and its schedule, and the layout written back as torchtitan's settings.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, to_int
from .result import Ledger
from .torchtitan_job import VERSION, _SCHEDULES, _Job


# --- the layout ---------------------------------------------------------------------------------

def _parallel(job: _Job, build: ConfigBuilder, ledger: Ledger, gpus: int | None, arch) -> None:
    degree = {k: to_int(f"parallelism.{k}", job.get(f"parallelism.{k}"), -1) for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
        "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
        "expert_tensor_parallel_degree")}
    replicate, shard = degree["data_parallel_replicate_degree"], degree["data_parallel_shard_degree"]
    tp, pp, cp = degree["tensor_parallel_degree"], degree["pipeline_parallel_degree"], degree["context_parallel_degree"]
    for key, value in degree.items():
        if value < 1 and not (key == "data_parallel_shard_degree" and value == -1):
            raise ConfigError(f"parallelism.{key}", value, "an integer >= 1" + (" or -1 (the rest of the world)"
                                                                               if "shard" in key else ""))
    others = replicate * tp * pp * cp
    if shard == -1:  # parallel_dims.py: the shard degree takes what the other degrees leave of the world
        if gpus is None:
            raise ConfigError("--gpus", None, "the number of GPUs: parallelism.data_parallel_shard_degree is -1, so "
                              "the launcher's world size decides it", "missing")
        if gpus % others:
            raise ConfigError("--gpus", gpus, f"a multiple of replicate x tp x pp x cp = {others}")
        shard = gpus // others
        ledger.note(f"data_parallel_shard_degree -1 = {gpus} GPUs / {others}: {shard}")
    elif gpus is not None and gpus != shard * others:
        raise ConfigError("--gpus", gpus, f"{shard * others} = the degrees' product", "torchtitan checks that the "
                          "degrees multiply to the world size")
    for key, path, value in (("tensor_parallel_degree", "parallel.tp", tp), ("pipeline_parallel_degree", "parallel.pp",
                              pp), ("context_parallel_degree", "parallel.cp", cp)):
        if value != 1 or job.given(f"parallelism.{key}"):
            build.set(path, value, f"parallelism.{key}")
    build.set("parallel.dp", replicate * shard, "parallelism.data_parallel_shard_degree", shard,
              why=f"x replicate {replicate}" if replicate > 1 else "")
    _sharding(job, build, ledger, replicate, shard, pp)
    if tp > 1:
        build.put("parallel.sequence_parallel", True)  # torchtitan's TP plan shards the norms' activations (SP)
        ledger.note("sequence parallel on with TP (torchtitan's tensor-parallel plan shards the norms)")
        if job.get("parallelism.disable_loss_parallel"):
            ledger.not_modelled("parallelism.disable_loss_parallel", True, "the full logits on every TP rank")
    if arch.is_moe:
        ep, etp = degree["expert_parallel_degree"], degree["expert_tensor_parallel_degree"]
        if ep != 1:
            build.set("parallel.ep", ep, "parallelism.expert_parallel_degree")
        if etp != tp:
            build.set("parallel.etp", etp, "parallelism.expert_tensor_parallel_degree", etp,
                      why="" if job.given("parallelism.expert_tensor_parallel_degree") else f"{VERSION}'s default")
    if pp > 1:
        _pipeline(job, build, ledger, pp, arch.num_layers)


def _sharding(job: _Job, build: ConfigBuilder, ledger: Ledger, replicate: int, shard: int, pp: int) -> None:
    """FSDP2 over the shard degree; reshard after forward unless "never", or "default" with PP
    (v0.2.2 parallelize.py apply_fsdp: reshard_after_forward = not pp_enabled)."""
    policy = job.get("parallelism.fsdp_reshard_after_forward")
    if shard == 1:
        build.put("parallel.zero_stage", 0)
        ledger.note("no FSDP sharding (data_parallel_shard_degree 1): plain replicas (zero_stage 0)")
        return
    reshard = policy == "always" or (policy == "default" and pp == 1)
    if policy not in ("default", "always", "never"):
        raise ConfigError("parallelism.fsdp_reshard_after_forward", policy, "'default', 'always' or 'never'")
    stage = 3 if reshard else 2
    if stage != 3:
        build.set("parallel.zero_stage", 2, "parallelism.fsdp_reshard_after_forward", policy,
                  why="parameters stay gathered between forward and backward")
    elif job.given("parallelism.fsdp_reshard_after_forward"):
        ledger.mapped("parallelism.fsdp_reshard_after_forward", policy, "parallel.zero_stage = 3 (fsdp2's default)")
    if replicate > 1:
        ledger.not_modelled("parallelism.data_parallel_replicate_degree", replicate,
                            f"HSDP: FSDP shards over {shard} GPUs only; the estimate shards over all "
                            f"{replicate * shard} data-parallel GPUs")


def _pipeline(job: _Job, build: ConfigBuilder, ledger: Ledger, pp: int, layers: int) -> None:
    """Stages per rank from the schedule (or layers_per_stage), and torchtitan's own split
    (v0.2.2 distributed/pipeline_parallel.py generate_llm_fqn_per_model_part: the embedding and the
    output count as first/last_stage_less_layers layers) written as a Megatron-style layout."""
    name = str(job.get("parallelism.pipeline_parallel_schedule"))
    found = _SCHEDULES.get(name.lower())
    if found is None:
        ledger.not_modelled("parallelism.pipeline_parallel_schedule", name, "estimated as 1F1B")
        found = ("1f1b", 1)
    schedule, per_rank = found
    first = to_int("parallelism.pipeline_parallel_first_stage_less_layers",
                   job.get("parallelism.pipeline_parallel_first_stage_less_layers"), 0)
    last = to_int("parallelism.pipeline_parallel_last_stage_less_layers",
                  job.get("parallelism.pipeline_parallel_last_stage_less_layers"), 0)
    per_stage = job.get("parallelism.pipeline_parallel_layers_per_stage")
    stages = pp * per_rank
    if per_stage is not None:
        per_stage = to_int("parallelism.pipeline_parallel_layers_per_stage", per_stage, 1)
        stages = -(-(layers + first + last) // per_stage)
        if stages % pp:
            raise ConfigError("parallelism.pipeline_parallel_layers_per_stage", per_stage,
                              f"a value giving a number of stages divisible by pp = {pp}")
    parts = job.get("parallelism.module_fqns_per_model_part")
    if parts is not None:
        layout = _layout_of_parts(parts, layers)
        stages = layout.count("|") + 1
        source, why = "parallelism.module_fqns_per_model_part", f"{stages} stages as listed"
    else:
        layout = torchtitan_layout(stages, layers, first, last)
        source, why = "parallelism.pipeline_parallel_schedule", f"{stages} stages, torchtitan's split with " \
                                                                f"first/last_stage_less_layers {first}/{last}"
    if stages % pp:
        raise ConfigError(source, stages, f"a number of stages divisible by pp = {pp}")
    if schedule == "dualpipev" and stages != 2 * pp:
        raise ConfigError("parallelism.pipeline_parallel_layers_per_stage", per_stage,
                          f"{2 * pp} stages with DualPipeV")
    build.set("parallel.pp_layout", layout, source, name if parts is None else f"{stages} parts", why=why)
    if schedule == "interleaved" and stages // pp > 1:
        build.put("parallel.vpp", stages // pp)
    elif schedule == "dualpipev":
        build.put("parallel.pp_schedule", "dualpipev")
    elif stages != pp:
        raise ConfigError("parallelism.pipeline_parallel_schedule", name, "a multi-stage schedule (Interleaved1F1B) "
                          "for more than one stage per rank")
    mbs = to_int("parallelism.pipeline_parallel_microbatch_size",
                 job.get("parallelism.pipeline_parallel_microbatch_size"), 1)
    local = build.get("training.micro_batch_size", 1)
    if local % mbs:
        raise ConfigError("parallelism.pipeline_parallel_microbatch_size", mbs,
                          f"a divisor of training.local_batch_size ({local})")
    gbs = build.get("training.global_batch_size") or local * build.get("parallel.dp", 1)
    build.put("training.micro_batch_size", mbs)
    build.put("training.global_batch_size", gbs)
    ledger.mapped("parallelism.pipeline_parallel_microbatch_size", mbs,
                  f"training.micro_batch_size = {mbs}; local batch {local} is {local // mbs} pipeline micro-batches")


def _layout_of_parts(parts: object, layers: int) -> str:
    """module_fqns_per_model_part (a list of module names per stage) as a layout: the embedding on the
    first, the norm and output on the last, transformer layers in order and each exactly once."""
    if not isinstance(parts, list) or not parts or not all(isinstance(p, list) for p in parts):
        raise ConfigError("parallelism.module_fqns_per_model_part", "...", "a list of lists of module names")
    groups, expected = [], 0
    for i, part in enumerate(parts):
        count = 0
        for name in part:
            m = re.fullmatch(r"layers\.(\d+)", str(name))
            if m:
                if int(m.group(1)) != expected:
                    raise ConfigError("parallelism.module_fqns_per_model_part", name, f"layers.{expected} next "
                                      "(layers in order, each once)")
                expected += 1
                count += 1
            elif (name, i) not in (("tok_embeddings", 0), ("norm", len(parts) - 1), ("output", len(parts) - 1)):
                raise ConfigError("parallelism.module_fqns_per_model_part", name, "tok_embeddings on the first "
                                  "part, layers.N, norm and output on the last")
        groups.append(("E" if i == 0 else "") + (f"t*{count}" if count > 1 else "t" * count)
                      + ("L" if i == len(parts) - 1 else ""))
    if expected != layers:
        raise ConfigError("parallelism.module_fqns_per_model_part", f"{expected} layers", f"all {layers} layers")
    return "|".join(groups)


def torchtitan_layout(stages: int, layers: int, first: int, last: int) -> str:
    """Megatron's layout syntax for torchtitan's split: effective layers (layers + first + last)
    spread evenly, the first `extra` stages one more, the embedding stage `first` fewer, the
    output stage `last` fewer."""
    effective = layers + first + last
    base, extra = divmod(effective, stages)
    if base == 0 or first > base or last > base:
        raise ConfigError("parallelism.pipeline_parallel_degree", stages, f"at most {effective} stages with "
                          f"first/last_stage_less_layers {first}/{last}", "a stage would hold no layer")
    groups, placed = [], 0
    for i in range(stages):
        n = base + (1 if i < extra else 0) - (first if i == 0 else 0) - (last if i == stages - 1 else 0)
        n = max(0, min(n, layers - placed)) if i < stages - 1 else layers - placed
        placed += n
        layers_text = f"t*{n}" if n > 1 else "t" * n
        groups.append(("E" if i == 0 else "") + layers_text + ("L" if i == stages - 1 else ""))
    return "|".join(groups)
