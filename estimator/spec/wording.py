"""Words the command line and the app both print, spelled once.

The verdict codes (``fits``, ``tight``, ``oom``: `memory.result.fit_on`) are the JSON's and the CSV's
values; people read `VERDICT_WORDS`, the same in the app, the CLI's text and the PDF and CSV
exports.
"""

from __future__ import annotations

VERDICT_WORDS = {"fits": "Fits", "tight": "Tight", "oom": "OOM"}
VERDICT_MEANINGS = {"fits": "below 80% of the GPU's memory", "tight": "80-100% of the GPU's memory",
                    "oom": "out of memory: above the GPU's capacity"}


def verdict_word(code: str) -> str:
    """How a verdict code is written for people ("OOM" for ``oom``)."""
    return VERDICT_WORDS.get(code, code)


def duration(seconds: float) -> str:
    """A time as short as it reads whole: milliseconds below a second ("116.0 ms"), seconds above
    ("10.40 s", "227 s"); a metric's value is cut at its column's width ("10,401.4 ms" was)."""
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds:,.2f} s" if seconds < 100 else f"{seconds:,.0f} s"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun in the number it takes: "1 GPU", "8 GPUs", "2 micro-batches"."""
    word = noun if n == 1 else plural or (noun + "es" if noun.endswith(("ch", "sh", "s", "x")) else noun + "s")
    return f"{n:,} {word}"
