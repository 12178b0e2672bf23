"""NCCL's world of one rank (estimator/spec/nccl.py, stage_shared.one_rank_world) held to the H200 records of
2026-11-27 (torch 2.11.0+cu130, NCCL 2.28.9, driver 580.159.04): the nccl-world experiment, NCCL's own ALLOC log of
the Megatron-Core step, and the DeepSpeed and Megatron-Core steps' bytes outside the caching allocator after the
build and after step 1. Every delta is in 2 MiB granules (cuMem's allocation granularity); a residual is stated
in granules with what it is."""

from __future__ import annotations

import json
from pathlib import Path

from estimator import estimate_config
from estimator.spec.cuda_modules import H200_STACK
from estimator.spec.nccl import (GRANULARITY, NCCL_KERNELS, NCCL_SHARED_STEPS, OLD_MAXCHANNELS, OLD_P2P_CHUNK,
                                 P2P_NVL_CHUNK, SMALL_PAGE, cumem, one_rank_communicator, shared_p2p_buffer)

MEASURED = Path(__file__).parent / "data" / "measured" / "gpu"
MiB = 2**20
COMMUNICATOR = 2 + 3 * 64  # granules: devCommSetup's 2 allocations + 3 per channel x 64 channels (spec/nccl.py)
KERNELS = 85  # granules: NCCL's kernels, with the process's first communicator
LAZY = H200_STACK.loaded("lazy")
CONTEXT_OUTSIDE = LAZY.context + LAZY.first_kernels  # the records' context stage: used less reserved


def granules(b: int) -> float:
    return b / GRANULARITY


def record(*parts: str) -> dict:
    return json.loads(MEASURED.joinpath(*parts).read_text())


def test_a_communicator_of_one_rank_by_hand():
    """194 allocations of 64,356 B requested (init.cc l. 512, 514: 23,648 + 4; channel.cc l. 42, 45, 56: 608 + 24 + 4
    per channel), each its own 2 MiB with cuMem: 388 MiB; torch 2.2's NCCL 2.19.3 is the first with cuMem on. Before
    it (NCCL 2.14.3, 2.18.1: MAXCHANNELS 32, no cuMem) the net proxy's shared buffer, 32 channels x 16 steps x
    128 KiB = 64 MiB, and 1 + 2 x 32 (2.14.3) or 1 + 3 x 32 (2.18.1) small allocations in the shared page."""
    comm = one_rank_communicator((2, 11))
    assert (comm.allocations, comm.bytes) == (194, 194 * 2 * MiB) == (COMMUNICATOR, 406_847_488)
    assert (OLD_MAXCHANNELS, NCCL_SHARED_STEPS, OLD_P2P_CHUNK) == (32, 16, 128 * 1024)
    assert one_rank_communicator((2, 1)) .bytes == one_rank_communicator((2, 0)).bytes == 32 * 16 * 128 * 1024 == \
        64 * MiB
    assert (one_rank_communicator((2, 0)).allocations, one_rank_communicator((2, 1)).allocations) == \
        (1 + 2 * 32 + 1, 1 + 3 * 32 + 1)
    assert not cumem((2, 0)) and not cumem((2, 1)) and cumem((2, 2)) and cumem((2, 13))
    assert NCCL_KERNELS == KERNELS * GRANULARITY == 178_257_920


