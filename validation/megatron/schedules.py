"""Megatron-Core's own interleaved-schedule code, run for every layout the estimator's in-flight
counts cover (estimator/memory/pipeline.py `interleaved_in_flight`).

`schedule_code(version)` compiles, from a release's own `megatron/core/pipeline_parallel/
schedules.py`, the two functions that decide a rank's interleaved order: `get_pp_rank_microbatches`
(total, all-in-warm-up, warm-up and remaining chunk-forwards of this rank) and `get_schedule_table`
(the (micro-batch, chunk) order). Only those two definitions are taken from the file (`ast`), as the
release wrote them, and run in a namespace whose `parallel_state` answers the pipeline size, rank
and virtual size asked for: importing the module would bring in CUDA graphs, MoE and communicator
code (0.19.0's for Python 3.12), none of which these functions read. Where each release's source
comes from (validation/install_frameworks.sh):

- 0.16: the installed megatron-core 0.16.1's schedules.py;
- 0.19: core_v0.19.0 (commit 5be96267) from a git snapshot of NVIDIA/Megatron-LM (the `fetch`
  tool's /work/.mirror/NVIDIA+Megatron-LM/repo, or $MEGATRON_LM_GIT), read with `git show`.

A rank's peak: the warm-up runs W chunk-forwards; the steady state (forward_backward_pipelining_
with_interleaving, "for k in range(num_microbatches_remaining)") runs forward W + k, then backward
k, so W + 1 chunks are alive at its top; when every chunk is in the warm-up (are_all_microbatches_
in_warmup) all of them are, the backwards coming after. The layouts are those Megatron accepts: its
group checks (p <= g <= m; m mod g = 0 or >= p) are inline in that function, mirrored by
`activations.interleaved_microbatches_error`.

    python -m validation.megatron schedules   # writes tests/data/measured/schedules/megatron-interleaved.json
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import typing
from pathlib import Path

from estimator.spec.versions import RELEASES

RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "schedules" / "megatron-interleaved.json"
SCHEDULES_PATH = "megatron/core/pipeline_parallel/schedules.py"
FUNCTIONS = ("get_pp_rank_microbatches", "get_schedule_table")
SNAPSHOT = Path(os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
# the layouts checked: every PP up to 16, VPP 2 to 8, micro-batches p to 4p, every group Megatron accepts
MAX_PP, VPPS, MAX_M_OVER_P = 16, range(2, 9), 4
COMMAND = "python -m validation.megatron schedules"


def release_source(version: str) -> str:
    """The text of schedules.py at the release; raises FileNotFoundError when it is not here."""
    release = next(r for r in RELEASES["megatron"] if r.version == version)
    if version == "0.16":
        import importlib.util
        import importlib.metadata
        spec = importlib.util.find_spec("megatron.core")
        if spec is None or importlib.metadata.version("megatron-core") != "0.16.1":
            raise FileNotFoundError("megatron-core 0.16.1 is not installed (validation/install_frameworks.sh)")
        return (Path(spec.origin).parent / "pipeline_parallel" / "schedules.py").read_text()
    if not SNAPSHOT.is_dir():
        raise FileNotFoundError(f"no git snapshot of NVIDIA/Megatron-LM at {SNAPSHOT} (set MEGATRON_LM_GIT)")
    done = subprocess.run(["git", "--git-dir", str(SNAPSHOT), "show", f"{release.commit}:{SCHEDULES_PATH}"],
                          capture_output=True, text=True)
    if done.returncode:
        raise FileNotFoundError(f"{release.cited} is not in the snapshot at {SNAPSHOT}: {done.stderr.strip()}")
    return done.stdout


class _PipelineState:
    """What the two functions ask megatron.core.parallel_state (a layout, not a process group)."""

    def __init__(self):
        self.size, self.rank, self.virtual = 1, 0, None

    def get_pipeline_model_parallel_world_size(self):
        return self.size

    def get_pipeline_model_parallel_rank(self):
        return self.rank

    def get_virtual_pipeline_model_parallel_world_size(self):
        return self.virtual


class ScheduleCode:
    """A release's get_pp_rank_microbatches and get_schedule_table, for one layout at a time."""

    def __init__(self, source: str):
        tree = ast.parse(source)
        defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS]
        if sorted(d.name for d in defs) != sorted(FUNCTIONS):
            raise LookupError(f"schedules.py does not define {FUNCTIONS}")
        self.state = _PipelineState()
        # the names their signatures and bodies read; anything else raises NameError when called
        namespace = {"parallel_state": self.state, "Optional": typing.Optional, "P2PCommunicator": object}
        exec(compile(ast.Module(body=defs, type_ignores=[]), SCHEDULES_PATH, "exec"), namespace)
        self.get_pp_rank_microbatches = namespace["get_pp_rank_microbatches"]
        self.get_schedule_table = namespace["get_schedule_table"]

    def peak_chunks(self, p: int, v: int, m: int, group: int) -> list[int]:
        """The chunk-forwards alive at each rank's peak in a training step (see the module docstring)."""
        table = self.get_schedule_table(m, v, group)
        assert sorted(table) == [(i, c) for i in range(m) for c in range(v)]  # each chunk of each micro-batch once
        out = []
        for rank in range(p):
            self.state.size, self.state.rank, self.state.virtual = p, rank, v
            total, all_warmup, warmup, remaining = self.get_pp_rank_microbatches(m, v, group)
            assert total == len(table) and warmup + remaining == total
            out.append(total if all_warmup else warmup + 1)
        return out


