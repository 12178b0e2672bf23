"""Fetching a model's ``config.json`` and its stored parameter count from the Hugging Face Hub.

Built on `huggingface_hub` (2.4.x), imported lazily inside the functions: importing this module
(or `estimator`) does no I/O and does not import `huggingface_hub`.

- `fetch_config` downloads ``config.json`` only (`hf_hub_download`), into the usual HF cache.
- `fetch_parameter_count` reads the safetensors headers (`get_safetensors_metadata`: HTTP range
  reads of each shard's header, never the weights) and sums the stored parameters.
- `fetch_model` combines both with `hf_config.architecture_from_hf_config` and the estimator's
  own count.

Settings are read when a function is called, not at import, so that changing them takes effect
(huggingface_hub itself reads its ``HF_*`` variables once, at its import):

- endpoint: the ``endpoint`` argument, else ``HF_ENDPOINT``, else https://huggingface.co;
- offline: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) true: the cache only, no request;
- token: the ``token`` argument, else ``HF_TOKEN``; never parsed from the model string, never
  stored in a file, never shown in a message (a model string that looks like it carries a
  credential is rejected without echoing it);
- cache: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else huggingface_hub's default.

Every failure is a `HubError` (a `ConfigError` on the field ``model``) with a one-line message.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar
from urllib.parse import unquote

from ..spec.architecture import Architecture, parameter_counts
from ..spec.errors import ConfigError, looks_secret, redact

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_CONFIG_BYTES = 2 * 1024 * 1024  # a config.json is a few KB; anything this large is not one
DEFAULT_TIMEOUT = 5.0

_ALLOWED_ID = "a Hugging Face model id: org/name, optionally @revision"

T = TypeVar("T")


class HubError(ConfigError):
    """A model that could not be fetched from the Hub. `kind` is one of: ``invalid_id``,
    ``not_found``, ``gated``, ``revision_not_found``, ``no_config``, ``offline``, ``timeout``,
    ``too_large``, ``malformed``, ``http``."""

    def __init__(self, kind: str, value: object, reason: str, allowed: str = _ALLOWED_ID):
        self.kind = kind
        super().__init__("model", value, allowed, reason)


# --- the model string ---------------------------------------------------------------------------

# The Hub's rules for a repository id (huggingface_hub.utils.validate_repo_id): org and name of
# letters, digits, "-", "_", "."; neither starts nor ends with "-" or "."; at most 96 characters.
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_NAME}/{_NAME}")
_ALLOWED_REPO = ("org/name: letters, digits, '-', '_' and '.', at most 96 characters each, neither "
                 "starting nor ending with '-' or '.', no '--' or '..'")
# A revision is a git ref name (git check-ref-format), which also covers a 40-hex commit and the
# Hub's refs/pr/N. huggingface_hub joins it to a cache path (refs/<revision>), so anything that
# could climb out of that folder (a leading "/", "..", a backslash) must be refused here.
_REF_FORBIDDEN = re.compile(r"[\s~^:?*\[\\]|\.\.|//|@\{")
MAX_REVISION_CHARS = 256
_ALLOWED_REVISION = ("a branch or tag name (git ref-name rules: no leading or trailing '/', no '//', '..', "
                     "'@{', backslash, space or any of ~^:?*[), a 40-hex commit, or refs/pr/N")
_HUB_URL = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/")


def _revision_problem(revision: str) -> str | None:
    """Why `revision` is not a git ref name, or None when it is one."""
    if not revision:
        return "empty revision"
    if len(revision) > MAX_REVISION_CHARS:
        return f"a revision longer than {MAX_REVISION_CHARS} characters"
    if revision == "@" or _REF_FORBIDDEN.search(revision) or not revision.isprintable():
        return "a revision with a character or sequence git refuses in a ref name"
    if revision.startswith("/") or revision.endswith(("/", ".")):
        return "a revision that starts with '/' or ends with '/' or '.'"
    if any(part.startswith(".") or part.endswith(".lock") for part in revision.split("/")):
        return "a revision with a part that starts with '.' or ends with '.lock'"
    return None


def _check_revision(model: str, revision: str) -> str:
    if looks_secret(revision):  # later messages quote the revision
        raise HubError("invalid_id", redact(revision), "a token must not be part of the revision")
    problem = _revision_problem(revision)
    if problem:
        raise HubError("invalid_id", model, problem, _ALLOWED_REVISION)
    return revision


def parse_hub_id(model: str) -> tuple[str, str | None]:
    """``"org/name@revision"`` (or a huggingface.co URL of the model) -> (repo id, revision).

    The one check of a model string before anything touches the network or the disk. Raises
    `HubError` (field ``model``, kind ``invalid_id``) naming what is allowed."""
    if not isinstance(model, str) or not model.strip():
        raise HubError("invalid_id", model, "empty or not a string")
    text = model.strip()
    if looks_secret(text):  # the placeholder, not the token, is what the error keeps and shows
        raise HubError("invalid_id", redact(text),
                       "a token must not be part of the model string; set HF_TOKEN or pass it separately")
    text, revision = _split_revision(model, text)
    if not _REPO_ID.fullmatch(text) or "--" in text or ".." in text or text.endswith(".git"):
        raise HubError("invalid_id", model, "not a valid repository id", _ALLOWED_REPO)
    return text, None if revision is None else _check_revision(model, revision)


def _split_revision(model: str, text: str) -> tuple[str, str | None]:
    """The repo part and the revision (unchecked) of ``org/name@rev``, or of a pasted Hub URL."""
    from_url = bool(_HUB_URL.match(text))
    if from_url:
        text = _HUB_URL.sub("", text).rstrip("/")
    text, at, revision = text.partition("@")
    if "/tree/" not in text:
        return text, revision if at else None
    if at:
        raise HubError("invalid_id", model, "two revisions given: /tree/ and @", _ALLOWED_REVISION)
    text, tree = text.split("/tree/", 1)
    return text, unquote(tree) if from_url else tree  # the Hub's URLs encode refs/pr/N as refs%2Fpr%2FN


# --- settings read at call time -------------------------------------------------------------------

def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_settings(endpoint: str | None = None, token: str | None = None) -> dict[str, Any]:
    """The endpoint, offline flag, token and cache folder in effect now."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE")
    if not cache and env.get("HF_HOME"):
        cache = os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    return {
        "endpoint": (endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
        "offline": _true(env.get("HF_HUB_OFFLINE")) or _true(env.get("TRANSFORMERS_OFFLINE")),
        # False (not None) tells huggingface_hub not to look for a stored login either
        "token": token or env.get("HF_TOKEN") or False,
        "cache_dir": os.path.expanduser(cache) if cache else None,
    }


# --- error translation ----------------------------------------------------------------------------

def _translate(error: BaseException, repo_id: str, what: str, settings: dict,
               revision: str | None = None) -> HubError:
    """A huggingface_hub/httpx2 exception as a one-line HubError (no traceback, no token)."""
    import httpx2
    from huggingface_hub import errors as hf

    where = settings["endpoint"]
    if isinstance(error, HubError):
        return error
    if isinstance(error, hf.GatedRepoError):  # before RepositoryNotFoundError, its base class
        has_token = bool(settings["token"])
        how = ("the token in use has not been granted access: accept the licence on "
               if has_token else "accept the licence on ")
        return HubError("gated", repo_id,
                        f"{repo_id} is a gated model; {how}{where}/{repo_id} and then set HF_TOKEN "
                        "to a read token of that account", "a model you have been granted access to")
    if isinstance(error, hf.RepositoryNotFoundError):
        return HubError("not_found", repo_id,
                        f"no model {repo_id} on {where} (or it is private: set HF_TOKEN to a token that can read it)")
    if isinstance(error, hf.RevisionNotFoundError):
        return HubError("revision_not_found", repo_id, f"{repo_id} has no revision {revision!r}",
                        "an existing branch, tag or commit of the model")
    if isinstance(error, hf.LocalEntryNotFoundError) or isinstance(error, hf.OfflineModeIsEnabled):
        if settings["offline"] or isinstance(error, hf.OfflineModeIsEnabled):
            return HubError("offline", repo_id,
                            f"offline mode (HF_HUB_OFFLINE) is on and the {what} of {repo_id} is not in the local cache",
                            "a model already in the local Hugging Face cache, or unset HF_HUB_OFFLINE")
        cause = error.__cause__ or error.__context__
        if isinstance(cause, httpx2.TimeoutException):
            return _timeout(repo_id, settings)
        return HubError("offline", repo_id, f"cannot reach the Hugging Face Hub at {where} (no connection?) "
                        f"and the {what} of {repo_id} is not in the local cache",
                        "a reachable Hub, or a model already in the local cache")
    if isinstance(error, hf.EntryNotFoundError):
        return HubError("no_config", repo_id, f"{repo_id} has no {what}",
                        "a transformers model repository with a config.json")
    if isinstance(error, httpx2.TimeoutException):
        return _timeout(repo_id, settings)
    if isinstance(error, (httpx2.ConnectError, httpx2.NetworkError, httpx2.RemoteProtocolError, ConnectionError)):
        return HubError("offline", repo_id, f"cannot reach the Hugging Face Hub at {where} (no connection?)",
                        "a reachable Hub, or a model already in the local cache")
    if isinstance(error, hf.HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 401:
            return HubError("http", repo_id, "the Hub refused the token (HTTP 401): check HF_TOKEN")
        return HubError("http", repo_id, f"the Hub answered HTTP {status} for the {what} of {repo_id}")
    if isinstance(error, hf.HFValidationError):
        return HubError("invalid_id", repo_id, "not a valid repository id")
    return HubError("http", repo_id, f"could not fetch the {what} of {repo_id} ({type(error).__name__})")


def _timeout(repo_id: str, settings: dict) -> HubError:
    return HubError("timeout", repo_id, f"the Hugging Face Hub at {settings['endpoint']} did not answer within "
                    f"{settings['timeout']:g} s", "a reachable Hub (or a longer timeout)")


def _bounded(call: Callable[[], T], timeout: float, on_timeout: Callable[[], HubError]) -> T:
    """Run `call` in a daemon thread and give up after `timeout` seconds.

    huggingface_hub retries a timed-out HEAD with a 60 s timeout and five back-offs before it
    gives up, so its own timeouts do not bound the wait; this does. The abandoned thread is a
    daemon: it never blocks the interpreter's exit."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as error:  # handed to the caller below
            box["error"] = error

    thread = threading.Thread(target=run, name="estimator-hub-fetch", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise on_timeout()
    if "error" in box:
        raise box["error"]
    return box["value"]


# --- fetching -------------------------------------------------------------------------------------

def _split(repo_id: str, revision: str | None) -> tuple[str, str | None]:
    parsed, rev = parse_hub_id(repo_id)
    if revision is not None:  # an explicit revision reaches the cache path as much as one in the id
        _check_revision(repo_id, revision)
    if revision is not None and rev is not None and revision != rev:
        raise HubError("invalid_id", repo_id, f"two revisions given: {rev!r} in the id and {revision!r}")
    return parsed, revision or rev


def fetch_config(repo_id: str, revision: str | None = None, token: str | None = None,
                 endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """The model's ``config.json`` as a dict. `repo_id` may be ``"org/name@revision"``.

    Downloads that one file (or reads it from the cache when offline). Raises `HubError`."""
    repo_id, revision = _split(repo_id, revision)
    settings = hub_settings(endpoint, token)
    settings["timeout"] = timeout

    def download() -> str:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

        common = dict(repo_id=repo_id, filename="config.json", revision=revision,
                      token=settings["token"], endpoint=settings["endpoint"], cache_dir=settings["cache_dir"],
                      etag_timeout=timeout)
        if settings["offline"]:
            return hf_hub_download(local_files_only=True, **common)
        # One HEAD of our own, without huggingface_hub's retries (it retries a failed HEAD with a
        # 60 s timeout and five back-offs): it gives the size before any download, and its
        # failure is reported at once. Like hf_hub_download, fall back to a cached copy.
        url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=settings["endpoint"])
        try:
            meta = get_hf_file_metadata(url, token=settings["token"], timeout=timeout,
                                        endpoint=settings["endpoint"])
        except Exception as probe_error:
            try:
                return hf_hub_download(local_files_only=True, **common)
            except Exception:
                raise probe_error from None
        if meta.size and meta.size > MAX_CONFIG_BYTES:
            raise _too_large(repo_id, meta.size)
        return hf_hub_download(**common)

    try:
        path = _bounded(download, timeout, lambda: _timeout(repo_id, settings))
    except HubError:
        raise
    except Exception as error:
        raise _translate(error, repo_id, "config.json", settings, revision) from None
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise _too_large(repo_id, size)
    try:
        with open(path, "rb") as f:
            config = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HubError("malformed", repo_id, f"the config.json of {repo_id} is not valid JSON "
                       f"({type(error).__name__} at position {getattr(error, 'pos', getattr(error, 'start', '?'))})",
                       "a config.json that is a JSON object") from None
    if not isinstance(config, dict):
        raise HubError("malformed", repo_id, f"the config.json of {repo_id} is a JSON {type(config).__name__}, "
                       "not an object", "a config.json that is a JSON object")
    return config


def _too_large(repo_id: str, size: int) -> HubError:
    return HubError("too_large", repo_id, f"the config.json of {repo_id} is {size:,} bytes, more than "
                    f"{MAX_CONFIG_BYTES:,}", f"a config.json of at most {MAX_CONFIG_BYTES:,} bytes")


def fetch_parameter_count(repo_id: str, revision: str | None = None, token: str | None = None,
                          endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> int | None:
    """The number of parameters the checkpoint stores: the sum over dtypes of the safetensors
    headers' tensor sizes (the Hub's "safetensors total"). None when the repository has no
    standard safetensors files or their headers cannot be parsed (huggingface_hub also reports an
    unknown repository that way; `fetch_model` asks for config.json first). Raises `HubError` for the
    failures `fetch_config` reports (in offline mode: ``offline``: the count needs the Hub)."""
    repo_id, revision = _split(repo_id, revision)
    settings = hub_settings(endpoint, token)
    settings["timeout"] = timeout
    if settings["offline"]:
        raise HubError("offline", repo_id, f"offline mode (HF_HUB_OFFLINE) is on: the stored parameter count of "
                       f"{repo_id} needs the Hub", "unset HF_HUB_OFFLINE")

    def count() -> int | None:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError

        api = HfApi(endpoint=settings["endpoint"], token=settings["token"])
        try:
            meta = api.get_safetensors_metadata(repo_id, revision=revision, timeout=timeout)
        except (NotASafetensorsRepoError, SafetensorsParsingError):
            return None
        return int(sum(meta.parameter_count.values()))

    try:
        return _bounded(count, timeout, lambda: _timeout(repo_id, settings))
    except HubError:
        raise
    except Exception as error:
        raise _translate(error, repo_id, "safetensors metadata", settings, revision) from None


@dataclass(frozen=True)
class HubModel:
    """A Hub model: its architecture and both parameter counts.

    `stored_count` is what the checkpoint holds (None when unknown: no safetensors, offline, or
    the count failed, see `count_note`); `computed_total` / `computed_active` are the estimator's
    counts of `architecture`; `mismatch` is True when both counts are known and differ (a
    quantised checkpoint with packed weights or scale tensors, a vision tower, an architecture
    detail the mapping does not know)."""

    repo_id: str
    revision: str | None
    config: dict
    architecture: Architecture
    ignored: list[str]
    stored_count: int | None
    computed_total: int
    computed_active: int
    mismatch: bool | None
    count_note: str = ""
    extra: dict = field(default_factory=dict)


def fetch_model(model: str, revision: str | None = None, token: str | None = None,
                endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                count: bool = True) -> HubModel:
    """Fetch ``config.json`` (required) and the stored parameter count (best effort)."""
    from .hf_config import architecture_from_hf_config

    repo_id, revision = _split(model, revision)
    config = fetch_config(repo_id, revision=revision, token=token, endpoint=endpoint, timeout=timeout)
    arch, ignored = architecture_from_hf_config(config, name=repo_id)
    counts = parameter_counts(arch)
    stored, note = None, ""
    if count:
        try:
            stored = fetch_parameter_count(repo_id, revision=revision, token=token, endpoint=endpoint,
                                           timeout=timeout)
            if stored is None:
                note = "the repository has no standard safetensors files to count"
        except HubError as error:
            note = str(error)
    mismatch = None if stored is None else stored != counts.total
    if mismatch and isinstance(config.get("quantization_config"), dict):
        note = note or "quantised checkpoint: stored tensors (packed weights, scales) differ from parameters"
    return HubModel(repo_id=repo_id, revision=revision, config=config, architecture=arch, ignored=ignored,
                    stored_count=stored, computed_total=counts.total, computed_active=counts.active,
                    mismatch=mismatch, count_note=note)