def test_ncclS_own_log_counts_four_communicators_of_194_allocations():
    """The Megatron-Core step's NCCL_DEBUG=INFO (INIT,ALLOC) log: 4 communicators ('Init COMPLETE'), 776 device
    allocations of 257,424 B requested = 4 x (2 + 3 x 64) allocations of 64,356 B; the kept lines (the first
    communicator's) are 64 channels x channel.cc:42/:45/:56, then init.cc:512 and :514, each pointer on its own
    2 MiB."""
    nccl = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")["measured"]["nccl"]
    assert (nccl["communicators"], nccl["device_allocs"], nccl["device_alloc_bytes"]) == \
        (4, 4 * COMMUNICATOR, 4 * 64_356)
    allocs = [line for line in nccl["lines"] if "Cuda Alloc Size" in line]
    sizes = [int(line.split("Size ")[1].split()[0]) for line in allocs[:COMMUNICATOR]]
    assert sizes == [608, 24, 4] * 64 + [23_648, 4]  # the channels (setupChannel), then devCommSetup
    pointers = [int(line.rsplit("pointer ", 1)[1], 16) for line in allocs[:COMMUNICATOR]]
    assert all(p % GRANULARITY == 0 for p in pointers) and len(set(p // GRANULARITY for p in pointers)) == COMMUNICATOR


def test_the_nccl_world_experiment_stage_by_stage():
    """deepspeed.init_distributed (device_id: the world's communicator made at once) adds NCCL's kernels and one
    communicator, 85 + 194 granules exactly; the 1-element and 64 MiB all_reduces add nothing outside the
    allocator (one rank: a copy, enqueue.cc ncclLaunchOneRank); the tiny ZeRO-3 engine's first step adds the
    world's clone (194) and 76 granules of the step's kernels (cuBLAS and PyTorch's; the HF step's are 33 + 33 + 8:
    cuda_modules.py); its second step nothing."""
    measured = record("experiments", "nccl-world-h200.json")["runs"][0]["measured"]
    deltas = {d["stage"]: d["outside_allocator_bytes"] for d in measured["deltas"]}
    assert deltas["context"] == CONTEXT_OUTSIDE == 648_871_936
    assert granules(deltas["init_distributed"]) == KERNELS + COMMUNICATOR == 279
    assert deltas["all_reduce_1"] == deltas["all_reduce_64mib"] == deltas["deepspeed_zero3_tiny_step2"] == 0
    assert granules(deltas["deepspeed_zero3_tiny"]) == COMMUNICATOR + 76 == 270


def _outside(config: dict) -> tuple[int, int]:
    """The estimate's runtime and communication bytes (outside the allocator) for a record's configuration."""
    result = estimate_config(config)
    s = next(s for s in result.stages if s.stage == result.peak_stage)
    return s.component("runtime").bytes, s.component("communication").bytes


def test_deepspeed_two_communicators():
    """DeepSpeed 0.19.5 at world size 1: the world's communicator (init_distributed) and its clone's (the engine's
    data-parallel group), both made by the build: after it 85 + 2 x 194 granules above the context, exactly. After
    step 1: 76 granules more, the step's kernels; the HF step's are 74 (the estimate's runtime), so the estimate is
    2 granules (4 MiB) under the 1,800,208,384 B all four DeepSpeed records hold at the end."""
    run = record("deepspeed", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1.json")
    measured = run["measured"]
    assert granules(measured["outside_after_build_bytes"] - CONTEXT_OUTSIDE) == KERNELS + 2 * COMMUNICATOR == 473
    assert granules(measured["outside_after_step1_bytes"] - measured["outside_after_build_bytes"]) == 76
    runtime, communication = _outside(run["config"])
    assert communication == (KERNELS + 2 * COMMUNICATOR) * GRANULARITY == 991_952_896
    assert measured["outside_after_step1_bytes"] - (runtime + communication) == 2 * GRANULARITY


def test_megatron_four_communicators():
    """Megatron-Core 0.16.1 at world size 1 (init_process_group without device_id: each communicator at its group's
    first collective): the build makes one (the world's all_gather_object in get_megatron_optimizer): 85 + 194
    granules; step 1 three more (the TP group's loss all_reduce, the DP x CP group's reduce_scatter and all_gather,
    and the distributed optimizer's instance group's gradient-norm all_reduce: the nccl-mechanism record) and 67
    granules of kernels, the HF eager step's 66 and
    1 more: the estimate is 1 granule (2 MiB) under the 2,595,028,992 B the three Megatron records hold."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    measured = run["measured"]
    context = measured["context_used_bytes"] - measured["context_reserved_bytes"]
    assert context == CONTEXT_OUTSIDE
    assert granules(measured["outside_after_build_bytes"] - context) == KERNELS + COMMUNICATOR
    assert granules(measured["outside_after_step1_bytes"] - measured["outside_after_build_bytes"]) == \
        3 * COMMUNICATOR + 67
    runtime, communication = _outside(run["config"])
    assert runtime == LAZY.context + LAZY.first_kernels + LAZY.cublas + LAZY.step_kernels == 787_283_968
    assert communication == (KERNELS + 4 * COMMUNICATOR) * GRANULARITY == 1_805_647_872
    assert measured["outside_after_step1_bytes"] - (runtime + communication) == GRANULARITY


def test_the_nccl_of_torch_before_2_2_allocates_without_cumem():
    """torch 2.0 (NCCL 2.14.3) and 2.1 (2.18.1): NCCL_CUMEM_ENABLE off by default, so, as the H200 run with
    NCCL_CUMEM_ENABLE=0 measured: NCCL's kernels (85 granules), each communicator's net proxy shared buffer (64 MiB
    at 32 channels x 128 KiB) and one 2 MiB page for all the communicators' small cudaMallocs. DeepSpeed's two
    communicators: 170 + 2 x 64 + 2 = 300 MiB (the world was charged 170.1 MiB, the requested bytes, before the run)."""
    run = record("deepspeed", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1.json")
    config = json.loads(json.dumps(run["config"]))
    for version in ("2.0", "2.1"):
        config["training"]["torch_version"] = version
        _, communication = _outside(config)
        assert communication == NCCL_KERNELS + 2 * 64 * MiB + SMALL_PAGE == 300 * MiB


def _mechanism(framework: str, cumem_enable: str | None) -> dict:
    runs = record("experiments", "nccl-mechanism-h200.json")["runs"]
    run = next(r for r in runs if r["run"] == {"framework": framework, "nccl_cumem_enable": cumem_enable})
    return run["measured"]


def _by_stage(measured: dict) -> tuple[dict, dict]:
    deltas = {d["stage"]: d["outside_allocator_bytes"] for d in measured["deltas"]}
    logs = {row["stage"]: row["nccl"] for row in measured["stages"]}
    return deltas, logs


def test_the_mechanism_record_with_cumem_stage_by_stage():
    """nccl-mechanism, DeepSpeed as NCCL defaults (cuMem on): nccl-world's granules again (85 + 194 at
    init_distributed, 194 + 76 at the tiny engine's first step, nothing at the all_reduces or step 2), and NCCL's own
    log at each stage says which: one communicator of 194 allocations of 64,356 B at init_distributed
    (ncclCommInitRankConfig) and one at the first step (ncclCommSplit of the world: the engine's clone)."""
    deltas, logs = _by_stage(_mechanism("deepspeed", None))
    assert deltas["context"] == CONTEXT_OUTSIDE
    assert granules(deltas["init_distributed"]) == KERNELS + COMMUNICATOR == 279
    assert granules(deltas["deepspeed_zero3_tiny"]) == COMMUNICATOR + 76 == 270
    assert deltas["all_reduce_1"] == deltas["all_reduce_64mib"] == deltas["deepspeed_zero3_tiny_step2"] == 0
    counts = {stage: (log["communicators"], log["device_allocs"], log["device_alloc_bytes"]) for stage, log in
              logs.items()}
    assert counts == {"context": (0, 0, 0), "init_distributed": (1, 194, 64_356), "all_reduce_1": (0, 0, 0),
                      "all_reduce_64mib": (0, 0, 0), "deepspeed_zero3_tiny": (1, 194, 64_356),
                      "deepspeed_zero3_tiny_step2": (0, 0, 0)}
    assert logs["init_distributed"]["init_lines"][0].startswith("ncclCommInitRankConfig")
    assert logs["deepspeed_zero3_tiny"]["init_lines"][0].startswith("ncclCommSplit")


def test_the_mechanism_record_without_cumem_stage_by_stage():
    """nccl-mechanism, DeepSpeed with NCCL_CUMEM_ENABLE=0: each communicator logs 195 allocations, its 194 small
    ones (64,356 B) and one of 536,870,912 B = 64 channels x 16 steps x 512 KiB, the net proxy's shared buffer
    (no runtime connect without cuMem: spec/nccl.py). init_distributed adds 342 granules = NCCL's kernels 85 (the
    same as with cuMem) + the buffer's 256 + 1 page for the 194 small cudaMallocs; the split adds the buffer's 256
    and the step's own 75 (76 with cuMem): its 388 small allocations and the step's small cudaMalloc share the page
    the first communicator opened."""
    deltas, logs = _by_stage(_mechanism("deepspeed", "0"))
    buffer = shared_p2p_buffer(64, P2P_NVL_CHUNK)
    assert buffer == 536_870_912 == 256 * GRANULARITY
    assert deltas["context"] == CONTEXT_OUTSIDE
    for stage in ("init_distributed", "deepspeed_zero3_tiny"):
        assert (logs[stage]["communicators"], logs[stage]["device_allocs"], logs[stage]["device_alloc_bytes"]) == \
            (1, COMMUNICATOR + 1, 64_356 + buffer)
    assert granules(deltas["init_distributed"]) == KERNELS + buffer // GRANULARITY + granules(SMALL_PAGE) == 342
    assert granules(deltas["deepspeed_zero3_tiny"]) == buffer // GRANULARITY + 76 - 1 == 331
    assert deltas["all_reduce_1"] == deltas["all_reduce_64mib"] == deltas["deepspeed_zero3_tiny_step2"] == 0


def test_runtime_connect_off_connects_the_shared_buffer_through_cumem():
    """nccl-runtime-connect (H200, 2026-11-27, third run): NCCL 2.28.9 as NCCL defaults (cuMem on) but
    NCCL_RUNTIME_CONNECT=0, so initialisation connects what it leaves to run time otherwise (init.cc runtimeConn),
    as NCCL 2.19-2.21 (torch 2.2-2.6) always do: each communicator adds the net proxy's shared buffer, 64 channels x 16
    steps x 512 KiB = 256 granules, beside its 194 small ones, each its own granule under cuMem (no shared page, unlike
    NCCL_CUMEM_ENABLE=0): init_distributed 85 + 194 + 256 = 535 granules, the split 194 + 256 + the step's 76 = 526,
    as predicted before the run. NCCL's ALLOC log counts the 194 small allocations of 64,356 B only; the buffer,
    made through cuMem, logs no 'Cuda Alloc' line. This is the rule spec/nccl.py applies to torch 2.2-2.6 at their
    32 channels and 128 KiB chunk (64 MiB, 32 granules: 97 + 32 = 129 a communicator)."""
    runs = record("experiments", "nccl-runtime-connect-h200.json")["runs"]
    assert [r["run"] for r in runs] == [{"framework": "deepspeed", "nccl_cumem_enable": None,
                                         "nccl_runtime_connect": "0"}]
    deltas, logs = _by_stage(runs[0]["measured"])
    buffer = shared_p2p_buffer(64, P2P_NVL_CHUNK) // GRANULARITY
    assert buffer == 256 and deltas["context"] == CONTEXT_OUTSIDE
    assert granules(deltas["init_distributed"]) == KERNELS + COMMUNICATOR + buffer == 535
    assert granules(deltas["deepspeed_zero3_tiny"]) == COMMUNICATOR + buffer + 76 == 526
    assert deltas["all_reduce_1"] == deltas["all_reduce_64mib"] == deltas["deepspeed_zero3_tiny_step2"] == 0
    for stage in ("init_distributed", "deepspeed_zero3_tiny"):
        assert (logs[stage]["communicators"], logs[stage]["device_allocs"], logs[stage]["device_alloc_bytes"]) == \
            (1, COMMUNICATOR, 64_356)
    # the rule for NCCL 2.19-2.21, the same mechanism at their channels and chunk, whose estimate cites this record
    from estimator.memory.stage_shared import one_rank_world
    from estimator.spec.training import Training

    for version, cited in (("2.4", True), ("2.6", True), ("2.8", False), ("2.1", False)):
        world = one_rank_world(Training(framework="deepspeed", torch_version=version))
        assert all(("nccl-runtime-connect-h200.json" in p.source) == cited
                   for p in world.parts if "communicator of one" in p.label), version
    assert one_rank_communicator((2, 6)).bytes == (1 + 3 * OLD_MAXCHANNELS + shared_p2p_buffer(
        OLD_MAXCHANNELS, OLD_P2P_CHUNK) // GRANULARITY) * GRANULARITY == 258 * MiB


def test_the_mechanism_record_names_megatronS_fourth_communicator():
    """nccl-mechanism, a tiny Megatron-Core step at world size 1 with every collective logged by group: the build
    all_gather_objects over the world (optimizer/__init__.py l. 181) and NCCL makes 1 communicator (85 + 194
    granules); step 1 issues collectives over three more groups, TENSOR_MODEL_PARALLEL_GROUP (the loss,
    cross_entropy.py l. 130, 148, 154), DATA_PARALLEL_GROUP_WITH_CP (param_and_grad_buffer.py l. 443, 285) and
    INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP (the gradient norm, clip_grads.py l. 130), and NCCL makes 3 (3 x 194
    allocations of 64,356 B, 3 x 194 + 67 granules); step 2 the same collectives and none."""
    measured = _mechanism("megatron", None)
    deltas, logs = _by_stage(measured)
    assert granules(deltas["build"]) == KERNELS + COMMUNICATOR
    assert granules(deltas["step1"]) == 3 * COMMUNICATOR + 67
    assert deltas["init"] == deltas["step2"] == 0
    assert [(logs[s]["communicators"], logs[s]["device_allocs"], logs[s]["device_alloc_bytes"]) for s in
            ("init", "build", "step1", "step2")] == [(0, 0, 0), (1, 194, 64_356), (3, 3 * 194, 3 * 64_356), (0, 0, 0)]
    calls = {(c["stage"], c["op"], c["group"], c["where"].split("megatron/core/")[-1]) for c in measured["collectives"]}
    assert {c for c in calls if c[0] != "step2"} == {
        ("build", "all_gather_object", "WORLD", "optimizer/__init__.py:181"),
        ("step1", "all_reduce", "TENSOR_MODEL_PARALLEL_GROUP", "tensor_parallel/cross_entropy.py:130"),
        ("step1", "all_reduce", "TENSOR_MODEL_PARALLEL_GROUP", "tensor_parallel/cross_entropy.py:148"),
        ("step1", "all_reduce", "TENSOR_MODEL_PARALLEL_GROUP", "tensor_parallel/cross_entropy.py:154"),
        ("step1", "reduce_scatter_tensor", "DATA_PARALLEL_GROUP_WITH_CP", "distributed/param_and_grad_buffer.py:443"),
        ("step1", "all_gather_into_tensor", "DATA_PARALLEL_GROUP_WITH_CP",
         "distributed/param_and_grad_buffer.py:285"),
        ("step1", "all_reduce", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "optimizer/clip_grads.py:130")}
    assert {(s, o, g, w) for s, o, g, w in calls if s == "step2"} == {("step2", o, g, w) for s, o, g, w in calls
                                                                        if s == "step1"}


def test_megatron_source_puts_the_gradient_norm_on_the_instance_group():
    """The installed Megatron-Core 0.16.1: get_grad_norm_fp32's all_reduce over grad_stats_parallel_group is
    clip_grads.py l. 130; the distributed optimizer's grad_stats_parallel_group is intra_dist_opt_group
    (optimizer/__init__.py l. 459), the others' the model-parallel group (l. 462, 466); parallel_state builds the
    instance group from intra_partial_expert_data_parallel_size = expert DP / num_distributed_optimizer_instances
    tp-ep-pp groups (l. 1266-1268, 1336-1347): with one instance, every rank of the world."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.core")
    if spec is None:
        import pytest

        pytest.skip("megatron-core is not installed")
    root = Path(spec.origin).parent
    clip = (root / "optimizer" / "clip_grads.py").read_text().splitlines()
    assert clip[129].strip() == "torch.distributed.all_reduce(" and "group=grad_stats_parallel_group" in clip[130]
    init = (root / "optimizer" / "__init__.py").read_text().splitlines()
    assert init[458].strip() == "setattr(optimizer, 'grad_stats_parallel_group', intra_dist_opt_group)"
    assert init[461].strip() == init[465].strip() == \
        "setattr(optimizer, 'grad_stats_parallel_group', model_parallel_group)"
    state = (root / "parallel_state.py").read_text().splitlines()
    assert "expert_data_parallel_size // num_distributed_optimizer_instances" in state[1266]
    assert 'group_desc="INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"' in state[1343]


def test_torchtitan_and_hf_at_one_rank_make_none():
    """Only DeepSpeed and Megatron-Core are charged a world of one rank: the HF Trainer on one GPU initialises no
    process group, and torchtitan's step issues its collectives only where parallel_dims enables a mesh
    (torchtitan trainer.py `if parallel_dims.dp_enabled`), none at world size 1."""
    from estimator.memory.stage_shared import ONE_RANK_GROUPS

    assert set(ONE_RANK_GROUPS) == {"deepspeed", "megatron"}
    assert [len(groups) for groups in ONE_RANK_GROUPS.values()] == [2, 4]
    assert [g for g, _, _ in ONE_RANK_GROUPS["megatron"]] == ["world", "TP", "DP x CP", "distributed optimizer instance"]


def _communication(tp: int, dp: int, framework: str = "megatron") -> tuple[int, str]:
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    config = json.loads(json.dumps(run["config"]))
    config["parallel"].update(tp=tp, dp=dp)
    config["training"]["global_batch_size"] = dp
    result = estimate_config(config)
    c = result.stages[0].component("communication")
    return c.bytes, c.formula


def test_megatron_groups_of_size_one_in_a_layout_of_several_gpus():
    """At TP 2 x DP 1 the DP x CP group is one rank and Megatron-Core still reduce-scatters and all-gathers over it
    (param_and_grad_buffer.py: no size test; the world-size-1 run makes its communicator); at TP 1 x DP 2 the TP
    group is one rank and the loss all-reduces over it: each gets a communicator of one rank, 64 channels (NCCL's
    topology of a one-rank communicator holds its own GPU only), beside the 0.5 GiB of each larger group: the
    world's (the optimizer build's all_gather_object), the distributed optimizer's instance group (the world at one
    instance: the gradient norm) and TP or DP x CP; NCCL's kernels once (nccl_groups.megatron_communicators)."""
    one = 194 * GRANULARITY
    tp2, dp2 = _communication(2, 1), _communication(1, 2)
    assert tp2[0] == dp2[0] == KERNELS * GRANULARITY + 3 * 512 * MiB + one == 2094 * MiB
    assert tp2[1].endswith("of one rank x 388.0 MiB (DP x CP) = 2,094.0 MiB")
    assert dp2[1].endswith("of one rank x 388.0 MiB (TP) = 2,094.0 MiB")
    assert _communication(2, 2)[0] == KERNELS * GRANULARITY + 4 * 512 * MiB  # no group of size 1


def test_inference_makes_no_training_communicators():
    """The groups' collectives are a training step's (the optimizer's build and gradient sync, the loss): a Megatron
    configuration in inference mode at world size 1 is charged none of them."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    config = json.loads(json.dumps(run["config"]))
    config["training"]["mode"] = "inference"
    for key in ("grad_dtype", "master_weights", "optimizer_dtype", "optimizer", "recompute", "loss"):
        config["training"].pop(key, None)
    result = estimate_config(config)
    assert result.stages[0].component("communication").bytes == 0


def test_megatron_without_the_distributed_optimizer_norms_over_the_model_parallel_group():
    """Without the distributed optimizer (zero_stage 0) Megatron-Core's gradient norm all-reduces over the
    model-parallel group (optimizer/__init__.py l. 462, 466), one rank at TP x PP 1: at TP 1 x DP 2 that group and the
    TP group each get a communicator of one rank (388 MiB each with cuMem) beside the DP x CP group's 0.5 GiB. With
    the distributed optimizer it is the instance group, the whole world at DP 2 (not of one rank). Beside them the
    world's and the DP x CP group's 0.5 GiB each and NCCL's kernels."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    config = json.loads(json.dumps(run["config"]))
    config["parallel"].update(tp=1, dp=2, zero_stage=0)
    config["training"]["global_batch_size"] = 2
    c = estimate_config(config).stages[0].component("communication")
    assert c.bytes == (KERNELS + 2 * 194) * GRANULARITY + 2 * 512 * MiB
    assert c.formula.endswith("2 of one rank x 388.0 MiB (TP, model-parallel (the gradient norm's)) = 1,970.0 MiB")
    assert _communication(1, 2)[0] == (KERNELS + 194) * GRANULARITY + 3 * 512 * MiB  # zero_stage 1: TP only


def test_size_one_groups_without_cumem_charge_the_process_page_once():
    """torch 2.1 (NCCL 2.18.1, no cuMem) at TP 2 x DP 1 and TP 1 x DP 2: the group of size 1 is the net proxy's
    shared buffer, 32 channels x 16 steps x 128 KiB = 64 MiB, beside the larger group's 0.5 GiB, and the process's
    small cudaMallocs share one 2 MiB page, as at world size 1 (the nccl-mechanism record: the world's split, a
    second communicator, adds no page). At TP 1 x DP 2 with zero_stage 0 two groups of size 1 share that page."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    for tp, dp, zero, groups in ((2, 1, 1, 1), (1, 2, 1, 1), (1, 2, 0, 2)):  # groups: of one rank; the rest 4 less
        config = json.loads(json.dumps(run["config"]))
        config["training"]["torch_version"] = "2.1"
        config["parallel"].update(tp=tp, dp=dp, zero_stage=zero)
        config["training"]["global_batch_size"] = dp
        c = estimate_config(config).stages[0].component("communication")
        assert c.bytes == NCCL_KERNELS + (4 - groups) * 512 * MiB + groups * 32 * 16 * 128 * 1024 + 2 * MiB
        assert [p.bytes for p in c.parts].count(SMALL_PAGE) == 1


def test_one_constructor_for_the_communicators_of_one_rank():
    """The world of one rank and the groups of size 1 in a larger layout build their communicators with one
    constructor (stage_shared.one_rank_communicators): the same bytes, formula and page, the labels theirs."""
    from estimator.memory.stage_shared import one_rank_communicators, one_rank_world
    from estimator.spec.training import Training

    for version in ("2.1", None):
        training = Training(framework="deepspeed", torch_version=version)
        world = one_rank_world(training).parts[1:]
        built, comm, page = one_rank_communicators(training, (("a", "s"), ("b", "s")))
        assert [(p.bytes, p.formula) for p in world] == [(p.bytes, p.formula) for p in built]
        assert comm == one_rank_communicator((2, 1) if version else (2, 13))
        assert (page != "") == (version == "2.1")
        assert [p.label for p in built][:2] == ["NCCL communicator of one rank: a", "NCCL communicator of one rank: b"]


def _with(run: dict, **training) -> dict:
    config = json.loads(json.dumps(run["config"]))
    config["training"].update(training)
    return config


def test_nccl_cumem_off_at_world_size_one_is_the_measured_no_cumem_world():
    """training.nccl_cumem false (NCCL_CUMEM_ENABLE=0, as slime's and verl's training processes set it) under torch
    2.13: each communicator of one rank is the net proxy's shared buffer, 64 channels x 16 steps x 512 KiB = 512 MiB
    = 256 granules, and the process's small allocations share one page. DeepSpeed's two communicators: 85 + 2 x 256
    + 1 = 598 granules, what the nccl-mechanism record's DeepSpeed run with NCCL_CUMEM_ENABLE=0 adds at
    init_distributed (342) and with the split's buffer (256) before its step's own 75. Megatron-Core's four:
    85 + 4 x 256 + 1 = 1,110 granules (2,220 MiB, against 1,722 MiB with cuMem)."""
    deepspeed = record("deepspeed", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1.json")
    _, communication = _outside(_with(deepspeed, nccl_cumem=False))
    assert communication == (85 + 2 * 256 + 1) * GRANULARITY == 1196 * MiB
    deltas, _ = _by_stage(_mechanism("deepspeed", "0"))
    assert communication == deltas["init_distributed"] + 256 * GRANULARITY
    megatron = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    assert _outside(_with(megatron, nccl_cumem=False))[1] == (85 + 4 * 256 + 1) * GRANULARITY == 2220 * MiB
    # set true, or left to torch 2.13's default: the cuMem world the records measured
    assert _outside(_with(megatron, nccl_cumem=True))[1] == _outside(_with(megatron))[1] == \
        (85 + 4 * 194) * GRANULARITY == 1722 * MiB
    comm = one_rank_communicator((2, 13), False)
    assert (comm.allocations, comm.bytes) == (194 + 1, 512 * MiB)


def test_nccl_cumem_off_in_megatron_groups_of_size_one():
    """TP 2 x DP 1 with NCCL_CUMEM_ENABLE=0 under torch 2.13: the DP x CP group of one rank is 512 MiB (the shared
    buffer at 64 channels x 512 KiB) and the process's page 2 MiB, beside the world's, TP's and the distributed
    optimizer instance's 0.5 GiB each and NCCL's kernels: 170 + 1,536 + 514 = 2,220 MiB, against 2,094 with cuMem."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    config = _with(run, nccl_cumem=False, global_batch_size=1)
    config["parallel"].update(tp=2, dp=1)
    c = estimate_config(config).stages[0].component("communication")
    assert c.bytes == NCCL_KERNELS + 3 * 512 * MiB + 512 * MiB + 2 * MiB == 2220 * MiB
    assert c.formula.endswith("1 of one rank x 512.0 MiB (DP x CP) + their small allocations' page 2 MiB = 2,220.0 MiB")


def test_nccl_cumem_on_before_torch_2_2_is_refused():
    """torch 2.0's NCCL 2.14.3 has no cuMem and 2.1's NCCL 2.18.1 with cuMem is not modelled: refused, named."""
    import pytest
    from estimator import ConfigError

    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    for version in ("2.0", "2.1"):
        with pytest.raises(ConfigError, match="training.nccl_cumem"):
            estimate_config(_with(run, torch_version=version, nccl_cumem=True))
    assert _outside(_with(run, torch_version="2.1", nccl_cumem=False))[1] == \
        _outside(_with(run, torch_version="2.1"))[1] == NCCL_KERNELS + 4 * 64 * MiB + SMALL_PAGE


def test_beside_an_sglang_engine_the_trainer_runs_without_cumem():
    """RL beside SGLang: SGLang sets NCCL_CUMEM_ENABLE=0 in its processes and the trainers that sync weights to it
    set the same (slime actor_group.py, verl's sglang_rollout.py): left unset, the trainer's Megatron world of one
    rank is the no-cuMem one, 85 + 4 x 256 + 1 granules; beside vLLM, torch's default (cuMem: 85 + 4 x 194);
    nccl_cumem set wins over either."""
    from estimator.spec.nccl import uses_cumem

    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    rl = {"algorithm": "grpo", "rollout_batch_size": 4, "samples_per_prompt": 2, "max_prompt_len": 512,
          "max_response_len": 512, "engine": "sglang", "engine_memory_fraction": 0.5}
    no_cumem, with_cumem = (85 + 4 * 256 + 1) * GRANULARITY, (85 + 4 * 194) * GRANULARITY
    for engine, setting, expected in (("sglang", None, no_cumem), ("vllm", None, with_cumem),
                                      ("sglang", True, with_cumem), ("vllm", False, no_cumem)):
        config = _with(run, rl={**rl, "engine": engine}, nccl_cumem=setting, seq_len=1024, global_batch_size=1)
        result = estimate_config(config)
        assert result.stages[result.peak_stage].component("communication").bytes == expected, (engine, setting)
    assert uses_cumem((2, 13), None, "sglang") is False and uses_cumem((2, 13), None, "vllm") is True
    assert uses_cumem((2, 1), None, "vllm") is False and uses_cumem((2, 13), True, "sglang") is True


def test_each_torch_release_names_the_nccl_its_wheels_pin():
    """TORCH_NCCL, read from each torch-2.X.0 cp311 manylinux x86_64 wheel's METADATA on PyPI (Requires-Dist
    nvidia-nccl-cu11/-cu12/-cu13 == ...): every torch release a user can name has one, and cuMem is on by default
    exactly from torch 2.2 (NCCL 2.19.3, the first pinned at or after v2.19.1-1)."""
    from estimator.spec.nccl import NCCL_CUMEM_FROM, TORCH_NCCL, nccl_release
    from estimator.spec.versions import TORCH_VERSIONS, torch_release

    assert {torch_release(v) for v in TORCH_VERSIONS} == set(TORCH_NCCL)
    assert [".".join(map(str, nccl_release(torch_release(v)))) for v in TORCH_VERSIONS] == [
        "2.14.3", "2.18.1", "2.19.3", "2.20.5", "2.20.5", "2.21.5", "2.21.5", "2.26.2", "2.27.3", "2.27.5", "2.27.5",
        "2.28.9", "2.29.7", "2.29.7"]
    assert [v for v in TORCH_VERSIONS if cumem(torch_release(v))][0] == "2.2"
    assert nccl_release((2, 1)) < NCCL_CUMEM_FROM <= nccl_release((2, 2))


def test_the_one_rank_rule_of_each_pinned_nccl_by_hand():
    """From NCCL's source at each tag (spec/nccl.py, "By release"): channels = 2 x MAXCHANNELS/2 (32 through 2.24, 64
    from 2.25.1), initChannel's device allocations a channel (3 from 2.18.1), devCommSetup's (2 from 2.23.4, with
    rankToLocalRank), runtime connect (from 2.22.3) and the chunk at one GPU (128 KiB while ncclTopoPathAllNVLink is
    false for one GPU, 512 KiB from 2.25.1)."""
    from estimator.spec.nccl import one_rank_rule

    KiB = 1024
    expected = {
        (2, 14, 3): (32, 2, 1, False, 128 * KiB), (2, 18, 1): (32, 3, 1, False, 128 * KiB),
        (2, 19, 3): (32, 3, 1, False, 128 * KiB), (2, 20, 5): (32, 3, 1, False, 128 * KiB),
        (2, 21, 5): (32, 3, 1, False, 128 * KiB), (2, 26, 2): (64, 3, 2, True, 512 * KiB),
        (2, 27, 3): (64, 3, 2, True, 512 * KiB), (2, 27, 5): (64, 3, 2, True, 512 * KiB),
        (2, 28, 9): (64, 3, 2, True, 512 * KiB), (2, 29, 7): (64, 3, 2, True, 512 * KiB)}
    for nccl, (channels, per_channel, dev_comm, runtime, chunk) in expected.items():
        rule = one_rank_rule(nccl)
        assert (rule.channels, rule.per_channel, rule.dev_comm, rule.runtime_connect, rule.chunk) == \
            (channels, per_channel, dev_comm, runtime, chunk), nccl
    assert one_rank_rule((2, 20, 5)).small == 1 + 3 * 32 == 97
    assert one_rank_rule((2, 20, 5)).shared_buffer == 32 * 16 * 128 * KiB == 64 * MiB == 32 * GRANULARITY
    assert one_rank_rule((2, 27, 3)).small == COMMUNICATOR
    assert one_rank_rule((2, 27, 3)).shared_buffer == 64 * 16 * 512 * KiB == 512 * MiB


def test_nccl_2_19_to_2_21_connect_the_shared_buffer_at_initialisation_with_cumem():
    """torch 2.2-2.6 (NCCL 2.19.3, 2.20.5, 2.21.5): no runtime connect, so with cuMem (their default) a communicator
    of one rank holds its 1 + 3 x 32 small allocations, a granule each, and the net proxy's shared buffer, one
    cuMemCreate of 32 x 16 x 128 KiB = 64 MiB (32 granules): 97 + 32 = 129 granules = 258 MiB, 98 allocations.
    With NCCL_CUMEM_ENABLE=0: the 64 MiB buffer by cudaMalloc, its 97 small allocations in the shared page (as
    torch 2.1's NCCL 2.18.1). torch 2.7-2.13 (NCCL 2.26.2-2.29.7): NCCL 2.28.9's, byte for byte."""
    for release in ((2, 2), (2, 3), (2, 4), (2, 5), (2, 6)):
        comm = one_rank_communicator(release)
        assert (comm.allocations, comm.bytes) == (1 + 3 * 32 + 1, (97 + 32) * GRANULARITY) == (98, 258 * MiB)
        assert comm.formula.endswith("connected at initialisation) = 258 MiB")
        off = one_rank_communicator(release, False)
        assert (off.allocations, off.bytes, off.formula) == (98, 64 * MiB, one_rank_communicator((2, 1)).formula
                                                            .replace("NCCL before 2.19: no cuMem",
                                                                     "NCCL_CUMEM_ENABLE=0"))
    for release in ((2, 7), (2, 8), (2, 9), (2, 10), (2, 12), (2, 13)):
        for setting in (None, True, False):
            assert one_rank_communicator(release, setting) == one_rank_communicator((2, 11), setting)


def _world(run: dict, version: str, cumem_setting: bool | None) -> int:
    return _outside(_with(run, torch_version=version, nccl_cumem=cumem_setting))[1]


def test_torch_2_4_and_2_6_worlds_of_one_rank_by_hand():
    """torch 2.4 (NCCL 2.20.5) and 2.6 (NCCL 2.21.5) at world size 1, NCCL's kernels 85 granules (2.28.9's, as
    measured) and each communicator 129 granules with cuMem: DeepSpeed's two 85 + 2 x 129 = 343 granules (686 MiB),
    Megatron-Core's four 85 + 4 x 129 = 601 (1,202 MiB), against 946 and 1,722 MiB under NCCL 2.28.9. With
    NCCL_CUMEM_ENABLE=0, each communicator's 64 MiB buffer and one page: DeepSpeed 170 + 2 x 64 + 2 = 300 MiB,
    Megatron-Core 170 + 4 x 64 + 2 = 428 MiB."""
    deepspeed = record("deepspeed", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1.json")
    megatron = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    for version in ("2.4", "2.6"):
        for setting in (None, True):
            assert _world(deepspeed, version, setting) == (85 + 2 * 129) * GRANULARITY == 686 * MiB
            assert _world(megatron, version, setting) == (85 + 4 * 129) * GRANULARITY == 1202 * MiB
        assert _world(deepspeed, version, False) == 170 * MiB + 2 * 64 * MiB + 2 * MiB == 300 * MiB
        assert _world(megatron, version, False) == 170 * MiB + 4 * 64 * MiB + 2 * MiB == 428 * MiB


def test_torch_2_8_world_of_one_rank_is_the_measured_rule():
    """torch 2.8 (NCCL 2.27.3): MAXCHANNELS 64, runtime connect, devCommSetup's 2: the H200's NCCL 2.28.9 worlds,
    DeepSpeed 85 + 2 x 194 = 473 granules (946 MiB) and Megatron-Core 85 + 4 x 194 = 861 (1,722 MiB); without cuMem
    85 + 2 x 256 + 1 = 598 (1,196 MiB) and 85 + 4 x 256 + 1 = 1,110 (2,220 MiB); its sources name the
    nccl-mechanism record there, not under torch 2.4 (NCCL 2.20.5, whose buffer is 64 MiB)."""
    deepspeed = record("deepspeed", "deepspeed-qwen-1.8b-zero3-foreach-adamw-recompute-s256-b1.json")
    megatron = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    assert _world(deepspeed, "2.8", None) == (85 + 2 * 194) * GRANULARITY == 946 * MiB
    assert _world(megatron, "2.8", None) == (85 + 4 * 194) * GRANULARITY == 1722 * MiB
    assert _world(deepspeed, "2.8", False) == (85 + 2 * 256 + 1) * GRANULARITY == 1196 * MiB
    assert _world(megatron, "2.8", False) == (85 + 4 * 256 + 1) * GRANULARITY == 2220 * MiB
    from estimator.memory.stage_shared import one_rank_world
    from estimator.spec.training import Training

    for version, named in (("2.8", True), ("2.4", False)):
        world = one_rank_world(Training(framework="deepspeed", torch_version=version, nccl_cumem=False))
        assert all(("536,870,912 B" in p.source) == named for p in world.parts if "communicator of one" in p.label)


def test_megatron_group_of_size_one_under_torch_2_4():
    """TP 2 x DP 1 under torch 2.4: the DP x CP group of one rank is NCCL 2.20.5's 258 MiB with cuMem, beside the
    world's, TP's and the distributed optimizer instance's 0.5 GiB each and NCCL's kernels (170 MiB): 1,964 MiB; with
    NCCL_CUMEM_ENABLE=0 its 64 MiB buffer and the process's page: 1,772 MiB."""
    run = record("megatron", "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers.json")
    for setting, expected in ((None, NCCL_KERNELS + 3 * 512 * MiB + 258 * MiB),
                              (False, NCCL_KERNELS + 3 * 512 * MiB + 64 * MiB + 2 * MiB)):
        config = _with(run, torch_version="2.4", nccl_cumem=setting, global_batch_size=1)
        config["parallel"].update(tp=2, dp=1)
        c = estimate_config(config).stages[0].component("communication")
        assert c.bytes == expected, setting
