"""vLLM's own prefix-caching default for a model: ``ModelConfig.is_prefix_caching_supported`` (config/model.py, the
default engine/arg_utils.py takes when --enable-prefix-caching is not given) with its ``attn_type``, built on CPU
from each preset's config.json, recorded for tests/test_serving_prefix_default.py. Releases whose ModelConfig
has the property (0.15 on); a checkpoint vLLM cannot inspect in the CPU venv is recorded with its error.

    /work/venvs/vllm/0.33.0/bin/python -m validation.vllm.prefix_defaults --out tests/data/serving/prefix-vllm-0.33.0.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from validation.core.record import write_json

PRESETS = ["llama-3.1-8b", "gemma-3-27b", "nemotron-h-8b", "falcon-h1-7b", "jamba-mini-1.5", "qwen3-next-80b-a3b"]


def run_case(preset: str) -> dict:
    from estimator.models.presets import get_hf_config
    from vllm.config.model import ModelConfig
    with tempfile.TemporaryDirectory() as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as fh:
            json.dump(get_hf_config(preset), fh)
        config = ModelConfig(model=model_dir, skip_tokenizer_init=True)
        return {"preset": preset, "attn_type": config.attn_type,
                "is_prefix_caching_supported": config.is_prefix_caching_supported}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import vllm
    records = []
    for preset in PRESETS:
        try:
            records.append(run_case(preset))
        except Exception as err:  # recorded, not guessed
            records.append({"preset": preset, "error": f"{type(err).__name__}: {err}"[:300]})
        print(json.dumps(records[-1]), flush=True)
    command = f"{sys.executable} -m validation.vllm.prefix_defaults --out {args.out}  (vllm=={vllm.__version__}; CPU)"
    write_json(args.out, {"command": command, "vllm_version": vllm.__version__, "records": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
