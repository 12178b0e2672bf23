"""``serving.limit_mm_per_prompt``: vLLM's --limit-mm-per-prompt as "modality=count" pairs (issue 24).

vLLM takes a JSON object ('{"image": 1, "video": 0}'); the config, the CLI and the URL take the same limits as
"image=1,video=0", which needs no quoting. A modality not named keeps vLLM's default of 999 items per prompt
(config/multimodal.py, 0.11.0 and 0.33.0).
"""

from __future__ import annotations

from .choices import MM_LIMITS_TEXT as PATTERN_TEXT
from .errors import ConfigError

DEFAULT_LIMIT = 999  # vLLM's default per prompt and modality (config/multimodal.py)
FIELD = "serving.limit_mm_per_prompt"


def parse_limits(text: str | None) -> dict[str, int]:
    """The limits the text names, {modality: count}; {} for None. The field's pattern has already held the form;
    a modality named twice is refused here."""
    if not text:
        return {}
    limits: dict[str, int] = {}
    for pair in text.split(","):
        modality, count = pair.split("=")
        if modality in limits:
            raise ConfigError(FIELD, text, PATTERN_TEXT, f"'{modality}' is named twice")
        limits[modality] = int(count)
    return limits


def limits_for(text: str | None, supported: tuple[str, ...], model: str) -> dict[str, int]:
    """Every modality the model takes with its limit (999 where not named). vLLM keeps only the model's own
    modalities (get_allowed_mm_limits: 0.11.0 multimodal/processing.py, 0.33.0 multimodal/processing/context.py):
    a 0 for another one ('video=0' for Gemma 3) asks for what the model does anyway and is taken; a limit above 0
    for it would change nothing, so it is refused rather than dropped."""
    given = parse_limits(text)
    for modality, count in given.items():
        if modality not in supported and count > 0:
            allowed = f"limits above 0 for {', '.join(supported)} only" if supported else "empty for a text-only model"
            raise ConfigError(FIELD, text, allowed, f"{model} takes no {modality} input")
    return {m: given.get(m, DEFAULT_LIMIT) for m in supported}
