"""The step's communication: tensor, context, expert, pipeline and data parallel collectives, their
buckets and what of them hides behind compute.
"""

from __future__ import annotations

from typing import NamedTuple

from . import collectives
from ..spec.dtypes import bytes_per_element
from ..spec.gpus import GPU
from ..spec.parallel import Parallel
from ..memory.activations.recompute import op_level
from ..memory.resolved import Resolved
from ..memory.states import fsdp2_gathered_block_bytes
from ..spec.choices import FSDP_FRAMEWORKS
from ..spec.training import Training
from .operations import _Context
from .layer_operations import _attention_widths
from .operation_table import OperationTable, StageWork


class Communication(NamedTuple):
    """One collective of the step on one GPU: its total time and the part compute does not hide.
    (An immutable record built and revised several times in every step: a NamedTuple's `_replace`
    costs a fraction of `dataclasses.replace`.)"""

    name: str
    group: str  # "TP", "CP", "EP", "DP", "expert DP", "PP"
    size: int  # ranks in the group
    link: str  # "intra-node" or "inter-node"
    bandwidth: float  # bytes/s, one direction, per GPU: the bus bandwidth NCCL reaches (collectives.py)
    bytes: float  # bytes one GPU sends per step (ring factors applied)
    time_s: float
    exposed_s: float
    formula: str
    line_bandwidth: float = 0.0  # the link's one-way line rate per GPU (the catalog's)
    calls: float = 0.0  # collective calls per step (each costs a latency)
    unhideable_s: float = 0.0  # exposed whatever the compute: a last bucket, a first prefetch unit

    def to_json(self) -> dict:
        return self._asdict()


# --- communication -----------------------------------------------------------------------------------

def _link(gpu: GPU, size: int, stride: int) -> tuple[str, float]:
    return collectives.link_of(gpu, size, stride)


def _ring(n: int, all_reduce: bool = False) -> float:
    return collectives.ring_factor(n, all_reduce)


def _collective(gpu: GPU, roof: bool, name: str, group: str, size: int, stride: int, wire_bytes: float,
                calls: float, formula: str, all_reduce: bool = False, ring: bool = True) -> Communication | None:
    """A collective of the step, exposed in full until an overlap rule says otherwise. At the roof
    it runs at the link's line rate with no latency; as expected, at nccl-tests' bus bandwidth
    plus a latency per call (collectives.py)."""
    if size <= 1 or wire_bytes <= 0:
        return None
    link, line = _link(gpu, size, stride)
    if ring:  # a ring crosses nodes through the NICs of all the group's ranks there (collectives.ring_line_rate)
        line = collectives.ring_line_rate(gpu, link, size, stride)
    bandwidth = line if roof else collectives.bus_bandwidth(gpu, link, all_reduce, size if ring else 0, stride)
    time = wire_bytes / bandwidth + (0.0 if roof else calls * collectives.LATENCY_S[link])
    return Communication(name, group, size, link, bandwidth, wire_bytes, time, time, formula, line, calls)


def _passes(cfg: Resolved, work: StageWork) -> float:
    """Passes over a layer per micro-batch whose collectives run: forward, backward (training) and
    the recomputed forward."""
    return (2.0 if cfg.is_training else 1.0) + work.recompute_fraction


