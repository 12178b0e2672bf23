"""The hybrid layers' saved tensors (issue 28, estimator/spec/hybrid.py): a Gated DeltaNet mixer
(Qwen3-Next) and a Mamba-2 mixer (Nemotron-H), as transformers 5.23 runs them with the CUDA kernels
it calls when their packages are installed, and the layers and blocks they make.

Gated DeltaNet (`Qwen3NextGatedDeltaNet.forward`): in_proj_qkvz and in_proj_ba read the norm's output;
q, k, v are concatenated (`torch.cat`) and run through causal-conv1d's `causal_conv1d_fn`
(CausalConv1dFn.forward saves its input x, Dao-AILab/causal-conv1d@0d2252d causal_conv1d_interface.py),
then flash-linear-attention's `chunk_gated_delta_rule` with q/k l2-normalised in the kernel
(ChunkGatedDeltaRuleFunction.forward, fla-org/flash-linear-attention@bc3b101 ops/gated_delta_rule/
chunk.py: `ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, A, ...)`, where q and k are the
normalised copies (l2norm_fwd: a new tensor and an fp32 rstd per row), v the contiguous copy
`input_guard` makes of the conv output's view, g the fp32 chunk-cumulated decay (chunk_local_cumsum),
A the (B, T, Hv, 64) solved intra-chunk matrix in k's dtype (chunk_fwd.py)). Around the kernels,
PyTorch ops: beta = b.sigmoid() (kept by sigmoid and the kernel), g = -exp(A_log) * softplus(a.float()
+ dt_bias) (softplus keeps its fp32 input, the product its fp32 output), the gated RMSNorm
(`Qwen3NextRMSNormGated`: the fp32 upcast, its rsqrt per head, the normalised tensor cast back before
the scale, the scaled product, the gate z in fp32 and its SiLU), and out_proj's input.

Mamba-2 (`NemotronHMamba2Mixer.forward` in training calls mamba-ssm's `mamba_split_conv1d_scan_combined`,
which fuses the conv, the chunked scan, the gated RMSNorm and out_proj: MambaSplitConv1dScanCombinedFn.
forward, state-spaces/mamba@e9594ce ops/triton/ssd_combined.py, `ctx.save_for_backward(zxbcdt, conv1d_weight,
conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, ...)`):
the in_proj output zxbcdt, the scan's output out_x (b, s, H p) in the input's dtype and the norm's fp32 rstd
per group and token (layernorm_gated._layer_norm_fwd); the conv output, the chunk states and the normalised
tensor die inside the call. in_proj keeps its input (the block norm's output).

Measured: tests/data/measured/{qwen3-next-80b-a3b,nemotron-h-8b}-*.json (validation/hybrid/kernels.py
emulates the three kernels from these sources), with the HF Trainer. Under the other frameworks the mixers
keep what the same kernels keep; Megatron-Core's Mamba mixer runs the fused kernel without the norm and
the projection (`mamba_entries`); the ops around the kernels are otherwise transformers' (an estimate
says so in its notes; not measured).
"""

from __future__ import annotations

from ...spec import hybrid
from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import ATTENTION_OUTPUT, Entry, NORM, _norm, _norm_output, fused_kernels, tokens_per_gpu
from .mamba_torch import BROADCAST, mamba2_mixers, torch_mamba1_entries, torch_mixer_entries

FLA_CHUNK = 64  # chunk_gated_delta_rule's chunk (fla chunk.py: chunk_size defaults to 64)


