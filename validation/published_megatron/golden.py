"""Megatron-LM's functional-test golden values as records (tests/data/measured/published/megatron_golden).

What a golden value is (Megatron-LM core_v0.16.1):
- ``megatron/training/training.py`` ``training_log``: with ``--log-memory-to-tensorboard`` the
  tensorboard writer gets ``mem-allocated-bytes`` = ``torch.cuda.memory_stats()["allocated_bytes.all.current"]``
  and ``mem-max-allocated-bytes`` = ``["allocated_bytes.all.peak"]`` after each logged iteration. The
  peak is never reset, so the value at iteration i is the peak of the process up to i.
- ``megatron/training/global_vars.py`` ``_set_tensorboard_writer``: only ``rank == world_size - 1``
  has a writer: the last global rank, which holds the last pipeline stage (the loss) under every
  rank order Megatron builds (tp-cp-ep-dp-pp and tp-pp-dp).
- ``tests/functional_tests/python_test_utils/get_test_results_from_tensorboard_logs.py`` writes the
  golden JSON from those scalars; a ckpt-resume case's JSON is its first run's.
- Iteration 1's peak comes before the optimizer's states exist (they are created in its step, after
  the forward/backward peak); from iteration 2 on the steady peak holds them. The record's measured
  peak is the last logged iteration's value (the maximum), the first iteration's is kept beside it.
- World size: ``tests/test_utils/recipes/{h100,gb200}/{gpt,moe}.yaml``: 1 node x 8 GPUs (GB200: 2 x 4);
  ``tests/functional_tests/shell_test_utils/_run_training.sh`` turns MODEL_ARGS into the command line
  (``true`` -> the bare switch, ``[a b]`` -> the words a b, ``(...)`` and values with spaces -> one word)
  and exports ENV_VARS.

Run: ``python -m validation.published_megatron golden --git-dir /work/.mirror/NVIDIA+Megatron-LM/repo``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import yaml

TAG = "core_v0.16.1"
REPOSITORY = "NVIDIA/Megatron-LM"
CASES_DIR = "tests/functional_tests/test_cases"
OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "published" / "megatron_golden"
WORLD_SIZE = 8  # recipes: nodes 1 x gpus 8 on dgx_a100/dgx_h100 (gb200: 2 x 4)
# The golden file a record takes, in order of preference: the dev container (current PyTorch and TE)
# on the GPUs of our catalog. GB200 has no catalog entry; an lts (older container) file only where
# no dev file of those GPUs exists.
PREFERRED = (("dev", "dgx_h100", "h100-80"), ("dev", "dgx_a100", "a100-80"), ("lts", "dgx_a100", "a100-80"))
FAMILIES = ("gpt", "moe", "mixtral")
# Families of test cases that are not GPT decoders: listed as not representable, by family.
OTHER_FAMILIES = {
    "bert": "BERT (encoder with a binary head): the estimator models decoder-only GPT models",
    "t5": "T5 (encoder-decoder): the estimator models decoder-only GPT models",
    "hybrid": "Mamba hybrid stack (state-space layers): the estimator models attention decoders",
    "multimodal-llava": "LLaVA (vision encoder + projector + language model): not modelled",
    "mimo": "multimodal MIMO model: not modelled",
    "gpt-nemo": "NeMo launcher (its own model config): not a Megatron-LM command line",
    "nemotron": "NeMo launcher (its own model config): not a Megatron-LM command line",
}
# Flags with which a case is not representable: the estimator has no field for what they do to memory.
UNREPRESENTABLE_FLAGS = {
    "--perform-rl-step": "GRPO reinforcement learning (rollouts, reference model, inference engine)",
    "--cuda-graph-impl": "CUDA graphs: their static input/output buffers and private memory pool",
    "--enable-cuda-graph": "CUDA graphs: their static input/output buffers and private memory pool",
    "--fine-grained-activation-offloading": "activation offloading of listed modules to the host",
    "--offload-modules": "activation offloading of listed modules to the host",
    "--use-torch-fsdp2": "Megatron on PyTorch FSDP2 (not Megatron's own buffers)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances (hierarchical sharding)",
    "--export-kd-teacher-load": "knowledge distillation: a second (teacher) model on every rank",
    "--experimental-attention-variant": "an experimental attention (gated delta net, sparse attention)",
    "--spec": "a custom layer spec module",
    "--mup": "muP parametrisation (scaled initialisation and learning rates): same tensors, but not checked",
    "--overlap-moe-expert-parallel-comm": "expert-parallel A2A overlap (a second micro-batch in flight per layer)",
    "--dsa-indexer-topk": "DeepSeek sparse attention's indexer",
}
# Words in a case's name that mark what the flags cannot show.
UNREPRESENTABLE_NAMES = {
    "modelopt_distill": "knowledge distillation: a second (teacher) model on every rank (ENV DISTILL_CONFIG)",
    "gdn": "gated delta net layers (linear attention): not modelled",
    "_dsa": "DeepSeek sparse attention: not modelled",
    "frozen_start": "inference of a frozen checkpoint, not a training step",
}


def git_show(git_dir: Path, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{TAG}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_lines(git_dir: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True, text=True)
    return out.stdout.split("\n")


def command_words(model_args: dict) -> list[str]:
    """MODEL_ARGS as _run_training.sh (core_v0.16.1) passes them to pretrain_gpt.py."""
    words: list[str] = []
    for key, value in model_args.items():
        if value is True:
            words.append(key)
            continue
        text = str(value).strip()
        if re.fullmatch(r"\[[^]]+\]", text):
            words += [key, *text[1:-1].split()]
        else:
            words += [key, text]
    return words


def launch_script(env: dict, model_args: dict, world_size: int = WORLD_SIZE) -> str:
    """The case as a shell script: ENV_VARS exported, then the torchrun command line."""
    words = ["torchrun", "--nproc_per_node", str(world_size), "--nnodes", "1", "pretrain_gpt.py",
             *command_words(model_args)]
    exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())
    return exports + " ".join(shlex.quote(w) for w in words) + "\n"


def golden_file(files: list[str]) -> tuple[str, str, str, str] | None:
    """(file, environment, platform, our GPU id) of the preferred golden file of a case."""
    names = {f.rsplit("/", 1)[1]: f for f in files}
    for environment, platform, gpu in PREFERRED:
        found = names.get(f"golden_values_{environment}_{platform}.json")
        if found:
            return found, environment, platform, gpu
    return None


def memory_series(golden: dict, key: str) -> dict[int, int]:
    values = golden.get(key, {}).get("values", {}) if isinstance(golden.get(key), dict) else {}
    series = {}
    for step, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if number == number and number > 0:
            series[int(step)] = int(number)
    return series


def exclusion(case: str, cfg: dict) -> str | None:
    """Why a case is not representable, or None."""
    args = cfg.get("MODEL_ARGS") or {}
    if cfg.get("MODE", "pretraining") != "pretraining":
        return f"MODE {cfg['MODE']}: not a training run"
    if cfg.get("TEST_TYPE") == "checkpoint-consistency":
        return "several runs of different GPU counts (MODEL_ENV_VARS), one checkpoint compared"
    if cfg.get("TEST_TYPE") == "release":
        return "a release (convergence) run: its recipe runs it on many nodes, not the 8 GPUs of the CI recipes"
    for flag, why in UNREPRESENTABLE_FLAGS.items():
        if flag in args:
            return f"{flag}: {why}"
    for word, why in UNREPRESENTABLE_NAMES.items():
        if word in case:
            return why
    return None


def refusal(launch: str, gpu: str) -> str | None:
    """The estimator's error for a launch script (the importer's or the estimate's), or None."""
    from estimator import estimate_config
    from estimator.spec.errors import ConfigError
    from estimator.importers import import_config

    try:
        estimate_config(import_config(launch, "megatron", gpu=gpu).config)
    except ConfigError as error:
        return str(error)
    return None