def tensor_parallel(cfg: Resolved, ctx: _Context, work: StageWork, table: OperationTable,
                    roof: bool) -> list[Communication]:
    """TP: 2 all-reduces per layer forward and 2 backward (Shoeybi et al. 2019, section 3), or with
    sequence parallelism 2 all-gathers + 2 reduce-scatters moving the same bytes (Korthikanti
    section 4.2.2); each of s*b*h*B bytes with the ring factor 2(t-1)/t. Full recompute repeats
    the forward's. Exposed as `tp_exposed` says (at the roof all of it: the roof hides nothing of TP)."""
    par, m, h = cfg.parallel, cfg.microbatches, cfg.architecture.hidden_size
    passes = _tp_passes(cfg, work)
    wire = 2 * passes * _ring(par.tp, all_reduce=True) * ctx.T * h * ctx.B * work.layers * m
    c = _collective(ctx.gpu, roof, "tensor-parallel all-reduce (or all-gather + reduce-scatter)", "TP", par.tp, 1,
                    wire, 2 * passes * work.layers * m, "2 per layer per direction x 2(t-1)/t x s*b*h*B x layers x m"
                    + (", + the forward's all-gathers again (operator-level SAC)" if passes % 1 else ""),
                    all_reduce=not par.sequence_parallel)
    if c is None:
        return []
    return [c if roof else c._replace(exposed_s=tp_exposed(cfg, c, work, table))]


def _tp_passes(cfg: Resolved, work: StageWork) -> float:
    """`_passes`, and under torchtitan's operator-level selective AC with sequence parallelism half a
    pass more: its policy saves the outputs of reduce_scatter_tensor but not of all_gather_into_tensor
    (torchtitan parallelize_llama.py _save_list, 9dec370 and 820504e), so the backward re-runs the
    forward's all-gathers to recompute what the weight gradients need."""
    extra = 0.5 if op_level(cfg.training) and cfg.parallel.sequence_parallel and cfg.is_training else 0.0
    return _passes(cfg, work) + extra


def tp_exposed(cfg: Resolved, c: Communication, work: StageWork, table: OperationTable) -> float:
    """The part of the TP collectives compute does not hide, pass by pass and layer by layer, out of
    equal shares per pass (every pass moves the same bytes):

    - Megatron-Core without --tp-comm-overlap: the forward's collectives are exposed. In backward each
      column-parallel linear reduces its input gradient (all-reduce, or reduce-scatter under sequence
      parallelism) asynchronously while it computes its weight gradient, and re-gathers its
      sequence-parallel input under the input-gradient GEMM (megatron/core/tensor_parallel/layers.py
      LinearWithGradAccumulationAndAsyncCommunication, CUDA_DEVICE_MAX_CONNECTIONS=1): half of the
      backward's collectives hide behind the weight-gradient GEMMs; the row-parallel linears' gathers
      of the output gradient stay exposed.
    - `training.async_tp`: a collective is cut into t chunks and each chunk's transfer runs under the
      GEMM of another (Wang et al. 2023, Overlap Communication with Dependent Computation via
      Decomposition in Large Deep Learning Models, ASPLOS): one chunk (1/t) stays exposed, and what is
      longer than the pass's GEMMs. Megatron's TE userbuffers overlap every pass (fprop, dgrad and
      wgrad, transformer_engine/pytorch/module/base.py initialize_ub). torchtitan's async TP is
      Inductor's micro-pipeline TP (torch/_inductor/fx_passes/micro_pipeline_tp.py): it fuses an
      all-gather only when every user is a matmul taking it as the left operand, a reduce-scatter only
      when its input is one matmul's output. The forward matches (the gathered input feeds wq/wk/wv and
      w1/w3, wo and w2 feed the scatters); the backward does not (the weight gradient takes the gathered
      output gradient transposed; wq/wk/wv's and w1/w3's input gradients are summed before the scatter):
      the forward and its recomputation overlap, the backward's collectives stay exposed.
    - every other stack: exposed in full."""
    tr, t, m = cfg.training, cfg.parallel.tp, cfg.microbatches
    passes = _tp_passes(cfg, work)
    forward_passes = 1 + work.recompute_fraction  # the recomputed all-gathers run in the backward graph
    per_pass = c.time_s / max(1, work.layers) / m / passes  # one layer, one micro-batch, one pass
    exposed = 0.0
    for v, n in work.counts.items():
        forward = backward = per_pass
        if tr.async_tp:
            forward = max(per_pass / t, per_pass - table.seconds[v, "matmul forward", False])
        if tr.framework == "megatron" and tr.async_tp:
            backward = max(per_pass / t, per_pass - table.seconds[v, "matmul backward", False])
        elif tr.framework == "megatron":
            backward = per_pass / 2 + max(0.0, per_pass / 2 - table.seconds[v, "weight gradient", False])
        exposed += n * m * (forward * forward_passes + backward * (passes - forward_passes))
    return min(c.time_s, exposed)


