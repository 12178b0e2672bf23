"""SimuMax's B200 release table as records (tests/data/measured/published/simumax_b200).

MooreThreads/SimuMax ``docs/b200/b200_release_v1.2_summary.json`` (release v1.2, 2026-05-11) holds, for
each run on 8 x B200 (NGC PyTorch 26.01: torch 2.10.0a0, TransformerEngine 2.11.0, CUDA 13.1;
Megatron-LM at 23e00ed0963c (core_v0.14.0), ``docs/b200/b200_real_repro_guide.md``), every rank's
``torch.cuda.max_memory_allocated()`` (``peak_memory_by_rank_mb``, MiB) after a few iterations, logged
on every rank by the guide's memory-logging patch. Rows that differ only in the micro-batch count
reuse one memory run (``memory_source_case``); a record is made per memory run.

The launch: the repository's launchers (``simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh``,
``run_pretrain_deepseekv2.sh``) run with the case's settings (model, layers, TP/PP/CP/EP, micro-batch
1, global batch = 1 x micro-batches x DP, sequence length) by bash in a scratch folder, the final
``eval``/run of the command replaced by nothing: the command they print is the record's.

Every case name ends in ``_cef``, which the published launchers do not spell out (they pass no
``--cross-entropy-loss-fusion``; the DeepSeek launcher has it commented out). The records read it as
cross-entropy fusion with TransformerEngine's Triton kernel (``--cross-entropy-loss-fusion
--cross-entropy-fusion-impl te``), added to the command and listed under ``assumed_flags``: the guide
(section 4) requires ``TRITON_PTXAS_PATH`` "for TE Triton fused CE in this environment" and the
launchers keep ``cuda.h`` discoverable "for TE Triton CE"; nothing else in these runs uses Triton.

Run: ``python -m validation.published_megatron simumax --git-dir /work/.mirror/MooreThreads+SimuMax/repo``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

REPOSITORY = "MooreThreads/SimuMax"
SUMMARY = "docs/b200/b200_release_v1.2_summary.json"
GUIDE = "docs/b200/b200_real_repro_guide.md"
LAUNCHERS = {"llama3": "simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh",
             "deepseek": "simu_tools/megatron_scripts/scripts/run_pretrain_deepseekv2.sh"}
MEGATRON_COMMIT = "23e00ed0963c35382dfe8a5a94fb3cda4d21e133"  # core_v0.14.0 (b200_real_repro_guide.md)
OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "published" / "simumax_b200"
WORLD = 8
CEF_FLAGS = ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]  # the "_cef" suffix (see above)
MiB = 1024**2
_CASE = re.compile(r"(?P<model>llama3_70b|llama3_405b|deepseekv2|deepseekv3)_")
_MODEL_TYPE = {"llama3_70b": "llama3_70b", "llama3_405b": "llama3_405b", "deepseekv2": "deepseek_v2",
               "deepseekv3": "deepseek_v3"}


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def sizes(case: str) -> dict[str, int]:
    """tp, pp, cp, ep, layers, seq and micro-batches from a case name such as
    llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef."""
    found = {k: int(v) for k, v in re.findall(r"(?:^|_)(tp|pp|cp|ep|dp|l|seq|mbc)(\d+)", case)}
    return {"tp": found.get("tp", 1), "pp": found.get("pp", 1), "cp": found.get("cp", 1), "ep": found.get("ep", 1),
            "dp": found["dp"], "layers": found["l"], "seq": found.get("seq", 4096), "mbc": found["mbc"]}


def launch_command(git_dir: Path, commit: str, case: str) -> str:
    """The torchrun command the case's launcher builds (run by bash, the launch itself removed)."""
    model = _CASE.match(case).group("model")
    n = sizes(case)
    family = "deepseek" if model.startswith("deepseek") else "llama3"
    script = git(git_dir, "show", f"{commit}:{LAUNCHERS[family]}")
    script = re.sub(r"^\s*(eval \$cmd|\$cmd)\s*$", "", script, flags=re.MULTILINE)
    env = {"MODEL_TYPE": _MODEL_TYPE[model], "TP_SIZE": n["tp"], "PP_SIZE": n["pp"], "CP_SIZE": n["cp"],
           "EP_SIZE": n["ep"], "MICRO_BATCH_SIZE": 1, "GLOBAL_BATCH_SIZE": n["mbc"] * n["dp"],
           "SEQ_LEN": n["seq"], "NUM_LAYERS": n["layers"], "NUM_LAYER": n["layers"], "DTYPE": "bf16",
           "TEST_TYPE": "test", "HOSTFILE": "hostfile"}
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "hostfile").write_text("127.0.0.1\n")
        (Path(scratch) / "run.sh").write_text(script)
        out = subprocess.run(["bash", "run.sh"], cwd=scratch, capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", **{k: str(v) for k, v in env.items()}}).stdout
    line = next(l for l in out.splitlines() if l.startswith("torchrun "))
    words = [("pretrain_gpt.py" if w.endswith(("pretrain_gpt.py", "pretrain_deepseekv2.py")) else w)
             for w in shlex.split(line)]
    if case.endswith("_cef"):
        words += CEF_FLAGS
    return " ".join(shlex.quote(w) for w in words) + "\n"


def by_stage(per_rank: dict[str, dict], pp: int) -> list[int]:
    """The largest max_memory_allocated of each pipeline stage's ranks (bytes). Megatron's rank
    order tp-cp-ep-dp-pp keeps pipeline stages outermost: rank r is on stage r // (world / pp)."""
    stages = [0] * pp
    for rank, values in per_rank.items():
        stage = int(rank) // (WORLD // pp)
        stages[stage] = max(stages[stage], round(values["max_allocated_mb"] * MiB))
    return stages


def build(git_dir: Path) -> list[dict]:
    commit = git(git_dir, "rev-parse", "HEAD").strip()
    summary = json.loads(git(git_dir, "show", f"{commit}:{SUMMARY}"))
    rows = summary["rows"]
    records = []
    for row in rows:
        if row.get("memory_source_case") not in (None, row["case"]):
            continue
        n = sizes(row["case"])
        stages = by_stage(row["peak_memory_by_rank_mb"], n["pp"])
        stage = max(range(n["pp"]), key=stages.__getitem__)
        reusing = [r["case"] for r in rows if r.get("memory_source_case") == row["case"] and r["case"] != row["case"]]
        records.append({
            "id": row["case"],
            "source": {"repository": REPOSITORY, "commit": commit, "file": SUMMARY, "guide": GUIDE,
                       "launcher": LAUNCHERS["deepseek" if row["case"].startswith("deepseek") else "llama3"],
                       "megatron_lm_commit": MEGATRON_COMMIT,
                       "note": "real_alloc_gib = max over ranks of max_memory_allocated (guide section 6); "
                               "the rows reusing this memory run: " + (", ".join(reusing) or "none")},
            "gpu": "b200", "world_size": WORLD,
            "versions": {"megatron_lm": "core_v0.14.0 (23e00ed0963c)", "transformer_engine": "2.11.0+c188b533",
                         "torch": "2.10.0a0+a36e1d39eb.nv26.01", "cuda": "13.1"},
            "launch": launch_command(git_dir, commit, row["case"]),
            "assumed_flags": CEF_FLAGS if row["case"].endswith("_cef") else [],
            "stage": stage,
            "peer_estimate": {"simumax_alloc_gib": row["perf_alloc_gib"], "simumax_alloc_error": row["alloc_err_pct"] / 100},
            "measured": {"max_allocated_bytes": stages[stage], "max_allocated_bytes_by_stage": stages,
                         "real_alloc_gib": row["real_alloc_gib"], "real_reserved_gib": row.get("real_reserved_gib")},
        })
    return records


def write(records: list[dict], out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    for record in records:
        (out / f"{record['id']}.json").write_text(json.dumps(record, indent=1) + "\n")
