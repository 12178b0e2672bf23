"""The fake world a distributed harness measures one rank of: torch's fake process group (backend
"fake", `FakeStore`), whose collectives allocate their outputs and move no data."""

from __future__ import annotations


def fake_world(size: int, rank: int = 0) -> None:
    """Make this process `rank` of a fake world of `size` ranks. A world of that size and rank
    already made (by this harness's previous case, or another harness's) is kept; any other is
    ended first."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if (dist.get_world_size(), dist.get_rank()) == (size, rank):
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=size, store=FakeStore())


def end_world() -> None:
    """End the fake world, if any (a single-device run must not see one left by an earlier case)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
