"""Real DeepSpeed 0.19.5 ZeRO-3's parameter coordinator against the replay's (estimator/memory/deepspeed_gathers.py
Coordinator over zero3_trace.build_trace): the all-gather calls (their parameters' numels) and the releases of a tiny
Llama (transformers, untied head and tied, gradient checkpointing) over 2 gloo ranks on the CPU, two steps of two
micro-batches, stage3_prefetch_bucket_size 5,000, persistence threshold 100 (the norms; real DeepSpeed gathers and
releases them too before the trace is recorded: left out of the comparison). Prints, per micro-batch, whether the
two sequences agree and both where they do not, and writes rank 0's sequences, per micro-batch, to RECORD
(tests/data/measured/deepspeed_partitions/zero3-gather-sequence-cpu-gloo.json;
tests/test_deepspeed_gather_sequence.py).

    PYTHONPATH=. .venv/deepspeed/bin/python -m validation.gpu.deepspeed_gather_sequence [--out FILE]

Found (2026-11-27): every recorded micro-batch's calls and releases agree, the embedding's release at each
backward's end (stage3.py backward_epilogue -> release_backward_leftovers, v0.19.5 l. 2772; from v0.19.3,
versions.py DEEPSPEED_RELEASE_LEFTOVERS) and its gather again at the next forward included, with the head tied
to it or not; the first micro-batch's forward agrees, and in its backward (no trace yet) v0.19.5 gathers one MLP
matrix of the layer before that layer's recomputation, which the trace does not have.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160,
             vocab_size=1000)
ZERO = {"stage": 3, "stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 5000,
        "stage3_max_live_parameters": 1_000_000_000, "reduce_bucket_size": 5000}
THRESHOLD = 100
RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "deepspeed_partitions" / \
    "zero3-gather-sequence-cpu-gloo.json"


def measure_rank(tied: bool = False) -> list:
    import deepspeed
    from deepspeed.runtime.zero import partition_parameters as pp
    from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
    from transformers import LlamaConfig, LlamaForCausalLM

    events: list = []
    cls = ppc.PartitionedParameterCoordinator
    gather = cls._PartitionedParameterCoordinator__all_gather_params_

    def all_gather_params_(self, params, forward, quantize=False):
        todo = sorted((p for p in params if p.ds_status == pp.ZeroParamStatus.NOT_AVAILABLE), key=lambda p: p.ds_id)
        if todo:
            events.append(("call", tuple(p.ds_numel for p in todo)))
        return gather(self, params, forward, quantize)

    cls._PartitionedParameterCoordinator__all_gather_params_ = all_gather_params_
    free = pp.free_param

    def free_param(param):
        events.append(("release", param.ds_numel))
        return free(param)

    pp.free_param = free_param
    config = LlamaConfig(**MODEL, max_position_embeddings=64, tie_word_embeddings=tied, use_cache=False,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
        "zero_optimization": ZERO, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9})
    events.clear()
    torch.manual_seed(1)
    for _ in range(4):
        events.append(("microbatch",))
        ids = torch.randint(0, MODEL["vocab_size"], (1, 8))
        loss = engine(input_ids=ids, labels=ids).loss
        events.append(("backward",))
        engine.backward(loss)
        engine.step()
    return events


def replayed(version: str = "0.19.5", tied: bool = False) -> list:
    """The estimator's coordinator (deepspeed_gathers.Gathers, under `version`'s rules: zero3_trace.release_rules) over the same
    four micro-batches, two a step, its calls and releases as the real run's are listed."""
    from estimator import estimate_config
    from estimator.memory.deepspeed_gathers import Coordinator, Gathers, chunks
    from estimator.memory.sharding import stage_parameters
    from estimator.memory.zero3_trace import MAX_REUSE_DISTANCE, build_trace, release_rules
    from estimator.spec.parallel import Parallel

    est = estimate_config({
        "model": {"name": "tiny-llama", "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
                  "intermediate_size": 160, "vocab_size": 1000, "tie_embeddings": tied},
        "training": {"framework": "deepspeed", "framework_version": version, "seq_len": 8, "micro_batch_size": 1,
                     "global_batch_size": 4, "recompute": "full", "param_dtype": "bf16", "compute_dtype": "bf16",
                     "optimizer": "adamw", "stage3_prefetch_bucket_size": 5000,
                     "stage3_param_persistence_threshold": THRESHOLD},
        "parallel": {"dp": 2, "zero_stage": 3}, "hardware": {"gpu": "h100-80"}})
    stage = stage_parameters(est.architecture, Parallel(dp=2), "deepspeed")[0]
    trace = build_trace(est.architecture, est.training, stage, THRESHOLD)
    events: list = []

    class Program:
        def alloc(self, nbytes, stream=0):
            return object()

        def free(self, *blocks):
            pass

        def transient(self, sizes):
            pass

    c = Coordinator(Program(), trace, 1, 2, ZERO["stage3_prefetch_bucket_size"], ZERO["stage3_max_live_parameters"],
                    MAX_REUSE_DISTANCE)
    call, release = c._call, c._release
    c._call = lambda params: (params and events.append(("call", tuple(c.numel[p] for p in params))), call(params))
    c._release = lambda p: (events.append(("release", c.numel[p])), release(p))
    g = Gathers(c, *chunks(trace, list(stage.layer_indices)), 0, *release_rules(est.training))
    for k in range(4):
        events.append(("microbatch",))
        g.forward()
        g.backward()  # no layer hook called: the forward's steps run here
        events.append(("backward",))
        g.end_backward()
        if k % 2:
            g.step()
    return events


def micro_batches(events: list) -> list[list]:
    out: list[list] = []
    for e in events:
        if e[0] == "call":
            e = ("call", tuple(n for n in e[1] if n > THRESHOLD))
            if not e[1]:
                continue
        if e[0] == "release" and e[1] <= THRESHOLD:
            continue
        if e[0] == "microbatch":
            out.append([])
        else:
            out[-1].append(e)
    return out


def main(argv=None) -> int:
    import deepspeed
    import transformers

    from .deepspeed_partitions import gloo_world

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    real = {tied: micro_batches(gloo_world(2, measure_rank, (tied,))[0]) for tied in (False, True)}

    def listed(sequence: list) -> list:
        return [[list(e[:1]) + [list(e[1]) if isinstance(e[1], tuple) else e[1]] if len(e) > 1 else list(e)
                 for e in m] for m in sequence]
    record = {"description": __doc__.split("\n\n")[0],
              "command": "PYTHONPATH=. .venv/deepspeed/bin/python -m validation.gpu.deepspeed_gather_sequence",
              "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0],
                           "transformers": transformers.__version__, "backend": "gloo (DeepSpeed CPU accelerator)"},
              "model": MODEL, "zero_optimization": ZERO, "threshold": THRESHOLD,
              "micro_batches": listed(real[False]), "tied_micro_batches": listed(real[True])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(args.out)
    for tied in (False, True):
        for k, (a, b) in enumerate(zip(real[tied], micro_batches(replayed(tied=tied)))):
            print(f"{'tied' if tied else 'untied'} head, micro-batch {k}: {'agree' if a == b else 'differ'}")
            if a != b:
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"  first difference at event {i} of {len(a)} (real) / {len(b)} (replay)")
                print("  real:  ", a[i:i + 6], "... ends", a[-3:])
                print("  replay:", b[i:i + 6], "... ends", b[-3:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
