"""Speed: a roofline per operation, the time each is expected to take, and one step built from them.

The roofline model (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model", CACM 52(4)) bounds the time of an operation by whichever the GPU runs out of
first, arithmetic or memory traffic:

    roof time = max(flops / peak_flops, bytes / memory_bandwidth)

An operation's arithmetic intensity is flops / bytes; where it exceeds the GPU's ridge point,
peak_flops / memory_bandwidth, the operation is compute-bound, otherwise memory-bound.

Real kernels reach only part of either roof, so each operation also carries what it is expected
to achieve (`kernels.py`: GEMMs at the measured maximum achievable matmul FLOPS less what small
dimensions lose, flash attention at its measured TFLOP/s by sequence length and head width,
memory-bound kernels at achieved bandwidth with the extra passes of unfused eager kernels, and a
launch floor per kernel):

    expected time = max(flops / (peak x compute efficiency), bytes x passes / (bandwidth x 0.9),
                        kernels x launch gap)

The step's `time_s`, `tokens_per_s_per_gpu` and `mfu` are the expected figures; `upper_bound`
holds the same three with every operation at its roof, every link at its line rate and all
overlappable traffic hidden.

What is counted, per GPU after TP/CP/EP sharding, for one micro-batch:

- every operation of a transformer layer (norms, the Q/K/V projections or MLA's down/up
  projections, rotary embedding, the attention core, the output projection, the MLP or the
  router with routed experts as grouped GEMMs and shared experts, residual adds), counted once
  per kind of layer and multiplied by the number of such layers on the stage;
- the embedding on the first stage, the final norm, LM head and loss on the last;
- backward as separate operations: for a linear layer the input-gradient (dX = dY W^T) and the
  weight-gradient (dW = X^T dY) matmuls, each with the forward's FLOPs (Narayanan et al. 2021,
  section 5.1: backward = 2 x forward); for flash attention 2.5 x the forward's FLOPs, since its
  backward recomputes the scores: five matmuls against two (Dao 2023, FlashAttention-2; the
  flash-attn repository's benchmarks/benchmark_flash_attention.py counts it the same way).

Notation: s = tokens of a sequence on this GPU (seq_len / CP), b = micro-batch, T = s*b, h =
hidden, a = query heads, g = KV heads, d = head width, f = MLP width, V = (padded) vocabulary,
t = TP, B = bytes of the compute dtype. A GEMM of an (M x K) input by a (K x N) weight does 2MKN
FLOPs and moves M*K + K*N + M*N elements (each read or written once: the ideal reuse a tiled
kernel approaches).

The step (`Step`) adds, on the slowest pipeline stage: the operations of every micro-batch,
recomputation, the pipeline bubble, the optimizer update and the communication that compute does
not hide (`collectives.py`: NCCL bus bandwidths as nccl-tests measures them, and what each
framework overlaps). See `roofline` for each term and its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from . import fp8, kernels, liger_operations
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from ..memory.resolved import Resolved, resolve, training_with
from ..memory.states import optimizer_state_bytes
from ..spec.training import Training
from .liger_operations import runs_liger_flce
from .operations import Bound, Operation, SOURCES, elementwise_kernels, speed_fused
from .operation_table import OperationTable, StageWork, layer_forward, operation_table, stage_operations, stage_works
from .communication import Communication, communication


@dataclass(frozen=True)
class Step:
    time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    bubble_fraction: float  # bubble / (compute + recompute); 1F1B: (p - 1) / (v m) (Narayanan 2021)
    exposed_comm_s: float
    compute_s: float  # the operations of all micro-batches
    recompute_s: float
    bubble_s: float
    optimizer_s: float
    microbatches: int
    tokens_per_step: int  # over all GPUs
    model_flops_per_token: float
    mfu_peak_flops: float
    communication: tuple[Communication, ...]
    upper_bound: Bound | None = None

    @property
    def bubble_share_of_step(self) -> float:
        """The share of the step the GPU idles in the pipeline bubble (bubble_s / time_s)."""
        return self.bubble_s / self.time_s if self.time_s else 0.0

    def exposed_by_group(self) -> dict[str, float]:
        """Exposed communication seconds by group (TP, CP, EP, DP, expert DP, PP)."""
        out: dict[str, float] = {}
        for c in self.communication:
            out[c.group] = out.get(c.group, 0.0) + c.exposed_s
        return out

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "time_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction", "bubble_share_of_step", "exposed_comm_s",
            "compute_s",
            "recompute_s", "bubble_s", "optimizer_s", "microbatches", "tokens_per_step",
            "model_flops_per_token", "mfu_peak_flops")}
        out["communication"] = [c.to_json() for c in self.communication]
        out["exposed_comm_by_group_s"] = self.exposed_by_group()
        if self.upper_bound is not None:
            out["upper_bound"] = self.upper_bound.to_json()
        return out


@dataclass(frozen=True)
class Roofline:
    mode: str  # "training" or "inference" (a prefill of seq_len tokens)
    gpu: str
    stage: int  # the pipeline stage shown: the slowest one, which sets the step time
    stage_times_s: tuple[float, ...]  # expected compute + recompute per step, every stage
    operations: tuple[Operation, ...]
    step: Step
    notes: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "operations": [op.to_json() for op in self.operations],
            "step": self.step.to_json(),
            "mode": self.mode, "gpu": self.gpu, "stage": self.stage,
            "stage_times_s": list(self.stage_times_s), "notes": list(self.notes), "sources": list(SOURCES),
        }


# --- the optimizer update ------------------------------------------------------------------------------

def optimizer_time(cfg: Resolved, rank: int, roof: bool) -> float:
    """Memory-bound, over the parameters this GPU updates (ZeRO >= 1 shards them): the update
    reads and writes the gradient once, the master copy and the parameter, and every optimizer
    state (states.optimizer_state_bytes, from the optimizer's record); as expected, at achieved
    bandwidth (kernels.BANDWIDTH_EFFICIENCY). FP8 under TransformerEngine adds the once-a-step cast of
    every weight the GPU holds to FP8 (fp8.py: TE keeps it over the micro-batches)."""
    if not cfg.is_training:
        return 0.0
    cast = _te_weight_cast_bytes(cfg, rank)
    recipe, par, sp = cfg.recipe, cfg.parallel, cfg.stages[rank]
    per_param = (bytes_per_element(recipe.grad_dtype) + (8 if recipe.master_weights else 0)
                 + 2 * bytes_per_element(recipe.param_dtype))
    traffic = [n * per_param + 2 * optimizer_state_bytes(sp.total, cfg.training.optimizer, recipe.optimizer_dtype,
                                                         experts) for n, experts in
               ((sp.dense_local, False), (sp.expert_local, True))]
    if cfg.zero_stage >= 1:
        traffic = [traffic[0] / (par.dp * par.cp), traffic[1] / max(1, par.expert_data_parallel)]
    bandwidth = cfg.gpu.memory_bandwidth * (1.0 if roof else kernels.BANDWIDTH_EFFICIENCY)
    return (sum(traffic) + cast) / bandwidth


def _te_weight_cast_bytes(cfg: Resolved, rank: int) -> float:
    """Bytes of TransformerEngine's once-a-step FP8 cast of the rank's weights (its embedding and LM head
    included: a bound on the linear layers' own), `fp8.weight_cast` bytes per element; 0 otherwise."""
    tr = cfg.training
    if not (tr.fp8 and tr.framework == "megatron" and cfg.gpu.fp8_flops is not None):
        return 0.0
    sp = cfg.stages[rank]
    return fp8.weight_cast(tr.framework, tr.fp8_recipe)[0] * (sp.dense_local + sp.expert_local)


# --- the step ----------------------------------------------------------------------------------------

def roofline_config(cfg) -> Roofline:
    """The roofline of a loaded `config.Config`."""
    return roofline(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)


@dataclass(frozen=True)
class _StepTimes:
    compute_s: float
    recompute_s: float
    bubble_s: float
    optimizer_s: float
    communication: tuple[Communication, ...]

    @property
    def exposed_comm_s(self) -> float:
        return sum(c.exposed_s for c in self.communication)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.recompute_s + self.bubble_s + self.exposed_comm_s + self.optimizer_s


def step_times(cfg: Resolved, table: OperationTable, work: StageWork, roof: bool) -> _StepTimes:
    """step time = compute                 the operations' times x micro-batches
                 + recompute               full: each recomputed layer's forward again; selective: the
                                           recomputed modules' forward (Korthikanti et al. 2022)
                 + bubble                  per schedule, `pipeline_bubble_s` (1F1B: (p - 1) / (v m) x
                                           (compute + recompute), Narayanan 2021)
                 + exposed communication   TP and EP in full; CP beyond the attention core; DP/FSDP as
                                           each framework overlaps it; PP behind the compute left
                 + optimizer update        memory-bound: read and write states, master, gradient"""
    par, m = cfg.parallel, cfg.microbatches
    compute = m * (work.forward_s + work.backward_s)
    recompute = m * work.recompute_s
    bubble = pipeline_bubble_s(par, work)
    comms = communication(cfg, table, work, roof)
    return _StepTimes(compute, recompute, bubble, optimizer_time(cfg, work.rank, roof), tuple(comms))


def per_chunk_config(cfg: Resolved) -> Resolved:
    """The configuration a rank's work is timed with: under DualPipe each rank runs each of its two
    stages on half the micro-batches (one direction's; deepseek-ai/DualPipe step() scatters the
    batch into num_chunks / 2 per direction), so its chunks' work counts m / 2 times."""
    if cfg.parallel.schedule != "dualpipe":
        return cfg
    return dataclasses.replace(cfg, microbatches=cfg.microbatches // 2)


def pipeline_bubble_s(par: Parallel, work: StageWork) -> float:
    """The pipeline bubble per step, from one micro-batch's forward F, backward B and recompute R on
    the rank (R runs inside the backward). The weight-gradient pass W is half of B (its GEMMs are
    half the backward's, Narayanan et al. 2021). deepseek-ai/DualPipe README, per chunk:
    1F1B (p - 1)(F + B), interleaved / v (Narayanan 2021); ZB-H1 (p - 1)(F + B - 2W) = (p - 1)(F + R)
    (Qi et al. 2023: a third of 1F1B's when F = B/2 = W); DualPipe and DualPipeV (PP/2 - 1)(F&B + B - 3W),
    F&B = F + B (two chunks overlap communication, not compute), over PP stages of half a rank's
    layers: PP = p under DualPipe, 2p under DualPipeV."""
    f, b, r, p = work.forward_s, work.backward_s, work.recompute_s, par.pp
    schedule = par.schedule
    if schedule == "zero_bubble":
        return (p - 1) * (f + r)
    if schedule in ("dualpipe", "dualpipev"):
        stages = p if schedule == "dualpipe" else 2 * p
        f, b, r = f / 2, b / 2, r / 2  # one chunk of the rank's two
        return max(0, stages // 2 - 1) * ((f + b + r) + (b + r) - 3 * b / 2)
    return (p - 1) / par.vpp * (f + b + r)


def roofline(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None) -> Roofline:
    """Operations of the slowest pipeline stage and the time of one step (training: forward,
    backward and optimizer over every micro-batch; inference: one forward prefill of the batch),
    as expected (`step`) and at the roofs (`step.upper_bound`); see `step_times` for the terms."""
    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    if training.rl:  # the trainer's update on prompt + response sequences (rl.py); generation is not timed
        from ..memory.rl import trainer_training
        resolve(arch, training, par, hardware)  # the RL fields' own checks
        rl_notes = (f"RL ({training.rl.algorithm}): the time of the trainer's update step on "
                    f"{training.rl.sequence_len:,}-token sequences; the rollout's generation and the scoring "
                    "passes are not timed",)
        result = roofline(arch, trainer_training(training), par, hardware)
        return dataclasses.replace(result, notes=tuple(result.notes) + rl_notes)
    cfg, m, table, expected, slowest, times = _expected(arch, training, par, hardware)
    roofs = stage_works(cfg, table, roof=True)
    at_roof = step_times(cfg, table, max(roofs, key=lambda w: w.per_microbatch_s), roof=True)
    return Roofline(mode=training.mode, gpu=table.ctx.gpu.id, stage=slowest,
                    stage_times_s=tuple(cfg.microbatches * w.per_microbatch_s for w in expected),
                    operations=tuple(stage_operations(cfg, expected[slowest], table)),
                    step=_step(cfg, m, table, times, at_roof), notes=table.notes + tuple(_notes(cfg, slowest)))


class Timing(NamedTuple):
    """The expected step of a layout without its operation list or its upper bound (`expected_step`)."""

    step: Step  # `roofline(...).step` with upper_bound None
    stage: int  # the slowest pipeline rank
    layer_forward: tuple[tuple[Operation, int], ...]  # its layer forward operations, each with its count per step


def expected_step(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
                  hardware: Hardware | None = None) -> Timing:
    """`roofline`'s expected step by the same code, for a search over layouts: it skips the step at
    the roofs and the copies of the operations with their counts."""
    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    if training.rl:
        from ..memory.rl import trainer_training
        resolve(arch, training, par, hardware)  # the RL fields' own checks
        return expected_step(arch, trainer_training(training), par, hardware)
    cfg, m, table, expected, slowest, times = _expected(arch, training, par, hardware)
    return Timing(_step(cfg, m, table, times, None), slowest, layer_forward(cfg, expected[slowest], table))


def _expected(arch: Architecture, training: Training, par: Parallel, hardware: Hardware):
    """(the configuration as a rank's work is timed, its micro-batches, its operation table, every
    rank's expected work, the slowest rank, that rank's step times as expected)."""
    # the memory model's rules and resolution; the FP8 recipe is modelled here, so its memory-side
    # refusal is skipped (the recipe and the ZeRO stage do not depend on it; FP8 weights belong to it)
    checked = training if not training.fp8 else training_with(
        arch, training, fp8=False, fp8_all_gather=False,  # the float8 all-gather needs fp8: timed here too
        param_dtype="bf16" if training.param_dtype == "fp8" else training.param_dtype)
    cfg = resolve(arch, checked, par, hardware)
    if training.fp8 or not cfg.is_training:
        cfg = dataclasses.replace(cfg, training=training, zero_stage=cfg.zero_stage if cfg.is_training else 0)
    table = operation_table(cfg)
    m, cfg = cfg.microbatches, per_chunk_config(cfg)
    expected = stage_works(cfg, table, roof=False)
    slowest = max(range(par.pp), key=lambda r: expected[r].per_microbatch_s)
    return cfg, m, table, expected, slowest, step_times(cfg, table, expected[slowest], roof=False)


def _step(cfg: Resolved, m: int, table: OperationTable, times: _StepTimes, at_roof: _StepTimes | None) -> Step:
    tokens_per_step = cfg.global_batch_size * cfg.training.seq_len
    gpus, peak = cfg.parallel.gpus, table.ctx.peak

    def throughput(time_s: float) -> tuple[float, float]:
        tokens = tokens_per_step / time_s / gpus
        return tokens, tokens * table.flops_per_token / peak

    tokens, mfu = throughput(times.time_s)
    return Step(
        time_s=times.time_s, tokens_per_s_per_gpu=tokens, mfu=mfu,
        bubble_fraction=times.bubble_s / (times.compute_s + times.recompute_s) if times.compute_s else 0.0,
        exposed_comm_s=times.exposed_comm_s, compute_s=times.compute_s, recompute_s=times.recompute_s,
        bubble_s=times.bubble_s, optimizer_s=times.optimizer_s, microbatches=m, tokens_per_step=tokens_per_step,
        model_flops_per_token=table.flops_per_token, mfu_peak_flops=peak, communication=times.communication,
        upper_bound=None if at_roof is None else Bound(at_roof.time_s, *throughput(at_roof.time_s)))


def _notes(cfg: Resolved, slowest: int) -> list[str]:
    notes = [
        f"stage {slowest} shown: the slowest pipeline stage, which sets the step time",
        "expected times: GEMMs at the measured maximum achievable matmul FLOPS less small-shape losses, flash "
        f"attention at its measured TFLOP/s ({kernels.attention_kernel(cfg.gpu, cfg.training.framework)} kernel), "
        "memory-bound kernels at 90% of bandwidth"
        + ("" if speed_fused(cfg.training) else " with the extra passes of eager (unfused) norms, rotary and "
                                                  "activations") + "; the roof time of each is its upper bound",
        "MFU: PaLM appendix B's 6N + 12*L*H*Q*T per token with the attention term halved for the causal mask, "
        "N = matmul weights a token passes through (top-k experts) including the LM head, without the "
        "embedding; against the compute dtype's peak (bf16 also under fp8)",
        f"communication at nccl-tests bus bandwidths (a ring across nodes through its ranks' NICs; an all-to-all "
        "over NVLink and the NIC at once); overlap "
        f"{cfg.parallel.comm_overlap:g} of what each framework hides (DP/FSDP: buckets and one-unit prefetch; PP "
        "behind the compute left); TP collectives exposed but what Megatron reduces under the weight gradient"
        + (" and what async TP overlaps with its GEMMs" if cfg.training.async_tp else "")
        + "; EP all-to-alls exposed; CP hides behind the attention core",
        "left out: biases, dropout, MTP modules, the embedding's TP all-reduce, compute slowed by concurrent "
        "communication kernels",
    ]
    notes += _liger_notes(cfg)
    if not cfg.is_training:
        notes.append("inference: one prefill of seq_len tokens per sequence, forward only, no optimizer; "
                     "the LM head runs on the last token of each sequence; time_s covers the global batch")
    return notes


def _liger_notes(cfg: Resolved) -> list[str]:
    """What Liger-Kernel changes in the step (kernels.LIGER_TRAFFIC, liger_operations.py), with their sources."""
    notes = []
    if elementwise_kernels(cfg.training) == "liger":
        notes.append(f"liger_kernel: RMSNorm, rotary and SwiGLU as Liger-Kernel's Triton kernels, one read of each input "
                     f"and one write of each output (rotary's backward rewrites the gradient in place: 2/3 of a fused "
                     f"backward's bytes; SwiGLU's backward recomputes SiLU in registers) in place of the eager ops' "
                     f"extra passes ({kernels.LIGER_SOURCE})")
    if cfg.is_training and runs_liger_flce(cfg.training):
        notes.append("loss 'chunked' (Liger's fused linear cross-entropy): the LM head's three GEMMs run chunk by chunk "
                     "inside the forward, the weight gradient accumulated over the chunks (its V x h sum read and "
                     "written each chunk), the cross-entropy kernel reads each chunk of logits twice and writes the "
                     f"gradient over them; backward only scales the two gradients ({liger_operations.SOURCE})")
    return notes


# --- text ----------------------------------------------------------------------------------------------

def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}".rstrip()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def render_roofline_text(result: Roofline) -> str:
    step = result.step
    lines = [f"Step time on {result.gpu} ({result.mode}), pipeline stage {result.stage} "
             f"(the slowest); one execution = one layer, one micro-batch, one GPU; 'roof ms' at the hardware's "
             f"roofs, 'ms each' as the kernels achieve it (estimator/speed/kernels.py)"]
    header = (f"  {'operation':<52}{'phase':<10}{'FLOPs':>12}{'bytes':>12}{'FLOP/B':>9}{'ridge':>7}"
              f"  {'bound':<8}{'roof ms':>9}{'ms each':>9}{'achieved':>9}{'count':>7}{'ms total':>10}")
    scope = None
    for op in result.operations:
        if op.scope != scope:
            scope = op.scope
            lines += ["", f"{scope}:", header]
        lines.append(f"  {op.name[:51]:<52}{op.phase:<10}{_si(op.flops):>12}{_si(op.bytes, 'B'):>12}"
                     f"{op.arithmetic_intensity:>9.1f}{op.ridge_point:>7.0f}  {op.bound:<8}{_ms(op.time_s):>9}"
                     f"{_ms(op.expected_time_s):>9}{op.achieved_fraction:>9.0%}{op.count:>7}"
                     f"{_ms(op.total_expected_s):>10}")
    lines += ["", "Communication per step:"]
    if not step.communication:
        lines.append("  none")
    for c in step.communication:
        lines.append(f"  {c.name:<60}{c.group:<10} n={c.size:<4}{c.link:<11}{_si(c.bytes, 'B'):>11}"
                     f"  {_ms(c.time_s):>9} ms, exposed {_ms(c.exposed_s)} ms")
    lines += [
        "",
        f"Step ({step.microbatches} micro-batches): {step.time_s:.4f} s = compute {step.compute_s:.4f}"
        f" + recompute {step.recompute_s:.4f} + bubble {step.bubble_s:.4f} (fraction {step.bubble_fraction:.3f})"
        f" + exposed communication {step.exposed_comm_s:.4f} + optimizer {step.optimizer_s:.4f}",
        f"Throughput: {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; MFU {step.mfu:.1%} "
        f"({_si(step.model_flops_per_token)}FLOP per token against {_si(step.mfu_peak_flops)}FLOP/s)",
        f"Upper bound (every operation at its roof): {step.upper_bound.time_s:.4f} s, "
        f"{step.upper_bound.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {step.upper_bound.mfu:.1%}",
        "",
    ]
    lines += [f"Note: {n}" for n in result.notes]
    return "\n".join(lines)
