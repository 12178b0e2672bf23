"""SGLang: a ``python -m sglang.launch_server --model-path MODEL ...`` line (see `serve`)."""

from __future__ import annotations

from .result import Imported
from .serve import looks_like_sglang, read_serve

KIND = "sglang"


def looks_like(text: str, name: str = "") -> bool:
    return looks_like_sglang(text)


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    return read_serve(text, "sglang", gpus, overrides)
