"""Where parameters live: pipeline stages, and the share of each stage one GPU holds.

Parameters fall into buckets by how they are split (Megatron-Bridge ``theoretical_memory_utils``
does the same): TP-sharded (attention, MLP, shared experts, embedding and head, divided by t),
replicated (norms, routers, MLA down-projections, divided by 1) and routed experts (divided by
EP x expert-TP). Pipeline stages own consecutive layers; the first holds the embedding (and a
learned position table), the last the final norm and LM head, and with tied embeddings and
PP > 1 the last stage keeps its own copy of the embedding matrix as the head (Megatron keeps
both copies and all-reduces their gradients, Shoeybi et al. 2019).
"""

from __future__ import annotations

import math
import re
from operator import add
from typing import NamedTuple

from ..spec.architecture import COLUMN, EXPERT_COLUMN, EXPERT_ROW, REPLICATED, ROW, VOCAB, Architecture, ParameterTensor
from ..spec.errors import ConfigError
from ..spec import vision as _vision
from ..spec.parallel import Parallel
from ..spec.sparse import indexer_tensors


def padded_vocab_size(vocab_size: int, tp: int, framework: str) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (``--make-vocab-size-divisible-by``
    128, times TP, in ``megatron/training/tokenizer``); other stacks use the tokenizer's size."""
    if framework != "megatron":
        return vocab_size
    multiple = 128 * tp
    return math.ceil(vocab_size / multiple) * multiple


_LAYOUT_ALLOWED = ("groups of E (embedding), t (layer), m (MTP) and L (loss) separated by |, with (...)*n and "
                   "x*n repeats")
_LAYOUT_MAX = 4 * 2**14  # symbols after unrolling: every layer, MTP module and separator of the longest model


def parse_layout(text: str) -> list[str]:
    """A layout string's virtual stages, as Megatron-Core's
    ``PipelineParallelLayerLayout.parse_str_to_list`` reads it: commas are cosmetic, ``(...)*n``
    then ``x*n`` are unrolled, ``|`` separates stages. Unrolling is bounded, so a short string
    cannot expand without limit."""
    def unroll(match: re.Match) -> str:
        if len(match.group(1)) * int(match.group(2)) > _LAYOUT_MAX:
            raise ConfigError("parallel.pp_layout", text, _LAYOUT_ALLOWED, f"it unrolls past {_LAYOUT_MAX} symbols")
        return match.group(1) * int(match.group(2))
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d{1,6})", r"(.)\*(\d{1,6})"):
        flat = re.sub(pattern, unroll, flat)
        if len(flat) > _LAYOUT_MAX:
            raise ConfigError("parallel.pp_layout", text, _LAYOUT_ALLOWED, f"it unrolls past {_LAYOUT_MAX} symbols")
    bad = sorted(set(flat) - set("EtmL|"))
    if bad:
        raise ConfigError("parallel.pp_layout", text, _LAYOUT_ALLOWED, f"unknown symbol {bad[0]!r}")
    return flat.split("|")


def layout_stage_layers(arch: Architecture, par: Parallel) -> list[int]:
    """Transformer layers of each virtual stage of `par.pp_layout`, checked as Megatron-Core's
    ``validate_layer_layout`` does (E first, L last, once each; t = num_layers; m = the MTP modules,
    after every layer). MTP is modelled beside the loss, so it must sit in the loss's stage."""
    text, stages = par.pp_layout, parse_layout(par.pp_layout)
    flat = "".join(stages)
    n = par.virtual_stages
    rules = ((len(stages) == n, f"{n} groups (pp x vpp{', 2 x pp under dualpipev' if n == 2 * par.pp else ''})",
              f"it has {len(stages)}"),
             (flat[:1] == "E" and flat[-1:] == "L" and flat.count("E") == flat.count("L") == 1,
              "E once, first, and L once, last", "Megatron-Core validate_layer_layout"),
             (flat.count("t") == arch.num_layers, f"{arch.num_layers} t (num_layers)", f"it has {flat.count('t')}"),
             (flat.count("m") == arch.mtp_layers, f"{arch.mtp_layers} m (mtp_layers)", f"it has {flat.count('m')}"),
             ("m" not in flat or ("t" not in flat[flat.index("m"):] and stages[-1].count("m") == arch.mtp_layers),
              "the m after every t, in the group of L", "MTP is modelled beside the loss"))
    for ok, allowed, why in rules:
        if not ok:
            raise ConfigError("parallel.pp_layout", text, allowed, why,
                              related=("parallel.pp", "parallel.vpp", "model.num_layers"))
    return [stage.count("t") for stage in stages]


