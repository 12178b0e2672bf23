"""The real-GPU experiments (validation/gpu/graphs.py, context.py, experiments.py) without a GPU: their code
run against the CPU stand-in (validation/gpu/devices.py FakeDevice), through the same command line, the
same processes and the same records step a session lent a GPU runs, so that a slip costs CI time and not
device time.

The stand-in charges 64 KiB per instantiated graph and 8 KiB per kernel node (an op run while capturing):
the experiment's deltas and its least-squares fit must give exactly those back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from validation.gpu import experiments  # noqa: E402
from validation.gpu.__main__ import main  # noqa: E402
from validation.gpu.context import MODES, STAGES, stage_deltas  # noqa: E402
from validation.gpu.devices import FakeDevice, driver_api_version  # noqa: E402
from validation.gpu.graphs import ALL_KINDS, GRID, KINDS, NODE_GRID, GraphRun, fit, measure_graphs  # noqa: E402

KiB = 1024
PER_GRAPH, PER_NODE = FakeDevice().per_graph, FakeDevice().per_node
TINY_GRID = (GraphRun("elementwise", 2, 8), GraphRun("mixed", 5, 4))


def test_the_stand_in_charges_what_this_test_says():
    assert (PER_GRAPH, PER_NODE) == (64 * KiB, 8 * KiB)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("kernels", [1, 3, 48])
def test_a_graph_of_k_kernels_is_k_ops(kind, kernels):
    """Each chain link is one op (one kernel launch on the GPU, where the driver counts the nodes): a graph's
    memory is 64 KiB + k x 8 KiB, at every checkpoint."""
    measured = measure_graphs(GraphRun(kind, kernels, 4), "cpu", 60)
    assert measured["kernel_nodes_per_graph"] == measured["nodes_per_graph"] == kernels
    assert measured["probe"]["used_after_instantiate"] == PER_GRAPH + kernels * PER_NODE
    assert measured["probe"]["used_after_instantiations"] == PER_GRAPH + kernels * PER_NODE  # replaced, not added
    assert len(measured["probe"]["instantiate_seconds"]) == 5
    assert measured["probe"]["used_after_capture"] == measured["probe"]["used_after_reset"] == 0
    assert [p["graphs"] for p in measured["points"]] == [1, 2, 4] and measured["stopped"] == "done"
    for point in measured["points"]:
        assert point["driver_bytes"] == point["graphs"] * (PER_GRAPH + kernels * PER_NODE)
        assert point["kernel_nodes"] == point["graphs"] * kernels and point["pool_bytes"] == 0
    assert measured["after_replay"]["driver_bytes"] == 4 * (PER_GRAPH + kernels * PER_NODE)
    assert measured["after_reset"]["driver_bytes"] == 0


def test_the_fit_separates_per_graph_and_per_node_bytes():
    points = [p for run in TINY_GRID for p in measure_graphs(run, "cpu", 60)["points"]]
    found = fit(points)
    assert found["per_graph_bytes"] == pytest.approx(PER_GRAPH, abs=1e-6)
    assert found["per_node_bytes"] == pytest.approx(PER_NODE, abs=1e-6)
    assert found["points"] == 4 + 3  # 1, 2, 4, 8 graphs and 1, 2, 4
    # one node count per graph cannot separate the two
    assert fit(measure_graphs(GraphRun("gemm", 2, 4), "cpu", 60)["points"]) is None


def test_a_sub_run_stops_at_its_deadline_with_what_it_measured():
    measured = measure_graphs(GraphRun("elementwise", 2, 2048), "cpu", 0)
    assert measured["stopped"] == "deadline"
    assert measured["points"] == [measured["points"][0]] and measured["points"][0]["graphs"] == 1


def test_the_default_grid():
    """What validation/README.md's time estimate counts: 10 sub-runs, 17,024 graphs, 700,416 kernel nodes, no
    sub-run over 131,072 nodes (1.3 GB at cccl's 10 KB a node, 8.5 GB at the forum's 65 KB)."""
    assert len(GRID) == 10
    assert sum(r.max_graphs for r in GRID) == 8 * 2048 + 512 + 128 == 17_024
    nodes = [r.max_graphs * r.kernels for r in GRID]
    assert sum(nodes) == 2048 * (1 + 64 + 16 + 16 + 4 + 48 + 1 + 64) + 512 * 256 + 128 * 1024 == 700_416
    assert max(nodes) == 131_072
    elementwise = sorted(r.kernels for r in GRID if r.kind == "elementwise")
    assert elementwise == [1, 4, 16, 64, 256, 1024] and {r.kind for r in GRID} == set(KINDS)


def test_the_node_grid():
    """cuda-graph-nodes: each vLLM-shaped kind at 16 and 64 nodes a graph, 2,048 graphs each (12,288 graphs,
    491,520 kernel nodes: at the H200's GEMM cost of 3.5 KiB a node 1.7 GB), its own fit per kind."""
    assert [(r.kind, r.kernels, r.max_graphs) for r in NODE_GRID] == [
        (k, n, 2048) for k in ("gemm_wide", "sdpa", "triton") for n in (16, 64)]
    assert sum(r.max_graphs * r.kernels for r in NODE_GRID) == 3 * 2048 * (16 + 64) == 491_520
    assert experiments.EXPERIMENTS["cuda-graph-nodes"].runs == tuple(
        experiments.SubRun((r.kind, str(r.kernels), "2048")) for r in NODE_GRID)


def test_a_node_kind_fits_its_own_costs_on_the_cpu():
    """Two node counts of one kind separate its per-graph and per-node bytes (what graph_fits does per kind)."""
    points = [p for n in (2, 5) for p in experiments.graph_points(
        [{"run": {"kind": "sdpa", "kernels": n}, "measured": measure_graphs(GraphRun("sdpa", n, 4), "cpu", 60)}])]
    found = experiments.graph_fits(points)["sdpa"]
    assert found["per_graph_bytes"] == pytest.approx(PER_GRAPH, abs=1e-6)
    assert found["per_node_bytes"] == pytest.approx(PER_NODE, abs=1e-6)


def test_stage_deltas():
    rows = [{"stage": "context", "used_bytes": 500, "reserved_bytes": 0},
            {"stage": "allocations", "used_bytes": 520, "reserved_bytes": 20},
            {"stage": "gemm_bf16", "used_bytes": 600, "reserved_bytes": 52}]
    assert stage_deltas(rows) == [
        {"stage": "context", "used_bytes": 500, "reserved_bytes": 0, "outside_allocator_bytes": 500},
        {"stage": "allocations", "used_bytes": 20, "reserved_bytes": 20, "outside_allocator_bytes": 0},
        {"stage": "gemm_bf16", "used_bytes": 80, "reserved_bytes": 32, "outside_allocator_bytes": 48}]


def test_the_run_command_and_the_records_on_the_cpu(tmp_path, monkeypatch):
    """`run --device cpu --case cuda-graphs --case cuda-context` (with a tiny grid and one process per
    module-loading mode): each sub-run a process of its own, its environment set, one line each, no
    workspace probe; then `records`' writer makes one record per experiment."""
    monkeypatch.setitem(experiments.EXPERIMENTS, "cuda-graphs", experiments.graph_experiment(TINY_GRID))
    monkeypatch.setitem(experiments.EXPERIMENTS, "cuda-context", experiments.context_experiment(repeats=1))
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--budget", "600", "--device", "cpu",
                 "--case", "cuda-graphs", "--case", "cuda-context"]) == 0
    lines = [json.loads(t) for t in (out / "runs.jsonl").read_text().splitlines()]
    assert [line["experiment"] for line in lines] == ["cuda-graphs"] * 2 + ["cuda-context"] * 3
    assert [line["measured"]["module_loading_env"] for line in lines[2:]] == list(MODES) == ["LAZY", "EAGER", None]
    paths = experiments.write_experiment_records(lines, tmp_path / "records")
    assert sorted(p.name for p in paths) == ["cuda-context-cpu.json", "cuda-graphs-cpu.json"]
    graphs = json.loads((tmp_path / "records" / "cuda-graphs-cpu.json").read_text())
    assert graphs["fit"]["all"]["per_graph_bytes"] == pytest.approx(PER_GRAPH, abs=1e-6)
    assert graphs["fit"]["all"]["per_node_bytes"] == pytest.approx(PER_NODE, abs=1e-6)
    assert graphs["fit"]["elementwise"] is None and graphs["fit"]["mixed"] is None
    assert [(p["kind"], p["graphs"]) for p in graphs["points"]] == [("elementwise", g) for g in (1, 2, 4, 8)] + [
        ("mixed", g) for g in (1, 2, 4)]
    context = json.loads((tmp_path / "records" / "cuda-context-cpu.json").read_text())
    for run in context["runs"]:
        assert [row["stage"] for row in run["measured"]["stages"]] == list(STAGES)
        assert run["measured"]["deltas"][0]["used_bytes"] == FakeDevice().context
    assert context["command"].startswith("python -m validation.gpu run --out DIR --case cuda-context")
    for record in (graphs, context):  # what test_a_recorded_experiment_is_what_its_lines_say does to a GPU record
        again = [{"experiment": record["experiment"], "versions": record["versions"], **run} for run in record["runs"]]
        assert experiments.experiment_record(record["experiment"], again) == record