def schedule_code(version: str) -> ScheduleCode:
    return ScheduleCode(release_source(version))


def layouts():
    """(p, v, m, g) of every layout checked, in a fixed order."""
    from estimator.memory.pipeline import interleaved_microbatches_error
    for p in range(2, MAX_PP + 1):
        for v in VPPS:
            for m in range(p, MAX_M_OVER_P * p + 1):
                for g in range(p, m + 1):
                    if not interleaved_microbatches_error(p, m, g):
                        yield p, v, m, g


def peaks(code: ScheduleCode) -> list[list[int]]:
    """[p, v, m, g, peak of rank 0, ..., peak of rank p - 1] for every layout."""
    return [[p, v, m, g, *code.peak_chunks(p, v, m, g)] for p, v, m, g in layouts()]


def digest(rows: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


SHOWN_PP = 4  # the record lists the rows up to this PP in full; the rest by their SHA-256


def write() -> int:
    """Run each release's code over every layout and record its peaks (all rows' SHA-256, and the
    rows up to PP 4 in full)."""
    out = {"what": "Megatron-Core's interleaved schedule, run from each release's own schedules.py "
                   "(validation/megatron/schedules.py): per layout [pp, vpp, micro-batches, group, chunk-forwards "
                   "alive at the peak of rank 0, ..., rank pp - 1]",
           "layouts": f"pp 2..{MAX_PP}, vpp {VPPS.start}..{VPPS.stop - 1}, micro-batches pp..{MAX_M_OVER_P} pp, "
                      "every group Megatron accepts", "command": COMMAND, "releases": {}}
    for release in RELEASES["megatron"]:
        rows = peaks(schedule_code(release.version))
        out["releases"][release.version] = {
            "release": release.cited, "source": SCHEDULES_PATH, "functions": list(FUNCTIONS), "rows": len(rows),
            "sha256": digest(rows), "rows_up_to_pp_4": [r for r in rows if r[0] <= SHOWN_PP]}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    shown = {}
    for version, release in out["releases"].items():  # one layout a line
        shown[version], release["rows_up_to_pp_4"] = release["rows_up_to_pp_4"], f"@{version}@"
    text = json.dumps(out, indent=1)
    for version, rows in shown.items():
        text = text.replace(f'"@{version}@"', "[\n   " + ",\n   ".join(json.dumps(r, separators=(",", ":"))
                                                                        for r in rows) + "\n   ]")
    RECORD.write_text(text + "\n")
    print(f"wrote {RECORD}")
    return 0
