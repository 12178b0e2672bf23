"""What real kernels achieve against the roofs: the fraction of peak FLOP/s or of peak memory
bandwidth that a GEMM, an attention kernel or a memory-bound kernel reaches, each from a
measured, cited source. `roofline.py` divides every operation's roof time by these fractions to
get the time a run is expected to take.

- GEMMs: the Maximum Achievable Matmul FLOPS (MAMF) each GPU reaches at its best shape
  (`MAMF`), less where the shape is small or skinny (`gemm_efficiency`).
- Flash attention: forward and backward TFLOP/s by sequence length and head width, measured on
  H100 SXM in the FlashAttention-3 paper for the two kernels frameworks run (`ATTENTION`).
- Memory-bound kernels: achieved HBM bandwidth (`BANDWIDTH_EFFICIENCY`), the extra passes an
  unfused (eager PyTorch) norm, rotary or activation makes, measured per framework's model code
  (`EAGER_TRAFFIC`), what Liger-Kernel's
  Triton kernels move instead (`LIGER_TRAFFIC`), and a launch gap per kernel (`LAUNCH_GAP_S`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.gpus import GPU

MAMF_SOURCE = ("Bekman, Machine Learning Engineering (stas00/ml-engineering), compute/accelerator/README.md, "
               "'Maximum Achievable Matmul FLOPS comparison table' (bf16 matmul, mamf-finder.py)")
FA3_SOURCE = ("Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao 2024, FlashAttention-3 (arXiv 2407.08608), "
              "figures 5-6: attention forward/backward TFLOP/s on H100 80GB SXM5, FlashAttention-2 and cuDNN "
              "bars, batch x seqlen = 16k tokens, 2048 hidden")
FA2_SOURCE = "Dao 2023, FlashAttention-2 (arXiv 2307.08691), abstract: 50-73% of the theoretical maximum on A100"
GEMM_SHAPE_SOURCE = ("NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication Background': tile and wave "
                     "quantization make small dimensions run below the large-GEMM rate")
BANDWIDTH_SOURCE = ("NVIDIA H100 NVL measured copy of 4 GiB at 90.6% of its 3.9 TB/s peak; read-read-write "
                    "91.4% (public ceiling-probe report quoting Bekman's MAMF methodology)")
LAUNCH_SOURCE = "one operation issued from Python: 4.2 us (same ceiling-probe report, eager PyTorch)"

# Best-shape bf16 matmul throughput as a fraction of the dense datasheet peak (MAMF table):
# A100 SXM 267.9/312, H100 SXM 792.1/989, GH200 821.0/989, MI300X 781.9/1300. H200 and H800 have
# the H100's compute die and are given its figure; MI325X the MI300X's (same CDNA 3 compute).
# Others: no measurement found, 0.80 (the NVIDIA rows' lower end).
MAMF = {"a100-40": 0.859, "a100-80": 0.859, "h100-80": 0.801, "h800": 0.801, "h200": 0.801, "gh200": 0.830,
        "mi300x": 0.601, "mi325x": 0.601}
MAMF_DEFAULT = 0.80
# The same table at stas00/ml-engineering 744d01e1 (issue 22's GPUs): bf16 B200 SXM 1745.0/2250, B300 SXM
# 1769.0/2250, GB200 1822.0/2500; torchtitan's 500 W H100 96GB takes the H100 SXM's share of its own peak.
MAMF.update({"b200": 0.776, "b300": 0.786, "gb200": 0.729, "h100-96-500w": 0.801})
MAMF_FP8_SOURCE = ("Bekman, Machine Learning Engineering (stas00/ml-engineering 744d01e1), compute/accelerator/"
                   "README.md, MAMF comparison table, FP8 (float8_e4m3fn) matmul")
# ... and its FP8 matmul table: H100 SXM 1402.6/1979, H200 1453.4/1979, GH200 1535.0/1979, B200 3432.5/4500,
# B300 3353.3/4500, GB200 3615.6/5000 (H800 and the 500 W H100: the H100 SXM's die). On every GPU measured an
# FP8 GEMM reaches a smaller share of its twice-as-high peak than a bf16 GEMM (H100: 70.9% against 80.3%).
# A GPU without an FP8 row takes its bf16 share.
MAMF_FP8 = {"h100-80": 0.709, "h800": 0.709, "h100-96-500w": 0.709, "h200": 0.734, "gh200": 0.776, "b200": 0.763,
            "b300": 0.745, "gb200": 0.723}
# A dimension of x elements runs at x / (x + GEMM_HALF) of the large-GEMM rate: MAMF's best shapes
# (>= 1,536 on every side) lose at most 2% per side, a 128-wide dimension a third (one tile).
GEMM_HALF = 64.0

# Inside a training step tensor-core kernels run below their isolated benchmark rate: sustained
# clocks under the step's power draw, NCCL kernels taking SMs while they overlap, and cache state
# between different kernels. No published breakdown separates these, so one factor is fitted to
# one measured run, Korthikanti et al. 2022 Table 3 (GPT-3 175B, TP 8 x PP 8 on 64 A100s,
# selective recompute: 51.4% MFU, 13.75 s an iteration), and held, unchanged, to every other
# published run in tests/test_roofline.py.
IN_STEP = 0.78

# HBM bandwidth a streaming kernel reaches (BANDWIDTH_SOURCE: ~0.9 on Hopper).
BANDWIDTH_EFFICIENCY = 0.90
# Gap per kernel launch: on the GPU back-to-back kernels leave a few microseconds; in eager PyTorch
# the CPU issues each op in ~4 us (LAUNCH_SOURCE), which a large kernel hides and a tiny one does
# not. Counted once per kernel as a floor under every operation's time.
LAUNCH_GAP_S = 4.2e-6


class Traffic(NamedTuple):
    """A memory-bound kernel's traffic over the fused kernel's bytes (each input read once, each output written
    once) and the kernels it launches."""

    passes: float
    kernels: int


FUSED = Traffic(1.0, 1)

# Eager PyTorch runs a norm, rotary embedding or gated activation as the model code's chain of aten ops, each a
# kernel that reads and writes whole tensors (often upcast to fp32), where Megatron's TransformerEngine runs one
# fused kernel. Measured (EAGER_TRAFFIC_RECORD, validation/eager_traffic.py: every aten op the chain and autograd's
# backward through it dispatch, its bytes read and written, bf16, 4096 tokens of Llama-3.1-8B) and divided by the
# fused kernel's bytes (operations._elementwise: forward in + out, backward out + 2 * in), per framework's model
# code (EAGER_CODE), per kind, (forward, backward):
# - transformers 5.23 (the HF Trainer's models: hf, fsdp1, deepspeed): LlamaRMSNorm's to(fp32), pow, mean, add,
#   rsqrt, mul, to(bf16), mul by the weight; apply_rotary_pos_emb's q * cos + rotate_half(q) * sin (neg and cat
#   of the halves) for q and k, whose backward also copies the transposed head gradient back.
# - torchtitan 0.3.0 (fsdp2): nn.RMSNorm, which torch 2.13 runs on CUDA as aten::_fused_rms_norm: one kernel
#   forward, a grad-input and a GammaBeta kernel backward that both read dY and X; ComplexRoPE's upcast, complex
#   multiply and downcast.
# - torchtune 0.6.1: RMSNorm (F.rms_norm on x.float() with a bf16 scale: the composite path on CUDA too) and
#   RotaryPositionalEmbeddings (fp32 pairs, four products, stack).
# - SwiGLU act(gate) * up: the same silu and mul in all three.
# - nn.LayerNorm ("layernorm": aten::native_layer_norm, torch's one CUDA kernel forward, a grad-input and a GammaBeta
#   kernel backward) and an ungated GELU ("gelu": one aten op each way, the fused bytes) in all three.
EAGER_TRAFFIC_RECORD = "tests/data/measured/eager_traffic/eager-traffic-bf16.json (torch 2.13, transformers 5.23, " \
                       "torchtitan 0.3.0, torchtune 0.6.1)"
# Each measured chain's (forward, backward) traffic, as the record has it (passes to 3 decimals).
EAGER_CHAIN_TRAFFIC = {
    "transformers-llama-rms-norm": (Traffic(9.002, 8), Traffic(15.335, 16)),
    "torch-rms-norm-cuda": (Traffic(1.0, 1), Traffic(1.667, 2)),
    "torch-rms-norm-composite": (Traffic(10.002, 8), Traffic(17.335, 17)),
    "torchtune-rms-norm": (Traffic(10.002, 8), Traffic(17.335, 17)),
    "transformers-rotate-half-rope": (Traffic(5.05, 10), Traffic(5.367, 16)),
    "torchtitan-complex-rope": (Traffic(5.05, 6), Traffic(3.433, 8)),
    "torchtune-rope": (Traffic(12.1, 18), Traffic(15.4, 28)),
    "swiglu": (Traffic(1.667, 2), Traffic(1.8, 3)),
    "torch-layer-norm-cuda": (Traffic(1.0, 1), Traffic(1.667, 2)),
    "gelu": (Traffic(1.0, 1), Traffic(1.0, 1)),
}
_SHARED = {"activation": "swiglu", "layernorm": "torch-layer-norm-cuda", "gelu": "gelu"}
# The chain each framework's model code runs, per kind. torchtitan's December 2024 benchmarks ran torch 1963fc8
# (2024-12), before torch's CUDA RMSNorm kernel (pytorch/pytorch PR 153666, "Fused RMSNorm implementation", 2025-05):
# nn.RMSNorm ran the composite chain.
EAGER_CHAINS = {
    "transformers": {"norm": "transformers-llama-rms-norm", "rope": "transformers-rotate-half-rope", **_SHARED},
    "torchtitan": {"norm": "torch-rms-norm-cuda", "rope": "torchtitan-complex-rope", **_SHARED},
    "torchtitan-2024-12": {"norm": "torch-rms-norm-composite", "rope": "torchtitan-complex-rope", **_SHARED},
    "torchtune": {"norm": "torchtune-rms-norm", "rope": "torchtune-rope", **_SHARED},
}
EAGER_TRAFFIC = {code: {kind: EAGER_CHAIN_TRAFFIC[chain] for kind, chain in chains.items()}
                 for code, chains in EAGER_CHAINS.items()}


def norm_group(norm: str) -> str:
    """The EAGER_TRAFFIC kind of an architecture's norm (Architecture.norm): LayerNorm is one torch kernel, an RMSNorm
    the model code's chain."""
    return "layernorm" if norm == "layernorm" else "norm"