def test_a_spent_budget_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(experiments.EXPERIMENTS, "cuda-graphs", experiments.graph_experiment(TINY_GRID))
    assert main(["run", "--out", str(tmp_path), "--budget", "0", "--device", "cpu", "--case", "cuda-graphs"]) == 0
    assert (tmp_path / "runs.jsonl").read_text() == ""
    assert (tmp_path / "log.txt").read_text().count("not run") == 2


def test_a_misspelt_case_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path), "--case", "cuda-grahps"]) == 2
    assert "--case cuda-grahps: not a case or experiment" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "--device cpu runs experiments only" in capsys.readouterr().err
    assert not (tmp_path / "runs.jsonl").exists()


def test_without_a_driver_its_version_is_none():
    """CI has no libcuda.so.1: the driver API's answer is None, not an error (on the GPU it is e.g. 13000)."""
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("a CUDA driver is installed here")
    assert driver_api_version() is None


def test_the_stand_in_has_every_method_the_real_device_has():
    """The experiments call only what both devices define, so the CPU run exercises every call they make."""
    from validation.gpu.devices import CudaDevice, FakeGraph

    def public(cls):
        return {name for name in dir(cls) if not name.startswith("_")}

    assert public(CudaDevice) == public(FakeDevice) - {"per_graph", "per_node", "context", "total", "driver"}
    import torch

    assert {"capture_begin", "capture_end", "instantiate", "replay", "reset"} <= public(FakeGraph) & public(
        torch.cuda.CUDAGraph)


