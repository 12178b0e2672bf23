"""The inverse question: N users at context L on this GPU: how many GPUs, with which layout?

Every replica layout (TP within a node, PP, KV cache dtype, weight format) is estimated once with
max_model_len = L; a layout that starts holds min(floor(max_concurrency), max_num_seqs) sequences of L
tokens per replica, so N users need ceil(N / that) replicas (data parallel). Options are listed fewest
GPUs first, then fewest changes to what was asked (the checkpoint's own format, the model's KV dtype),
then most sequences per GPU.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .checkpoint import checkpoint_format
from .service import estimate_serving
from ..spec.serving import Serving

TP_SIZES = (1, 2, 4, 8, 16)
PP_SIZES = (1, 2, 4, 8)
ALTERNATIVE_FORMATS = ("fp8", "awq_int4")  # quantized checkpoints people serve instead of 16-bit ones


@dataclass(frozen=True)
class Option:
    gpus: int
    replicas: int
    sequences_per_replica: int
    parallel: Parallel
    serving: Serving
    changes: dict  # the serving fields changed from what was asked
    result: object  # the replica's serving estimate

    def to_json(self) -> dict:
        return {"gpus": self.gpus, "replicas": self.replicas, "sequences_per_replica": self.sequences_per_replica,
                "parallel": {"tp": self.parallel.tp, "pp": self.parallel.pp, "dp": self.replicas},
                "serving_changes": self.changes, "serving": self.result.to_json()}


@dataclass(frozen=True)
class ServePlan:
    users: int
    context: int
    options: tuple[Option, ...]
    searched: int
    seconds: float

    def to_json(self) -> dict:
        return {"users": self.users, "context": self.context, "options": [o.to_json() for o in self.options],
                "searched": self.searched, "seconds": self.seconds}


def _variants(serving: Serving, checkpoint: dict | None) -> list[dict]:
    kv = [{}] if serving.kv_cache_dtype is not None else [{}, {"kv_cache_dtype": "fp8"}]
    loaded = checkpoint_format(checkpoint, serving.weight_format).name
    formats = [{}] + [{"weight_format": f} for f in ALTERNATIVE_FORMATS if f != loaded]
    return [{**a, **b} for b in formats for a in kv]


def serve_plan(arch: Architecture, serving: Serving, hardware: Hardware, users: int, context: int,
               checkpoint: dict | None = None, gpus_per_node: int = 8, limit: int = 10) -> ServePlan:
    if users < 1:
        raise ConfigError("--users", users, "a positive integer")
    if context < 1:
        raise ConfigError("--context", context, "a positive integer")
    start = time.perf_counter()
    base = dataclasses.replace(serving, max_model_len=context)
    options, searched = [], 0
    for tp in (t for t in TP_SIZES if t <= gpus_per_node):
        for pp in (p for p in PP_SIZES if p <= arch.num_layers):
            for changes in _variants(base, checkpoint):
                searched += 1
                try:
                    result = estimate_serving(arch, dataclasses.replace(base, **changes), Parallel(tp=tp, pp=pp),
                                              hardware, checkpoint)
                except ConfigError as err:
                    if err.field == "serving.max_model_len":
                        raise  # the context itself is refused: no layout helps
                    continue  # this layout is not one the engine accepts (heads over TP)
                if not result.starts:
                    continue
                per_replica = min(int(result.capacity.max_concurrency), result.resolved.max_num_seqs)
                if per_replica < 1:
                    continue
                replicas = math.ceil(users / per_replica)
                options.append(Option(tp * pp * replicas, replicas, per_replica, Parallel(tp=tp, pp=pp),
                                      dataclasses.replace(base, **changes), changes, result))
    options.sort(key=lambda o: (o.gpus, len(o.changes), -o.sequences_per_replica / (o.parallel.tp * o.parallel.pp),
                                o.parallel.pp, o.parallel.tp))
    return ServePlan(users, context, tuple(options[:limit]), searched, time.perf_counter() - start)


def render_plan_text(plan: ServePlan) -> str:
    if not plan.options:
        return (f"No layout of up to {max(TP_SIZES)} x {max(PP_SIZES)} GPUs per replica holds one sequence of "
                f"{plan.context:,} tokens.")
    lines = [f"{plan.users:,} users at {plan.context:,} tokens: {len(plan.options)} options, fewest GPUs first "
             f"({plan.searched} layouts in {plan.seconds:.2f} s)",
             f"  {'GPUs':>5} {'replicas':>8} {'TP':>3} {'PP':>3} {'seq/replica':>11}  changes"]
    for o in plan.options:
        changes = ", ".join(f"{k}={v}" for k, v in o.changes.items()) or "-"
        lines.append(f"  {o.gpus:>5} {o.replicas:>8} {o.parallel.tp:>3} {o.parallel.pp:>3} "
                     f"{o.sequences_per_replica:>11}  {changes}")
    return "\n".join(lines)
