"""The planner's answers, held fixed while its search changes: the README's case (DeepSeek-V3 on 2,048
H800s, the recipe deepseek-v3-as-reported, as `python -m estimator plan` runs it) and two smaller ones
(an MoE model under Megatron, a dense one under FSDP2). Every listed layout with every number, the
Pareto flags, the order, and the layouts judged, as the search gave them before its exact-speed checks
(estimator/search/search.py `_exact_ceilings`, issue #26: code at commit fb081d9).

The search's rules are exact, so a change to how it prunes must leave these answers byte for byte as
they were. The numbers are the estimator's: when a change to the estimate or the roofline moves them
on purpose (its own tests say why), regenerate the file with `python tests/test_planner_answers.py`
at that commit, never to make a change to the search pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from estimator import Training, load_config  # noqa: E402
from estimator.search.planner import plan  # noqa: E402
from estimator.models.presets import get_architecture, get_recipe  # noqa: E402

ANSWERS = ROOT / "tests" / "data" / "planner" / "answers.json"


def _readme_case():
    cfg = load_config(get_recipe("deepseek-v3-as-reported").config)
    return plan(cfg.architecture, cfg.training, cfg.hardware, 2048, comm_overlap=cfg.parallel.comm_overlap)


CASES = {
    "deepseek-v3 on 2048 h800": _readme_case,
    "mixtral-8x7b on 16 h100-80, megatron": lambda: plan(
        get_architecture("mixtral-8x7b"), Training(seq_len=4096, global_batch_size=128, framework="megatron"),
        "h100-80", 16),
    "llama-3.1-8b on 32 h100-80, fsdp2": lambda: plan(
        get_architecture("llama-3.1-8b"), Training(seq_len=8192, global_batch_size=64, framework="fsdp2"),
        "h100-80", 32),
}


def answer(name: str) -> dict:
    result = CASES[name]().to_json()
    # through JSON as stored: floats round-trip exactly
    return json.loads(json.dumps({"searched": result["searched"], "layouts": result["layouts"]}))


@pytest.mark.parametrize("name", list(CASES))
def test_the_answer_is_the_one_recorded(name):
    expected = json.loads(ANSWERS.read_text())[name]
    got = answer(name)
    assert got["searched"] == expected["searched"]
    assert len(got["layouts"]) == len(expected["layouts"])
    for rank, (mine, theirs) in enumerate(zip(got["layouts"], expected["layouts"]), 1):
        assert mine == theirs, f"rank {rank}"


def test_the_recorded_answers_are_what_the_readme_says():
    # the README's case as the README describes it (Planner section): the answer lists the 50 fastest and
    # the Pareto front, its fastest layout fits, and the recipe's own layout family (1F1B, PP 16) is found
    readme = json.loads(ANSWERS.read_text())["deepseek-v3 on 2048 h800"]
    layouts = readme["layouts"]
    assert readme["searched"] > 1_000_000 and len(layouts) > 50
    assert [x["tokens_per_s_per_gpu"] for x in layouts] == sorted((x["tokens_per_s_per_gpu"] for x in layouts),
                                                                  reverse=True)
    assert all(x["utilization"] <= 0.8 for x in layouts)
    assert any(x["parallel"]["pp"] == 16 and x["parallel"]["vpp"] == 1 for x in layouts)


if __name__ == "__main__":  # regenerate: only when the estimator's numbers change on purpose (docstring)
    ANSWERS.parent.mkdir(parents=True, exist_ok=True)
    ANSWERS.write_text(json.dumps({name: answer(name) for name in CASES}, indent=0, sort_keys=True) + "\n")
    print(f"wrote {ANSWERS}")