def gated_delta_net_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Gated DeltaNet mixer and its norm (see the module docstring)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    hk, hv = arch.linear_num_key_heads, arch.linear_num_value_heads
    qk, v = hk * arch.linear_key_head_dim, hv * arch.linear_value_head_dim
    out = _norm("linear attention norm input", T, arch, training)
    out += _norm_output("in_proj input (qkvz and ba projections)", T, arch, training, 2, NORM)
    out.append(Entry("q, k, v concatenated (causal-conv1d's saved input)", T * (2 * qk + v), B, "tp",
                     "B*s*b*(2*Hk*K + Hv*V)"))
    if training.ssm_kernels != "fused":  # transformers' torch fallback (no fla): memory/activations/gdn_torch.py
        from .gdn_torch import torch_gdn_entries
        out += torch_gdn_entries(arch, training, par)
    else:
        out += [
            Entry("q and k l2-normalised (kept by fla's chunked gated delta rule)", T * 2 * qk, B, "tp", "2*B*s*b*Hk*K"),
            Entry("q and k rstd per head (fp32, fla l2norm)", T * 2 * hk, 4, "tp", "2*4*s*b*Hk"),
            Entry("v made contiguous (kept by fla)", T * v, B, "tp", "B*s*b*Hv*V"),
            Entry("decay g cumulated per chunk (fp32, kept by fla)", T * hv, 4, "tp", "4*s*b*Hv"),
            Entry(f"A, the solved intra-chunk matrices (s x Hv x {FLA_CHUNK}, kept by fla)", T * hv * FLA_CHUNK, B,
                  "tp", f"B*s*b*Hv*{FLA_CHUNK}"),
        ]
    out += [
        Entry("beta = sigmoid(b) (kept by sigmoid and fla)", T * hv, B, "tp", "B*s*b*Hv"),
        Entry("a + dt_bias and its softplus (fp32, kept by softplus and the A_log product)", T * 2 * hv, 4, "tp",
              "2*4*s*b*Hv"),
        Entry("gated norm input (fp32 upcast)", T * v, 4, "tp", "4*s*b*Hv*V"),
        Entry("gated norm rsqrt per head (fp32)", T * hv, 4, "tp", "4*s*b*Hv"),
        Entry("gated norm: normalised, cast back before the scale", T * v, B, "tp", "B*s*b*Hv*V"),
        Entry("gated norm: scaled (kept by the gate product)", T * v, B, "tp", "B*s*b*Hv*V"),
        Entry("gate z in fp32 and its SiLU (kept by SiLU and the gate product)", T * 2 * v, 4, "tp", "2*4*s*b*Hv*V"),
        Entry(ATTENTION_OUTPUT, T * v, B, "tp", "B*s*b*Hv*V", gemm_input=True),
    ]
    return out


def mamba_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Mamba-2 block: its norm and the fused mixer (see the module docstring)."""
    T = tokens_per_gpu(training, par)
    return _norm("Mamba norm input", T, arch, training) + mamba_mixer_entries(arch, training, par, "in_proj input")


def mamba_mixer_entries(arch: Architecture, training: Training, par: Parallel, input_name: str) -> list[Entry]:
    """The fused Mamba-2 mixer from in_proj's input on. Without the gated norm (Falcon-H1's mamba_rms_norm false)
    the kernel gates the scan output itself and keeps no rstd (ssd_combined.py: rmsnorm_weight None, z given to
    _mamba_chunk_scan_combined_fwd, out_x still saved)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    H, g, n = arch.mamba_num_heads, arch.mamba_num_groups, arch.mamba_state_size
    d = H * arch.mamba_head_dim
    out = _norm_output(input_name, T, arch, training, 1, NORM)
    if training.ssm_kernels != "fused":  # transformers' torch fallback (no mamba-ssm): memory/activations/mamba_torch.py
        return out + torch_mixer_entries(arch, training, par)
    out.append(Entry("in_proj output z, x, B, C, dt (kept by mamba-ssm's fused mixer)", T * (2 * d + 2 * g * n + H), B,
                     "tp", "B*s*b*(2*H*p + 2*g*n + H)"))
    out.append(Entry("scan output before the gate (kept by the fused mixer)", T * d, B, "tp", "B*s*b*H*p"))
    if fused_kernels(training):
        # Megatron-Core 0.16.1 ssm/mamba_mixer.py _ssm_training: the fused kernel without rmsnorm_weight and
        # outproj_weight gates the scan output in the kernel (ssd_combined.py: z given, out = out_x * silu(z)),
        # then its own RMSNorm (`self.norm`, a fused norm keeping its input) and out_proj (keeping its input)
        # (without rmsnorm, the gated output made contiguous goes to out_proj as it is)
        if arch.mamba_gated_norm:
            out.append(Entry("gated scan output (the Mamba norm's input)", T * d, B, "tp", "B*s*b*H*p"))
        out.append(Entry("normalised scan output (out_proj input)" if arch.mamba_gated_norm else
                         "gated scan output (out_proj input)", T * d, B, "tp", "B*s*b*H*p", gemm_input=True))
    elif arch.mamba_gated_norm:
        out.append(Entry("gated norm rstd per group (fp32, kept by the fused mixer)", T * g, 4, "tp", "4*s*b*g"))
    return out