def test_the_torch_calls_of_the_real_device_exist():
    """What CudaDevice calls, in the installed torch (a CPU build defines them too): a misspelt name fails
    here rather than on the GPU. keep_graph, instantiate and raw_cuda_graph are torch >= 2.8's
    (pytorch/pytorch#155164); the GPU machine ran 2.11."""
    import inspect

    import torch

    for name in ("synchronize", "mem_get_info", "memory_reserved", "memory_allocated", "Stream", "stream",
                 "current_stream", "graph_pool_handle", "CUDAGraph", "init"):
        assert hasattr(torch.cuda, name), name
    for name in ("raw_cuda_graph", "instantiate", "replay", "reset", "capture_end"):
        assert hasattr(torch.cuda.CUDAGraph, name), name
    assert "pool" in inspect.signature(torch.cuda.CUDAGraph.capture_begin).parameters
    assert "keep_graph" in inspect.signature(torch.cuda.CUDAGraph.__new__).parameters
    assert hasattr(torch.cuda.Stream, "wait_stream")


RECORDS = sorted(experiments.EXPERIMENT_RECORDS.glob("*.json"))


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_recorded_experiment_is_what_its_lines_say(path):
    """A record `records` wrote from a GPU run (none yet: the next session lent a GPU runs the command in
    validation/README.md): made again from its own runs, it is the same; its driver is named; a graph point's
    driver bytes are its used bytes less the pool's."""
    record = json.loads(path.read_text())
    lines = [{"experiment": record["experiment"], "versions": record["versions"], **run} for run in record["runs"]]
    assert experiments.experiment_record(record["experiment"], lines) == record
    assert record["versions"]["driver"]
    if record["experiment"] != "nccl-world":  # its first record (2026-11-27) predates nccl_world.py naming it
        assert record["versions"]["cuda_driver_api"]
    for point in record.get("points", []):
        assert point["driver_bytes"] == point["used_bytes"] - point["pool_bytes"]


