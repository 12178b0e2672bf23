"""The installed torch's own pipelining (torch 2.13, the release the torchtitan 0.3.0 harness runs) against
memory/pp_receive.py's rule for it: two CPU processes over gloo run Schedule1F1B for two steps of 4
micro-batches (run here: torch 2.13.0+cpu, 4 activation buffers, 4 gradient buffers, no .grad); the receiving
stage keeps one activation receive buffer per micro-batch (distinct storages), the sending stage one gradient
receive buffer per micro-batch, and no buffer keeps a .grad after the step (pytorch#164329:
titan_releases' pp_recv_grads_kept is False for 0.3.0 and main)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

M = 4  # micro-batches a step


def _probe(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    h, b = 16, 2
    stage = PipelineStage(nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h)), rank, world,
                          torch.device("cpu"))
    schedule = Schedule1F1B(stage, M, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    x, y = torch.randn(b * M, h), torch.randn(b * M, h)
    for _ in range(2):
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])

    def buffers(info: dict) -> list:
        return [i.buffer for infos in info.values() for i in infos if i.buffer is not None]

    received, grads = buffers(stage.args_recv_info), buffers(stage.grad_recv_info)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"activation": len({t.untyped_storage().data_ptr() for t in received}),
                   "with_grad": sum(t.grad is not None for t in received),
                   "gradient": len({t.untyped_storage().data_ptr() for t in grads})}, f)
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is needed")
def test_torch_keeps_a_receive_buffer_per_micro_batch_and_drops_its_grad():
    from estimator.memory.titan_releases import RULES

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        # two fresh interpreters running this file (not multiprocessing's spawn, whose children re-import the
        # test module through whatever sys.path the suite's earlier tests left)
        ranks = [subprocess.Popen([sys.executable, __file__, str(r), store, out], stderr=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        errors = [p.communicate(timeout=300)[1] for p in ranks]
        assert [p.returncode for p in ranks] == [0, 0], errors
        first, second = (json.load(open(f"{out}.{r}")) for r in (0, 1))
    # torch 2.10 on drops the .grad once read (pytorch#164329): the releases of 0.3.0 and main
    kept = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 10)
    assert first == {"activation": 0, "with_grad": 0, "gradient": M}
    assert second == {"activation": M, "with_grad": M if kept else 0, "gradient": 0}
    assert not RULES["0.3.0"].pp_recv_grads_kept and not RULES["main"].pp_recv_grads_kept


if __name__ == "__main__":
    _probe(int(sys.argv[1]), 2, sys.argv[2], sys.argv[3])
