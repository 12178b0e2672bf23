"""Real DeepSpeed 0.19.5 ZeRO-3's parameter coordinator against the replay's (estimator/memory/deepspeed_gathers.py
Coordinator over zero3_trace.build_trace): the all-gather calls (their parameters' numels) and the releases of a tiny
Llama (transformers, untied head, gradient checkpointing) over 2 gloo ranks on the CPU, two steps of two
micro-batches, stage3_prefetch_bucket_size 5,000, persistence threshold 100 (the norms; real DeepSpeed gathers and
releases them too before the trace is recorded: left out of the comparison). Prints, per micro-batch, whether the
two sequences agree and both where they do not.

    PYTHONPATH=. .venv/deepspeed/bin/python -m validation.gpu.deepspeed_gather_sequence

Found (2026-11-27): the first micro-batch's forward and every recorded micro-batch's calls and releases agree but
for the embedding, which v0.19.5 releases at the backward's end (stage3.py backward -> release_backward_leftovers,
l. 2772; not in v0.12.3) and gathers again at the next forward, where the replay (zero3_trace: no hook releases it)
holds it to the step; and in the first micro-batch's backward (no trace) v0.19.5 gathers one MLP matrix of the
layer before its recomputation (release_sub_module's ds_recompute_parameters), which the trace does not have.
"""

from __future__ import annotations

import sys

import torch

MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160,
             vocab_size=1000)
ZERO = {"stage": 3, "stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 5000,
        "stage3_max_live_parameters": 1_000_000_000, "reduce_bucket_size": 5000}
THRESHOLD = 100


def measure_rank() -> list:
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
    config = LlamaConfig(**MODEL, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False,
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


def replayed() -> list:
    from estimator import estimate_config
    from estimator.memory.deepspeed_gathers import Coordinator
    from estimator.memory.sharding import stage_parameters
    from estimator.memory.zero3_trace import MAX_REUSE_DISTANCE, build_trace
    from estimator.spec.parallel import Parallel

    est = estimate_config({
        "model": {"name": "tiny-llama", "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
                  "intermediate_size": 160, "vocab_size": 1000, "tie_embeddings": False},
        "training": {"framework": "deepspeed", "seq_len": 8, "micro_batch_size": 1, "global_batch_size": 4,
                     "recompute": "full", "param_dtype": "bf16", "compute_dtype": "bf16", "optimizer": "adamw",
                     "stage3_prefetch_bucket_size": 5000, "stage3_param_persistence_threshold": THRESHOLD},
        "parallel": {"dp": 2, "zero_stage": 3}, "hardware": {"gpu": "h100-80"}})
    trace = build_trace(est.architecture, est.training,
                        stage_parameters(est.architecture, Parallel(dp=2), "deepspeed")[0], THRESHOLD)
    events: list = []

    class Program:
        def alloc(self, nbytes, stream=0):
            return object()

        def free(self, *blocks):
            pass

    c = Coordinator(Program(), trace, 1, 2, ZERO["stage3_prefetch_bucket_size"], ZERO["stage3_max_live_parameters"],
                    MAX_REUSE_DISTANCE)
    call, release = c._call, c._release
    c._call = lambda params: (params and events.append(("call", tuple(c.numel[p] for p in params))), call(params))
    c._release = lambda p: (events.append(("release", c.numel[p])), release(p))
    for k in range(4):
        c.reset()  # v0.19.5: reset_step at the forward's start
        events.append(("microbatch",))
        for s in range(len(trace.steps)):
            if s == trace.backward_from:
                events.append(("backward",))
            c.run(s)
        c.complete = True
        if k % 2:
            c.release_all()
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


def main() -> int:
    from .deepspeed_partitions import gloo_world

    ranks = gloo_world(2, measure_rank)
    real, ours = micro_batches(ranks[0]), micro_batches(replayed())
    for k, (a, b) in enumerate(zip(real, ours)):
        print(f"micro-batch {k}: {'agree' if a == b else 'differ'}")
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  first difference at event {i} of {len(a)} (real) / {len(b)} (replay)")
            print("  real:  ", a[i:i + 6], "... ends", a[-3:])
            print("  replay:", b[i:i + 6], "... ends", b[-3:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