def activation_group(gated: bool) -> str:
    """The kind of an MLP's activation: a gated one is act(gate) * up, an ungated one a single GELU."""
    return "activation" if gated else "gelu"


# Whose model code each framework runs eagerly (Megatron-Core runs TransformerEngine's fused kernels).
EAGER_CODE = {"hf": "transformers", "fsdp1": "transformers", "deepspeed": "transformers", "fsdp2": "torchtitan",
              "torchtune": "torchtune", "hf_fsdp2": "transformers"}


def eager_code(framework: str, framework_version: str | None) -> str:
    """The EAGER_TRAFFIC entry of a framework's eager model code at a release (training.framework_version)."""
    if framework == "fsdp2" and framework_version == "2024-12":
        return "torchtitan-2024-12"
    return EAGER_CODE[framework]


# Liger-Kernel's Triton kernels (training.liger_kernel: the HF Trainer's use_liger_kernel), per release, per kernel
# kind, (forward, backward), against the fused kernel's bytes (operations._elementwise: forward reads the input
# and writes the output; backward reads the output gradient and the saved input and writes the input gradient):
# - norm, ops/rms_norm.py: _rms_norm_forward_kernel reads a row of X once and writes Y and one fp32 rstd; backward
#   _rms_norm_backward_kernel reads dY and X, writes dX, and a per-SM fp32 partial of dW that _dW.sum(0) reduces
#   (a second kernel over sm_count x h: negligible bytes).
# - rope, ops/rope.py: _triton_rope rotates q and k in place (read, write), cos and sin read per token; backward
#   runs the same kernel on dq and dk with sin negated: it reads the gradient and writes it, not the saved
#   input: 2 of the fused backward's 3 passes.
# - activation, ops/swiglu.py: _swiglu_forward_kernel reads a and b, writes c; _swiglu_backward_kernel reads dc, a,
#   b, recomputes silu(a) in registers and writes da, db into a and b: the fused kernel's 3 and 5 passes.
LIGER_RELEASE = "0.8.5"
LIGER_SOURCE = (f"liger-kernel {LIGER_RELEASE} src/liger_kernel/ops/rms_norm.py, rope.py, swiglu.py (Triton kernels "
                "patched in by apply_liger_kernel_to_<model_type>)")
