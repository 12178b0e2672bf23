"""The pipeline schedule's micro-batches: how many a step runs, how many each rank holds in flight
(1F1B, interleaved 1F1B, ZB-H1, DualPipe, DualPipeV), and the counts Megatron-Core accepts."""

from __future__ import annotations

from functools import lru_cache

from ..spec.parallel import Parallel
from ..spec.training import Training


# --- pipeline schedule -----------------------------------------------------------------------------

def pipeline_filling_microbatches(par: Parallel, group: int | None = None) -> int:
    """The fewest micro-batches per step at which every pipeline rank holds as many in flight as
    any larger global batch would (see `in_flight_chunks`): p for 1F1B, where rank r holds
    min(p - r, m); interleaved, the fewest that Megatron-Core accepts (`interleaved_microbatches_error`)
    with m v >= W_0 + 1 chunk-forwards for rank 0's warm-up W_0 = 2(p - 1) + (v - 1)g: with the group
    g of `microbatch_group` that is g when g >= 2p - 1, else g + p (2p for the default g = p); 2p under
    DualPipe(V), the fewest it runs. Without a pipeline, one."""
    if par.pp == 1:
        return 1
    if par.schedule == "interleaved":
        return interleaved_filling_microbatches(par.pp, microbatch_group(par, group))
    # DualPipe and DualPipeV assert num_chunks >= 2 x num_ranks (deepseek-ai/DualPipe); ZB-H1 fills as 1F1B
    return 2 * par.pp if par.schedule in ("dualpipe", "dualpipev") else par.pp


def interleaved_filling_microbatches(p: int, group: int) -> int:
    """`pipeline_filling_microbatches` of Megatron's interleaved schedule: g when g >= 2p - 1, else g + p."""
    return group if group >= 2 * p - 1 else group + p


def global_batch_size(training: Training, par: Parallel) -> int:
    """The global batch the estimate assumes: the one given, else micro-batch x DP x the micro-batches
    that fill the pipeline, so that the default is what a real run on this layout holds rather than
    one micro-batch in flight."""
    if training.global_batch_size:
        return training.global_batch_size
    fill = pipeline_filling_microbatches(par, training.microbatch_group_size) if training.mode == "training" else 1
    return training.micro_batch_size * par.dp * fill


def microbatches(training: Training, par: Parallel) -> int:
    """m = global batch / (micro-batch x DP)."""
    return global_batch_size(training, par) // (training.micro_batch_size * par.dp)


# Qi et al. 2023 (Zero Bubble Pipeline Parallelism), Table 1: a layer's F pass keeps M_B = 34sbh
# (+ 5as^2b without flash attention); its B pass frees all but M_W = 32sbh, the inputs of its linear
# layers and their output gradients, which the deferred W pass reads (sail-sg zero-bubble
# WeightGradStore.put(total_input, grad_output, ...)). The share of a micro-batch's activations a
# deferred W holds is therefore 32/34.
ZB_W_SHARE = 32 / 34


