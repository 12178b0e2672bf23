"""The torchtune harness's declaration (validation/core/harness.py), and the environment it runs
in: torchtune 0.6.1 needs torchao 0.10.0, which the other harnesses cannot share, so `list`,
`measure`, `explain` and `selftest` re-run themselves with .venv/torchtune's Python when torchtune
is not importable here; `report` reads the records only."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..core.harness import Command, Harness

VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv" / "torchtune" / "bin" / "python"

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF records (validation/record.py): torchtune's "
    "own model builder and the step of recipes/full_finetune_single_device.py (loss * tokens, "
    "backward, scale_grads, optimizer step, zero_grad; or per-parameter optimizers stepped in "
    "the backward) run under torch FakeTensorMode on CPU; every tensor storage is logged when "
    "an op creates it and when it is freed, rounded up to 512 bytes as the CUDA caching "
    "allocator does. The model is built on the meta device in bf16, its RoPE buffers computed "
    "for real (they stay on the GPU: counted with the activations, also given in buffer_bytes), "
    "then given fake CPU storage. CUDA behaviour emulated: FlashAttention-2 allocations for SDPA "
    "(torchtune expands the KV heads before it), F.rms_norm dispatched as on CUDA (validation/emulation.py "
    "fused_rms_norm; torchtune's fp32 input with a bf16 scale takes the composite path there too: "
    "layer_norm.cpp refuses the fused kernel on a dtype mismatch), fused AdamW with its step counters on the "
    "device, host scalars not counted. Activation offloading: torchtune's OffloadActivations "
    "runs unchanged with CUDA streams and events as no-ops, its pinned host copies not counted "
    "and each copy back a new device storage (validation/torchtune/emulation.py). torchao "
    "AdamW8bit: its 8-bit states (uint8 codes, fp32 scale per 256, qmap) are measured; its "
    "torch.compile'd per-parameter step runs eagerly and uncounted (updates in place) beside the scratch "
    "Inductor's kernels allocate for it, counted: each 8-bit state's new codes and block scales "
    "(validation/torchtune/inductor_scratch.py). Step 2 "
    "is measured. Categories: parameters, gradients, optimizer_states, activations (everything "
    "else, buffers and the batch included). Validated byte for byte against real CPU runs of "
    "tiny models (tests/test_harness_torchtune.py)."
)


def in_torchtune_env(argv: list[str]) -> int | None:
    """Re-run in the torchtune venv when torchtune is missing here; None when it is here."""
    if importlib.util.find_spec("torchtune") is not None:
        return None
    if not VENV_PYTHON.exists():
        print(f"torchtune is not installed here and {VENV_PYTHON} does not exist; create it: "
              "python -m venv --system-site-packages .venv/torchtune && .venv/torchtune/bin/pip "
              "install torchtune==0.6.1 torchao==0.10.0 -c <torch pin>", file=sys.stderr)
        return 2
    root = str(VENV_PYTHON.parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    os.execve(str(VENV_PYTHON), [str(VENV_PYTHON), "-m", "validation.torchtune", *argv], env)


HARNESS = Harness(
    name="torchtune", title="torchtune", order=(4, 3), method=METHOD, distributions=("torch", "torchtune", "torchao"),
    report="report:report", trace="step:traced_step", prepare="plugin:in_torchtune_env",
    commands=(Command("selftest", "tiny models measured fake and real, as JSON", "selftest:main",
                      arguments=("variants",)),))