LIGER_TRAFFIC = {
    "0.8.5": {
        "norm": (Traffic(1.0, 1), Traffic(1.0, 2)),
        "rope": (Traffic(1.0, 1), Traffic(2 / 3, 1)),
        "activation": (Traffic(1.0, 1), Traffic(1.0, 1)),
    },
}


class AttentionCurve(NamedTuple):
    """Throughput of one attention kernel and direction as a fraction of the H100's 989 TFLOP/s:
    peak * s / (s + s_half) for a sequence of s tokens, fitted to the FA3 paper's bars (head dim
    128) at 512 and 16k; the bars between are within 5%."""

    peak: float  # fraction of the dense bf16 peak at long sequences
    s_half: float  # tokens at which the kernel reaches half of it


# FA3 paper, head dim 128 on H100 SXM5: forward with causal mask FlashAttention-2 191 (512) ... 335
# (16k), cuDNN 315 ... 539; backward FlashAttention-2 214 ... 322, cuDNN 305 ... 516 TFLOP/s.
ATTENTION = {
    ("fa2", "forward"): AttentionCurve(345 / 989, 412),
    ("fa2", "backward"): AttentionCurve(330 / 989, 278),
    ("cudnn", "forward"): AttentionCurve(550 / 989, 382),
    ("cudnn", "backward"): AttentionCurve(530 / 989, 378),
}
# Head width against 128 at long sequences (FA3 paper, same figures): width 64 forward, FA2 324 of
# 370 and cuDNN 413 of 595; width 256 (causal) FA2 298 of 335, cuDNN 509 of 539.
HEAD_DIM_FACTOR = {"fa2": {64: 0.88, 128: 1.0, 256: 0.89}, "cudnn": {64: 0.70, 128: 1.0, 256: 0.94}}
# Outside Hopper: FlashAttention-2 on A100 reaches 50-73% of peak (FA2_SOURCE), forward at the top
# of that range, backward lower; used for every non-Hopper GPU (no other measurement found).
AMPERE_ATTENTION = {"forward": AttentionCurve(0.70, 412), "backward": AttentionCurve(0.55, 278)}
HOPPER = ("h100-80", "h100-nvl", "h100-pcie", "h800", "h100-96-500w", "h200", "gh200")