def context_parallel(cfg: Resolved, ctx: _Context, work: StageWork, table: OperationTable,
                     roof: bool) -> list[Communication]:
    """CP: ring attention passes each rank's K/V chunk around the ring, cp - 1 hops; backward passes
    K/V and their gradients. Overlapped with the attention core of the chunk in hand
    (Megatron-Core context parallelism docs), so only the excess over that compute is exposed."""
    par, m = cfg.parallel, cfg.microbatches
    if par.cp <= 1:
        return []
    d_qk, d_v, kv_heads = _attention_widths(cfg.architecture)
    directions = 2 if cfg.is_training else 1
    kv = ctx.T * kv_heads / par.tp * (d_qk + d_v) * ctx.B
    per_layer = (par.cp - 1) * kv * (1 + 2 * (directions - 1))
    attention = sum(n * table.seconds[v, "attention", roof] for v, n in work.counts.items()) * m
    c = _collective(ctx.gpu, roof, "context-parallel ring exchange of K and V", "CP", par.cp, par.tp,
                    per_layer * work.layers * m, (par.cp - 1) * directions * work.layers * m,
                    "(cp-1) x s*b*g*(d_k + d_v)/t*B per layer forward, x2 more in backward (K/V and their gradients)",
                    ring=False)
    return [c._replace(exposed_s=max(0.0, c.time_s - attention))] if c else []


def expert_parallel(cfg: Resolved, ctx: _Context, work: StageWork, roof: bool) -> list[Communication]:
    """EP: an all-to-all dispatches the k routed copies of each token and another combines them,
    forward and backward (Megatron-Core alltoall token dispatcher); (ep-1)/ep of them leave the
    GPU (a balanced router). Exposed: the experts wait for their tokens (no overlap modelled).
    A group wider than a node sends to its node's peers over NVLink and to the rest through its NIC
    at the same time (`collectives.split_all_to_all`); DeepEP/HybridEP send a token once to each
    other node (`collectives.node_deduplicated_all_to_all`)."""
    arch, par, m = cfg.architecture, cfg.parallel, cfg.microbatches
    moe_layers = sum(n for (kind, _), n in work.counts.items() if kind == "moe")
    if not moe_layers or par.ep <= 1:
        return []
    passes = _passes(cfg, work)
    k, phi = arch.num_experts_per_token, cfg.training.moe_capacity_factor
    copy = 2 * passes * arch.hidden_size * ctx.B  # one token copy's dispatch and combine, every pass
    copies = k * phi * ctx.T_sp * moe_layers * m  # the routed copies of the stage's tokens per step
    c = _collective(ctx.gpu, roof, "expert-parallel all-to-all (dispatch and combine)", "EP", par.ep, par.etp,
                    (par.ep - 1) / par.ep * copy * copies, 2 * passes * moe_layers * m,
                    "2 per MoE layer per direction x (ep-1)/ep x k*phi*s*b*h/t*B", ring=False)
    if c is None or c.link != "inter-node":
        return [c] if c else []
    if cfg.training.moe_dispatcher == "deepep":
        time, nic, nvlink = collectives.node_deduplicated_all_to_all(ctx.gpu, par.ep, par.etp, copy, k,
                                                                     copies / k, c.calls, roof)
        formula = ("; DeepEP/HybridEP: each token once to each other node its experts are on, "
                   "(nodes-1)(1-(1-1/nodes)^k) copies through the NIC, then over NVLink inside that node")
        moved = nic + nvlink
    else:
        time, moved = collectives.split_all_to_all(ctx.gpu, par.ep, par.etp, copy * copies, c.calls, roof)
        formula = "; across nodes (r-1)/ep of the copies over NVLink and (ep-r)/ep through the NIC at once"
    return [c._replace(time_s=time, exposed_s=time, bytes=moved, bandwidth=moved / time, formula=c.formula + formula)]