def parallel_hybrid_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Falcon-H1 layer's mixers (transformers 5.23 FalconH1DecoderLayer.forward): one norm, whose output each
    branch scales by its muP multiplier first (attention_in_multiplier, the mixer's ssm_in_multiplier), so q, k, v
    keep one scaled copy and in_proj another while the norm's output itself dies (a product by a Python number keeps
    nothing); the mixer's in_proj output times the muP vector (a buffer) is what the fused kernel keeps; the
    branches' outputs are scaled and summed without being kept. Measured: tests/data/measured/falcon-h1-*.json."""
    from .attention import attention_entries
    return attention_entries(arch, training, par) + mamba_mixer_entries(
        arch, training, par, "in_proj input (the norm's output x ssm_in_multiplier)")


SCAN_CHUNK = 2048  # mamba-ssm selective_scan.cpp: the state saved at the end of every 2048 tokens


def mamba1_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Mamba-1 mixer with Jamba's dt/B/C norms and its norm (transformers 5.23 JambaMambaMixer.forward with
    causal-conv1d's causal_conv1d_fn and mamba-ssm's selective_scan_fn). in_proj's output (x and the gate z) is
    kept whole by the conv's saved input (a view of its first half); the conv output by the scan (u) and,
    transposed, copied by x_proj's matmul; dt, B, C from x_proj's output through RMSNorms (fp32 upcast, rsqrt,
    the normalised tensor kept by the scale); dt_proj's matmul keeps the normed dt; the scan
    (SelectiveScanFn, state-spaces/mamba@e9594ce selective_scan_interface.py and selective_scan.cpp) keeps u,
    delta, contiguous copies of B, C (b, n, l) and z, its pre-gate output `out = empty_like(delta)` and x, the
    fp32 state at every 2048-token chunk's end (b, d, chunks, 2 n); out_proj copies the transposed gated
    output. A = -exp(A_log.float()) (exp keeps its output, the kernel A), D and dt_proj's bias in fp32: per layer,
    not per token. Measured: tests/data/measured/jamba-mini-1.5-*.json (validation/hybrid/mamba1.py)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    d, n, r = arch.mamba_expand * arch.hidden_size, arch.mamba_state_size, arch.mamba_dt_rank
    chunks = -(-training.seq_len // par.cp // SCAN_CHUNK)
    out = _norm("Mamba norm input", T, arch, training)
    out += _norm_output("in_proj input", T, arch, training, 1, NORM)
    if training.ssm_kernels != "fused":  # transformers' torch fallback (no mamba-ssm): memory/activations/mamba_torch.py
        return out + torch_mamba1_entries(arch, training, par)
    out += [
        Entry("in_proj output x and z (the conv's saved input is a view of it)", T * 2 * d, B, "tp", "2*B*s*b*d"),
        Entry("conv output (kept by the scan as u)", T * d, B, "tp", "B*s*b*d"),
        Entry("conv output transposed, copied by x_proj's matmul", T * d, B, "tp", "B*s*b*d", gemm_input=True),
        Entry("dt, B, C norms: fp32 upcasts", T * (r + 2 * n), 4, "none", "4*s*b*(r + 2*n)"),
        Entry("dt, B, C norms: rsqrt per token (fp32)", T * 3, 4, "none", "3*4*s*b"),
        Entry("dt, B, C norms: normalised, before the scale", T * (r + 2 * n), B, "none", "B*s*b*(r + 2*n)"),
        Entry("normed dt (dt_proj's matmul input)", T * r, B, "none", "B*s*b*r", gemm_input=True),
        Entry("B and C made contiguous (b, n, l), kept by the scan", T * 2 * n, B, "none", "2*B*s*b*n"),
        Entry("delta = dt_proj(dt) (kept by the scan)", T * d, B, "tp", "B*s*b*d"),
        Entry("gate z made contiguous (kept by the scan)", T * d, B, "tp", "B*s*b*d"),
        Entry("scan output before the gate (kept by the scan)", T * d, B, "tp", "B*s*b*d"),
        Entry(f"scan state at each {SCAN_CHUNK}-token chunk's end (fp32)", training.micro_batch_size * d * chunks * 2 * n,
              4, "tp", f"4*b*d*ceil(s/{SCAN_CHUNK})*2*n", split_by_cp=False),
        Entry("gated output transposed, copied by out_proj's matmul", T * d, B, "tp", "B*s*b*d", gemm_input=True),
        Entry("A = -exp(A_log) twice, D and dt bias in fp32 (per layer)", 2 * d * n + 2 * d, 4, "tp", "4*(2*d*n + 2*d)",
              split_by_cp=False),
    ]
    return out


def hybrid_layer_entries(arch: Architecture, training: Training, par: Parallel, kind: str) -> list[Entry]:
    """One layer (or block) of a hybrid model: its mixer's entries, then its MLP's or MoE's."""
    from .attention import attention_entries
    from .mlp import mlp_entries

    mixer, ffn = hybrid.MIXER[kind], hybrid.FFN[kind]
    out = {"attention": attention_entries, "linear_attention": gated_delta_net_entries,
           "mamba": mamba_entries, "mamba1": mamba1_entries, "attention_mamba": parallel_hybrid_entries,
           None: lambda *a: []}[mixer](arch, training, par)
    if ffn is not None:
        out += mlp_entries(arch, training, par, ffn)
    return out


def ssm_kernels_note(arch: Architecture, training: Training, par: Parallel) -> str | None:
    """What the estimate says of the SSM kernels it assumed, for a model with Mamba mixers under transformers."""
    from dataclasses import replace

    from ...spec.choices import TRANSFORMERS_FRAMEWORKS
    from .mamba_torch import mixers

    two, one = mamba2_mixers(arch), mixers(arch, ("mamba1",))
    if training.mode != "training" or training.framework not in TRANSFORMERS_FRAMEWORKS:
        return None
    if not (two or one):
        linear = mixers(arch, ("linear_attention",))
        if not linear:
            return None
        saved = {k: sum(e.bytes(par) for e in gated_delta_net_entries(arch, replace(training, ssm_kernels=k), par))
                 for k in ("fused", "torch")}
        gib = (saved["torch"] - saved["fused"]) / 2**30
        if training.ssm_kernels == "fused":
            return (f"SSM kernels 'fused': the Gated DeltaNet layers run flash-linear-attention's and causal-conv1d's "
                    f"kernels; without them transformers' torch_chunk_gated_delta_rule keeps {gib:.2f} GiB more per "
                    f"layer ({linear} layers): ssm_kernels 'torch'")
        return (f"SSM kernels '{training.ssm_kernels}': the Gated DeltaNet layers on transformers' "
                f"torch_chunk_gated_delta_rule keep {gib:.2f} GiB more per layer ({linear} layers; every saved tensor "
                "checked on a real CPU layer); its backward's per-chunk gradients beside them are not modelled")
    entries = (lambda t: mamba_mixer_entries(arch, t, par, "x")) if two else (lambda t: mamba1_entries(arch, t, par))
    saved = {k: sum(e.bytes(par) for e in entries(replace(training, ssm_kernels=k))) for k in ("fused", "torch")}
    gib, count = (saved["torch"] - saved["fused"]) / 2**30, two or one
    kind = "Mamba-2" if two else "Mamba-1"
    if training.ssm_kernels == "fused":
        return (f"SSM kernels 'fused': the {kind} mixers run mamba-ssm's and causal-conv1d's kernels. Without those "
                "packages transformers logs that it falls back to its reference PyTorch code, which keeps "
                f"{gib:.2f} GiB more per mixer ({count} mixers): set ssm_kernels to 'torch' for that path"
                + (f" (transformers 5.18 and later; '{BROADCAST}' for 5.17 and earlier)" if two else ""))
    if training.ssm_kernels == "torch" or not two:
        return (f"SSM kernels '{training.ssm_kernels}': transformers' reference PyTorch code of the {kind} mixers (no "
                f"mamba-ssm / causal-conv1d installed), {gib:.2f} GiB more saved per mixer than mamba-ssm's kernel "
                f"({count} mixers)" + (", as transformers 5.18 and later run it (einsums); 5.17 and earlier "
                                       f"multiply broadcast operands: '{BROADCAST}'" if two else
                                       ": the recurrent scan keeps every token's state"))
    return (f"SSM kernels '{BROADCAST}': transformers 5.17 and earlier's reference PyTorch code of the Mamba-2 "
            "mixers, whose scan makes 6-D fp32 products and, in backward, two gradients of the largest at once "
            "beside the layer's saved tensors; 5.18 and later contract with einsums ('torch')")
