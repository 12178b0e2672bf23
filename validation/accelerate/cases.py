"""The measured cases of the HF Trainer's step through Accelerate, and each one's configuration in the
contract's JSON format (the plain harness's, with `training_loop: "trainer"`).

Each base run is one the plain harnesses measure (or could: the same Run / LoraRun), so a record
compares with its plain-loop sibling: full fine-tuning of pure-bf16 models (the Trainer's
`bf16=True` over a model loaded in bf16) and one AMP run (fp32 weights), LoRA (fp32 adapters over
a bf16 base), QLoRA with and without peft's prepare_model_for_kbit_training; and TRL's SFTTrainer step over
five of them (validation/accelerate/trl_sft.py; the loss type in the id and the description, the contract
configuration still `training_loop: "trainer"`).
"""

from __future__ import annotations

from ..hf.cases import case_id as hf_case_id, contract_config as hf_config, describe as hf_describe
from ..peft.build import ALL_SEVEN, LoraRun
from ..hf.step import Run
from ..peft.cases import CASES as PEFT_CASES
from ..peft.cases import case_id as peft_case_id, contract_config as peft_config, describe as peft_describe
from .harness import AccelerateRun


def case_id(run: AccelerateRun) -> str:
    base = peft_case_id(run.base) if run.lora else hf_case_id(run.base)
    trl = f"-trl-sft-{run.trl_sft}" if run.trl_sft else ""
    return f"{base}-accelerate-{run.mixed_precision}{trl}"


def _lora(model, seq, batch=1, recompute="none", **kw) -> LoraRun:
    return LoraRun(model, seq, batch, rank=16, alpha=32, targets=ALL_SEVEN, recompute=recompute, **kw)


def _runs() -> list[AccelerateRun]:
    A, P = AccelerateRun, PEFT_CASES
    return [
        # full fine-tuning, pure bf16: Accelerate's fp32 copy of the logits beside the loss's own fp32 upcast
        A(Run("qwen2.5-0.5b", 2048, 2)), A(Run("qwen2.5-0.5b", 8192, recompute="full")),
        A(Run("llama-3.2-1b", 2048)), A(Run("llama-3.2-1b", 4096, 2, recompute="full")),
        A(Run("llama-3.1-8b", 4096)),
        # AMP: fp32 weights under Accelerate's autocast (the plain harness's own autocast otherwise)
        A(Run("llama-3.2-1b", 2048, recipe="amp")),
        # LoRA: fp32 adapters under autocast
        A(_lora("qwen2.5-0.5b", 2048)), A(_lora("qwen2.5-0.5b", 8192, recompute="full")),
        A(_lora("llama-3.2-1b", 2048)), A(_lora("llama-3.2-1b", 4096)),
        A(P["llama-3.1-8b-lora-r16-qv-norecompute-drop00-s4096-b1"]),
        A(P["llama-3.1-8b-lora-r16-all7-norecompute-drop00-s2048-b1"]),
        A(P["llama-3.1-8b-lora-r16-all7-recompute-drop00-s4096-b1"]),
        A(P["qwen2.5-7b-lora-r16-alllinear-recompute-drop00-s8192-b1"]),
        # adapter dropout (on peft's fp32 cast of the input, before lora_A's autocast) and DoRA
        A(_lora("llama-3.2-1b", 2048, dropout=0.05)), A(P["llama-3.1-8b-lora-r8-qv-norecompute-drop05-s2048-b2"]),
        A(P["llama-3.1-8b-dora-r16-qv-norecompute-drop00-s2048-b1"]), A(P["qwen3-8b-dora-r8-qv-norecompute-drop05-s2048-b1"]),
        # QLoRA (emulated bitsandbytes NF4), plain and with prepare_model_for_kbit_training's fp32 norms,
        # embeddings and head: under autocast SDPA gets bf16 inputs again (the flash path)
        A(P["llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1"]),
        A(P["llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1-prepared"]),
        # TRL's SFTTrainer (trl 1.9.0, trl_sft.py) over five of the bases above, with each loss type: "nll" (trl
        # 1.6.0 and earlier's default: the fp32 logits kept for entropy and accuracy) and "chunked_nll" (1.7.0 on:
        # the head in checkpointed 256-token chunks over an fp32 copy of its weight)
        *(A(base, trl_sft=loss) for base in (
            Run("qwen2.5-0.5b", 2048, 2), Run("qwen2.5-0.5b", 8192, recompute="full"),
            Run("llama-3.2-1b", 4096, 2, recompute="full"), Run("llama-3.1-8b", 4096),
            P["llama-3.1-8b-lora-r16-all7-recompute-drop00-s4096-b1"]) for loss in ("nll", "chunked_nll")),
    ]


CASES: dict[str, AccelerateRun] = {case_id(r): r for r in _runs()}


def contract_config(run: AccelerateRun) -> dict:
    config = peft_config(run.base) if run.lora else hf_config(run.base)
    config["training"]["training_loop"] = "trl_sft" if run.trl_sft else "trainer"
    if run.trl_sft:  # TRL's loss_type: chunked_nll is loss "chunked" under its loop (activations/trl_loss.py)
        config["training"]["loss"] = "chunked" if run.trl_sft == "chunked_nll" else "standard"
    return config


def describe(run: AccelerateRun) -> str:
    base = peft_describe(run.base) if run.lora else hf_describe(run.base)
    step = (f"TRL's SFTTrainer.training_step (trl 1.9.0, SFTConfig loss_type '{run.trl_sft}'; a batch of "
            f"full-length sequences, every token a target)" if run.trl_sft else "the HF Trainer's step")
    return (f"{base}; through {step} with the real Accelerate: Accelerator(mixed_precision="
            f"'{run.mixed_precision}').prepare (autocast and convert_outputs_to_fp32 around the forward), "
            f"accelerator.backward, clip_grad_norm_ to 1.0")
