"""A Mamba-2 mixer on transformers' torch fallback (training.ssm_kernels "torch"): what a GPU without mamba-ssm and
causal-conv1d runs. transformers 5.23 wraps each kernel in `use_kernel_func_from_hub_with_fallback`; without the
package, `mamba2_split_conv1d_scan_combined` returns None and the mixer goes on in PyTorch ops (transformers 5.23
models/falcon_h1/modeling_falcon_h1.py FalconH1Mixer.forward lines 667-823; models/nemotron_h/modeling_nemotron_h.py
NemotronHMamba2Mixer.forward lines 466-610, the same ops but for the muP products and the tail). Cited below as
FH (modeling_falcon_h1.py) and NH (modeling_nemotron_h.py) with their line numbers at 5.23.0.

What autograd keeps, per mixer, from in_proj's output on (measured: tests/data/measured/ssm_torch/; every tensor
checked by name against a real CPU run of the mixer's autograd graph):
  - in_proj's output (b, s, 2d + 2gn + H) in the compute dtype: the conv's input is a transposed view of it and the
    gate's SiLU keeps the gate, a view of it (FH 726-728, 740-746; F.conv1d in causal_conv1d_fn FH 371-377);
  - the conv's output, (s + k - 1) long (padding k - 1, then sliced to s: FH 371-378), kept whole by the SiLU;
  - dt + dt_bias (kept by softplus) and softplus(dt) (kept by clamp), (b, s, H) (mamba2_chunk_scan FH 488-492);
  - x in fp32 (kept by x * dt) and x padded to whole chunks (F.pad copies even with no padding; kept by the D
    residual's product with D), dt in fp32 twice (x * dt and A * dt) (FH 494-505);
  - per chunk of L tokens: L = exp(segment_sum(A)) (kept by exp and the product with G), G = einsum(C, B) (kept by
    that product) and M's copy laid out for Y_diag's bmm, each (b, H, c, L, L) fp32 (FH 516-527);
  - the bmms' copies of their permuted operands (einsum's reshape): x * dt twice (Y_diag's and states'), C twice
    (G's and C_times_states'), B once (G's), B * decay once (states'); B repeated to every head in fp32 (kept by
    B * decay); decay_states and exp(A_cumsum) (kept by their products) (FH 527-559);
  - the chunk states with the zero initial state (b, c + 1, H, p, n) fp32 (kept by new_states' einsum) and the c
    chunk-start states' copy (kept by C_times_states' bmm), the chunk decay (b, H, c + 1, c + 1) fp32 (FH 539-559);
  - C_times_states (kept by Y_off's product) and the scan's output (padded; kept by the gate or the norm), each
    (b, c L, H, p) fp32 (FH 559-569);
  - the tail: without the gated norm (Falcon-H1's mamba_rms_norm false) SiLU(gate) in the compute dtype (kept by the
    product with the fp32 scan output) (FH 819-821); with it (FalconH1RMSNormGated, norm_before_gate false;
    NemotronHRMSNormGated) the gate in fp32 (kept by SiLU), SiLU's output, the gated product (kept by pow and the
    rsqrt product), the fp32 rsqrt per group, the normalised tensor (kept by the weight's product) (FH 245-275,
    NH 62-74); then out_proj's input, the result cast to the compute dtype (FH 823, NH 610);
  - per layer, not per token: A = -exp(A_log) and its negation (fp32, H each), segment_sum's two bool masks for the
    chunk (L x L) and for the chunks (c + 1) x (c + 1) (FH 309-326).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, tokens_per_gpu

SOURCE = "transformers 5.23.0 models/falcon_h1/modeling_falcon_h1.py mamba2_chunk_scan (torch fallback)"
BROADCAST = "torch_5.17"  # transformers 5.17 and earlier: the scan's contractions as broadcast products and sums
BROADCAST_SOURCE = "transformers 5.17.0 models/falcon_h1/modeling_falcon_h1.py mamba2_chunk_scan lines 498-566"


def chunks(arch: Architecture, training: Training, par: Parallel) -> int:
    """The chunks a sequence is padded into (pad_tensor_by_size, reshape_into_chunks: FH 278-306, 497)."""
    return -(-int(training.seq_len // par.cp) // arch.mamba_chunk_size)


def torch_mixer_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Mamba-2 mixer's saved tensors on transformers' torch path, from in_proj's output to out_proj's input (see
    the module docstring)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b = training.micro_batch_size
    H, p, g, n = arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_num_groups, arch.mamba_state_size
    L, k, d = arch.mamba_chunk_size, arch.mamba_conv_kernel, H * p
    c = chunks(arch, training, par)
    Tp = b * c * L  # the tokens padded to whole chunks
    conv = d + 2 * g * n
    if training.ssm_kernels == BROADCAST:
        scan = broadcast_scan_entries(arch, training, par)
    else:
        scan = [
            Entry("L = exp(segment sums), G = C B^T and M's copy per chunk (fp32)", Tp * 3 * H * L, 4, "tp",
                  "3*4*b*c*L*H*L", tensors=3),
            Entry("x * dt: the Y_diag and states bmms' copies (fp32)", Tp * 2 * d, 4, "tp", "2*4*b*c*L*H*p", tensors=2),
            Entry("B and C over every head: the bmms' copies of C (2), B, B * decay; B repeated (fp32)",
                  Tp * 5 * H * n, 4, "tp", "5*4*b*c*L*H*n", tensors=5),
            Entry("decay_states and exp(A_cumsum) (fp32)", Tp * 2 * H, 4, "tp", "2*4*b*c*L*H", tensors=2),
            Entry("chunk states with the initial one, and the chunk-start states' copy (fp32)",
                  b * (2 * c + 1) * H * p * n, 4, "tp", "4*b*(2*c + 1)*H*p*n", split_by_cp=False, tensors=2),
        ]
    out = [
        Entry("in_proj output z, x, B, C, dt (the conv's input and the gate, views of it)", T * (2 * d + 2 * g * n + H),
              B, "tp", "B*s*b*(2*H*p + 2*g*n + H)"),
        Entry("conv output, k - 1 positions longer (kept by its SiLU)", b * (training.seq_len / par.cp + k - 1) * conv,
              B, "tp", "B*b*(s + k - 1)*(H*p + 2*g*n)"),
        Entry("dt + dt_bias and its softplus (kept by softplus and clamp)", T * 2 * H, B, "tp", "2*B*s*b*H"),
        Entry("x in fp32 (kept by x * dt)", T * d, 4, "tp", "4*s*b*H*p"),
        Entry("dt in fp32, twice (kept by x * dt and A * dt)", T * 2 * H, 4, "tp", "2*4*s*b*H"),
        Entry("x padded to whole chunks (kept by the D residual)", Tp * d, 4, "tp", "4*b*c*L*H*p"),
        *scan,
        Entry("chunk decay (fp32)", b * H * (c + 1) ** 2, 4, "tp", "4*b*H*(c + 1)^2", split_by_cp=False),
        Entry("C_times_states and the scan output, padded (fp32)", Tp * 2 * d, 4, "tp", "2*4*b*c*L*H*p", tensors=2),
    ]
    if arch.mamba_gated_norm:
        out += [
            Entry("gated norm: gate in fp32, its SiLU, the gated product, the normalised tensor (fp32)", T * 4 * d, 4,
                  "tp", "4*4*s*b*H*p", tensors=4),
            Entry("gated norm rsqrt per group (fp32)", T * g, 4, "tp", "4*s*b*g"),
        ]
    else:
        out.append(Entry("SiLU(gate) (kept by the gate's product)", T * d, B, "tp", "B*s*b*H*p"))
    out += [
        Entry("out_proj input (the output cast to the compute dtype)", T * d, B, "tp", "B*s*b*H*p", gemm_input=True),
        Entry("A = -exp(A_log) and its negation (fp32), segment_sum's bool masks (per layer)",
              2 * H * 4 + 2 * L * L + 2 * (c + 1) ** 2, 1, "none", "2*4*H + 2*L^2 + 2*(c + 1)^2", split_by_cp=False),
    ]
    return out



def broadcast_scan_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The scan's saved tensors where transformers 5.17 and earlier contract by broadcasting and summing (5.17.0
    FH 527-560: G = (C[:, :, :, None] * B[:, :, None]).sum(-1), M = (G[..., None] * L[..., None]).sum(-1),
    Y_diag = (M[..., None] * x[:, :, None]).sum(3), states = (B_decay[..., None, :] * x[..., None]).sum(2),
    new_states = (decay_chunk[..., None, None] * states[:, :, None]).sum(1), C_times_states = C[..., None, :] *
    states[:, :, None]): each product keeps its operands as they are (views, no copies), so G, L and M, x * dt
    once, C and B repeated to every head and B * decay, both (c + 1)-chunk states tensors (the chunk-start states
    are a view of new_states). Checked by name against a real CPU run of 5.17.0's mixer's autograd graph."""
    b, T = training.micro_batch_size, tokens_per_gpu(training, par)
    H, p, n, L = arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size, arch.mamba_chunk_size
    c = chunks(arch, training, par)
    Tp, d = b * c * L, H * p
    return [
        Entry("L = exp(segment sums), G and M per chunk (fp32, kept by the broadcast products)", Tp * 3 * H * L, 4,
              "tp", "3*4*b*c*L*H*L", tensors=3),
        Entry("x * dt in chunks (fp32, kept by the Y_diag and states products)", Tp * d, 4, "tp", "4*b*c*L*H*p"),
        Entry("C and B repeated to every head, B * decay (fp32)", Tp * 3 * H * n, 4, "tp", "3*4*b*c*L*H*n", tensors=3),
        Entry("decay_states and exp(A_cumsum) (fp32)", Tp * 2 * H, 4, "tp", "2*4*b*c*L*H", tensors=2),
        Entry("chunk states with the initial one and the new states (fp32)", b * 2 * (c + 1) * H * p * n, 4, "tp",
              "2*4*b*(c + 1)*H*p*n", split_by_cp=False, tensors=2),
    ]


