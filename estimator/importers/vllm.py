"""vLLM: a ``vllm serve MODEL ...`` line (see `serve`)."""

from __future__ import annotations

from .result import Imported
from .serve import looks_like_vllm, read_serve

KIND = "vllm"


def looks_like(text: str, name: str = "") -> bool:
    return looks_like_vllm(text)


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    return read_serve(text, "vllm", gpus, overrides)
