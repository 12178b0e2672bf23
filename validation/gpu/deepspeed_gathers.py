"""What real DeepSpeed 0.19.5 ZeRO-3 allocates when it gathers parameters over data-parallel ranks (issue 23: the
replay over ranks, estimator/memory/deepspeed_gathers.py), on DeepSpeed's CPU accelerator over gloo, each rank a
spawned process.

A tiny Qwen2-shaped model of transformers (random weights, bf16, odd sizes so that every partition is padded at 2
ranks), deepspeed.initialize with ZeRO-3 (no persistent parameters, no prefetch), then, outside any forward, the
parameters' own all_gather_coalesced (partition_parameters.py, what the coordinator calls): over one parameter (the
embedding) and over one layer's attention projections at once, each waited on. Per rank the record keeps the
numels, the bytes of the storage each gathered parameter points at, the bytes of the coalesced call's flat tensor
(the storage of the handle's partitions) and whether a parameter's storage is that flat tensor's.

    .venv/deepspeed/bin/python -m validation.gpu.deepspeed_gathers [--out FILE]

writes tests/data/measured/deepspeed_partitions/zero3-gathers-cpu-gloo.json (RECORD).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "deepspeed_partitions" / \
    "zero3-gathers-cpu-gloo.json"
# odd numels throughout: embedding 1001 x 45, q/o 45 x 45, k/v 9 x 45, MLP 99 x 45
MODEL = dict(hidden_size=45, num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1,
             intermediate_size=99, vocab_size=1001)


def ds_config() -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                  "stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 5_000},
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def _gathered(params: list, handle) -> dict:
    flat = None
    for h in getattr(handle, "handles", [handle]):  # MultipleAllGatherHandles: one per dtype (here one)
        parts = getattr(h, "partitions", None)
        if parts:
            flat = parts[0].untyped_storage()
    out = {"numels": [p.ds_numel for p in params],
           "storage_bytes": [p.data.untyped_storage().nbytes() for p in params],
           "flat_bytes": flat.nbytes() if flat is not None else None,
           "shares_flat": [flat is not None and p.data.untyped_storage().data_ptr() == flat.data_ptr()
                           for p in params]}
    return out


def measure_rank() -> dict:
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**MODEL, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config())
    module = engine.module
    embedding = module.model.embed_tokens.weight
    attention = module.model.layers[0].self_attn
    projections = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight, attention.o_proj.weight]
    out = {"rank": deepspeed.comm.get_rank(), "world": deepspeed.comm.get_world_size()}
    handle = embedding.all_gather_coalesced([embedding])
    handle.wait()
    out["one"] = _gathered([embedding], handle)
    handle = projections[0].all_gather_coalesced(projections)
    handle.wait()
    out["several"] = _gathered(sorted(projections, key=lambda p: p.ds_id), handle)
    return out


def measure_world(world: int = 2) -> list:
    from .deepspeed_partitions import gloo_world

    return gloo_world(world, measure_rank)


def main(argv=None) -> int:
    import deepspeed
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RECORD)
    args = parser.parse_args(argv)
    record = {"description": __doc__.split("\n\n")[0],
              "command": "PYTHONPATH=. .venv/deepspeed/bin/python -m validation.gpu.deepspeed_gathers",
              "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__.split("+")[0],
                           "transformers": transformers.__version__, "backend": "gloo (DeepSpeed CPU accelerator)"},
              "model": MODEL, "ranks": measure_world(2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
