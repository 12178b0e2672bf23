"""bitsandbytes' 4-bit linear layer as the HF Trainer's QLoRA runs it, emulated for fake tensors.

transformers' ``load_in_4bit`` replaces every ``nn.Linear`` of the decoder layers with
bitsandbytes' ``Linear4bit``, whose weight (``Params4bit``) is quantized when it moves to the GPU,
and peft wraps each adapted one with its own ``lora.bnb.Linear4bit``. ``Params4bit`` cannot hold a
fake tensor, so this module rebuilds, from bitsandbytes' source, what those layers allocate and
keep; tests/test_harness_peft.py checks it against the real library on a tiny CPU run.

Storage (bitsandbytes 0.49.2 ``functional.quantize_4bit``, ``backends/cuda/ops.py``): the codes
packed two per byte, ``uint8 [(n + 1) // 2, 1]``; per weight its own 16-entry fp32 NF4 code book
(``get_4bit_type`` builds one per call); with double quantization (``compress_statistics``) the
absmax of every 64 weights quantized to ``uint8 [n / 64]``, an fp32 absmax per 256 of those, their
fp32 mean (``offset``), and a copy of the 256-entry fp32 dynamic code book (``quantize_blockwise``:
``code.to(A.device, copy=True)``) per weight; without it, an fp32 absmax per 64 weights.

The layer (``nn.Linear4bit.forward``): the input cast to the compute dtype (a no-op for a bf16
input), then ``MatMul4Bit``: the forward dequantizes the whole weight (``dequantize_4bit``: the
absmax first, ``dequantize_blockwise`` into a new fp32 ``[n / 64]`` when nested, then a new
``[out, in]`` tensor in the weight's dtype) and multiplies; the backward dequantizes again for the
input's gradient. What it keeps for backward: the packed weight and its state, and its input A
through bitsandbytes 0.43.1 (``ctx.tensors = (A, B)``); from 0.43.2 on (commit 9e753741, PR #1270
"fix QLoRA mem bug: delete useless buffered activation") ``(None, B)``: nothing of the activations.
Both only when the input or the weight needs a gradient.

peft's wrapper (peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear4bit.forward``): the base output is
cloned ("defensively", per its comment), the input cast to the adapters' dtype (fp32), and without
autocast the adapter's output is cast back to the base output's dtype before the sum.
"""

from __future__ import annotations

import torch
from torch import nn

# bitsandbytes' last release whose MatMul4Bit keeps its input for backward
LAST_SAVING_INPUT = (0, 43, 1)
BLOCK = 64  # weights per absmax (quantize_4bit's blocksize)
NESTED_BLOCK = 256  # absmax values per second-level absmax (quantize_blockwise)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def saves_input(version: str) -> bool:
    return version_tuple(version) <= LAST_SAVING_INPUT


class QuantState:
    """The tensors of one weight's quantization state (bitsandbytes ``QuantState``)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype, nested: bool, device) -> None:
        n = shape.numel()
        blocks = -(-n // BLOCK)
        self.shape, self.dtype, self.nested = shape, dtype, nested
        self.code = torch.zeros(16, dtype=torch.float32, device=device)  # its own NF4 code book
        if nested:
            self.absmax = torch.zeros(blocks, dtype=torch.uint8, device=device)
            self.state2_absmax = torch.zeros(-(-blocks // NESTED_BLOCK), dtype=torch.float32, device=device)
            self.offset = torch.zeros((), dtype=torch.float32, device=device)
            self.dynamic_code = torch.zeros(256, dtype=torch.float32, device=device)  # its own copy
        else:
            self.absmax = torch.zeros(blocks, dtype=torch.float32, device=device)

    def tensors(self) -> list[torch.Tensor]:
        out = [self.code, self.absmax]
        if self.nested:
            out += [self.state2_absmax, self.offset, self.dynamic_code]
        return out


def dequantize_4bit(state: QuantState, device) -> torch.Tensor:
    """What ``functional.dequantize_4bit`` allocates on CUDA: the nested absmax dequantized into a
    new fp32 tensor (``dequantize_blockwise``, then ``+= offset`` in place), freed on return, and the
    weight in its dtype (``torch.empty(shape, dtype)``). The values are zeros: only the memory is
    emulated."""
    if state.nested:
        absmax = torch.zeros(state.absmax.shape, dtype=torch.float32, device=device)
        absmax += state.offset
        del absmax
    return torch.zeros(state.shape, dtype=state.dtype, device=device)


class MatMul4Bit(torch.autograd.Function):
    """bitsandbytes ``autograd._functions.MatMul4Bit`` (0.49.2; 0.43.1 and before also keep A)."""

    @staticmethod
    def forward(ctx, A, B, bias, state: QuantState, keep_input: bool):
        weight = dequantize_4bit(state, A.device).to(A.dtype)
        output = torch.nn.functional.linear(A, weight, bias)
        del weight
        ctx.state = state
        ctx.bias_dtype = None if bias is None else bias.dtype
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A if keep_input else None, B)
        else:
            ctx.tensors = (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        req_grad_a, _, req_grad_bias, _, _ = ctx.needs_input_grad
        grad_a = grad_bias = None
        if req_grad_bias:
            grad_bias = grad_output.sum(0, dtype=ctx.bias_dtype)
        if req_grad_a:
            grad_a = torch.matmul(grad_output, dequantize_4bit(ctx.state, grad_output.device).to(grad_output.dtype))
        return grad_a, None, grad_bias, None, None


class Linear4bit(nn.Linear):
    """bitsandbytes ``nn.Linear4bit`` (compute dtype bf16). Built like an ``nn.Linear`` (so peft and
    the meta-device build treat it as one) until `quantize` replaces its weight by the packed codes."""

    def __init__(self, in_features: int, out_features: int, bias: bool, compute_dtype: torch.dtype,
                 keep_input: bool, double_quant: bool, **kw) -> None:
        super().__init__(in_features, out_features, bias, **kw)
        self.compute_dtype, self.keep_input, self.double_quant = compute_dtype, keep_input, double_quant
        self.quant_state: QuantState | None = None

    def quantize(self) -> None:
        """``Params4bit._quantize`` on the move to the GPU: the bf16 weight gives way to its codes."""
        w = self.weight
        state = QuantState(w.shape, w.dtype, self.double_quant, w.device)
        packed = torch.zeros(((w.numel() + 1) // 2, 1), dtype=torch.uint8, device=w.device)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.quant_state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return MatMul4Bit.apply(x, self.weight.t(), bias, self.quant_state, self.keep_input).to(inp_dtype)


def replace_linears(model: nn.Module, keep_input: bool, double_quant: bool) -> int:
    """transformers' ``replace_with_bnb_linear`` for ``load_in_4bit``: every ``nn.Linear`` of the
    decoder layers (the LM head stays: ``llm_int8_skip_modules`` defaults to the output embedding).
    Runs on the meta model before peft wraps it; returns how many."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and ".layers." in full:
                new = Linear4bit(child.in_features, child.out_features, child.bias is not None, torch.bfloat16,
                                 keep_input, double_quant, device=child.weight.device, dtype=child.weight.dtype)
                setattr(module, child_name, new)
                count += 1
    return count


