"""What real DeepSpeed 0.19.5 ZeRO-1 and ZeRO-2 allocate per rank at data-parallel world sizes above one (issue 23:
"nothing measured checks ZeRO-2 at dp > 1"), on DeepSpeed's CPU accelerator over gloo, each rank a spawned process.

Tiny Llama- and Qwen2-shaped models of transformers (random weights from the config, bf16, untied head, no
download; the Qwen2 one has q/k/v biases and sizes that leave the no-decay group's flat tensor padded at 4 ranks),
the optimizer torch.optim.AdamW with the HF Trainer's two parameter groups (deepspeed_step.trainer_groups; a LoRA
run's adapters alone, the groups filtered by requires_grad as Trainer.create_optimizer filters them, the empty one
dropped by DeepSpeed), given to deepspeed.initialize as deepspeed_step does, ZeRO stage 1 or 2, overlap_comm on or off, contiguous gradients on,
reduce_bucket_size `BUCKET` elements. One training step; per rank the record keeps, read off DeepSpeed's
DeepSpeedZeroOptimizer (runtime/zero/stage_1_and_2.py):
- per group: the parameters' numels in group order (`bit16_groups`), the padded flat tensor (`bit16_groups_flat`),
  `partition_size`, `groups_padding`, the fp32 partition (`single_partition_of_fp32_groups`) and the indices of
  `params_in_partition` with their numels summed;
- `grads_in_partition`'s numel (read in copy_grads_in_partition, which makes it at the first reduction; the epilogue
  drops the name, _release_ipg_buffers) and the ipg buckets' buffers (setup_buckets).

    .venv/deepspeed/bin/python -m validation.gpu.deepspeed_partitions [--out FILE] [--worlds 2 4]

writes tests/data/measured/deepspeed_partitions/zero12-cpu-gloo.json (RECORD).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "deepspeed_partitions" / \
    "zero12-cpu-gloo.json"
BUCKET = 5_000  # reduce_bucket_size, elements: below the embedding's and the head's numel (they go alone)
MODELS = {
    # tiny-llama's sizes (deepspeed_step.MODELS["tiny"]): embedding and head 64,000, a layer's matrices 43,008
    "llama": dict(kind="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=160, vocab_size=1000),
    # Qwen2: q/k/v biases (40 + 10 + 10); no-decay group 3 x 140 + 40 = 460 elements, padded at 4 ranks (464)
    "qwen2": dict(kind="qwen2", hidden_size=40, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                  intermediate_size=100, vocab_size=1001),
}


@dataclass(frozen=True)
class PartitionRun:
    model: str  # MODELS
    zero_stage: int  # 1 or 2
    overlap_comm: bool
    lora: bool = False  # a LoRA adapter (rank 4, q_proj and v_proj) on the frozen model: its adapters alone trained

    @property
    def id(self) -> str:
        return (f"{self.model}-zero{self.zero_stage}-overlap{'on' if self.overlap_comm else 'off'}"
                + ("-lora" if self.lora else ""))


RUNS = tuple(PartitionRun(m, z, o) for m in MODELS for z in (1, 2) for o in (False, True)) + (
    PartitionRun("llama", 2, True, lora=True), PartitionRun("llama", 1, False, lora=True))


def ds_config(run: PartitionRun) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": run.zero_stage, "overlap_comm": run.overlap_comm,
                                  "contiguous_gradients": True, "reduce_bucket_size": BUCKET,
                                  "allgather_bucket_size": BUCKET, "reduce_scatter": True},
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def build_model(run: PartitionRun):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = dict(MODELS[run.model])
    kind = sizes.pop("kind")
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config,
                                                                                          Qwen2ForCausalLM)
    config = config_class(**sizes, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False,
                          attn_implementation="sdpa")
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    if run.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    model.train()
    return model


def trainer_groups(model) -> list[dict]:
    """deepspeed_step.trainer_groups, each group's parameters filtered by requires_grad (Trainer.create_optimizer's
    `p.requires_grad`). A LoRA run's no-decay group is empty (its adapters are all matrices): DeepSpeed drops it
    (engine.py _configure_optimizer l. 2002, `len(pg["params"]) != 0`)."""
    from .deepspeed_step import trainer_groups as groups

    return [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in groups(model)]


def measure_rank(run: PartitionRun) -> dict:
    import deepspeed

    model = build_model(run)
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trainer_groups(model), lr=1e-4, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(run))
    zero = engine.optimizer
    seen = {"grads_in_partition": 0, "buckets": []}
    copy, setup = zero.copy_grads_in_partition, zero.setup_buckets

    def copy_grads_in_partition(param):
        copy(param)
        if zero.grads_in_partition is not None:
            seen["grads_in_partition"] = max(seen["grads_in_partition"], zero.grads_in_partition.numel())

    def setup_buckets():
        setup()
        seen["buckets"] = [b.numel() for bucket in zero.ipg_buckets.values() for b in bucket.buffer]

    zero.copy_grads_in_partition, zero.setup_buckets = copy_grads_in_partition, setup_buckets
    torch.manual_seed(1)
    ids = torch.randint(0, MODELS[run.model]["vocab_size"], (1, 8))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    groups = []
    for i, params in enumerate(zero.bit16_groups):
        inside = {id(p) for p in zero.params_in_partition[i]}
        groups.append({"names": [names[id(p)] for p in params], "numels": [p.numel() for p in params],
                       "flat_numel": zero.bit16_groups_flat[i].numel(), "partition_size": zero.partition_size[i],
                       "padding": zero.groups_padding[i],
                       "fp32_partition_numel": zero.single_partition_of_fp32_groups[i].numel(),
                       "params_in_partition": [j for j, p in enumerate(params) if id(p) in inside],
                       "params_in_partition_numel": sum(p.numel() for p in zero.params_in_partition[i])})
    return {"rank": deepspeed.comm.get_rank(), "groups": groups,
            "grads_in_partition_numel": seen["grads_in_partition"], "ipg_bucket_numels": seen["buckets"],
            "loss": float(loss.detach())}


def _gloo_rank(rank: int, world: int, port: int, measure, args: tuple, queue) -> None:
    """One spawned rank: DeepSpeed's distributed init over gloo, then `measure(*args)` on the queue as (rank, it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import importlib
    import logging

    import deepspeed

    # gloo alone: the CPU accelerator's shared-memory all-reduce op is a C++ build (comm/torch.py build_shm_op).
    # The module by name: `import deepspeed.comm.torch as m` binds deepspeed.comm's attribute `torch`, torch itself
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)
    deepspeed.init_distributed("gloo", auto_mpi_discovery=False)
    try:
        queue.put((rank, measure(*args)))
    finally:
        torch.distributed.destroy_process_group()


