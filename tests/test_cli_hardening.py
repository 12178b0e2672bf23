"""The command line under hostile or broken input: no credential is ever printed, a broken config
file is bad input (exit 2, one line naming --config), never an internal error."""

from __future__ import annotations

import json

import pytest

from estimator import cli
from estimator.spec.errors import ConfigError
from estimator.models.presets import list_presets

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUv"


@pytest.fixture
def write(tmp_path):
    def write(content: str | bytes, name: str = "config.json") -> str:
        path = tmp_path / name
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        return str(path)
    return write


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *absent: str) -> None:
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    for text in absent:
        assert text not in err


# --- credentials are never echoed ---------------------------------------------------------------

@pytest.mark.parametrize("model", [f"https://huggingface.co/org/name?token={TOKEN}", f"org/name@{TOKEN}",
                                   f"https://user:{TOKEN}@huggingface.co/org/name", TOKEN])
def test_a_token_in_the_model_string_is_not_printed(model, write, capsys):
    code, out, err = run(capsys, "estimate", "--config", write(json.dumps({"model": model})))
    assert code == 2 and out == ""
    assert_one_line(err, TOKEN)
    assert "model" in err


@pytest.mark.parametrize("config", [{"model": "llama-3.1-8b", TOKEN: 1},
                                    {"model": "llama-3.1-8b", "training": {TOKEN: 1}},
                                    {"model": "llama-3.1-8b", "hardware": {"gpu": TOKEN}}])
def test_a_token_as_a_key_or_value_of_the_config_is_not_printed(config, write, capsys):
    code, out, err = run(capsys, "estimate", "--config", write(json.dumps(config)))
    assert code == 2 and out == ""
    assert_one_line(err, TOKEN)


@pytest.mark.parametrize("extra", [["--bogus", TOKEN], [f"--bogus={TOKEN}"], ["--tp", TOKEN],
                                   [f"--gpu={TOKEN}"], ["--json", "--json", TOKEN]])
def test_a_token_on_the_command_line_is_not_printed(extra, write, capsys):
    code, out, err = run(capsys, "estimate", "--config", write('{"model": "llama-3.1-8b"}'), *extra)
    assert code == 2 and out == ""
    assert_one_line(err, TOKEN)


@pytest.mark.parametrize("argv", [[TOKEN], ["estimate", "--config", f"/no/such/{TOKEN}.json"]])
def test_a_token_as_a_command_or_a_path_is_not_printed(argv, capsys):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert_one_line(err, TOKEN)


def test_an_internal_error_quoting_a_token_is_one_line_without_it(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError(f"request to https://x.test/?token={TOKEN} failed\nsecond line")
    monkeypatch.setattr(cli, "_cmd_presets", broken)
    code, _, err = run(capsys, "presets")
    assert code == 1 and "internal error" in err
    assert_one_line(err, TOKEN)


def test_a_config_error_whose_reason_quotes_a_token_keeps_only_the_field(monkeypatch, capsys):
    def broken(args):
        raise ConfigError("model", "org/name", "a model", f"the Hub said: bad token {TOKEN}")
    monkeypatch.setattr(cli, "_cmd_presets", broken)
    code, _, err = run(capsys, "presets")
    assert code == 2 and err.startswith("error: model: ")
    assert_one_line(err, TOKEN)


# --- a broken config file is bad input ----------------------------------------------------------

def test_a_config_that_is_not_utf8(write, capsys):
    code, out, err = run(capsys, "estimate", "--config", write(b'{"model": "llama\xff-3.1-8b"}'))
    assert code == 2 and out == ""
    assert_one_line(err)
    assert "--config" in err and "UTF-8" in err and "offset 16" in err


def test_a_config_with_a_5001_digit_integer(write, capsys):
    path = write('{"model": "llama-3.1-8b", "training": {"seq_len": ' + "9" * 5001 + "}}")
    code, out, err = run(capsys, "estimate", "--config", path)
    assert code == 2 and out == ""
    assert_one_line(err, "9" * 100)
    assert "--config" in err and "integer" in err


def test_a_config_nested_100000_deep(write, capsys):
    code, out, err = run(capsys, "estimate", "--config", write("[" * 100_000 + "]" * 100_000))
    assert code == 2 and out == ""
    assert_one_line(err)
    assert "--config" in err and "nested too deeply" in err


def test_a_config_larger_than_the_limit_is_refused(tmp_path, capsys):
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:  # sparse: no disk is used
        fh.truncate(cli.MAX_CONFIG_BYTES + 1)
    code, out, err = run(capsys, "estimate", "--config", str(path))
    assert code == 2 and out == ""
    assert_one_line(err)
    assert "--config" in err and "16 MiB" in err


def test_a_config_at_the_limit_is_read(write, capsys):
    text = '{"model": "llama-3.1-8b"}'
    code, _, err = run(capsys, "estimate", "--config", write(text + " " * (cli.MAX_CONFIG_BYTES - len(text))))
    assert code == 0 and err == ""


def test_a_100000_digit_flag_is_refused_unparsed(write, capsys, monkeypatch):
    """The flag's text is refused by parse_text's length gate before any parsing (no regex, int() or
    float() of it) and before any estimate: what keeps it cheap (its time: bench/bench_refusals.py)."""
    from estimator.memory import memory
    from estimator.spec import values
    parsed, estimated = [], []
    real_parse, real_estimate = values._from_text, memory.estimate_resolved
    monkeypatch.setattr(values, "_from_text", lambda f, text: parsed.append((f.path, len(text))) or real_parse(f, text))
    monkeypatch.setattr(memory, "estimate_resolved", lambda *a, **k: estimated.append(a) or real_estimate(*a, **k))
    path = write('{"model": "llama-3.1-8b"}')
    for flag, field in (("--seq-len", "training.seq_len"), ("--tp", "parallel.tp"), ("--dropout", "training.dropout")):
        code, out, err = run(capsys, "estimate", "--config", path, flag, "9" * 100_000)
        assert code == 2 and out == ""
        assert_one_line(err, "9" * 100)
        assert len(err) < 1000 and f"[{field}]" in err
    assert parsed == [] and estimated == []


# --- presets ------------------------------------------------------------------------------------

def test_presets_lists_id_name_parameters_and_family_in_columns(capsys):
    code, out, err = run(capsys, "presets")
    assert code == 0 and err == ""
    lines = out.splitlines()
    presets = list_presets()
    assert [line.split()[0] for line in lines] == [p.id for p in presets]
    by_id = dict(zip((p.id for p in presets), lines))
    assert "Llama 3.1 8B" in by_id["llama-3.1-8b"] and "8.03B" in by_id["llama-3.1-8b"]
    assert by_id["llama-3.1-8b"].endswith("  llama")
    assert "46.70B (12.88B active)" in by_id["mixtral-8x7b"] and by_id["mixtral-8x7b"].endswith("  mixtral")
    # aligned: every name and every count starts in the same column
    assert len({line.index(p.name, len(p.id)) for line, p in zip(lines, presets)}) == 1
    assert len({line.index(f"{p.published_total / 1e9:.2f}B", len(p.id) + len(p.name))
                for line, p in zip(lines, presets)}) == 1
