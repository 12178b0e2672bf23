"""FSDP1's sharding strategies as Accelerate users set them (`fsdp_sharding_strategy` in the Accelerate
config, `fsdp_config["sharding_strategy"]` for the Trainer; accelerate 1.15 utils/dataclasses.py
`FullyShardedDataParallelPlugin.sharding_strategy`, a torch `ShardingStrategy` by name), and the process
groups each needs in the harness's fake world.

torch 2.13 distributed/fsdp (`_init_utils.py`, `_flat_param.py`, `_runtime_utils.py`):
- FULL_SHARD: parameters, gradients and optimizer states sharded over the world; a unit's unsharded
  parameters freed after its forward (`RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`) and its backward.
- SHARD_GRAD_OP: the same shards, but a unit's unsharded parameters are not freed after its forward
  (`NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`; `_post_forward_reshard`): they stay from its forward to
  the reshard after its backward (`_should_free_in_backward`).
- HYBRID_SHARD: FULL_SHARD within a shard group, replicated across groups (the sharded gradient is
  all-reduced over the replicas in place, `_reduce_grad`). Without a device mesh FSDP takes the node's
  devices as the shard group (`_init_intra_and_inter_node_groups` with the device handle's count); the
  harness, whose CPU device handle counts one device, passes the 2-D mesh (replicas, shard group) that
  a node of `shard_group` GPUs makes.
- NO_SHARD: nothing sharded (DDP-like): full fp32 FlatParameters, gradients and states; with mixed
  precision a unit runs on a bf16 copy (`_mp_shard`) freed at each reshard (`post_reshard`), its gradient
  all-reduced (`_all_reduce_grad`) and cast to the FlatParameter's fp32 (`_cast_grad_to_param_dtype`).
"""

from __future__ import annotations

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")


def process_groups(run) -> dict:
    """FSDP's keyword for the run's groups: a (replicas x shard group) device mesh for HYBRID_SHARD, none
    (the default group, the whole world) otherwise."""
    if run is None or run.strategy != "HYBRID_SHARD":
        return {}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils._python_dispatch import _disable_current_modes

    if not run.shard_group or run.world % run.shard_group:
        raise ValueError(f"HYBRID_SHARD needs a shard group dividing the world ({run.world}): {run.shard_group}")
    with _disable_current_modes():  # the mesh's rank table is host memory with real values, in a GPU run too
        mesh = init_device_mesh("cpu", (run.world // run.shard_group, run.shard_group),
                                mesh_dim_names=("replicate", "shard"))
    return {"device_mesh": mesh}