def build(git_dir: Path) -> tuple[list[dict], list[dict]]:
    """(records, exclusions) of every gpt/moe/mixtral case with memory golden values at TAG."""
    commit = git_lines(git_dir, "rev-parse", f"{TAG}^{{commit}}")[0]
    files = [f for f in git_lines(git_dir, "ls-tree", "-r", "--name-only", TAG, CASES_DIR) if f]
    by_case: dict[str, list[str]] = {}
    for f in files:
        if f.rsplit("/", 1)[1].startswith("golden_values"):
            by_case.setdefault(f.rsplit("/", 1)[0], []).append(f)
    records, excluded = [], []
    for case_dir, golden_files in sorted(by_case.items()):
        family, case = case_dir[len(CASES_DIR) + 1:].split("/", 1)
        chosen = golden_file(golden_files)
        if chosen is None:
            continue
        path, environment, platform, gpu = chosen
        golden = json.loads(git_show(git_dir, path))
        peak = memory_series(golden, "mem-max-allocated-bytes")
        if not peak:
            continue
        if family not in FAMILIES:
            excluded.append({"case": case_dir, "why": OTHER_FAMILIES.get(family, f"family {family}: not modelled")})
            continue
        cfg = yaml.safe_load(git_show(git_dir, f"{case_dir}/model_config.yaml"))
        why = exclusion(case, cfg)
        if why:
            excluded.append({"case": case_dir, "why": why})
            continue
        launch = launch_script(cfg.get("ENV_VARS") or {}, cfg.get("MODEL_ARGS") or {})
        refused = refusal(launch, gpu)
        if refused:
            excluded.append({"case": case_dir, "why": f"the estimator refuses it: {refused}"})
            continue
        last = max(peak)
        current = memory_series(golden, "mem-allocated-bytes")
        changed = [line for line in git_lines(git_dir, "log", "-1", "--format=%H %as", TAG, "--", path) if line]
        golden_commit, golden_date = changed[0].split() if changed else ("", "")
        records.append({
            "id": f"{family}-{case}",
            "source": {
                "repository": REPOSITORY, "tag": TAG, "commit": commit, "case": case_dir,
                "model_config": f"{case_dir}/model_config.yaml", "golden_values": path,
                "golden_values_commit": golden_commit, "golden_values_date": golden_date,
                "note": "the golden values are what CI measured with the main branch at golden_values_commit "
                        "(or earlier, where that commit moved the file); the flags are the tag's",
            },
            "environment": environment, "platform": platform, "gpu": gpu, "world_size": WORLD_SIZE,
            "test_type": cfg.get("TEST_TYPE", "regular"),
            "memory_checked_by_ci": "mem-max-allocated-bytes" in (cfg.get("METRICS") or []),
            "env": {k: str(v) for k, v in (cfg.get("ENV_VARS") or {}).items()},
            "model_args": {k: v if isinstance(v, (bool, int, float)) else str(v)
                           for k, v in (cfg.get("MODEL_ARGS") or {}).items()},
            "launch": launch,
            "logging_rank": "global rank world_size - 1 (megatron/training/global_vars.py "
                            "_set_tensorboard_writer): the last pipeline stage",
            "measured": {
                "max_allocated_bytes": peak[last], "iteration": last,
                "max_allocated_bytes_iteration_1": peak.get(min(peak)),
                "allocated_bytes": current.get(last, current[max(current)] if current else None),
                "iterations_logged": [min(peak), last],
            },
        })
    mark_duplicates(records)
    return records, excluded


def mark_duplicates(records: list[dict]) -> None:
    """Cases that import to the same configuration on the same GPU, with the same flags left
    unmodelled, are one run for the statistics: each but the first (a regular test before a
    resume test) gets ``duplicate_of``."""
    from estimator.importers import import_config

    first: dict[str, str] = {}
    order = sorted(records, key=lambda r: (r["test_type"] != "regular", r["id"]))
    for record in order:
        imported = import_config(record["launch"], "megatron", gpu=record["gpu"])
        key = json.dumps([imported.config, sorted((s.name, s.value) for s in imported.unsupported)], sort_keys=True)
        if key in first:
            record["duplicate_of"] = first[key]
        else:
            first[key] = record["id"]


def write(records: list[dict], excluded: list[dict], out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    for record in records:
        (out / f"{record['id']}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "excluded.txt").write_text(
        f"# Megatron-LM {TAG} functional-test cases with memory golden values that the estimator cannot\n"
        "# represent, and why (validation/published_megatron/golden.py).\n"
        + "".join(f"{e['case']}\t{e['why']}\n" for e in excluded))
