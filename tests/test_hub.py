"""estimator.hub against the real huggingface_hub client and a fake Hub on 127.0.0.1.

No test reaches the internet: every endpoint is the loopback server of `hub_server.py` (or a
closed loopback port), and HF_ENDPOINT points there too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hub_server import FakeHub, safetensors_bytes  # noqa: E402

from estimator.models import hub  # noqa: E402
from estimator.spec.architecture import parameter_counts  # noqa: E402
from estimator.spec.errors import ConfigError  # noqa: E402
from estimator.models.hf_config import architecture_from_hf_config  # noqa: E402

GOOD_TOKEN = "hf_GrantedAccessToken123"
BAD_TOKEN = "hf_NoAccessToThisRepo456"

# A tiny Llama: h=64, 2 layers, 4 heads, ffn 128, vocab 100, untied.
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100, "tie_word_embeddings": False}


def tiny_tensors(layers: range) -> dict[str, tuple[str, list[int]]]:
    """The tensors of TINY, named and shaped as LlamaForCausalLM stores them."""
    out: dict[str, tuple[str, list[int]]] = {}
    for i in layers:
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{name}.weight"] = ("BF16", [64, 64])
        out[p + "mlp.gate_proj.weight"] = ("BF16", [128, 64])
        out[p + "mlp.up_proj.weight"] = ("BF16", [128, 64])
        out[p + "mlp.down_proj.weight"] = ("BF16", [64, 128])
        out[p + "input_layernorm.weight"] = ("F32", [64])
        out[p + "post_attention_layernorm.weight"] = ("F32", [64])
    return out


EMBED = {"model.embed_tokens.weight": ("BF16", [100, 64]), "model.norm.weight": ("F32", [64]),
         "lm_head.weight": ("BF16", [100, 64])}


def numel(tensors: dict[str, tuple[str, list[int]]]) -> int:
    total = 0
    for _dtype, shape in tensors.values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


@pytest.fixture(scope="module")
def fake():
    server = FakeHub().start()
    single = {**tiny_tensors(range(2)), **EMBED}
    server.add("org/tiny", {"config.json": TINY, "model.safetensors": safetensors_bytes(single)},
               revisions={"v1": {"config.json": {**TINY, "num_hidden_layers": 1}}})
    # sharded: layer 0 + embeddings in shard 1; layer 1 + head in shard 2, whose header is longer
    # than the client's first 100,000-byte range read
    shard1 = {**tiny_tensors(range(1)), "model.embed_tokens.weight": ("BF16", [100, 64])}
    shard2 = {**tiny_tensors(range(1, 2)), "model.norm.weight": ("F32", [64]), "lm_head.weight": ("BF16", [100, 64])}
    names = {"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2}
    index = {"metadata": {"total_size": 0},
             "weight_map": {t: f for f, tensors in names.items() for t in tensors}}
    server.add("org/sharded", {
        "config.json": TINY, "model.safetensors.index.json": index,
        "model-00001-of-00002.safetensors": safetensors_bytes(shard1),
        "model-00002-of-00002.safetensors": safetensors_bytes(shard2, pad_header_to=150_000)})
    server.add("org/bin-only", {"config.json": TINY, "pytorch_model.bin": b"\0" * 16})
    server.add("org/wrong-count", {"config.json": TINY,
                                   "model.safetensors": safetensors_bytes(tiny_tensors(range(2)))})
    server.add("meta/gated", {"config.json": TINY, "model.safetensors": safetensors_bytes(single)},
               gated=True, allowed_tokens=(GOOD_TOKEN,))
    server.add("org/no-config", {"README.md": "# no config"})
    server.add("org/huge", {"config.json": b"{" + b" " * (2 * 1024 * 1024) + b"}"})
    server.add("org/broken", {"config.json": b'{"model_type": "llama", '})
    server.add("org/array", {"config.json": b"[1, 2, 3]"})
    server.add("org/slow", {"config.json": TINY}, delay=3.0)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch, fake):
    """A fresh HF cache per test, no ambient token, HF_ENDPOINT on the fake Hub."""
    import huggingface_hub.constants as constants

    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    # HfApi's internal downloads (the safetensors index) use the cache huggingface_hub read at import
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    fake.requests.clear()
    yield


def closed_port_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_one_line(error: Exception, *secrets: str) -> None:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text
    for secret in secrets:
        assert secret not in text


# --- success ------------------------------------------------------------------------------------

def test_fetch_config_with_explicit_endpoint(fake):
    assert hub.fetch_config("org/tiny", endpoint=fake.endpoint) == TINY
    methods = [m for m, path, _ in fake.requests if path.endswith("/config.json")]
    assert "GET" in methods and set(methods) <= {"HEAD", "GET"}
    assert all("/org/tiny/resolve/main/config.json" in path for _, path, _ in fake.requests)


def test_fetch_config_reads_hf_endpoint_at_call_time(fake, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_endpoint())
    with pytest.raises(hub.HubError):
        hub.fetch_config("org/tiny", timeout=2)
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    assert hub.fetch_config("org/tiny") == TINY


def test_revision_in_the_model_string(fake):
    config = hub.fetch_config("org/tiny@v1")
    assert config["num_hidden_layers"] == 1
    assert any("/org/tiny/resolve/v1/config.json" in path for _, path, _ in fake.requests)


def test_config_goes_to_the_hf_home_cache(tmp_path):
    hub.fetch_config("org/tiny")
    assert list((tmp_path / "hf" / "hub").glob("models--org--tiny/snapshots/*/config.json"))


def test_huggingface_url_is_accepted():
    assert hub.parse_hub_id("https://huggingface.co/org/tiny") == ("org/tiny", None)
    assert hub.parse_hub_id("org/tiny@refs/pr/1") == ("org/tiny", "refs/pr/1")
    assert hub.parse_hub_id("https://huggingface.co/org/tiny/tree/v1") == ("org/tiny", "v1")


# --- failures -----------------------------------------------------------------------------------

def test_unknown_repo():
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/does-not-exist")
    error = caught.value
    assert isinstance(error, ConfigError) and error.field == "model" and error.kind == "not_found"
    assert "org/does-not-exist" in str(error)
    assert_one_line(error)


def test_unknown_revision():
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/tiny@no-such-branch")
    assert caught.value.kind == "revision_not_found" and "no-such-branch" in str(caught.value)


def test_gated_repo_without_token_says_how_to_get_access(fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("meta/gated")
    error = caught.value
    assert error.kind == "gated"
    assert "licence" in str(error) and "HF_TOKEN" in str(error) and "meta/gated" in str(error)
    assert_one_line(error)


def test_gated_repo_with_a_token_that_has_no_access(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", BAD_TOKEN)
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("meta/gated")
    assert caught.value.kind == "gated"
    assert_one_line(caught.value, BAD_TOKEN)
    assert any(headers.get("authorization") == f"Bearer {BAD_TOKEN}" for _, _, headers in fake.requests)


def test_gated_repo_with_hf_token_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert hub.fetch_config("meta/gated") == TINY


def test_gated_repo_with_a_token_from_the_caller(fake):
    assert hub.fetch_config("meta/gated", token=GOOD_TOKEN) == TINY
    assert hub.fetch_parameter_count("meta/gated", token=GOOD_TOKEN) == numel({**tiny_tensors(range(2)), **EMBED})


def test_no_token_is_sent_without_one(fake):
    hub.fetch_config("org/tiny")
    assert all("authorization" not in headers for _, _, headers in fake.requests)


def test_missing_config_json():
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/no-config")
    assert caught.value.kind == "no_config" and "config.json" in str(caught.value)


def test_offline_mode_without_cache_makes_no_request(fake, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/tiny")
    assert caught.value.kind == "offline" and "HF_HUB_OFFLINE" in str(caught.value)
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_parameter_count("org/tiny")
    assert caught.value.kind == "offline"
    assert fake.requests == []


def test_offline_mode_uses_the_cache(fake, monkeypatch):
    assert hub.fetch_config("org/tiny") == TINY
    fake.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.fetch_config("org/tiny") == TINY
    assert fake.requests == []


@pytest.fixture
def waits(monkeypatch) -> list[float | None]:
    """The timeout of every wait on a fetch's thread (`hub._bounded`'s join), as it waits: the wait is
    what the caller's timeout must bound (huggingface_hub's own retries do not)."""
    import threading
    import types

    seen: list[float | None] = []

    class Recorded(threading.Thread):
        def join(self, timeout=None):
            seen.append(timeout)
            super().join(timeout)
    monkeypatch.setattr(hub, "threading", types.SimpleNamespace(Thread=Recorded))
    return seen


def test_no_connection(waits):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/tiny", endpoint=closed_port_endpoint(), timeout=3)
    assert caught.value.kind in ("offline", "timeout")
    assert "cannot reach" in str(caught.value) or "did not answer" in str(caught.value)
    assert waits == [3]  # one wait, bounded by the timeout (its time: bench/bench_refusals.py)


def test_timeout_is_bounded(fake, waits):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/slow", timeout=0.5)
    assert caught.value.kind == "timeout" and "0.5 s" in str(caught.value)
    assert waits == [0.5]  # the server waits 3 s; the one wait on the fetch is bounded by the timeout


def test_oversized_config_is_refused_before_download(fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("org/huge")
    assert caught.value.kind == "too_large"
    assert f"{hub.MAX_CONFIG_BYTES:,}" in str(caught.value)
    # the size came from the HEAD; no GET
    assert [m for m, path, _ in fake.requests if "/org/huge/" in path] == ["HEAD"]


@pytest.mark.parametrize("repo", ["org/broken", "org/array"])
def test_malformed_config(repo):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config(repo)
    assert caught.value.kind == "malformed" and "JSON" in str(caught.value)
    assert_one_line(caught.value)


@pytest.mark.parametrize("model", ["", "   ", "noslash", "a/b/c", "org/na me", "org/-bad", "org/a--b",
                                   "org/tiny@", "org/tiny@../x"])
def test_invalid_repo_id(model, fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config(model)
    assert caught.value.kind == "invalid_id" and caught.value.field == "model"
    assert fake.requests == []


@pytest.mark.parametrize("model", [f"org/tiny@{GOOD_TOKEN}", f"{GOOD_TOKEN}/tiny",
                                   f"https://user:{GOOD_TOKEN}@huggingface.co/org/tiny",
                                   f"org/tiny?token={GOOD_TOKEN}"])
def test_a_token_in_the_model_string_is_refused_and_not_echoed(model, fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config(model)
    assert caught.value.kind == "invalid_id"
    assert_one_line(caught.value, GOOD_TOKEN)
    assert fake.requests == []


# --- revisions: git ref names only, never a path ------------------------------------------------

SHA = "0123456789abcdef0123456789abcdef01234567"


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_a_revision_naming_a_path_writes_nothing_there(tmp_path, fake, monkeypatch):
    """huggingface_hub caches a revision under refs/<revision>; an absolute one would land outside."""
    target = tmp_path / "outside" / "x"
    fake.add("org/escape", {"config.json": TINY}, revisions={str(target): {"config.json": TINY}})
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_model(f"org/escape@{target}")
    assert caught.value.kind == "invalid_id" and caught.value.field == "model"
    assert "refs/pr/N" in caught.value.allowed
    assert not target.exists() and files_under(tmp_path) == []
    assert fake.requests == []


@pytest.mark.parametrize("revision", ["/some/dir/x", "a/", "a//b", ".hidden", "a/.x", "x.lock", "x.",
                                      "a/../../b", "..", "@", "a@{1}", "a\\b", "a b", "a\tb", "a~1", "a^",
                                      "a:b", "a?", "a*", "a[", "a\x7f", "v" * 257])
def test_revisions_git_refuses_are_refused_before_any_request(revision, tmp_path, fake, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_model(f"org/tiny@{revision}")
    assert caught.value.kind == "invalid_id"
    with pytest.raises(hub.HubError):  # the same rule for a revision passed on its own
        hub.fetch_config("org/tiny", revision=revision)
    assert fake.requests == [] and files_under(tmp_path) == []


def test_a_path_in_a_pasted_tree_url_is_refused(fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config("https://huggingface.co/org/tiny/tree/%2Fetc%2Fx")
    assert caught.value.kind == "invalid_id" and fake.requests == []


def test_branch_tag_commit_and_pr_revisions_are_fetched(fake):
    layers = {"main": 2, "v1.0": 3, SHA: 4, "refs/pr/3": 5, "feature/x-1_y": 6}
    fake.add("org/revs", {"config.json": TINY},
             revisions={rev: {"config.json": {**TINY, "num_hidden_layers": n}} for rev, n in layers.items()})
    for rev, n in layers.items():
        assert hub.parse_hub_id(f"org/revs@{rev}") == ("org/revs", rev)
        assert hub.fetch_config(f"org/revs@{rev}")["num_hidden_layers"] == n
    assert hub.parse_hub_id("https://huggingface.co/org/revs/tree/refs%2Fpr%2F3") == ("org/revs", "refs/pr/3")


@pytest.mark.parametrize("model", ["_org/name_", "Org-1.x/Model_2.5-b"])
def test_repo_ids_the_hub_allows(model):
    assert hub.parse_hub_id(model) == (model, None)


@pytest.mark.parametrize("model", [f"org/{'a' * 97}", f"{'a' * 97}/name", "org/name.git", "org/.name",
                                   "org/name-", "-org/name", "org/a..b", "org/na+me", "org/name/extra"])
def test_repo_ids_the_hub_refuses(model, fake):
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_config(model)
    assert caught.value.kind == "invalid_id" and "96" in caught.value.allowed
    assert fake.requests == []


def test_a_revision_naming_a_path_is_refused_by_the_config_path(tmp_path, fake):
    from estimator.models.loading import load_config

    target = tmp_path / "outside" / "y"
    fake.add("org/escape2", {"config.json": TINY}, revisions={str(target): {"config.json": TINY}})
    with pytest.raises(hub.HubError):
        load_config({"model": f"org/escape2@{target}"})
    run = _cli(tmp_path, f"org/escape2@{target}")
    assert run.returncode == 2 and "revision" in run.stderr and len(run.stderr.splitlines()) == 1
    assert not target.exists() and fake.requests == []


def test_hub_module_has_no_redaction_of_its_own():
    """One redaction for every message: estimator.errors'."""
    from estimator.spec import errors

    assert not hasattr(hub, "_SECRET") and not hasattr(hub, "_redacted")
    with pytest.raises(hub.HubError) as caught:
        hub.parse_hub_id(f"org/tiny?access_token={GOOD_TOKEN}")
    assert caught.value.value == errors.REDACTED and GOOD_TOKEN not in str(caught.value)
    with pytest.raises(hub.HubError) as caught:  # a revision passed on its own is checked alike
        hub.fetch_config("org/tiny", revision=GOOD_TOKEN)
    assert caught.value.value == errors.REDACTED and GOOD_TOKEN not in str(caught.value)