def pipeline_parallel(cfg: Resolved, ctx: _Context, roof: bool) -> list[Communication]:
    """PP: each micro-batch sends its activations (s*b*h*B, /t with Megatron's scatter-gather over
    TP) to the next stage and its gradient back, once per virtual chunk."""
    par, m = cfg.parallel, cfg.microbatches
    if par.pp <= 1:
        return []
    directions = 2 if cfg.is_training else 1
    hop = ctx.T * cfg.architecture.hidden_size * ctx.B / (par.tp if par.sequence_parallel else 1)
    c = _collective(ctx.gpu, roof, "pipeline send/receive of activations", "PP", par.pp, par.gpus_per_stage,
                    directions * par.vpp * hop * m, directions * par.vpp * m,
                    "directions x v x s*b*h*B (/t with sequence parallelism) x m", ring=False)
    return [c] if c else []


# Gradient buckets, in parameters: Megatron-Core DDP max(40M, 1M x DP) (distributed_data_parallel_config
# bucket_size); DeepSpeed reduce_bucket_size 5e8 elements (ZeRO config default; the timing keeps it whatever
# training.reduce_bucket_size says: the memory model reads that field, deepspeed_step.deepspeed_settings); PyTorch
# DDP 25 MiB (bucket_cap_mb) of gradient bytes.
def _bucket_params(framework: str, n: int, grad_bytes: float) -> float:
    if framework == "megatron":
        return max(40e6, 1e6 * n)
    if framework == "deepspeed":
        return 5e8
    return 25 * 2**20 / grad_bytes


def _sharded_per_unit(cfg: Resolved, zero: int) -> bool:
    """Gathers and reduce-scatters run unit by unit (one layer) in every micro-batch: FSDP2 with
    sharded gradients, and ZeRO-3 in any framework."""
    return zero == 3 or (zero == 2 and cfg.training.framework in FSDP_FRAMEWORKS)


def _dp_dtypes(cfg: Resolved, ctx: _Context) -> tuple[float, float, bool]:
    """(bytes of a reduced gradient element, of a gathered parameter element, whether the gradients are reduced
    once per step under the HF Trainer's no_sync): fully_shard gathers the compute copy (MixedPrecisionPolicy);
    the HF Trainer's FSDP2 reduce-scatters in bf16 (Accelerate's reduce_dtype), the last micro-batch's only
    (memory/hf_fsdp2.py)."""
    fw = cfg.training.framework
    G, P = bytes_per_element(cfg.recipe.grad_dtype), bytes_per_element(cfg.recipe.param_dtype)
    no_sync = fw == "hf_fsdp2"
    return (ctx.B if no_sync else G), (ctx.B if fw in FSDP_FRAMEWORKS else P), no_sync


