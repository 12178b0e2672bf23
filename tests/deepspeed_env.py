"""DeepSpeed's own environment for the tests that run it live (test_gpu_framework_steps, test_deepspeed_partitions,
test_deepspeed_accumulation): installed beside Accelerate, DeepSpeed changes Accelerate's autocast wrapper, so it
lives in .venv/deepspeed (validation/install_frameworks.sh) and the tests run it as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEEPSPEED_PYTHON = ROOT / ".venv" / "deepspeed" / "bin" / "python"  # validation/install_frameworks.sh

needs_deepspeed = pytest.mark.skipif(
    not DEEPSPEED_PYTHON.exists(), reason="no DeepSpeed environment: python -m venv --system-site-packages "
    ".venv/deepspeed && DS_BUILD_OPS=0 .venv/deepspeed/bin/pip install deepspeed==0.19.5 -c <file pinning torch>")


def run_deepspeed(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`.venv/deepspeed/bin/python *args` from the repository root with the repository on PYTHONPATH; a test
    failure naming the command, its exit status and the tail of its stderr when it does not exit 0."""
    done = subprocess.run([str(DEEPSPEED_PYTHON), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode != 0:
        pytest.fail(f"DeepSpeed's python {' '.join(args)!r:.300} exited {done.returncode}; its stderr ends:\n"
                    f"{done.stderr[-4000:]}", pytrace=False)
    return done


def deepspeed_json(code: str, timeout: float):
    """The JSON that `code`, run by DeepSpeed's python (`-c code`), prints as its last line of stdout."""
    done = run_deepspeed("-c", code, timeout=timeout)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        pytest.fail(f"DeepSpeed's python -c {code!r:.300} ended its stdout with {last[:300]!r}, not JSON; its stderr "
                    f"ends:\n{done.stderr[-4000:]}", pytrace=False)