def quantize(model: nn.Module) -> None:
    """Quantize every emulated Linear4bit (after its weight has storage)."""
    for layer in [m for m in model.modules() if isinstance(m, Linear4bit)]:
        layer.quantize()


def _quant_state(module: nn.Module):
    """A 4-bit layer's quantization state: the emulation's, or real bitsandbytes' (on its Params4bit;
    not peft's wrapper, whose ``weight`` is its base layer's)."""
    if isinstance(module, Linear4bit):
        return module.quant_state
    if type(module).__module__.startswith("bitsandbytes"):
        return getattr(module.weight, "quant_state", None)
    return None


def _tensors(state) -> list[torch.Tensor]:
    if isinstance(state, QuantState):
        return state.tensors()
    out = [state.code, state.absmax]  # bitsandbytes' QuantState
    if state.nested:
        out += [state.state2.absmax, state.offset, state.state2.code]
    return out


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The quantization states' tensors, each once: bitsandbytes keeps them on the Params4bit, not as
    parameters or buffers; the harness counts them with the parameters."""
    seen: dict[int, torch.Tensor] = {}
    for m in model.modules():
        state = _quant_state(m)
        if state is not None:
            for t in _tensors(state):
                seen.setdefault(id(t.untyped_storage()), t)
    return list(seen.values())


def logical_numel(model: nn.Module) -> int:
    """Weights the packed 4-bit codes stand for beyond their own element count (two per byte)."""
    return sum(m.in_features * m.out_features - m.weight.numel() for m in model.modules()
               if _quant_state(m) is not None)


def real_peft_model(run):
    """The same model with real bitsandbytes (for the tiny CPU check): every linear of the decoder
    layers a ``bitsandbytes.nn.Linear4bit`` quantized on its move to the device, as transformers'
    ``load_in_4bit`` builds it, and peft's own ``lora.bnb.Linear4bit`` around the adapted ones."""
    import bitsandbytes as bnb
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from .build import lora_config, model_config
    base = AutoModelForCausalLM.from_config(model_config(run), dtype=torch.bfloat16)
    for name, module in list(base.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and ".layers." in f"{name}.{child_name}":
                new = bnb.nn.Linear4bit(child.in_features, child.out_features, child.bias is not None,
                                        compute_dtype=torch.bfloat16, compress_statistics=run.double_quant,
                                        quant_type="nf4")
                new.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                               compress_statistics=run.double_quant, quant_type="nf4")
                if child.bias is not None:
                    new.bias = nn.Parameter(child.bias.data, requires_grad=False)
                setattr(module, child_name, new.to("cpu"))  # Params4bit quantizes on the move
    config = lora_config(run)
    config._custom_modules = None  # peft's own bitsandbytes dispatch
    return get_peft_model(base, config)


def lora_layer_class():
    """peft's ``lora.bnb.Linear4bit`` for the emulated layer: peft's LoRA ``Linear`` with the bnb
    wrapper's forward (peft 0.21.2 tuners/lora/bnb.py), registered as a custom module."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    class LoraLinear4bit(LoraLinear):
        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            result = self.base_layer(x, *args, **kwargs)
            result = result.clone()  # "defensively clone" (peft's comment, after Tim Dettmers)
            for active_adapter in self.active_adapters:
                if active_adapter not in self.lora_A.keys():
                    continue
                lora_A, lora_B = self.lora_A[active_adapter], self.lora_B[active_adapter]
                dropout, scaling = self.lora_dropout[active_adapter], self.scaling[active_adapter]
                requires_conversion = not torch.is_autocast_enabled()
                if requires_conversion:
                    expected_dtype = result.dtype
                    x = self._cast_input_dtype(x, lora_A.weight.dtype)
                if active_adapter not in self.lora_variant:
                    output = lora_B(lora_A(dropout(x))) * scaling
                    if requires_conversion:
                        output = output.to(expected_dtype)
                    result = result + output
                else:
                    result = self.lora_variant[active_adapter].forward(self, active_adapter=active_adapter, x=x,
                                                                       result=result)
                    if requires_conversion:
                        result = result.to(expected_dtype)
            return result

    return LoraLinear4bit
