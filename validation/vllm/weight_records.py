"""Record the tensors vLLM's quantized linear methods create per weight format and TP rank, on CPU.

Run inside a venv holding vLLM (see kv_records.py):

    /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.weight_records --out tests/data/serving/vllm-0.11.0-weights.json

Each format's ``LinearMethod.create_weights`` is called the way vLLM's ColumnParallelLinear and
RowParallelLinear call it (input_size_per_partition, output_partition_sizes), for Llama-3.1-8B's fused
gate/up projection (column-parallel) and down projection (row-parallel) at TP 1, 2 and 4; the record is
every parameter's shape, dtype and bytes. These are the tensors as the checkpoint is loaded into them,
before ``process_weights_after_loading`` (which repacks on the GPU). vLLM's platform checks ask a GPU; on
CPU they are answered as on an H100 (compute capability 9.0, the CUTLASS kernels available), the TP
group as a single rank, and the current config as the default compilation config: none of that
changes a tensor's shape.
"""

from __future__ import annotations

import argparse
import sys
import types

from validation.core.record import write_json

SHAPES = {"gate_up_proj": ("column", 4096, 2 * 14336), "down_proj": ("row", 14336, 4096)}


def _pretend_hopper() -> None:
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    cls = type(current_platform)
    cls.get_device_capability = classmethod(lambda c, device_id=0: DeviceCapability(9, 0))
    cls.has_device_capability = classmethod(
        lambda c, cap, device_id=0: 90 >= (cap if isinstance(cap, int) else cap[0] * 10 + cap[1]))


def _stand_ins() -> None:
    from vllm.config import CompilationConfig
    import vllm.distributed.parallel_state as parallel_state
    fake = types.SimpleNamespace(compilation_config=CompilationConfig(level=3))
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if not name.startswith("vllm"):
            continue
        for attr in list(vars(module)):
            if attr.startswith("cutlass_") and "supports" in attr:
                setattr(module, attr, lambda *a, **k: True)
        if getattr(module, "get_current_vllm_config", None) is not None:
            module.get_current_vllm_config = lambda: fake
    parallel_state._TP = types.SimpleNamespace(world_size=1, rank_in_group=0, rank=0)
    import vllm.model_executor.parameter as parameter
    parameter.get_tensor_model_parallel_rank = lambda: 0
    parameter.get_tensor_model_parallel_world_size = lambda: 1
    from vllm.platforms import current_platform
    type(current_platform).is_cuda = lambda self: True


def _methods():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.awq_marlin import AWQMarlinConfig, AWQMarlinLinearMethod
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod
    from vllm.model_executor.layers.quantization.gptq_marlin import GPTQMarlinConfig, GPTQMarlinLinearMethod
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config, ModelOptNvFp4LinearMethod
    _stand_ins()
    return {
        "bf16": lambda: UnquantizedLinearMethod(),
        "fp8": lambda: Fp8LinearMethod(Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic")),
        "fp8_block": lambda: Fp8LinearMethod(Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                                                       weight_block_size=[128, 128])),
        "gptq_int4": lambda: GPTQMarlinLinearMethod(GPTQMarlinConfig(
            weight_bits=4, group_size=128, desc_act=False, is_sym=True, lm_head_quantized=False, dynamic={},
            full_config={})),
        "awq_int4": lambda: AWQMarlinLinearMethod(AWQMarlinConfig(
            weight_bits=4, group_size=128, zero_point=True, lm_head_quantized=False, modules_to_not_convert=None,
            full_config={})),
        "nvfp4": lambda: ModelOptNvFp4LinearMethod(ModelOptNvFp4Config(
            is_checkpoint_nvfp4_serialized=True, kv_cache_quant_algo=None, exclude_modules=[], group_size=16)),
    }


def create(method, split: str, inp: int, out: int, tp: int) -> dict:
    import torch
    layer = torch.nn.Module()
    in_part, out_part = (inp, out // tp) if split == "column" else (inp // tp, out)
    method.create_weights(layer, in_part, [out_part], inp, out, torch.bfloat16, weight_loader=lambda *a, **k: None)
    return {name: {"shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                   "bytes": p.numel() * p.element_size()} for name, p in layer.named_parameters()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import vllm
    _pretend_hopper()
    records = []
    for fmt, make in _methods().items():
        for layer, (split, inp, out) in SHAPES.items():
            for tp in (1, 2, 4):
                records.append({"format": fmt, "layer": layer, "split": split, "input_size": inp, "output_size": out,
                                "tp": tp, "parameters": create(make(), split, inp, out, tp)})
    command = f"{sys.executable} -m validation.vllm.weight_records --out {args.out}  (vllm=={vllm.__version__}; CPU)"
    write_json(args.out, {"command": command, "vllm_version": vllm.__version__, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
