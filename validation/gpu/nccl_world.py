"""What a one-rank DeepSpeed run holds outside PyTorch's allocator, stage by stage (issue 23).

The four H200 DeepSpeed steps (tests/data/measured/gpu/deepspeed) hold 1,800,208,384 B outside the caching allocator
(mem_get_info's used less max reserved) where every HF Trainer run holds 804,061,184 (the context and the kernels
it loaded): 950 MiB more, the same in all four. DeepSpeed initialises torch.distributed over NCCL even for one rank
(deepspeed.init_distributed) and its engine and ZeRO optimizers run collectives on it (all_reduce of norms and
overflow flags); which of these holds the 950 MiB (the NCCL communicator, its kernels, DeepSpeed's own streams) is
what this separates. One process, each stage once, in this order, and after each the device's used bytes, the
allocator's reserved and allocated bytes and this process's nvidia-smi reading:
- context: torch.cuda.init() and a one-element tensor;
- init_distributed: deepspeed.init_distributed('nccl') over a world of one rank (as deepspeed_step.py does);
- all_reduce_1: the first collective, an all_reduce of one element (NCCL makes its communicator here);
- all_reduce_64mib: an all_reduce of 64 MiB (fp32);
- deepspeed_zero3_tiny: deepspeed.initialize of the tiny model under ZeRO-3 with torch's AdamW and its first step
  (deepspeed_step.TINY: what DeepSpeed adds beside NCCL);
- deepspeed_zero3_tiny_step2: its second step.
On the CPU (the self-test) the same stages run over gloo against the CPU stand-in of devices.py.
"""

from __future__ import annotations

import json
import sys

import torch

STAGES = ("context", "init_distributed", "all_reduce_1", "all_reduce_64mib", "deepspeed_zero3_tiny",
          "deepspeed_zero3_tiny_step2")


def measure_nccl_world(device: str) -> dict:
    from .context import stage_deltas, stage_marker
    from .devices import device_named

    rows: list[dict] = []
    run_stages(device, stage_marker(device_named(device), rows))
    return {"stages": rows, "deltas": stage_deltas(rows)}


def run_stages(device: str, mark) -> None:
    """STAGES in order, `mark(stage)` after each (nccl_mechanism.py marks them with NCCL's log as well)."""
    import torch.distributed as dist

    from .deepspeed_step import TINY, DeepSpeedStep, _init_one_rank
    from .framework_step import one_rank_environment
    from .measure import nullphase

    if device == "cuda":
        torch.cuda.init()
    torch.zeros(1, device=device)
    mark("context")
    try:
        with one_rank_environment(launcher=True):
            _init_one_rank(device)
            mark("init_distributed")
            dist.all_reduce(torch.ones(1, device=device))
            mark("all_reduce_1")
            dist.all_reduce(torch.ones(16 * 2**20, device=device))
            mark("all_reduce_64mib")
            step = DeepSpeedStep(TINY, device)  # its own init_distributed finds the group made
            step.step(lambda name: nullphase())
            mark("deepspeed_zero3_tiny")
            step.step(lambda name: nullphase())
            mark("deepspeed_zero3_tiny_step2")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.nccl_world DEVICE`: one JSON line on stdout."""
    from .devices import driver_api_version
    from .measure import versions

    device = argv[0]
    measured = measure_nccl_world(device)
    import deepspeed

    found = versions(device) | {"deepspeed": deepspeed.__version__,
                                "cuda_driver_api": driver_api_version() if device == "cuda" else None,
                                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else None}
    print(json.dumps({"experiment": "nccl-world", "run": {"world_size": 1}, "measured": measured, "versions": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
