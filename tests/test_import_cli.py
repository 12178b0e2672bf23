"""`python -m estimator import` and `check` (CONTRACT.md "Additions: launch configurations"), the
Python API `estimator.check`, and hostile input: refused with exit status 2, fast, nothing run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import estimator
from estimator import ConfigError
from estimator.importers import import_config
from estimator.importers.source import MAX_BYTES, parse_yaml
from import_refusals import FILE_TOO_LARGE, SUBSTITUTION, TOO_LARGE

DATA = Path(__file__).parent / "data" / "launch"
LLAMA_FP8 = str(DATA / "megatron" / "train_llama3_8b_h100_fp8.sh")
TITAN_8B = str(DATA / "torchtitan" / "llama3_8b.toml")


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "estimator", *args], capture_output=True, text=True, input=stdin,
                          timeout=120)


def test_import_prints_the_config_and_the_settings_on_stderr():
    run = cli("import", TITAN_8B, "--gpus", "64", "--gpu", "a100-80")
    assert run.returncode == 0
    expected = import_config(Path(TITAN_8B).read_text(), gpus=64, gpu="a100-80").config  # kind guessed: torchtitan
    assert json.loads(run.stdout) == expected and expected["training"]["framework"] == "fsdp2"
    lines = run.stderr.splitlines()
    assert "ignored: optimizer.lr '0.0003' (learning rate)" in lines
    assert all(line.split(":")[0] in ("ignored", "not modelled", "unknown", "note") for line in lines)


def test_import_of_a_command_line_after_dashes():
    run = cli("import", "--from", "megatron", "--gpus", "2", "--", "pretrain_gpt.py", "--num-layers", "2",
              "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128", "--vocab-size", "1000",
              "--position-embedding-type", "rope", "--bf16", "--tensor-model-parallel-size", "2", "--tpyo", "1")
    assert run.returncode == 0
    config = json.loads(run.stdout)
    assert config["parallel"] == {"tp": 2, "dp": 1, "sequence_parallel": False, "comm_overlap": 0.0}
    assert "unknown: --tpyo '1' (not a flag of Megatron-LM core_v0.16.1)" in run.stderr.splitlines()


@pytest.mark.parametrize("extra, allow, code, verdict", [
    ((), (), 1, "OOM"),  # the script as published: 88 GiB on an 80 GB H100
    (("--seq-length", "4096"), (), 1, "TIGHT"),
    (("--seq-length", "4096"), ("--allow-tight",), 0, "TIGHT"),
    (("--seq-length", "2048"), (), 0, "FITS"),
])
def test_check_exit_status_follows_the_verdict(extra, allow, code, verdict):
    run = cli("check", LLAMA_FP8, *allow, *(("--", *extra) if extra else ()))
    assert run.returncode == code, run.stderr
    *stages, last = run.stdout.splitlines()
    assert last.startswith(f"{verdict} on h100-80") and stages[0].startswith("stage 0: 32 layers")
    result = estimator.check(LLAMA_FP8) if not extra else None
    if result is not None:
        assert result.fit.verdict == "oom" and f"{result.device_total_bytes / 2**30:.2f} GiB" in last


def test_check_json_and_the_python_api_agree():
    run = cli("check", TITAN_8B, "--gpus", "64", "--json")
    assert run.returncode == 0
    out = json.loads(run.stdout)
    api = estimator.check(TITAN_8B, gpus=64)
    assert out["device_total_bytes"] == api.device_total_bytes and out["fit"]["verdict"] == api.fit.verdict == "fits"
    assert out["launch"]["kind"] == "torchtitan" and out["launch"]["config"]["model"] == "llama-3.1-8b"
    assert estimator.check(Path(TITAN_8B).read_text(), kind="torchtitan", gpus=64).to_json() == api.to_json()


def test_bad_input_exits_2_with_one_line():
    for args in (("check", "/nonexistent.toml"), ("check", TITAN_8B), ("import", "--from", "sglang", TITAN_8B),
                 ("import",)):
        run = cli(*args)
        assert run.returncode == 2 and run.stdout == "" and len(run.stderr.splitlines()) == 1, args
        assert run.stderr.startswith("error: ")


def test_hostile_inputs_refused_by_their_guard_and_nothing_run(tmp_path, importer_reads):
    """Each is refused by the guard that bounds its cost, not by a clock (their times:
    bench/bench_refusals.py): a file or text over MAX_BYTES by the size check (the file unread), before
    any reader runs; a command substitution by the shell reader, which never runs it."""
    marker = tmp_path / "ran"
    big = tmp_path / "big.toml"
    big.write_text("[model]\n" + "x = 1\n" * (10 * 2**20 // 6))  # 10 MiB
    many = "[parallelism]\n" + "".join(f"k{i} = 1\n" for i in range(10**6))  # 10^6 keys
    hostile = [
        (str(big), None, FILE_TOO_LARGE),
        ("-", many, FILE_TOO_LARGE),
        ("-", f"pretrain_gpt.py --num-layers $(touch {marker}) --hidden-size 8", SUBSTITUTION),
        ("-", f"pretrain_gpt.py --num-layers `touch {marker}`", SUBSTITUTION),
        ("-", f"L=$(touch {marker})\npretrain_gpt.py --num-layers $L", SUBSTITUTION),
    ]
    for path, stdin, refusal in hostile:
        run = cli("check", path, "--from", "torchtitan" if stdin is many or path == str(big) else "megatron",
                  "--gpus", "8", stdin=stdin)
        assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, (path, run.stderr)
        assert refusal in run.stderr, run.stderr
    assert not marker.exists()
    for text, kind, refusal in ((many, "torchtitan", TOO_LARGE),
                                (f"pretrain_gpt.py --num-layers $(touch {marker})", "megatron", SUBSTITUTION)):
        with pytest.raises(ConfigError) as info:
            import_config(text, kind, gpus=8)
        assert refusal in str(info.value)
    assert importer_reads == ["megatron"]  # the 10^6 keys reached no reader
    assert len(many) > MAX_BYTES


def test_yaml_is_data_only(tmp_path, monkeypatch):
    import yaml
    marker = tmp_path / "ran"
    with pytest.raises(ConfigError, match="!!python"):
        parse_yaml(f"a: !!python/object/apply:os.system ['touch {marker}']", "x.yaml")
    assert not marker.exists()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
    built, real = [], yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, *a, **k: built.append(len(text)) or real(text, *a, **k))
    with pytest.raises(ConfigError, match="bomb"):  # 9^10 values once expanded: counted, never built
        parse_yaml(bomb, "bomb.yaml")
    assert built == []
    assert parse_yaml("a: &x 1\nb: *x\n", "ok.yaml") == {"a": 1, "b": 1}
