"""Record the sizes of MXFP4 expert matrices after the Hopper swizzle of each vLLM release's own triton_kernels, on CPU.

    python3 -m validation.vllm.mxfp4_swizzle --out tests/data/serving/mxfp4-hopper-swizzle.json \\
        0.15.0=/path/to/vllm-0.15.0 0.19.0=/path/to/vllm-0.19.0 ...

Each path is an unpacked vLLM wheel (its Python files); the release's bundled copy,
vllm/third_party/triton_kernels, is imported alone (a fresh interpreter per release) and its
``convert_layout`` is called the way vLLM's utils/mxfp4_utils.py ``_swizzle_mxfp4`` calls it on Hopper: the
uint8 values [E, N, K/2] and scales [E, N, K/32] transposed to put K on dim 1, wrapped (values as FP4) and
converted to HopperMXValueLayout(mx_axis=1) and HopperMXScaleLayout(mx_axis=1, num_warps=8); from 0.33 the
scales are first padded to 4 columns (0.33.0 _swizzle_mxfp4). The swizzle is pure torch, so it runs on CPU; one
expert is enough (the expert dimension is never padded). The record is the bytes of each swizzled tensor for
gpt-oss's gate-up (2I x 2880) and down (2880 x I) matrices at intermediate sizes per rank 2880, 1472 (TP 2,
padded to 64) and 768 (TP 4, 720 padded to 64); needs the `triton` package (its kernels are imported, not run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from validation.core.record import write_json

HIDDEN = 2880
INTERMEDIATE = (2880, 1472, 768)
SCALE_COLUMNS_TO_4 = (0, 33)  # 0.33.0 utils/mxfp4_utils.py _swizzle_mxfp4: "pad K (num scale groups) to 0 mod 4"

_CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1] + "/vllm/third_party")
from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout
pad4 = sys.argv[2] == "1"
out = []
for rows, inputs in json.loads(sys.argv[3]):
    values = torch.zeros(1, rows, inputs // 2, dtype=torch.uint8)
    scales = torch.zeros(1, rows, inputs // 32, dtype=torch.uint8)
    if pad4:
        scales = torch.nn.functional.pad(scales, (0, -scales.shape[-1] % 4))
    v = convert_layout(wrap_torch_tensor(values.transpose(-2, -1), dtype=FP4), HopperMXValueLayout, mx_axis=1)
    s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), HopperMXScaleLayout, mx_axis=1, num_warps=8)
    size = lambda t: t.storage.data.numel() * t.storage.data.element_size()
    out.append({"rows": rows, "inputs": inputs, "value_bytes": size(v), "scale_bytes": size(s)})
print(json.dumps(out))
"""


def matrices() -> list[tuple[int, int]]:
    """(output rows, inputs) of gate-up and down for each intermediate size."""
    return [m for i in INTERMEDIATE for m in ((2 * i, HIDDEN), (HIDDEN, i))]


def record(release: str, path: str) -> dict:
    version = tuple(int(x) for x in release.split(".")[:2])
    pad4 = "1" if version >= SCALE_COLUMNS_TO_4 else "0"
    done = subprocess.run([sys.executable, "-c", _CHILD, path, pad4, json.dumps(matrices())],
                          capture_output=True, text=True, check=True)
    return {"vllm_version": release, "experts": 1, "matrices": json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("releases", nargs="+", help="RELEASE=PATH of an unpacked vLLM wheel")
    args = parser.parse_args()
    records = [record(*item.split("=", 1)) for item in args.releases]
    command = "python3 -m validation.vllm.mxfp4_swizzle --out " + args.out + " " + " ".join(
        item.split("=", 1)[0] + "=<vllm-" + item.split("=", 1)[0] + " wheel>" for item in args.releases)
    write_json(args.out, {"command": command, "records": records})


if __name__ == "__main__":
    main()