# --- stored parameter counts --------------------------------------------------------------------

def test_safetensors_count_single_file():
    expected = numel({**tiny_tensors(range(2)), **EMBED})
    assert hub.fetch_parameter_count("org/tiny") == expected


def test_safetensors_count_sharded_with_a_long_header(fake):
    expected = numel({**tiny_tensors(range(2)), **EMBED})
    assert hub.fetch_parameter_count("org/sharded") == expected
    ranges = [headers.get("range") for m, path, headers in fake.requests
              if m == "GET" and path.endswith("00002.safetensors")]
    assert "bytes=0-100000" in ranges and any(r and r.startswith("bytes=8-") for r in ranges)


def test_safetensors_count_absent_for_a_bin_only_repo():
    assert hub.fetch_parameter_count("org/bin-only") is None


def test_safetensors_count_errors_are_hub_errors():
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_parameter_count("meta/gated")
    assert caught.value.kind == "gated"
    # huggingface_hub's get_safetensors_metadata reports an unknown repository as "not a
    # safetensors repo"; fetch_model asks for config.json first, which names the real problem.
    assert hub.fetch_parameter_count("org/does-not-exist") is None
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_model("org/does-not-exist")
    assert caught.value.kind == "not_found"


def test_fetch_model_counts_agree():
    model = hub.fetch_model("org/tiny")
    arch, _ = architecture_from_hf_config(TINY)
    assert model.computed_total == parameter_counts(arch).total
    assert model.stored_count == numel({**tiny_tensors(range(2)), **EMBED}) == model.computed_total
    assert model.mismatch is False and model.ignored == []


