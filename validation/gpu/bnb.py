"""QLoRA as the HF stack runs it: bitsandbytes 4-bit layers under peft adapters (the fake-tensor
harness uses torchao's NF4 instead, since bitsandbytes' `Params4bit` cannot wrap a fake tensor).

`from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))` replaces every
nn.Linear but the LM head by `bnb.nn.Linear4bit` (transformers integrations/bitsandbytes.py,
`replace_with_bnb_linear`, `modules_to_not_convert` = the output embedding) and quantizes each
weight as it is moved to the GPU (`Params4bit._quantize`). With no checkpoint to load, the model is
built in bf16 on the GPU and each linear is replaced and quantized in place, which leaves the same
tensors. `prepare=True` also runs peft's `prepare_model_for_kbit_training` (what most QLoRA recipes
call): every parameter that is not 4-bit is cast to fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..peft.build import LoraRun, enable_recompute, lora_config, model_config, trainable_parameters


@dataclass(frozen=True)
class BnbRun(LoraRun):
    """A LoraRun (its `double_quant` is BitsAndBytesConfig's bnb_4bit_use_double_quant, its `prepare`
    peft's prepare_model_for_kbit_training) run with bitsandbytes itself."""


def quantize_linears(model: nn.Module, double_quant: bool) -> int:
    import bitsandbytes as bnb

    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child is model.get_output_embeddings():
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=double_quant,
                                      quant_type="nf4", device="meta")
            weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=double_quant,
                                       quant_type="nf4")
            layer.weight = weight.to(child.weight.device)  # quantized here
            if child.bias is not None:
                layer.bias = nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, layer)
            count += 1
    return count


def build(run: BnbRun, device: str):
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        base = AutoModelForCausalLM.from_config(model_config(run), dtype=torch.bfloat16)
    for p in base.parameters():
        p.requires_grad_(False)
    quantize_linears(base, run.double_quant)
    base.is_loaded_in_4bit = True  # what from_pretrained sets; peft dispatches its bnb LoRA layers on it
    if device == "cuda":
        torch.cuda.empty_cache()  # the bf16 weights replaced: a checkpoint load never held them all
    if run.prepare:
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=run.recompute == "full",
                                               gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, lora_config(run))
    model.train()
    if run.recompute == "full" and not run.prepare:
        enable_recompute(model)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=2e-4, weight_decay=0.0, fused=device == "cuda")
    return model, opt