def in_flight_chunks(rank: int, par: Parallel, m: int, chunks: tuple[range, ...] = (), group: int | None = None) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, in units of the rank's
    whole layer stack (`chunks`, its layer ranges, weigh DualPipe's two chunks by their layers).

    1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs p - r forwards before its first
    backward, so it holds min(p - r, m) micro-batches.
    Interleaved 1F1B with v chunks: `interleaved_in_flight` (Megatron-Core's warm-up, `group` its
    micro-batch group size). ZB-H1 and DualPipe(V): `zero_bubble_in_flight`, `dualpipe_in_flight`.
    """
    p, v = par.pp, par.vpp
    if par.schedule == "zero_bubble":
        return zero_bubble_in_flight(rank, p, m)
    if par.schedule in ("dualpipe", "dualpipev"):
        return dualpipe_in_flight(rank, par, chunks)
    if v == 1:
        return float(min(p - rank, m))
    return interleaved_in_flight(rank, p, v, m, microbatch_group(par, group), chunk_sizes(chunks))


def in_flight_per_rank(par: Parallel, m: int, chunks: list[tuple[range, ...]], group: int | None = None) -> list[float]:
    """`in_flight_chunks` of every rank, first to last (`chunks`: each rank's layer ranges), in one
    pass: an estimate asks for all of them, and 1F1B's and the interleaved schedule's closed forms
    cost one arithmetic step per rank."""
    p, v = par.pp, par.vpp
    if par.schedule in ("zero_bubble", "dualpipe", "dualpipev"):
        return [in_flight_chunks(r, par, m, c) for r, c in enumerate(chunks)]
    if v == 1:
        return [float(min(p - r, m)) for r in range(p)]
    return list(_interleaved_per_rank(p, v, m, microbatch_group(par, group), tuple(chunks)))


@lru_cache(maxsize=256)
def _interleaved_per_rank(p: int, v: int, m: int, group: int, chunks: tuple[tuple[range, ...], ...]) -> tuple[float, ...]:
    """`in_flight_per_rank` of the interleaved schedule, remembered: a planner's search asks for the
    same few (DeepSeek-V3 on 2,048 GPUs: 73 distinct of about 5,000 asked) and a rank with uneven
    chunks replays its schedule (`interleaved_chunk_peak`, m v steps: 7,680 there). Bounded in
    entries: a key is integers and the ranks' layer ranges (the resolved stages' own range objects),
    a value one float per rank: at PP 16 with 4 chunks about 4 KB, so a full cache a megabyte."""
    return tuple(interleaved_in_flight(r, p, v, m, group, chunk_sizes(chunks[r] if r < len(chunks) else ()))
                 for r in range(p))


def chunk_sizes(chunks: tuple[range, ...]) -> tuple[int, ...]:
    """The layers of each of a rank's virtual chunks, or () when they hold as many each (the closed form)."""
    sizes = tuple(len(c) for c in chunks)
    return sizes if len(set(sizes)) > 1 else ()


# Megatron-Core's interleaved schedule (pipeline_parallel/schedules.py), the same at every release the
# estimator offers (versions.py: core_v0.16.1 and core_v0.19.0; tests/test_megatron_schedules.py runs
# each release's own code). It dates from core_v0.10.0 (commit 4295be1a, "tunable schedule with
# overlapping", 2024-11-01); before it, m = p ran every chunk-forward first (all m v in flight).
MEGATRON_SCHEDULE_SOURCE = ("Megatron-Core pipeline_parallel/schedules.py get_pp_rank_microbatches and "
                            "get_schedule_table (core_v0.16.1 = core_v0.19.0; since core_v0.10.0, commit 4295be1a)")


def microbatch_group(par: Parallel, group: int | None) -> int:
    """--microbatch-group-size-per-virtual-pipeline-stage, Megatron's default pp when unset
    (model_parallel_config.py __post_init__)."""
    return par.pp if group is None else group


def interleaved_warmup(rank: int, p: int, v: int, m: int, group: int) -> int:
    """Chunk-forwards rank r runs before its first backward (get_pp_rank_microbatches, training,
    without --overlap-moe-expert-parallel-comm): 2(p - r - 1) + (v - 1)g, all m v when that many or more."""
    return min(2 * (p - rank - 1) + (v - 1) * group, m * v)


def interleaved_in_flight(rank: int, p: int, v: int, m: int, group: int, sizes: tuple[int, ...] = ()) -> float:
    """Rank r's chunk activations at its peak, in whole stacks (each chunk is 1/v of its layers): the
    warm-up W, then the steady state runs one forward before each backward, W + 1 at its top; all m v
    when the warm-up runs every chunk. For r = 0 and g = p that is p(1 + (p - 1)/(p v)) stacks,
    Korthikanti's factor. Chunks of unequal layers (`sizes`: the embedding or the loss counted in the
    split, an uneven first or last stage, a pipeline layout) weigh by their layers: `interleaved_chunk_peak`."""
    if sizes and sum(sizes):
        return interleaved_chunk_peak(rank, p, v, m, group, sizes) / sum(sizes)
    warmup = interleaved_warmup(rank, p, v, m, group)
    return (warmup if warmup == m * v else warmup + 1) / v


def interleaved_schedule(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each chunk-forward in running order (schedules.py get_schedule_table): each
    group of g micro-batches runs through chunks 0 .. v - 1; a chunk-backward runs the same order with the
    chunk reversed (get_model_chunk_id, forward=False)."""
    order = []
    for start in range(0, m, group):
        batch = range(start, m if start + group >= m else start + group)
        order += [(mb, chunk) for chunk in range(v) for mb in batch]
    return order


def interleaved_chunk_peak(rank: int, p: int, v: int, m: int, group: int, sizes: tuple[int, ...]) -> int:
    """The most layers' activations rank r holds at once when its chunks hold `sizes` layers: the warm-up's
    chunk-forwards, then each steady step's forward before its backward (schedules.py
    forward_backward_pipelining_with_interleaving), the backwards freeing their chunk's micro-batch."""
    order = interleaved_schedule(m, v, group)
    warmup = interleaved_warmup(rank, p, v, m, group)
    held = sum(sizes[chunk] for _, chunk in order[:warmup])
    peak = held
    for step in range(m * v - warmup):
        held += sizes[order[warmup + step][1]]
        peak = max(peak, held)
        held -= sizes[v - 1 - order[step][1]]
    return peak


def interleaved_microbatches_error(p: int, m: int, group: int) -> str:
    """Why Megatron-Core's interleaved schedule refuses m micro-batches in groups of g (schedules.py
    forward_backward_pipelining_with_interleaving: p <= g <= m, and the last group, m mod g, empty or
    at least p), or "" when it runs them."""
    if not p <= group <= m:
        return f"at least one whole group (the group is {group}, pp = {p} or more)"
    if 0 < m % group < p:
        return f"a last group (micro-batches mod group) of 0 or at least pp = {p}, not {m % group}"
    return ""


def in_flight_rule(par: Parallel, group: int | None = None) -> tuple[str, str]:
    """(text appended to the activations' formula, its source) for the schedules beyond 1F1B."""
    schedule = par.schedule
    if schedule == "interleaved":
        return (f"; interleaved in flight: min(2(p - r - 1) + (v - 1) x {microbatch_group(par, group)} + 1, m v) "
                "chunks / v (micro-batch group of the virtual stages)", MEGATRON_SCHEDULE_SOURCE)
    if schedule == "zero_bubble":
        return ("; ZB-H1 in flight: min(p - r, m) + 32/34 x min(r, m - p + r) deferred W inputs",
                "Qi et al. 2023 (ZB-H1, Table 1); sail-sg zb-h1-quick-start schedules.py")
    if schedule in ("dualpipe", "dualpipev"):
        return (f"; {'DualPipe' if schedule == 'dualpipe' else 'DualPipeV'} in flight: (2n - k) x chunk 0 + "
                "(k + 1) x chunk 1 by layer share, 2n + 1 = PP + 1 stages in all",
                "deepseek-ai/DualPipe README and dualpipe.py/dualpipev.py step(); DeepSeek-V3 report 3.2.1")
    return "", ""


def zero_bubble_in_flight(rank: int, p: int, m: int) -> float:
    """ZB-H1 (Qi et al. 2023, section 2.1; sail-sg zb-h1-quick-start ``schedules.py``): rank r keeps
    1F1B's min(p - r, m) micro-batches and defers the W pass of its first r steady-state backwards,
    holding ZB_W_SHARE of a micro-batch for each: min(p - r, m) + 32/34 x min(r, m - (p - r)). Rank 0
    defers nothing, so the peak over ranks is 1F1B's (the paper's "same peak memory as 1F1B")."""
    return min(p - rank, m) + ZB_W_SHARE * min(rank, max(0, m - (p - rank)))


def dualpipe_in_flight(rank: int, par: Parallel, chunks: tuple[range, ...] = ()) -> float:
    """DualPipe and DualPipeV (deepseek-ai/DualPipe ``dualpipe.py``/``dualpipev.py`` step()): with
    n = p/2 and k = min(r, p - 1 - r) under DualPipe (n = p, k = r under DualPipeV), a rank runs
    2(n - k - 1) + (k + 1) forwards of its chunk in code phase 0 and k + 1 of phase 1, then one more
    phase-0 forward opens the main F&B loop, whose pairs keep the level: the peak holds 2n - k chunks
    of phase 0 and k + 1 of phase 1, 2n + 1 chunks in all: the README's "PP + 1" activations. Each
    chunk counts by its share of the rank's layers (DualPipe's second-half ranks run phase 0 on their
    second chunk). The deferred W passes (enable_zb) come after backwards, below this peak."""
    p = par.pp
    n, k = (p // 2, min(rank, p - 1 - rank)) if par.pp_schedule == "dualpipe" else (p, rank)
    sizes = [len(c) for c in chunks] if len(chunks) == 2 and any(chunks) else [1, 1]
    share = [size / sum(sizes) for size in sizes]
    swap = par.pp_schedule == "dualpipe" and rank >= p // 2  # dualpipe.py: phase ^= is_in_second_half
    return (2 * n - k) * share[swap] + (k + 1) * share[1 - swap]