def split_key(par: Parallel) -> tuple:
    """The layout fields that decide how the layers split over the pipeline: the memo key of what
    `layers_per_stage` and `stage_parameters` derive from them (an architecture is immutable, so a
    layout search and an app rerun read them back instead of splitting again)."""
    return (par.pp, par.vpp, par.pp_first_stage_layers, par.pp_last_stage_layers, par.pp_schedule,
            par.pp_account_for_embedding, par.pp_account_for_loss, par.pp_layout)


def layers_per_stage(arch: Architecture, par: Parallel) -> list[int]:
    """Transformer layers on each pipeline rank, first to last (all of its chunks: under DualPipe
    the two stages it holds). Remembered on the architecture; a split that does not divide raises
    every time (nothing is remembered then)."""
    def split() -> tuple[int, ...]:
        sizes = virtual_stage_sizes(arch, par)
        return tuple(sum(sizes[k] for k in ks) for ks in rank_virtual_stages(par))
    return list(arch.cached(("layers per stage",) + split_key(par), split))


def _rank_split(arch: Architecture, par: Parallel) -> list[int]:
    """Layers of each rank from pp, vpp and pp_first/last_stage_layers.

    An uneven split gives the first and last ranks their own counts and the middle ranks an
    even share of the rest. Llama 3 trains its 126 layers on 16 stages with one layer fewer on
    the first and last (Grattafiori et al. 2024, section 3.3.2), as Megatron's
    ``--decoder-first/last-pipeline-num-layers`` do."""
    p, v, total = par.pp, par.vpp, arch.num_layers
    first, last = par.pp_first_stage_layers, par.pp_last_stage_layers
    if first is None and last is None:
        if total % p == 0 and (total // p) % v:  # the stages divide; their chunks do not
            raise ConfigError("parallel.vpp", v, f"a divisor of the {total // p} layers of each stage",
                              f"pp x vpp = {p * v} does not divide num_layers ({total})",
                              related=("parallel.pp", "model.num_layers"))
        if total % (p * v):
            raise ConfigError("parallel.pp", p, f"a pp x vpp that divides num_layers ({total})",
                              f"pp x vpp = {p * v}; set pp_first_stage_layers/pp_last_stage_layers for an uneven split",
                              related=("parallel.vpp", "model.num_layers", "parallel.pp_first_stage_layers"))
        return [total // p] * p
    middle_stages = p - (first is not None) - (last is not None)
    rest = total - (first or 0) - (last or 0)
    if rest < 0 or (middle_stages == 0 and rest != 0) or (middle_stages and rest % middle_stages):
        raise ConfigError("parallel.pp_first_stage_layers", first,
                          f"first and last stage layers that leave a multiple of the {middle_stages} "
                          f"middle stages out of num_layers ({total})", f"pp_last_stage_layers = {last}",
                          related=("parallel.pp_last_stage_layers", "parallel.pp", "model.num_layers"))
    even = rest // middle_stages if middle_stages else 0
    counts = [even] * p
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    if any(c == 0 for c in counts[1:-1]) or any(c < 1 for c in counts):
        raise ConfigError("parallel.pp", p, "at most one stage per layer", f"a stage would hold no layer: {counts}",
                          related=("model.num_layers", "parallel.pp_first_stage_layers",
                                   "parallel.pp_last_stage_layers"))
    if v > 1:
        if any(c % v for c in counts[1:-1]) or counts[0] < v or counts[-1] < v:
            raise ConfigError("parallel.vpp", v, f"a divisor of every middle stage's layer count and at most the "
                              f"first and last stage's ({counts})", related=("parallel.pp",))
    return counts


def chunk_sizes(counts: list[int], v: int) -> list[list[int]]:
    """Layers of each virtual chunk per rank. A first or last rank with fewer layers than
    ceil/v chunks gives up layers from its first (resp. last) chunk, where the embedding (resp.
    the loss) already sits (Megatron's ``--account-for-embedding/loss-in-pipeline-split``)."""
    out = []
    for rank, c in enumerate(counts):
        size = -(-c // v)
        chunks = [size] * v
        deficit = size * v - c
        order = range(v) if rank == 0 else range(v - 1, -1, -1)
        for i in order:
            if deficit == 0:
                break
            take = min(deficit, chunks[i] - 1 if v > 1 else deficit)
            chunks[i] -= take
            deficit -= take
        out.append(chunks)
    return out


def rank_virtual_stages(par: Parallel) -> list[list[int]]:
    """The virtual stages (model chunks, numbered in layer order) each rank runs, in its order.
    Interleaved: rank r holds r, r + p, r + 2p, ... (Narayanan et al. 2021). DualPipe: stages r and
    p - 1 - r, every stage on two ranks (DeepSeek-V3 report section 3.2.1; deepseek-ai/DualPipe
    examples/example_dualpipe.py). DualPipeV: r and 2p - 1 - r of 2p (example_dualpipev.py)."""
    p = par.pp
    if par.pp_schedule == "dualpipe":
        return [[r, p - 1 - r] for r in range(p)]
    if par.pp_schedule == "dualpipev":
        return [[r, 2 * p - 1 - r] for r in range(p)]
    return [[j * p + r for j in range(par.vpp)] for r in range(p)]


def virtual_stage_sizes(arch: Architecture, par: Parallel) -> list[int]:
    """Transformer layers of each virtual stage, in layer order: from pp_layout, from Megatron's
    account-for-embedding/loss split, or from pp, vpp and the first/last stage layers."""
    n, total = par.virtual_stages, arch.num_layers
    if par.pp_layout is not None:
        return layout_stage_layers(arch, par)
    e, l = int(par.pp_account_for_embedding), int(par.pp_account_for_loss)
    if e or l:  # Megatron-Core get_transformer_layer_offset: (num_layers + e + l) / (pp x vpp) per stage
        if (total + e + l) % n:
            raise ConfigError("parallel.pp_account_for_embedding" if e else "parallel.pp_account_for_loss", True,
                              f"false unless num_layers + {e + l} = {total + e + l} divides by the {n} virtual "
                              "stages", "Megatron-Core counts the embedding/loss as a layer of the split",
                              related=("parallel.pp", "parallel.vpp", "model.num_layers"))
        sizes = [(total + e + l) // n] * n
        sizes[0] -= e
        sizes[-1] -= l
        return sizes
    if par.pp_schedule == "dualpipev":
        if total % n:
            raise ConfigError("parallel.pp", par.pp, f"a pp whose 2 x pp divides num_layers ({total}) with "
                              "pp_schedule 'dualpipev'", "DualPipeV cuts the model into 2 x pp stages",
                              related=("parallel.pp_schedule", "model.num_layers", "parallel.pp_layout"))
        return [total // n] * n
    per_rank = chunk_sizes(_rank_split(arch, par), par.vpp)
    return [per_rank[k % par.pp][k // par.pp] for k in range(n)]


def stage_layer_chunks(arch: Architecture, par: Parallel) -> list[tuple[range, ...]]:
    """Global layer ranges on each rank, one per chunk, in the order the rank runs them."""
    sizes = virtual_stage_sizes(arch, par)
    ranges, start = [], 0
    for size in sizes:
        ranges.append(range(start, start + size))
        start += size
    return [tuple(ranges[k] for k in ks) for ks in rank_virtual_stages(par)]


def stage_layer_indices(arch: Architecture, par: Parallel) -> list[list[int]]:
    """Global layer indices on each rank, in the order the rank runs its chunks. One entry per
    layer, so for display and tests: estimates read the ranges of `stage_layer_chunks`."""
    return [[i for r in chunks for i in r] for chunks in stage_layer_chunks(arch, par)]


def chunk_kind_counts(arch: Architecture, chunks: tuple[range, ...], skip: int = 0) -> tuple[tuple[str, int], ...]:
    """(kind, layers) over a rank's chunks, in the order it runs them, leaving out its first `skip`
    layers (those full recompute does not store); kinds sorted, each with at least one layer.
    Each chunk is counted in closed form (`Architecture.kind_counts`), so the cost is one step per
    chunk, whatever the number of layers."""
    counts: dict[str, int] = {}
    for r in chunks:
        start = r.start + min(skip, len(r))
        skip -= start - r.start
        for kind, n in arch.kind_counts(start, r.stop):
            counts[kind] = counts.get(kind, 0) + n
    return tuple(sorted((kind, n) for kind, n in counts.items() if n > 0))


def layers_key(arch: Architecture, chunks: tuple[range, ...]) -> tuple:
    """What the kinds of a rank's layers depend on once its first n layers (`chunk_kind_counts`' skip)
    or every N-th (`stored_kind_counts`) are left out: its chunks' lengths, and where the chunks sit
    only where layers of one length can differ in kind: MoE every k-th layer (k > 1), or chunks that
    reach into the dense first layers (`first_dense_layers`). Ranks with equal keys store layers of
    the same kinds under full recompute."""
    if arch.is_moe and (arch.moe_layer_frequency > 1 or any(r.start < arch.first_dense_layers for r in chunks)):
        return chunks
    if arch.is_hybrid:  # the kinds follow an interval or a pattern: where a chunk sits matters
        return chunks
    return tuple(len(r) for r in chunks)


def stored_kind_counts(arch: Architecture, chunks: tuple[range, ...], every: int) -> tuple[tuple[str, int], ...]:
    """(kind, layers) over a rank's chunks that checkpointing every `every`-th layer leaves stored:
    the rank's layers in running order, counted from 1, are checkpointed at multiples of `every`
    (torchtitan's `_apply_layer_sac` counts the blocks it wraps). Only the checkpointed layers are
    walked (at most layers / every steps); the rest is `chunk_kind_counts`."""
    counts = dict(chunk_kind_counts(arch, chunks))
    position = 0  # layers of the rank before this chunk
    for r in chunks:
        first = r.start + (every - 1 - position % every)  # the chunk's first layer whose count is a multiple
        for index in range(first, r.stop, every):
            counts[arch.layer_kind(index)] -= 1
        position += len(r)
    return tuple(sorted((kind, n) for kind, n in counts.items() if n > 0))


def local_numel(t: ParameterTensor, par: Parallel) -> float:
    """Elements of tensor `t` one GPU holds under TP (and EP x expert-TP for routed experts)."""
    if t.split in (COLUMN, ROW, VOCAB):
        return t.numel / par.tp
    if t.split in (EXPERT_COLUMN, EXPERT_ROW):
        return t.numel / (par.ep * par.etp)
    assert t.split == REPLICATED
    return t.numel


class Bucket(NamedTuple):
    """Totals over a group of tensors on one GPU, split into non-expert (dense) and routed-expert
    parts because ZeRO shards them over different groups. Everything the optimizer-state and
    transient formulas need is here, so a stage never walks its tensors again. (A NamedTuple:
    stages add and scale buckets on every estimate.)"""

    dense: float = 0.0
    expert: float = 0.0
    dense_hidden_matrices: float = 0.0  # 2-D hidden weights (Muon's momentum-only set)
    expert_hidden_matrices: float = 0.0
    dense_small: float = 0.0  # tensors under 4096 elements (bitsandbytes keeps them in 32-bit)
    expert_small: float = 0.0
    dense_factored: float = 0.0  # Adafactor: rows + columns of matrices, all of vectors
    expert_factored: float = 0.0
    matrices: float = 0.0  # weights a matmul reads (autocast casts them), embedding lookups excluded
    largest_tensor: float = 0.0  # the one field that is a maximum, not a sum

    def times(self, n: int) -> "Bucket":
        return Bucket(*[v * n for v in self[:-1]], self[-1])

    def plus(self, other: "Bucket") -> "Bucket":
        return Bucket(*map(add, self[:-1], other[:-1]), max(self[-1], other[-1]))


_SUMMED = Bucket._fields[:-1]


def factored_elements(t: ParameterTensor, par: Parallel) -> float:
    """Adafactor's state for one tensor on a GPU: rows + columns for a matrix, all of a vector
    (Shazeer & Stern 2018, section 3)."""
    if len(t.shape) != 2:
        return local_numel(t, par)
    rows, cols = t.shape
    if t.split in (COLUMN, VOCAB):
        rows /= par.tp
    elif t.split == ROW:
        cols /= par.tp
    elif t.split == EXPERT_COLUMN:
        rows /= par.etp
    elif t.split == EXPERT_ROW:
        cols /= par.etp
    copies = t.copies / par.ep if t.split in (EXPERT_COLUMN, EXPERT_ROW) else t.copies
    return (rows + cols) * copies


def bucket(tensors: list[ParameterTensor], par: Parallel) -> Bucket:
    sums = dict.fromkeys(_SUMMED, 0.0)
    largest = 0.0
    for t in tensors:
        n = local_numel(t, par)
        side = "expert" if t.is_expert else "dense"
        sums[side] += n
        if t.role == "hidden_matrix":
            sums[f"{side}_hidden_matrices"] += n
        if math.prod(t.shape) < 4096:
            sums[f"{side}_small"] += n
        sums[f"{side}_factored"] += factored_elements(t, par)
        if t.role in ("hidden_matrix", "head"):
            sums["matrices"] += n
        largest = max(largest, n / t.copies)
    return Bucket(**sums, largest_tensor=largest)


class StageParameters(NamedTuple):
    """Parameters of one pipeline stage on one GPU, as buckets. (An immutable record built for
    every stage of every estimate: a NamedTuple costs a third of a frozen dataclass.)"""

    stage: int
    kind_counts: tuple[tuple[str, int], ...]  # layers of each kind on the stage
    total: Bucket  # everything on the stage
    largest_layer_local: float  # one layer's elements on a GPU (the FSDP/ZeRO-3 unit)
    root_local: float  # embedding + final norm + head on a GPU (the FSDP root unit)
    chunks: tuple[range, ...] = ()  # the rank's layers, one range per virtual chunk, in running order
    first: bool = False  # runs the first virtual stage: the embedding (rank 0; under DualPipe also rank p - 1)
    last: bool = False  # runs the last one: final norm, head, MTP and loss (DualPipe: ranks p - 1 and 0; V: rank 0)
    layers_key: tuple = ()  # what the kinds of its layers, less any first n or every N-th, depend on (`layers_key`)
    vision_encoder: Bucket = Bucket()  # a first stage's vision encoder (what training.freeze_vision freezes)
    vision_tower: Bucket = Bucket()  # ... and the whole tower with its merger or projector (the breakdown names it)
    indexers: Bucket = Bucket()  # DeepSeek Sparse Attention's lightning indexers (untrained under HF: sparse_hf.py)

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.kind_counts)

    @property
    def layer_indices(self) -> tuple[int, ...]:
        """One entry per layer, for display and tests; estimates read `chunks`."""
        return tuple(i for r in self.chunks for i in r)

    @property
    def dense_local(self) -> float:
        return self.total.dense

    @property
    def expert_local(self) -> float:
        return self.total.expert

    @property
    def local(self) -> float:
        return self.total.dense + self.total.expert


def stage_parameters(arch: Architecture, par: Parallel, framework: str) -> list[StageParameters]:
    vocab = padded_vocab_size(arch.vocab_size, par.tp, framework)
    per_kind = {k: arch.cached((k, par.tp, par.ep, par.etp), lambda k=k: bucket(arch.layer_tensors(k), par))
                for k in arch.kinds}
    chunks_per_rank = stage_layer_chunks(arch, par)
    held = rank_virtual_stages(par)
    stages = []
    cache: dict[tuple, tuple[Bucket, float, float]] = {}
    last = par.virtual_stages - 1
    for rank, chunks in enumerate(chunks_per_rank):
        counts = chunk_kind_counts(arch, chunks)
        key = (0 in held[rank], last in held[rank], counts)
        if key not in cache:
            total = Bucket()
            for kind, count in counts:  # DualPipe: both stages' layers, its "2x" parameters (DualPipe README)
                total = total.plus(per_kind[kind].times(count))
            root = Bucket()
            if key[0]:
                root = root.plus(arch.cached(("first root", par.tp, vocab), lambda: _first_root(arch, par, vocab)))
            if key[1]:
                copy = arch.tie_embeddings and par.pp > 1 and not key[0]  # a head rank without the embedding
                root = root.plus(arch.cached(("last root", par.tp, par.ep, par.etp, vocab, copy, par.pp > 1),
                                             lambda: _last_root(arch, par, vocab, copy)))
            largest = max((per_kind[k].dense + per_kind[k].expert for k, _ in counts), default=0.0)
            cache[key] = (total.plus(root), largest, root.dense)
        total, largest, root_dense = cache[key]
        encoder = tower = Bucket()
        if key[0] and arch.vision_tower is not None:
            encoder = arch.cached(("vision encoder", par.tp), lambda: bucket(_vision.encoder_tensors(arch), par))
            tower = arch.cached(("vision tower", par.tp), lambda: bucket(arch.vision_tensors(), par))
        indexers = Bucket()
        if arch.uses_sparse_attention:  # one indexer per layer, every layer an attention layer (spec/sparse.py)
            indexers = arch.cached(("indexers", par.tp), lambda: bucket(indexer_tensors(arch), par)).times(
                sum(n for _, n in counts))
        stages.append(StageParameters(rank, counts, total, largest, root_dense, chunks, key[0], key[1],
                                      layers_key(arch, chunks), encoder, tower, indexers))
    return stages


def _first_root(arch: Architecture, par: Parallel, vocab: int) -> Bucket:
    """The embedding, and a vision-language model's vision tower, which runs before the first layer."""
    return bucket(arch.embedding_tensors(vocab) + arch.vision_tensors(), par)


def _last_root(arch: Architecture, par: Parallel, vocab: int, copy: bool) -> Bucket:
    """Final norm and head; with tied embeddings under PP a last stage without the embedding keeps
    its own copy of it as the head (`copy`); MTP modules sit after the last layer (Megatron). A rank
    holding both ends (DualPipe, DualPipeV) shares the matrix (DeepSeek-V3 report section 3.2.3)."""
    tensors = arch.head_tensors(vocab)
    if copy:
        tensors.append(ParameterTensor("lm_head (tied copy)", (vocab, arch.hidden_size), VOCAB, "head"))
    root = bucket(tensors, par)
    if arch.tie_embeddings and not copy:  # the head multiplies by the embedding matrix itself
        root = root.plus(Bucket(matrices=vocab * arch.hidden_size / par.tp))
    if arch.mtp_layers:
        root = root.plus(bucket(arch.mtp_tensors(), par).times(arch.mtp_layers))
    return root
