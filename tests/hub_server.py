"""A small fake Hugging Face Hub on 127.0.0.1 for the tests of `estimator.hub`.

It serves what the real `huggingface_hub` client (2.4.x) asks for when it runs
`hf_hub_download` and `get_safetensors_metadata` (read from its source,
``file_download.py``, ``utils/_http.py`` and ``hf_api.py``):

- ``HEAD`` and ``GET /{org}/{name}/resolve/{revision}/{path}``. A found file answers with
  ``X-Repo-Commit`` (40 hex digits: without it the client refuses the file), ``ETag`` (the
  blob id the cache is keyed on) and ``Content-Length``; ``GET`` honours ``Range: bytes=a-b``
  with ``206`` and ``Content-Range`` (the safetensors header reads ``bytes=0-100000``, then
  ``bytes=8-N`` when the header is longer).
- Errors carry ``X-Error-Code``, which `hf_raise_for_status` turns into exceptions:
  ``RepoNotFound`` (404), ``GatedRepo`` (401 without a token, 403 with one that has no access),
  ``RevisionNotFound`` (404), ``EntryNotFound`` (404, with ``X-Repo-Commit``).

No Xet headers are sent, so the client downloads over plain HTTP. Each request is recorded in
`FakeHub.requests` (method, path, headers with lower-case names) so tests can check what was sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Repo:
    files: dict[str, bytes]  # path -> content, for revision "main"
    gated: bool = False
    allowed_tokens: tuple[str, ...] = ()  # tokens that were granted access to a gated repo
    revisions: dict[str, dict[str, bytes]] = field(default_factory=dict)  # other revisions
    delay: float = 0.0  # seconds to wait before answering (timeouts)


def commit_of(repo_id: str, revision: str) -> str:
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], metadata: dict | None = None,
                      pad_header_to: int = 0) -> bytes:
    """A header-only safetensors file: 8-byte little-endian header length, the JSON header,
    no tensor data (the client reads only the header). `pad_header_to` pads the header with
    spaces, as the format allows, to exercise the client's second range read."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "U8": 1}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    if len(raw) < pad_header_to:
        raw += b" " * (pad_header_to - len(raw))
    return struct.pack("<Q", len(raw)) + raw


class FakeHub:
    """Start with `start()`, point the client at `endpoint`, stop with `stop()`."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- set-up -------------------------------------------------------------------------------
    def add(self, repo_id: str, files: dict[str, bytes | dict | str], **kwargs) -> Repo:
        encoded = {path: _encode(content) for path, content in files.items()}
        revisions = {rev: {p: _encode(c) for p, c in fs.items()} for rev, fs in kwargs.pop("revisions", {}).items()}
        repo = Repo(files=encoded, revisions=revisions, **kwargs)
        self.repos[repo_id] = repo
        return repo

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _encode(content: bytes | dict | str) -> bytes:
    if isinstance(content, bytes):
        return content
    if isinstance(content, str):
        return content.encode()
    return json.dumps(content).encode()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        payload = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _serve(self, body: bool) -> None:
        self.fake.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        match = _RESOLVE.match(self.path.split("?", 1)[0])
        if match is None:
            self._error(404, "RepoNotFound", "Not found")
            return
        repo_id, revision, path = match["repo"], unquote(match["rev"]), unquote(match["path"])
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        if repo.delay:
            time.sleep(repo.delay)
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
            if token is None:
                self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated to access it. Please log in.")
                return
            if token not in repo.allowed_tokens:
                self._error(403, "GatedRepo", "Access to model is restricted and you are not in the authorized list.")
                return
        files = repo.files if revision == "main" else repo.revisions.get(revision)
        if files is None:
            self._error(404, "RevisionNotFound", "Invalid rev id")
            return
        commit = commit_of(repo_id, revision)
        content = files.get(path)
        if content is None:
            self._error(404, "EntryNotFound", "Entry not found", commit=commit)
            return
        status, chunk, extra = 200, content, {}
        rng = self.headers.get("Range") if body else None
        if rng:
            m = _RANGE.match(rng.strip())
            if m:
                start = int(m[1])
                end = int(m[2]) if m[2] else len(content) - 1
                end = min(end, len(content) - 1)
                chunk = content[start:end + 1]
                status = 206
                extra["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", '"' + hashlib.sha1(content).hexdigest() + '"')
        self.send_header("Content-Length", str(len(chunk)))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(chunk)