def data_parallel(cfg: Resolved, ctx: _Context, work: StageWork, roof: bool) -> list[Communication]:
    """DP / ZeRO / FSDP traffic of the stage (training only), exposed as each framework overlaps it.

    Gradients are reduced once per step (accumulated over micro-batches: DDP's no_sync, Megatron,
    DeepSpeed ZeRO-1/2) by an all-reduce (ZeRO 0) or a reduce-scatter; ZeRO-1/2 all-gather the
    updated parameters once; ZeRO-3 and FSDP2 gather each layer before its forward and again before
    its backward and reduce-scatter its gradient, in every micro-batch (Rajbhandari et al. 2020,
    section 7: 1.5x the all-reduce volume per micro-batch); FSDP2 shard-grad-op gathers for the
    forward only. Overlap (`collectives.OVERLAP_SOURCES`):

    - bucketed gradient reduction hides behind the last micro-batch's backward but its last bucket;
    - Megatron's parameter all-gather hides behind the next forward but its first bucket; DeepSpeed
      ZeRO-1/2 gathers after the step, exposed;
    - per-unit gathers (FSDP2, ZeRO-3) prefetch one unit: the first waits (FSDP2's root unit,
      embedding and head, gathered at the start of forward), then each shows only where it is
      longer than the unit before's compute; in backward the gather and the reduce-scatter share
      the link, and the last reduce-scatter waits.

    `parallel.comm_overlap` scales what these rules hide (1: all of it, 0: none)."""
    if not cfg.is_training:
        return []
    tr, par, gpu, m, zero = cfg.training, cfg.parallel, ctx.gpu, cfg.microbatches, cfg.zero_stage
    sp = cfg.stages[work.rank]
    G, P, no_sync = _dp_dtypes(cfg, ctx)
    per_unit = _sharded_per_unit(cfg, zero)
    layers = max(1, work.layers)
    out: list[Communication] = []
    for label, group, n, stride, params in (
            ("", "DP", par.dp * par.cp, par.tp, sp.dense_local),
            ("expert ", "expert DP", max(1, par.expert_data_parallel), par.ep * par.etp, sp.expert_local)):
        if n <= 1 or not params:
            continue
        buckets = params / _bucket_params(tr.framework, n, G)
        if zero == 0:
            grad = _collective(gpu, roof, f"{label}gradient all-reduce", group, n, stride, _ring(n, True) * params * G,
                               buckets, "2(n-1)/n x params x grad bytes, once per step", all_reduce=True)
            out.append(_bucketed(grad, work.backward_s + work.recompute_s, buckets, par, roof))
            continue
        reductions = m if per_unit and not no_sync else 1
        grad = _collective(gpu, roof, f"{label}gradient reduce-scatter", group, n, stride,
                           reductions * _ring(n) * params * G, reductions * (layers if per_unit else buckets),
                           "(n-1)/n x params x grad bytes" + (", every micro-batch" if reductions > 1 else
                                                              ", once per step"))
        gathers = (2 * m if zero == 3 else m) if per_unit else 1
        gathered = _gathered_bytes(tr, P, sp, params) if label == "" else P
        gather = _collective(gpu, roof, f"{label}parameter all-gather", group, n, stride,
                             gathers * _ring(n) * params * gathered, gathers * (layers if per_unit else buckets),
                             f"{gathers} x (n-1)/n x params x param bytes" + (
                                 " (forward and backward, every micro-batch)" if zero == 3 else "")
                             + (" (float8 linear weights at 1 B)" if gathered != P else ""))
        if per_unit:
            root = sp.root_local * P * _ring(n) if tr.framework in FSDP_FRAMEWORKS and label == "" else 0.0
            out += _per_unit(grad, gather, work, zero == 3, root, par, roof)
        else:
            out.append(_bucketed(grad, work.backward_s + work.recompute_s, buckets, par, roof))
            exposed_gather = tr.framework == "deepspeed"  # all_gather_dp_groups after the step
            out.append(gather if exposed_gather else _bucketed(gather, work.forward_s, buckets, par, roof))
    return out


def _overlapped(c: Communication, raw_exposed: float, par: Parallel, unhideable_s: float) -> Communication:
    """`parallel.comm_overlap` of what the overlap rule hides stays hidden; at most what is exposed
    of `unhideable_s` is exposed whatever the compute."""
    hidden = (c.time_s - raw_exposed) * par.comm_overlap
    exposed = c.time_s - hidden
    return c._replace(exposed_s=exposed, unhideable_s=min(exposed, unhideable_s))