def gemm_efficiency(gpu: GPU, M: float, K: float, N: float, fp8: bool = False) -> float:
    """Fraction of the dense peak (of its dtype: fp8 for an FP8 GEMM) a GEMM of (M x K) @ (K x N)
    reaches: MAMF of that dtype x the shape factor of each dimension (GEMM_SHAPE_SOURCE)."""
    shape = 1.0
    for x in (M, K, N):
        shape *= x / (x + GEMM_HALF)
    mamf = MAMF.get(gpu.id, MAMF_DEFAULT)
    if fp8:
        mamf = MAMF_FP8.get(gpu.id, mamf)
    return mamf * shape * IN_STEP


def attention_kernel(gpu: GPU, framework: str) -> str:
    """The flash kernel a framework runs: Megatron-Core's TransformerEngine picks cuDNN fused
    attention on Hopper; PyTorch SDPA (torchtitan, HF, DeepSpeed) runs FlashAttention-2."""
    return "cudnn" if framework == "megatron" and gpu.id in HOPPER else "fa2"


def attention_efficiency(gpu: GPU, framework: str, direction: str, seq: float, head_dim: int) -> float:
    """Fraction of the dense peak a flash attention kernel reaches over sequences of `seq` tokens."""
    kernel = attention_kernel(gpu, framework)
    curve = ATTENTION[kernel, direction] if gpu.id in HOPPER else AMPERE_ATTENTION[direction]
    widths = HEAD_DIM_FACTOR[kernel]
    nearest = min(widths, key=lambda w: abs(w - head_dim))
    return curve.peak * seq / (seq + curve.s_half) * widths[nearest] * IN_STEP


def traffic(group: str, implementation: str, phase: str, code: str) -> Traffic:
    """The traffic of an elementwise group ("norm", "rope", "activation" or other) in one phase, as one
    implementation runs it: "eager" (the model code `code` names, `eager_code`, as PyTorch ops, `EAGER_TRAFFIC`), "fused"
    (TransformerEngine's kernels or torch.compile's) or "liger" (Liger-Kernel's, `LIGER_TRAFFIC`; the groups it
    does not patch run eager)."""
    index = 0 if phase == "forward" else 1
    if implementation == "liger" and group in LIGER_TRAFFIC[LIGER_RELEASE]:
        return LIGER_TRAFFIC[LIGER_RELEASE][group][index]
    eager = EAGER_TRAFFIC[code] if implementation != "fused" else {}
    return eager[group][index] if group in eager else FUSED


SOURCES = (EAGER_TRAFFIC_RECORD, MAMF_SOURCE, MAMF_FP8_SOURCE, GEMM_SHAPE_SOURCE, FA3_SOURCE, FA2_SOURCE, BANDWIDTH_SOURCE, LAUNCH_SOURCE)