def gloo_world(world: int, measure, args: tuple = ()) -> list:
    """Each rank's `measure(*args)` (a module-level function, so a spawned process finds it), by rank, over `world`
    spawned gloo ranks; a rank that fails, or 600 s without every answer, stops the others. Shared by this module,
    deepspeed_accumulation.py, deepspeed_gathers.py and deepspeed_gather_sequence.py."""
    import queue as queues
    import time

    import torch.multiprocessing as mp

    from .framework_step import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, measure, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    out: list = [None] * world
    left, deadline = world, time.monotonic() + 600
    while left:
        try:
            rank, record = queue.get(timeout=2)
        except queues.Empty:
            if any(p.exitcode for p in procs) or time.monotonic() > deadline:  # a rank failed: stop the others
                for p in procs:
                    p.kill()
                raise RuntimeError(f"rank processes ended {[p.exitcode for p in procs]}") from None
            continue
        out[rank] = record
        left -= 1
    for p in procs:
        p.join(60)
        if p.exitcode:
            raise RuntimeError(f"rank process exited {p.exitcode}")
    return out


def _each_run(measure, runs: tuple) -> list:
    return [(run.id, measure(run)) for run in runs]


def measure_world(world: int, runs: tuple = RUNS, measure=None) -> dict:
    """{run id: [each rank's record, by rank]} for `runs` over `world` spawned gloo ranks, each run measured by
    `measure` (this module's measure_rank unless given)."""
    out: dict = {}
    for rank, records in enumerate(gloo_world(world, _each_run, (measure or measure_rank, runs))):
        for run_id, record in records:
            out.setdefault(run_id, [None] * world)[rank] = record
    return out


def world_record(doc: str, module: str, worlds, runs: tuple, measure_world) -> dict:
    """The record of a gloo-world measurer (this one, deepspeed_accumulation.py): `doc`'s first paragraph, the
    command that runs `module`, the versions, the models, `runs` and `measure_world(world, runs)` for each world."""
    import deepspeed
    import transformers

    return {"description": doc.split("\n\n")[0], "command": f"PYTHONPATH=. .venv/deepspeed/bin/python -m {module} "
            "--worlds " + " ".join(map(str, worlds)),
            "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0],
                         "transformers": transformers.__version__, "backend": "gloo (DeepSpeed CPU accelerator)"},
            "bucket": BUCKET, "models": MODELS, "runs": {run.id: asdict(run) for run in runs},
            "worlds": {str(w): measure_world(w, runs) for w in worlds}}


def measure(worlds=(2, 4), runs: tuple = RUNS) -> dict:
    return world_record(__doc__, "validation.gpu.deepspeed_partitions", worlds, runs, measure_world)


def write_main(argv, doc: str, out: Path, worlds: list[int], measure) -> int:
    """A gloo-world measurer's command line (`--out FILE`, `--worlds N ...`): `measure(worlds)` written to FILE
    (record.write_json), its path printed."""
    from ..core.record import write_json

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--worlds", type=int, nargs="+", default=worlds)
    args = parser.parse_args(argv)
    write_json(args.out, measure(tuple(args.worlds)))
    print(args.out)
    return 0


def main(argv=None) -> int:
    return write_main(argv, __doc__, RECORD, [2, 4], measure)


if __name__ == "__main__":
    sys.exit(main())
