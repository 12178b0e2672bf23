"""peft's `prepare_model_for_kbit_training`: what it changes in a quantized-base (QLoRA) fine-tune.

Most HF QLoRA recipes call it (TRL, axolotl, the PEFT docs). peft 0.21 `utils/other.py`:

- every parameter in fp16/bf16 that is not bitsandbytes' 4-bit `Params4bit` (and every parameter
  of an 8-bit model but the int8 weights) is cast to fp32 in place: the embeddings, the norms'
  scales and the LM head (`adapters.inventory` charges them 4 bytes);
- with ``use_gradient_checkpointing=True`` (its default) it turns gradient checkpointing on, with
  the caller's kwargs (the recipes pass ``use_reentrant=False``; `training.recompute` says whether
  the run checkpoints).

What follows in transformers' Llama-style code (transformers 5.x `modeling_llama.py`): the fp32
embedding output makes the residual stream fp32; `LlamaRMSNorm` returns ``weight *
hidden.to(input_dtype)``, fp32 with an fp32 input and an fp32 scale; bitsandbytes' `Linear4bit`
casts its input to its 16-bit compute dtype and its output back to the input's dtype
(bitsandbytes 0.48 `nn/modules.py` Linear4bit.forward), so every projection's output, the
attention's q, k and v and the MLP's products are fp32; the fp32 LM head makes fp32 logits (the
loss's upcast is then no copy). So a prepared run's activations are those of an fp32 run
(`ledger_training`).

Attention: SDPA gets fp32 q, k, v. With grouped KV heads (``enable_gqa``) no fused CUDA kernel
takes them (flash and cuDNN need fp16/bf16; memory-efficient attention refuses unequal head counts:
torch 2.11 `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`, reported in
pytorch/pytorch#181528), so PyTorch runs its math backend (`attention.cpp`
`_scaled_dot_product_attention_math`), which materialises the fp32 scores: it keeps the scaled q,
the keys expanded to every head (scaled), the values expanded, and `_safe_softmax`'s fp32
output for backward (`activations.attention.attention_entries`). Its backward holds, beside that kept
softmax, the probabilities' gradient and the scores' gradient; on an H200 (torch 2.11) one more
score-sized fp32 tensor is alive at that moment (measured: tests/data/measured/gpu/llama-3.1-8b-
qlora-bnb-r16-all7-recompute-drop00-s4096-b1-prepared.json; the CPU harness, validation/peft, sees
the first two only, and its record is listed in tests/test_accuracy.py KNOWN_GAPS). With equal
head counts memory-efficient attention runs, which keeps no scores.

Under the HF Trainer's autocast (`under_autocast`) SDPA casts q, k, v to the autocast dtype and the fused kernel
runs; the fp32 LM head is cast for its matmul and that 16-bit copy is kept for backward (`autocast_head_copy`).
"""

from __future__ import annotations

from dataclasses import replace

from ..spec.errors import ConfigError

SOURCE = ("peft 0.21 utils/other.py prepare_model_for_kbit_training (16-bit parameters that are not 4-bit cast to "
          "fp32); transformers 5.x LlamaRMSNorm (weight * hidden.to(input_dtype)); bitsandbytes 0.48 Linear4bit "
          "(output cast back to the input dtype)")
MATH_SOURCE = ("torch 2.11 aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (fp32 with grouped KV heads: no fused "
               "kernel, math backend; pytorch/pytorch#181528), attention.cpp _scaled_dot_product_attention_math; "
               "the backward's third score-sized tensor measured on an H200 (tests/data/measured/gpu/"
               "llama-3.1-8b-qlora-bnb-r16-all7-recompute-drop00-s4096-b1-prepared.json)")


def prepared(training) -> bool:
    return training.adapter is not None and training.adapter.prepare_kbit


def check_prepare_kbit(adapter, training) -> None:
    """prepare_model_for_kbit_training is the HF stack's, for a quantized base of 16-bit weights."""
    from ..spec.choices import QUANTIZED
    from ..spec.adapter import base_dtype
    field = "training.adapter.prepare_kbit"
    if training.framework != "hf":
        raise ConfigError(field, True, "false unless framework is 'hf'", "it is peft's function for a "
                          "transformers model under the HF Trainer", related=("training.framework",))
    if base_dtype(adapter, training.param_dtype) not in QUANTIZED:
        raise ConfigError(field, True, f"false unless base_dtype is one of {', '.join(map(repr, QUANTIZED))}",
                          "it prepares a quantized (k-bit) base", related=("training.adapter.base_dtype",))
    if training.param_dtype not in ("bf16", "fp16"):
        raise ConfigError(field, True, "false unless param_dtype is 'bf16' or 'fp16'",
                          "it casts the 16-bit weights to fp32; fp32 weights it leaves as they are",
                          related=("training.param_dtype",))


def ledger_training(training):
    """The training setup whose activations a prepared run keeps: the same, computed in fp32."""
    return replace(training, compute_dtype="fp32") if prepared(training) else training


def under_autocast(training) -> bool:
    """A prepared run under the HF Trainer's autocast (trainer_loop.through_accelerate). Its weights are 16-bit
    (check_prepare_kbit) and no config computes wider than its weights, so the Trainer's loop is enough; read from
    the loop, which `ledger_training` keeps (its compute dtype it makes fp32)."""
    return prepared(training) and training.framework == "hf" and training.training_loop in ("trainer", "trl_sft")


def math_attention(arch, training) -> bool:
    """SDPA on fp32 q, k, v with grouped KV heads runs PyTorch's math backend (module docstring); under the
    Trainer's autocast SDPA casts them to the autocast dtype first (autocast's lower-precision list), so the
    fused kernel runs. A multi-query Falcon on SDPA runs it at any dtype (activations/sdpa_math.py)."""
    from .activations.sdpa_math import falcon_math_sdpa
    return falcon_math_sdpa(arch, training) or (
        prepared(training) and training.attention == "flash" and not arch.uses_mla
        and arch.num_kv_heads != arch.num_attention_heads and not under_autocast(training))


AUTOCAST_HEAD_SOURCE = (
    "torch autocast: F.linear is on the lower-precision list, so the fp32 LM head weight that "
    "prepare_model_for_kbit_training made is cast to the autocast dtype at every forward, and the matmul keeps that "
    "copy for the gradient of its input (aten mm backward needs mat2); measured through the real Accelerate: "
    "tests/data/measured/accelerate/llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1-prepared-accelerate-bf16")


def autocast_head_copy(arch, training, par, vocab: int):
    """A prepared run under the Trainer's autocast keeps a 16-bit copy of its fp32 LM head weight from the
    forward's head to the backward's (AUTOCAST_HEAD_SOURCE): V x h x B on the last stage (V over TP)."""
    from ..spec.dtypes import bytes_per_element
    from .components import component
    B = bytes_per_element(training.compute_dtype)
    return component("logits", "autocast's 16-bit copy of the fp32 LM head weight (kept for backward)",
                     vocab / par.tp * arch.hidden_size * B, f"{B:g} B x V x h", AUTOCAST_HEAD_SOURCE)


def score_bytes(training, par) -> float:
    """One fp32 score-sized tensor of the math backend: b x a x s x s x 4 (a over TP: adapters run at TP 1)."""
    s = training.seq_len / par.cp
    return 4.0 * training.micro_batch_size * s * training.seq_len