def test_the_nccl_mechanism_experiment_on_the_cpu(tmp_path):
    """`nccl-mechanism` (validation/gpu/nccl_mechanism.py): three sub-runs, nccl-world's stages as NCCL defaults and
    with NCCL_CUMEM_ENABLE=0, and a tiny Megatron-Core step. On the CPU: the DeepSpeed stages once (DeepSpeed's own
    environment; the two DeepSpeed sub-runs differ only in NCCL's environment, which gloo ignores) and the Megatron
    step, whose collectives are recorded by group: the world's all_gather_object in the build (get_megatron_optimizer),
    then each step the TP group's three loss all_reduces and the DP x CP group's reduce_scatter and all_gather
    (wrapped before Megatron-Core binds them at import); then `records` makes one record of the three lines."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from validation.gpu.nccl_mechanism import DEEPSPEED_STAGES, MEGATRON_STAGES

    nccl = experiments.EXPERIMENTS["nccl-mechanism"]
    assert [(r.args, dict(r.env)) for r in nccl.runs] == [
        (("deepspeed",), {"NCCL_CUMEM_ENABLE": None}), (("deepspeed",), {"NCCL_CUMEM_ENABLE": "0"}),
        (("megatron",), {"NCCL_CUMEM_ENABLE": None})]
    root = Path(__file__).resolve().parents[1]
    deepspeed_python = root / ".venv" / "deepspeed" / "bin" / "python"
    if not deepspeed_python.exists():
        pytest.skip("no DeepSpeed environment (tests/test_gpu_framework_steps.py)")
    env = dict(os.environ, PYTHONPATH=str(root))
    lines = []
    for python, which, cumem in ((deepspeed_python, "deepspeed", None), (deepspeed_python, "deepspeed", "0"),
                                 (sys.executable, "megatron", None)):
        run_env = {k: v for k, v in env.items() if k != "NCCL_CUMEM_ENABLE"} | ({"NCCL_CUMEM_ENABLE": cumem}
                                                                                if cumem else {})
        if which == "deepspeed" and cumem:  # gloo: the same stages again tell nothing on the CPU
            lines.append(json.loads(json.dumps(lines[0])) | {"run": {"framework": "deepspeed",
                                                                     "nccl_cumem_enable": "0"}})
            continue
        done = subprocess.run([str(python), "-m", "validation.gpu.nccl_mechanism", which, "cpu"], cwd=root, env=run_env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        lines.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [row["stage"] for row in lines[0]["measured"]["stages"]] == list(DEEPSPEED_STAGES)
    megatron = lines[2]["measured"]
    assert [row["stage"] for row in megatron["stages"]] == list(MEGATRON_STAGES)
    assert [(g["stage"], g["group"]) for g in megatron["groups_by_stage"]] == [
        ("build", "WORLD"), ("step1", "DATA_PARALLEL_GROUP_WITH_CP"), ("step1", "TENSOR_MODEL_PARALLEL_GROUP"),
        ("step2", "DATA_PARALLEL_GROUP_WITH_CP"), ("step2", "TENSOR_MODEL_PARALLEL_GROUP")]
    where = {(c["op"], c["where"]) for c in megatron["collectives"] if c["stage"] == "step1"}
    assert where == {("all_reduce", f"megatron/core/tensor_parallel/cross_entropy.py:{n}") for n in (130, 148, 154)} | {
        ("reduce_scatter_tensor", "megatron/core/distributed/param_and_grad_buffer.py:443"),
        ("all_gather_into_tensor", "megatron/core/distributed/param_and_grad_buffer.py:285")}
    for line in lines[2:]:  # the versions a record's lines must share (experiment_record) are torch's and the GPU's
        line["versions"] = lines[0]["versions"] | {k: v for k, v in line["versions"].items() if k == "megatron_core"}
    record = experiments.experiment_record("nccl-mechanism", lines)
    assert [r["run"]["framework"] for r in record["runs"]] == ["deepspeed", "deepspeed", "megatron"]


def test_the_nccl_log_is_cut_stage_by_stage(monkeypatch):
    """NCCL writes its debug file line by line (NCCL debug.cc: setlinebuf): each cut summarises what came since the
    last one, its communicators, device allocations and the lines that start or split a communicator."""
    import os

    from validation.gpu.nccl_mechanism import NcclLog

    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):  # what NcclLog sets is removed on exit
        monkeypatch.delenv(name, raising=False)
    log = NcclLog()
    assert os.environ["NCCL_DEBUG_SUBSYS"] == "INIT,ALLOC" and os.environ["NCCL_DEBUG_FILE"].endswith("nccl.%p.log")
    path = os.path.join(log.folder, "nccl.1.log")
    start = "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init START\n"
    alloc = "h:1:1 [0] NCCL INFO channel.cc:42 Cuda Alloc Size 608 pointer 0x7f0000200000\n"
    done = "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init COMPLETE\n"
    with open(path, "w") as f:
        f.write(start + alloc + alloc + done)
    assert log.cut() == {"communicators": 1, "device_allocs": 2, "device_alloc_bytes": 1216, "init_lines": [
        "ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init START",
        "ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init COMPLETE"]}
    assert log.cut() == {"communicators": 0, "device_allocs": 0, "device_alloc_bytes": 0, "init_lines": []}
    with open(path, "a") as f:
        f.write(alloc)
    assert log.cut()["device_allocs"] == 1


def test_the_nccl_runtime_connect_experiment_is_nccl_mechanismS_deepspeed_run_without_runtime_connect(monkeypatch,
                                                                                                     capsys):
    """`nccl-runtime-connect`: one sub-run, nccl_mechanism.py's DeepSpeed stages with cuMem left to NCCL's default
    and NCCL_RUNTIME_CONNECT=0 (what NCCL 2.19-2.21, torch 2.2-2.6, do at initialisation: spec/nccl.py); its line
    names that experiment and the setting, so `records` writes it apart from nccl-mechanism's (whose lines keep
    their two-key run)."""
    import sys
    import types

    from validation.gpu import measure, nccl_mechanism

    nccl = experiments.EXPERIMENTS["nccl-runtime-connect"]
    assert (nccl.module, nccl.takes_deadline) == ("nccl_mechanism", False)
    assert [(r.args, dict(r.env)) for r in nccl.runs] == [
        (("deepspeed",), {"NCCL_CUMEM_ENABLE": None, "NCCL_RUNTIME_CONNECT": "0"})]
    monkeypatch.setattr(nccl_mechanism, "measure_deepspeed_stages", lambda device: {"stages": []})
    monkeypatch.setattr(measure, "versions", lambda device: {"torch": "t"})
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(__version__="d"))
    lines = []
    for env in ({"NCCL_RUNTIME_CONNECT": "0"}, {}):
        monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
        monkeypatch.delenv("NCCL_RUNTIME_CONNECT", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert nccl_mechanism.main(["deepspeed", "cpu"]) == 0
        lines.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert [(line["experiment"], line["run"]) for line in lines] == [
        ("nccl-runtime-connect", {"framework": "deepspeed", "nccl_cumem_enable": None, "nccl_runtime_connect": "0"}),
        ("nccl-mechanism", {"framework": "deepspeed", "nccl_cumem_enable": None})]
