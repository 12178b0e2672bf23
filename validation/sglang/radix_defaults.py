"""Whether SGLang keeps its radix cache when the serve line says nothing about it: ``ServerArgs`` resolved
(every model hook's declarations) on CPU for a grid of checkpoints, recorded for
tests/test_serving_prefix_default.py, which holds estimator/serving/prefix_default.py to it.

    /work/venvs/sglang-helper/bin/python -m validation.sglang.radix_defaults --out tests/data/serving/sglang-0.5.23-radix.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from validation.core.record import write_json
from validation.sglang.pool_records import _cuda_quantizations, _gpu_memory, _platform, _server_args

# (name, preset whose config.json is served, changes to that config): the presets as published, and an
# EmbeddingGemma-shaped checkpoint (Gemma 3's text model with bidirectional attention, whose hook turns the cache off)
CASES = [
    ("llama-3.1-8b", "llama-3.1-8b", {}),
    ("qwen3-next-80b-a3b", "qwen3-next-80b-a3b", {}),
    ("nemotron-h-8b", "nemotron-h-8b", {}),
    ("gemma-3-27b", "gemma-3-27b", {}),
    ("embeddinggemma-shaped", "gemma-3-27b", {"text_only": True, "use_bidirectional_attention": True}),
]


def checkpoint(preset: str, changes: dict) -> dict:
    from estimator.models.presets import get_hf_config
    raw = get_hf_config(preset)
    if changes.get("text_only"):
        raw = dict(raw["text_config"], model_type="gemma3_text", architectures=["Gemma3TextModel"],
                   vocab_size=262208, max_position_embeddings=131072, torch_dtype="bfloat16")
    return {**raw, **{k: v for k, v in changes.items() if k != "text_only"}}


def run_case(case) -> dict:
    name, preset, changes = case
    raw = checkpoint(preset, changes)
    with tempfile.TemporaryDirectory() as model_dir, _platform("h100-80"):
        with open(os.path.join(model_dir, "config.json"), "w") as fh:
            json.dump(raw, fh)
        _gpu_memory(81559)
        from sglang.srt.arg_groups.overrides import resolved_view
        args = resolved_view(_server_args(model_dir, 1, 1, {}))  # no --disable-radix-cache
    return {"name": name, "preset": preset, "changes": changes, "disable_radix_cache": args.disable_radix_cache}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from validation.sglang.stubs import install
    install()
    import sglang
    _cuda_quantizations()
    records = []
    for case in CASES:
        try:
            records.append(run_case(case))
        except Exception as err:  # a checkpoint SGLang refuses is recorded with its message
            records.append({"name": case[0], "preset": case[1], "changes": case[2],
                            "error": f"{type(err).__name__}: {err}"[:400]})
        print(json.dumps(records[-1]), flush=True)
    command = f"{sys.executable} -m validation.sglang.radix_defaults --out {args.out}  (sglang=={sglang.__version__})"
    write_json(args.out, {"command": command, "sglang_version": sglang.__version__, "records": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