def broadcast_products(arch: Architecture, training: Training, par: Parallel) -> dict[str, float]:
    """The 6-D fp32 products transformers 5.17's scan sums (BROADCAST_SOURCE), in bytes: each is made and summed in
    forward, and in backward its MulBackward makes both operands' gradients at the product's full size before
    autograd sums them to the operands' shapes (torch/csrc/autograd/engine.cpp validate_outputs: at::sum_to), so
    two of them are alive at once."""
    b = training.micro_batch_size
    H, p, n, L = arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size, arch.mamba_chunk_size
    c = chunks(arch, training, par)
    Tp = b * c * L
    return {"G = (C * B).sum(-1): b x c x L x L x H x n": 4 * Tp * L * H * n / par.tp,
            "Y_diag = (M * x).sum(3): b x c x L x L x H x p": 4 * Tp * L * H * p / par.tp,
            "states, C_times_states: b x c x L x H x p x n": 4 * Tp * H * p * n / par.tp,
            "new_states: b x (c + 1) x (c + 1) x H x p x n": 4 * b * (c + 1) ** 2 * H * p * n / par.tp}



def mamba2_mixers(arch: Architecture) -> int:
    """The model's Mamba-2 mixers: Nemotron-H's M blocks, one in every Falcon-H1 layer."""
    return mixers(arch, ("mamba", "attention_mamba"))