def _bucketed(c: Communication, compute: float, buckets: float, par: Parallel, roof: bool) -> Communication:
    if roof:
        return c  # the roof hides traffic behind whatever compute is left (hide_behind_compute)
    return _overlapped(c, collectives.bucketed_exposure(c.time_s, compute, buckets), par,
                       c.time_s / max(1.0, buckets))


def _gathered_bytes(training: Training, P: float, sp, params: float) -> float:
    """Bytes per dense parameter FSDP2 gathers: with fp8_all_gather torchao gathers the float8 linears'
    weights at 1 byte (states.fsdp2_gathered_block_bytes), the root unit (embedding, head) at P."""
    if not training.fp8_all_gather or params <= 0:
        return P
    block, _ = fsdp2_gathered_block_bytes(training, P, sp)
    root = min(sp.root_local, params)
    return (block * (params - root) + P * root) / params


def _per_unit(grad: Communication, gather: Communication, work: StageWork, zero3: bool, root_bytes: float,
              par: Parallel, roof: bool) -> list[Communication]:
    """Exposure of FSDP2 / ZeRO-3 traffic, unit (layer) by unit, in each micro-batch (see
    `data_parallel`); split between the gather and the reduce-scatter in proportion to their time."""
    if roof:
        return [grad, gather]
    layers = max(1, work.layers)
    gather_passes = 2 if zero3 else 1
    m_gathers = max(1.0, gather.calls / layers / gather_passes)  # micro-batches
    ag_unit = (gather.time_s / m_gathers / gather_passes) / layers
    rs_unit = grad.time_s / m_gathers / layers
    root = root_bytes / gather.bandwidth if root_bytes else 0.0
    forward = collectives.pipelined_exposure(ag_unit, work.forward_s / layers, layers, first=root + ag_unit)
    backward_comm = rs_unit + (ag_unit if zero3 else 0.0)
    backward = collectives.pipelined_exposure(backward_comm, (work.backward_s + work.recompute_s) / layers, layers)
    backward += rs_unit  # the first layer's reduce-scatter has no compute after it
    total = m_gathers * (forward + backward)
    floor = m_gathers * (root + ag_unit + (ag_unit if zero3 else 0.0) + 2 * rs_unit)  # whatever the compute
    share = gather.time_s / (gather.time_s + grad.time_s)
    out = []
    for c, part in ((gather, share), (grad, 1 - share)):
        out.append(_overlapped(c, min(c.time_s, total * part), par, floor * part))
    return out


def hide_behind_compute(comms: list[Communication], groups: tuple[str, ...], budget: float,
                        overlap: float) -> list[Communication]:
    """`overlap` of the time of these groups' traffic hides behind compute, never more than the
    compute there is (the roof's overlap rule; the expected step's for pipeline sends)."""
    out = []
    for c in comms:
        if c.group in groups:
            hidden = min(overlap * c.exposed_s, budget)
            budget -= hidden
            c = c._replace(exposed_s=c.exposed_s - hidden)
        out.append(c)
    return out


def communication(cfg: Resolved, table: OperationTable, work: StageWork, roof: bool) -> list[Communication]:
    """Every collective of the stage per step, with the part compute does not hide."""
    ctx = table.ctx
    comms = (tensor_parallel(cfg, ctx, work, table, roof) + context_parallel(cfg, ctx, work, table, roof)
             + expert_parallel(cfg, ctx, work, roof) + data_parallel(cfg, ctx, work, roof)
             + pipeline_parallel(cfg, ctx, roof))
    ideal = cfg.microbatches * (work.per_microbatch_s)
    hidden_groups = ("DP", "expert DP", "PP") if roof else ("PP",)
    if not roof:  # the DP rules above already used the compute they hide behind
        ideal -= sum(c.time_s - c.exposed_s for c in comms if c.group in ("DP", "expert DP"))
    return hide_behind_compute(comms, hidden_groups, max(0.0, ideal), cfg.parallel.comm_overlap)
