"""Tiny torchtune runs measured fake and real, printed as JSON for tests/test_harness_torchtune.py
(which runs this in the torchtune environment: `python -m validation.torchtune selftest`)."""

from __future__ import annotations

import json
from dataclasses import asdict

from .build import TuneRun

SEQ, BATCH = 64, 2

VARIANTS = {
    "plain": TuneRun("tiny-llama3_1", SEQ, BATCH),
    "ac-chunked": TuneRun("tiny-llama3_1", SEQ, BATCH, activation_checkpointing=True, loss="chunked"),
    "offload": TuneRun("tiny-llama3_1", SEQ, BATCH, activation_offloading=True),
    "ac-offload-inbwd": TuneRun("tiny-llama3_1", SEQ, BATCH, activation_checkpointing=True,
                                activation_offloading=True, loss="chunked", optimizer_in_bwd=True),
    "inbwd": TuneRun("tiny-llama3_1", SEQ, BATCH, optimizer_in_bwd=True),
    "adamw8bit": TuneRun("tiny-llama3_1", SEQ, BATCH, optimizer="adamw8bit"),
    "qwen2": TuneRun("tiny-qwen2", SEQ, BATCH, activation_checkpointing=True),
    # lora_qwen2 builds a RoPE module in every layer's attention (lora_qwen2_self_attention)
    "qwen2-lora": TuneRun("tiny-qwen2", SEQ, BATCH, activation_checkpointing=True, loss="chunked", method="lora"),
    "llama3_2-tied-offload": TuneRun("tiny-llama3_2", SEQ, BATCH, activation_offloading=True, loss="chunked"),
    "lora": TuneRun("tiny-llama3_1", SEQ, BATCH, activation_checkpointing=True, loss="chunked", method="lora"),
    "qlora-offload": TuneRun("tiny-llama3_1-256", SEQ, BATCH, activation_offloading=True, loss="chunked",
                             method="qlora"),
    # lora_finetune_distributed on rank 0 of a fake 2-rank process group (FSDP2)
    "lora-fsdp2": TuneRun("tiny-llama3_1-256", SEQ, BATCH, activation_checkpointing=True, loss="chunked",
                          method="lora", world=2),
    "qlora-fsdp2": TuneRun("tiny-llama3_1-256", SEQ, BATCH, activation_checkpointing=True, loss="chunked",
                           method="qlora", world=2),
}


def main(names=None) -> int:
    from .step import measure

    out = {}
    for name in names or VARIANTS:
        run = VARIANTS[name]
        out[name] = {"run": asdict(run), "fake": measure(run, fake=True), "real": measure(run, fake=False)}
    print(json.dumps(out))
    return 0
