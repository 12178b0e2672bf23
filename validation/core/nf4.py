"""torchao's NF4 tensor, wherever the installed torchao keeps it."""

from __future__ import annotations

import logging


def _nf4_module():
    # torchao logs every optional CUDA extension it cannot load on a CPU build: not our concern.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    try:  # torchao >= 0.15
        from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor
    except ImportError:  # torchao 0.10 (the one torchtune 0.6.1 imports)
        from torchao.dtypes import nf4tensor as nf4_tensor
    return nf4_tensor


def to_nf4(weight):
    """NF4 with torchao's (and QLoRA's) defaults: blocks of 64, scales double-quantized in
    blocks of 256. torchao asserts numel / 64 is a multiple of 256."""
    return _nf4_module().to_nf4(weight, block_size=64, scaler_block_size=256)


def nf4_class():
    return _nf4_module().NF4Tensor