def mixers(arch: Architecture, names: tuple[str, ...]) -> int:
    """The model's layers whose mixer is one of `names` (spec/hybrid.py MIXER)."""
    from ...spec import hybrid

    if not arch.is_hybrid:
        return 0
    return sum(1 for kind in arch.layer_kinds() if hybrid.MIXER[kind] in names)


JAMBA_SOURCE = "transformers 5.23.0 models/jamba/modeling_jamba.py JambaMambaMixer.forward and mamba_selective_scan"


def torch_mamba1_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A Mamba-1 mixer (Jamba) on transformers' torch fallback, from in_proj's output on (JAMBA_SOURCE; cited JM:
    modeling_jamba.py at 5.23.0, the same code in 5.17.0): without causal-conv1d and mamba-ssm, causal_conv1d_fn
    (JM 240-260) and mamba_selective_scan's recurrent loop (JM 333-438) run in PyTorch ops. The conv keeps in_proj's
    output (a view) and its SiLU the (s + k - 1)-long output; x_proj's matmul a copy of the transposed conv output;
    the dt, B, C RMSNorms as with the kernel; dt_proj's matmul the normed dt and C's norm output is kept by every
    step's bmm; softplus keeps dt + bias, the products its output; discrete_A = exp(A dt) and discrete_B = dt B in
    fp32, (b, d, s, n) each (kept by the loop's products and the x product), B and x in fp32; the loop keeps every
    step's fp32 state (b, d, n; the first a zero state in the compute dtype) and its cast for the bmm with C; the D
    product keeps the conv output, the gate's product the fp32 scan output and SiLU(z) (JM 425-431); out_proj a
    copy of the transposed output. Per layer: A = -exp(A_log) twice, D in fp32. Checked against a real CPU mixer's
    autograd graph (tests/test_ssm_torch.py)."""
    B = bytes_per_element(training.compute_dtype)
    T, b = tokens_per_gpu(training, par), training.micro_batch_size
    s = training.seq_len / par.cp
    d, n, r, k = arch.mamba_expand * arch.hidden_size, arch.mamba_state_size, arch.mamba_dt_rank, arch.mamba_conv_kernel
    return [
        Entry("in_proj output x and z (the conv's input and the gate, views of it)", T * 2 * d, B, "tp", "2*B*s*b*d"),
        Entry("conv output, k - 1 positions longer (kept by its SiLU)", b * (s + k - 1) * d, B, "tp",
              "B*b*(s + k - 1)*d"),
        Entry("conv output after SiLU (kept by the D product)", T * d, B, "tp", "B*s*b*d"),
        Entry("conv output transposed, copied by x_proj's matmul", T * d, B, "tp", "B*s*b*d", gemm_input=True),
        Entry("dt, B, C norms: fp32 upcasts", T * (r + 2 * n), 4, "none", "4*s*b*(r + 2*n)"),
        Entry("dt, B, C norms: rsqrt per token (fp32)", T * 3, 4, "none", "3*4*s*b"),
        Entry("dt, B, C norms: normalised, before the scale", T * (r + 2 * n), B, "none", "B*s*b*(r + 2*n)"),
        Entry("normed dt (dt_proj's matmul input) and C (every step's bmm)", T * (r + n), B, "none", "B*s*b*(r + n)"),
        Entry("dt + bias and its softplus (kept by softplus and the products)", T * 2 * d, B, "tp", "2*B*s*b*d"),
        Entry("B and x in fp32 (kept by the discretisation's products)", T * (n + d), 4, "tp", "4*s*b*(n + d)"),
        Entry("discrete_A and discrete_B (fp32, b x d x s x n)", T * 2 * d * n, 4, "tp", "2*4*s*b*d*n", tensors=2),
        Entry("every step's state: fp32 (kept by the next step) and its cast for the bmm with C", b * d * n * (
            4 * (s - 1) + B * (s + 1)), 1, "tp", "b*d*n*(4*(s - 1) + B*(s + 1))"),
        Entry("scan output (fp32) and SiLU(z) (kept by the gate's product)", T * d * (4 + B), 1, "tp", "(4 + B)*s*b*d"),
        Entry("gated output transposed, copied by out_proj's matmul", T * d, B, "tp", "B*s*b*d", gemm_input=True),
        Entry("A = -exp(A_log) twice and D in fp32 (per layer)", 2 * d * n + d, 4, "tp", "4*(2*d*n + d)",
              split_by_cp=False),
    ]