def test_fetch_model_flags_a_mismatch():
    model = hub.fetch_model("org/wrong-count")  # the checkpoint lacks the embedding and head
    assert model.stored_count == numel(tiny_tensors(range(2)))
    assert model.mismatch is True


def test_fetch_model_without_safetensors():
    model = hub.fetch_model("org/bin-only")
    assert model.stored_count is None and model.mismatch is None and "safetensors" in model.count_note


# --- import hygiene -----------------------------------------------------------------------------

def test_importing_estimator_does_not_import_huggingface_hub():
    code = ("import sys, estimator, estimator.models.hub, estimator.models.presets, estimator.models.hf_config; "
            "print('huggingface_hub' in sys.modules, 'httpx2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.stdout.split() == ["False", "False"]


def test_tiny_fixture_matches_the_config():
    """The fake checkpoint is the architecture's own tensor list, counted independently."""
    assert json.loads(json.dumps(TINY)) == TINY
    assert numel(tiny_tensors(range(1))) == 4 * 64 * 64 + 3 * 128 * 64 + 2 * 64


def _cli(tmp_path, model, env_extra=None):
    import json as _json
    import os
    path = tmp_path / "config.json"
    path.write_text(_json.dumps({"model": model, "parallel": {"tp": 1}}))
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                          capture_output=True, text=True, env=env)


def test_cli_estimates_a_hub_model(tmp_path, fake):
    import json as _json
    run = _cli(tmp_path, "org/tiny")
    assert run.returncode == 0, run.stderr
    assert _json.loads(run.stdout)["stages"][0]["layers"] == TINY["num_hidden_layers"]
    pinned = _cli(tmp_path, "org/tiny@v1")  # the revision's config has one layer
    assert _json.loads(pinned.stdout)["stages"][0]["layers"] == 1


def test_cli_gated_model_is_one_line_and_exit_2(tmp_path, fake):
    run = _cli(tmp_path, "meta/gated")
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "licence" in run.stderr
    assert "Traceback" not in run.stderr
