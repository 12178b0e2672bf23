"""Megatron-LM / Megatron-Core: a ``pretrain_gpt.py`` command line, the script that builds it, or a
file of its arguments, read into our JSON config.

Flags, their defaults and their meaning follow Megatron-LM core_v0.16.1
(``megatron/training/arguments.py``; commit 55ac7082517c3878ae653c07c09c534b8aed49f6) and
megatron-core 0.16.1's ``TransformerConfig``; each mapping below cites the rule of ``validate_args``
it copies. The flag table itself is `megatron_flags.FLAGS`. A ``torchrun --nproc_per_node P
--nnodes N`` prefix gives the world size; ``--gpus`` overrides it.
"""

from __future__ import annotations

import ast
import re

from ..errors import ConfigError
from . import megatron_flags
from .build import ConfigBuilder, split_flags, to_float, to_int
from .models import is_hub_id, preset_for
from .result import Imported, Ledger
from .shell import Launch, read_launch

KIND = "megatron"
VERSION = "Megatron-LM core_v0.16.1"
_ENTRY = re.compile(r"(?:^|/)pretrain_gpt\.py$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")

# Argument groups of arguments.py whose every flag leaves memory and speed alone.
_IGNORED_GROUPS = {
    "logging": "logging", "checkpointing": "checkpointing", "data and dataloader": "data loading",
    "learning rate and weight decay": "the learning-rate schedule", "validation": "evaluation",
    "one logger": "logging", "RNG and initialization": "initialisation", "straggler": "monitoring",
    "rerun engine": "fault tolerance", "ft_package": "fault tolerance", "autoresume": "job control",
    "profiling": "profiling", "In-process restart": "fault tolerance", "workload inspector": "monitoring",
    "msc": "storage", "tokenizer": "the tokenizer's files", "regularization": "optimizer hyper-parameters",
}
# Flags of the other groups that leave memory and speed alone, with the reason.
_IGNORED = {
    **dict.fromkeys(("--train-iters", "--train-samples", "--exit-interval", "--exit-duration-in-mins",
                     "--exit-signal-handler", "--exit-signal", "--exit-signal-handler-for-dataloader",
                     "--iterations-to-skip", "--check-weight-hash-across-dp-replicas-interval",
                     "--train-sync-interval", "--result-rejected-tracker-filename"), "run length and job control"),
    **dict.fromkeys(("--manual-gc", "--manual-gc-interval", "--no-manual-gc-eval", "--disable-manual-gc-eval"),
                    "Python garbage collection timing"),
    **dict.fromkeys(("--use-mcore-models", "--use-legacy-models", "--no-check-for-nan-in-loss-and-grad",
                     "--check-for-large-grads", "--deterministic-mode", "--no-initialization",
                     "--use-cpu-initialization", "--init-model-with-meta-device", "--init-method-std",
                     "--embedding-init-method-std", "--disable-gloo-process-groups", "--dataloader-type",
                     "--distributed-backend", "--distributed-timeout-minutes",
                     "--distributed-timeout-seconds-after-init", "--local-rank", "--lazy-mpu-init",
                     "--nccl-communicator-config-path", "--config-logger-dir", "--tp-comm-bootstrap-backend",
                     "--dump-param-to-param-group-map", "--fake-process-group"), "setup, not the step's memory"),
    **dict.fromkeys(("--norm-epsilon", "--apply-layernorm-1p", "--rotary-base", "--rotary-percent",
                     "--rotary-interleaved", "--rotary-seq-len-interpolation-factor", "--use-rope-scaling",
                     "--rope-scaling-factor", "--rope-type", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim",
                     "--calculate-per-token-loss", "--apply-query-key-layer-scaling", "--qk-clip", "--qk-clip-alpha",
                     "--qk-clip-threshold", "--glu-linear-offset", "--activation-func-clamp-value", "--openai-gelu",
                     "--onnx-safe", "--mtp-loss-scaling-factor", "--softmax-type"),
                    "numerics with the same tensors"),
    **dict.fromkeys(("--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff",
                     "--moe-router-score-function", "--moe-router-topk-scaling-factor", "--moe-router-pre-softmax",
                     "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-bias-update-rate",
                     "--moe-input-jitter-eps", "--moe-per-layer-logging", "--moe-router-force-load-balancing",
                     "--moe-use-upcycling", "--moe-upcycling-granularity", "--moe-enable-routing-replay",
                     "--moe-token-drop-policy"),
                    "router numerics and losses (the estimate assumes balanced routing)"),
    **dict.fromkeys(("--fp8-margin", "--fp8-interval", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
                     "--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window",
                     "--hysteresis"), "scaling numerics (a few scalars per tensor)"),
    "--rampup-batch-size": "the warm-up batch; the estimate is of the full global batch",
    "--max-position-embeddings": "the RoPE table bound; only a learned position table stores it",
}
# Megatron's attention backends (AttnBackend): which keep the s x s scores
_EAGER_BACKENDS = ("unfused", "local")
_FP8_RECIPES = {"delayed": "tensorwise", "tensorwise": "tensorwise", "mxfp8": "mxfp8", "blockwise": "blockwise"}
# --tokenizer-type values whose vocabulary is fixed by the name
_TOKENIZER_VOCAB = {"GPT2BPETokenizer": (50257, "GPT-2's BPE vocabulary"),
                    "Llama2Tokenizer": (32000, "Llama 2's SentencePiece vocabulary")}


def is_entry(word: str) -> bool:
    return bool(_ENTRY.search(word))


def looks_like(text: str, name: str = "") -> bool:
    return bool(_ENTRY.search(text) or re.search(r"--(tensor|pipeline)-model-parallel-size\b|--num-layers\b", text))


def _arity(flag: str) -> int | None:
    found = megatron_flags.FLAGS.get(flag)
    return None if found is None else found[0]


def _group(flag: str) -> str:
    return megatron_flags.GROUPS[megatron_flags.FLAGS[flag][1]]


class _Args:
    """The parsed flags; each one read is remembered, so that the rest can be accounted for."""

    def __init__(self, values: dict[str, object]):
        self.values = values
        self.used: set[str] = set()

    def take(self, flag: str, default: object = None) -> object:
        if flag in self.values:
            self.used.add(flag)
            return self.values[flag]
        return default

    def on(self, flag: str) -> bool:
        return self.take(flag) is True

    def int(self, flag: str, default: int | None = None, low: int = 1) -> int | None:
        value = self.take(flag)
        return default if value is None else to_int(flag, value, low)


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    """`overrides`: flags given beside the file (after ``--`` on our command line); they come last,
    so they win as a repeated flag does in argparse."""
    ledger = Ledger()
    launch = read_launch(text, is_entry)
    if overrides:
        launch = Launch(launch.launcher, launch.entry, launch.args + tuple(overrides), launch.notes, launch.env)
    for note in launch.notes:
        ledger.note(note)
    if not launch.entry and not any(w.startswith("--") for w in launch.args):
        raise ConfigError("launch config", "megatron", "a pretrain_gpt.py command line, its script or its arguments",
                          "no Megatron flags found")
    args = _Args(split_flags(launch.args, _arity, ledger, VERSION))
    build = ConfigBuilder(ledger)
    world = _world_size(launch.launcher, gpus, ledger)
    _model(args, build, ledger)
    _training(args, build, ledger)
    _parallel(args, build, ledger, world)
    _account_rest(args, ledger)
    _allocator(dict(launch.env), build)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _world_size(launcher: tuple[str, ...], gpus: int | None, ledger: Ledger) -> int | None:
    """torchrun's --nproc_per_node x --nnodes; --gpus wins where both are given."""
    per_node = nodes = None
    if launcher and any(w.split("/")[-1] in _LAUNCHERS or w in _LAUNCHERS for w in launcher):
        values = dict(_launcher_pairs(launcher))
        per_node = values.get("--nproc_per_node", values.get("--nproc-per-node"))
        nodes = values.get("--nnodes")
        for flag, value in values.items():
            if flag not in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
                ledger.ignore(flag, value, "launcher setting (rendezvous, ranks)")
    launched = None
    if per_node is not None or nodes is not None:
        p = to_int("--nproc_per_node", per_node if per_node is not None else "1", 1)
        n = to_int("--nnodes", nodes if nodes is not None else "1", 1)
        launched = p * n
        ledger.mapped("torchrun --nproc_per_node x --nnodes", f"{p} x {n}", f"world size {launched}")
    if gpus is not None:
        if launched is not None and launched != gpus:
            ledger.note(f"--gpus {gpus} replaces the launcher's world size {launched}")
        return gpus
    return launched


def _launcher_pairs(words: tuple[str, ...]):
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.startswith("--"):
            name, eq, value = w.partition("=")
            if not eq and i < len(words) and not words[i].startswith("-"):
                value = words[i]
                i += 1
            yield name, value


# --- the model ----------------------------------------------------------------------------------

def _model(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    layers = args.int("--num-layers") or args.int("--decoder-num-layers")
    hidden, heads = args.int("--hidden-size"), args.int("--num-attention-heads")
    if layers is None and hidden is None and heads is None:
        _model_by_name(args, build, ledger)
        return
    for flag, value in (("--num-layers", layers), ("--hidden-size", hidden), ("--num-attention-heads", heads)):
        if value is None:
            raise ConfigError(flag, None, "an integer: Megatron needs it to build the model", "missing")
    build.set("model.num_layers", layers, "--num-layers")
    build.set("model.hidden_size", hidden, "--hidden-size")
    build.set("model.num_attention_heads", heads, "--num-attention-heads")
    swiglu = args.on("--swiglu")
    gated = swiglu or args.on("--quick-geglu")
    if not gated:
        build.put("model.gated_mlp", False)
        ledger.note("no --swiglu: a plain two-matrix GeLU MLP (Megatron's default activation)")
    else:
        build.set("model.gated_mlp", True, "--swiglu" if swiglu else "--quick-geglu", "")
    if args.on("--squared-relu"):
        ledger.mapped("--squared-relu", "", "a plain two-matrix MLP")
    ffn = args.int("--ffn-hidden-size")
    if ffn is None:  # arguments.py validate_args: int(4h x 2/3 / 64) x 64 with --swiglu, else 4h
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        build.put("model.intermediate_size", ffn)
        ledger.note(f"no --ffn-hidden-size: {ffn}, Megatron's default for this hidden size")
    else:
        build.set("model.intermediate_size", ffn, "--ffn-hidden-size")
    _attention_shape(args, build, ledger, hidden, heads)
    _embeddings(args, build, ledger)
    norm = args.take("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise ConfigError("--normalization", norm, "'LayerNorm' or 'RMSNorm'")
    if "--normalization" in args.values:
        build.set("model.norm", norm.lower(), "--normalization")
    else:
        build.put("model.norm", "layernorm")
        ledger.note("no --normalization: LayerNorm (Megatron's default)")
    bias = not args.on("--disable-bias-linear")  # add_bias_linear defaults to True
    if bias:
        build.put("model.linear_bias", True)
        ledger.note("no --disable-bias-linear: biases on every linear layer (Megatron's default)")
    else:
        ledger.mapped("--disable-bias-linear", "", "model.linear_bias = false")
    if args.on("--add-qkv-bias"):
        build.set("model.qkv_bias", True, "--add-qkv-bias", "")
    if args.on("--qk-layernorm"):
        if build.get("model.kv_lora_rank") is not None:  # MLA: the norms of the latent q and kv, already counted
            ledger.mapped("--qk-layernorm", "", "MLA's latent norms (part of the MLA fields)")
        else:
            build.set("model.qk_norm", True, "--qk-layernorm", "")
    _moe_shape(args, build, ffn)
    mtp = args.int("--mtp-num-layers", low=0)
    if mtp:
        build.set("model.mtp_layers", mtp, "--mtp-num-layers")


def _attention_shape(args: _Args, build: ConfigBuilder, ledger: Ledger, hidden: int, heads: int) -> None:
    if args.on("--multi-latent-attention"):
        ledger.mapped("--multi-latent-attention", "", "multi-head latent attention (the MLA fields below)")
        q_rank = args.int("--q-lora-rank", low=0)
        if q_rank:
            build.set("model.q_lora_rank", q_rank, "--q-lora-rank")
        for flag, field, default in (("--kv-lora-rank", "kv_lora_rank", 32), ("--qk-head-dim", "qk_nope_head_dim", 128),
                                     ("--qk-pos-emb-head-dim", "qk_rope_head_dim", 64),
                                     ("--v-head-dim", "v_head_dim", 128)):
            value = args.int(flag)
            if value is None:  # the defaults of arguments.py _add_mla_args
                build.put(f"model.{field}", default)
            else:
                build.set(f"model.{field}", value, flag)
        args.take("--kv-channels")
        if "--kv-channels" in args.values:
            ledger.mapped("--kv-channels", args.values["--kv-channels"], "not used by MLA's shapes")
        return
    if args.on("--group-query-attention"):
        groups = args.int("--num-query-groups", default=1)
        build.set("model.num_kv_heads", groups, "--num-query-groups", why="with --group-query-attention")
    elif "--num-query-groups" in args.values:
        args.take("--num-query-groups")
        ledger.mapped("--num-query-groups", args.values["--num-query-groups"],
                      "not used without --group-query-attention (every head has its own keys and values)")
    kv = args.int("--kv-channels")
    if kv is not None and kv != hidden // heads:
        build.set("model.head_dim", kv, "--kv-channels")
    elif kv is not None:
        ledger.mapped("--kv-channels", kv, "model.head_dim = hidden size / heads (the default)")


def _embeddings(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    if args.on("--untie-embeddings-and-output-weights"):
        ledger.mapped("--untie-embeddings-and-output-weights", "", "model.tie_embeddings = false")
    else:
        build.put("model.tie_embeddings", True)
        ledger.note("no --untie-embeddings-and-output-weights: the output layer shares the embedding (Megatron's "
                    "default)")
    kind = args.take("--position-embedding-type", "learned_absolute")
    if args.on("--use-rotary-position-embeddings"):
        kind = "rope"
    table = args.take("--no-position-embedding") is not True  # deprecated: drops the learned table
    if not table and kind != "learned_absolute":
        ledger.mapped("--no-position-embedding", "", f"no learned position table (none with {kind})")
    learned = kind == "learned_absolute" and table
    positions = args.take("--max-position-embeddings") if learned else None
    if learned:
        if positions is None:
            raise ConfigError("--max-position-embeddings", None, "an integer with learned absolute positions "
                              "(Megatron's default --position-embedding-type)", "missing")
        build.set("model.position_embedding", "learned", "--position-embedding-type" if "--position-embedding-type"
                  in args.values else "(no --position-embedding-type)", kind)
        build.set("model.max_position_embeddings", to_int("--max-position-embeddings", positions, 1),
                  "--max-position-embeddings")
    elif kind in ("rope", "learned_absolute", "none"):
        build.set("model.position_embedding", "rope", "--position-embedding-type", kind,
                  why="no position table" if kind != "rope" else "")
    else:
        ledger.not_modelled("--position-embedding-type", kind, "estimated as RoPE (no position parameters)")
    _vocabulary(args, build, ledger)


def _vocabulary(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    """--vocab-size, or the size a named tokenizer implies; padded as Megatron pads it."""
    vocab = args.int("--vocab-size")
    source = "--vocab-size"
    if vocab is None:
        kind = args.take("--tokenizer-type")
        model = args.take("--tokenizer-model")
        if kind is None and args.take("--vocab-file") is not None:
            kind = "GPT2BPETokenizer"  # a vocab and merge file without a type: the legacy GPT-2 BPE
        if kind in _TOKENIZER_VOCAB:
            vocab, what = _TOKENIZER_VOCAB[kind]
            source = "--tokenizer-type" if "--tokenizer-type" in args.values else "--vocab-file"
            ledger.mapped(source, kind if source == "--tokenizer-type" else args.values["--vocab-file"],
                          f"model.vocab_size = {vocab} ({what})")
        elif isinstance(model, str) and preset_for(model):
            from ..presets import get_architecture
            vocab = get_architecture(preset_for(model)).vocab_size
            source = "--tokenizer-model"
            ledger.mapped("--tokenizer-model", model, f"model.vocab_size = {vocab} (the bundled "
                                                      f"{preset_for(model)}'s tokenizer)")
        else:
            raise ConfigError("--vocab-size", None, "an integer (or a --tokenizer-type / --tokenizer-model whose "
                              "vocabulary this estimator knows)", "the vocabulary size is not in the command line")
    divisor = args.int("--make-vocab-size-divisible-by", default=128)
    tp = args.int("--tensor-model-parallel-size", default=1)
    padded = args.int("--padded-vocab-size")
    if padded is not None:
        build.set("model.vocab_size", padded, "--padded-vocab-size")
        return
    if divisor != 128:  # Megatron pads to a multiple of divisor x TP (tokenizer.py _vocab_size_with_padding)
        multiple = divisor * tp
        padded = -(-vocab // multiple) * multiple
        ours = -(-padded // (128 * tp)) * (128 * tp)  # what the estimate's own padding then makes of it
        if ours == padded:
            build.set("model.vocab_size", padded, "--make-vocab-size-divisible-by", divisor,
                      why=f"{vocab} padded to a multiple of {multiple} as Megatron pads it")
            return
        ledger.not_modelled("--make-vocab-size-divisible-by", divisor, f"Megatron pads {vocab} to {padded}; the "
                            f"estimate pads to {ours}, a multiple of 128 x TP")
    if source == "--vocab-size":
        build.set("model.vocab_size", vocab, source)
    else:
        build.put("model.vocab_size", vocab)


def _moe_shape(args: _Args, build: ConfigBuilder, ffn: int) -> None:
    experts = args.int("--num-experts", low=0)
    if not experts:
        return
    build.set("model.num_experts", experts, "--num-experts")
    build.set("model.num_experts_per_token", args.int("--moe-router-topk", default=2), "--moe-router-topk",
              args.values.get("--moe-router-topk", "2 (default)"))
    width = args.int("--moe-ffn-hidden-size")  # arguments.py: defaults to --ffn-hidden-size
    build.set("model.moe_intermediate_size", width or ffn, "--moe-ffn-hidden-size",
              width if width else f"{ffn} (= --ffn-hidden-size)")
    shared = args.int("--moe-shared-expert-intermediate-size")
    if shared:  # Megatron builds one shared expert of this (total) width
        build.set("model.num_shared_experts", 1, "--moe-shared-expert-intermediate-size", shared)
        build.put("model.shared_expert_intermediate_size", shared)
    if args.on("--moe-shared-expert-gate"):
        build.set("model.shared_expert_gate", True, "--moe-shared-expert-gate", "")
    if args.on("--moe-router-enable-expert-bias"):
        build.set("model.router_bias", True, "--moe-router-enable-expert-bias", "")
    freq = args.take("--moe-layer-freq")
    if freq is not None:
        first, every = moe_layer_pattern(str(freq))
        if first:
            build.set("model.first_dense_layers", first, "--moe-layer-freq", freq)
        if every != 1:
            build.set("model.moe_layer_frequency", every, "--moe-layer-freq", freq)
        if not first and every == 1:
            build.ledger.mapped("--moe-layer-freq", freq, "every layer is MoE (the default)")


def moe_layer_pattern(text: str) -> tuple[int, int]:
    """(leading dense layers, MoE every N-th) of --moe-layer-freq: an integer N (arguments.py
    moe_freq_type: layer i is MoE when i % N == 0) or a list expression of 0/1 per layer such as
    ``([0]*3+[1]*58)``, read as data (list literals, + and * only; nothing is evaluated)."""
    text = text.strip()
    if re.fullmatch(r"\d{1,6}", text):
        every = int(text)
        if every < 1:
            raise ConfigError("--moe-layer-freq", text, "an integer >= 1 or a list of 0/1 per layer")
        return 0, every
    try:
        pattern = _list_value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ConfigError("--moe-layer-freq", text, "an integer or a list expression of 0 and 1 such as "
                          "([0]*3+[1]*58)") from None
    ones = [i for i, v in enumerate(pattern) if v == 1]
    if not ones or any(v not in (0, 1) for v in pattern):
        raise ConfigError("--moe-layer-freq", text, "0 (dense) and 1 (MoE) per layer, at least one 1")
    first = ones[0]
    every = ones[1] - ones[0] if len(ones) > 1 else len(pattern) - first
    expected = [1 if i >= first and (i - first) % every == 0 else 0 for i in range(len(pattern))]
    if pattern != expected:
        raise ConfigError("--moe-layer-freq", text, "leading dense layers then MoE every N-th layer (the patterns "
                          "the estimator models)", "an irregular pattern")
    return first, every


def _list_value(node) -> list[int]:
    if isinstance(node, ast.List):
        out = []
        for item in node.elts:
            if not (isinstance(item, ast.Constant) and type(item.value) is int):
                raise ValueError("not an integer")
            out.append(item.value)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_value(node.left) + _list_value(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = node.left, node.right
        if isinstance(left, ast.Constant):
            left, right = right, left
        if not (isinstance(right, ast.Constant) and type(right.value) is int and 0 <= right.value <= 16384):
            raise ValueError("bad repeat")
        items = _list_value(left)
        if len(items) * right.value > 16384:
            raise ValueError("too long")
        return items * right.value
    raise ValueError("not a list expression")


def _model_by_name(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    """No --num-layers/--hidden-size/--num-attention-heads: the model is the Hugging Face id the
    tokenizer names (--tokenizer-model org/name), the bundled preset where there is one."""
    model = args.take("--tokenizer-model")
    if not (isinstance(model, str) and is_hub_id(model)):
        raise ConfigError("--num-layers", None, "--num-layers, --hidden-size and --num-attention-heads, or a "
                          "--tokenizer-model that is a Hugging Face id", "the command line does not say the model")
    preset = preset_for(model)
    build.named_model = preset or model
    ledger.mapped("--tokenizer-model", model, f"model = {build.named_model!r} (no architecture flags: the model the "
                                              "tokenizer names" + (", bundled" if preset else "") + ")")


# --- the training setup -------------------------------------------------------------------------

def _training(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    seq = args.int("--seq-length") or args.int("--encoder-seq-length")
    if seq is None:
        raise ConfigError("--seq-length", None, "an integer", "missing")
    build.set("training.seq_len", seq, "--seq-length")
    mbs = args.int("--micro-batch-size")
    if mbs is None:
        ledger.note("no --micro-batch-size: 1")
    elif mbs != 1:
        build.set("training.micro_batch_size", mbs, "--micro-batch-size")
    else:
        ledger.mapped("--micro-batch-size", 1, "training.micro_batch_size = 1 (the default)")
    gbs = args.int("--global-batch-size")
    if gbs is not None:
        build.set("training.global_batch_size", gbs, "--global-batch-size")
    _precision(args, build, ledger)
    _recompute(args, build, ledger)
    _kernels(args, build, ledger)
    _optimizer(args, build, ledger)


def _precision(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    bf16, fp16 = args.on("--bf16"), args.on("--fp16")
    if bf16 and fp16:
        raise ConfigError("--bf16", "--fp16", "one of --bf16 and --fp16", "both given")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    if dtype == "fp32":
        build.put("training.param_dtype", "fp32")
        build.put("training.compute_dtype", "fp32")
        ledger.note("neither --bf16 nor --fp16: fp32 parameters and compute (Megatron's default)")
    elif dtype == "fp16":
        build.set("training.param_dtype", "fp16", "--fp16", "")
        build.put("training.compute_dtype", "fp16")
    else:
        ledger.mapped("--bf16", "", "training.param_dtype = \"bf16\" (the default)")
    # bf16 accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16 (validate_args);
    # fp16 keeps them in fp16 unless --accumulate-allreduce-grads-in-fp32
    if args.on("--grad-reduce-in-bf16"):
        build.set("training.grad_dtype", "bf16", "--grad-reduce-in-bf16", "")
    elif fp16 and not args.on("--accumulate-allreduce-grads-in-fp32"):
        build.put("training.grad_dtype", "fp16")
        ledger.note("--fp16 without --accumulate-allreduce-grads-in-fp32: fp16 gradients")
    elif args.on("--accumulate-allreduce-grads-in-fp32"):
        ledger.mapped("--accumulate-allreduce-grads-in-fp32", "", "training.grad_dtype = \"fp32\"")
    fmt = args.take("--fp8-format")
    if fmt is not None:
        build.set("training.fp8", True, "--fp8-format", fmt)
        recipe = args.take("--fp8-recipe", "delayed")  # TransformerConfig default: delayed scaling
        if recipe not in _FP8_RECIPES:
            ledger.not_modelled("--fp8-recipe", recipe, "estimated with per-tensor scales (tensorwise)")
        elif "--fp8-recipe" in args.values:
            build.set("training.fp8_recipe", _FP8_RECIPES[recipe], "--fp8-recipe", recipe,
                      why="delayed scaling keeps per-tensor scales" if recipe == "delayed" else "")
        else:
            ledger.note("no --fp8-recipe: Megatron's delayed scaling, per-tensor scales (fp8_recipe tensorwise)")
        if args.on("--fp8-param-gather"):
            build.set("training.param_dtype", "fp8", "--fp8-param-gather", "",
                      why="the weights are stored in FP8, cast from the fp32 master copy")
    if args.on("--use-precision-aware-optimizer"):
        ledger.mapped("--use-precision-aware-optimizer", "", "with the dtypes below")
        avg, sq = args.take("--exp-avg-dtype", "fp32"), args.take("--exp-avg-sq-dtype", "fp32")
        if avg == sq and avg in ("fp32", "bf16", "fp16"):
            if avg != "fp32":
                build.set("training.optimizer_dtype", avg, "--exp-avg-dtype / --exp-avg-sq-dtype", avg)
        else:
            ledger.not_modelled("--exp-avg-dtype / --exp-avg-sq-dtype", f"{avg} / {sq}",
                                "moments of different or FP8 dtypes; estimated in fp32")
        grads = args.take("--main-grads-dtype", "fp32")
        if grads == "bf16":
            build.set("training.grad_dtype", "bf16", "--main-grads-dtype", grads)
        params = args.take("--main-params-dtype", "fp32")
        if params != "fp32":
            ledger.not_modelled("--main-params-dtype", params, "fp16 master weights; estimated in fp32")


def _recompute(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    granularity = args.take("--recompute-granularity")
    if args.on("--recompute-activations"):  # validate_args: the same as --recompute-granularity selective
        granularity = "selective"
        ledger.mapped("--recompute-activations", "", "training.recompute = \"selective\"")
    modules = args.take("--recompute-modules")
    if args.on("--moe-layer-recompute"):  # TransformerConfig: selective, with "moe" added to the modules
        granularity = "selective"
        modules = list(modules or ["core_attn"]) + ["moe"]
        ledger.mapped("--moe-layer-recompute", "", "recompute module moe (Megatron-Core turns it into that)")
    if granularity is None:
        return
    if granularity == "selective":
        build.set("training.recompute", "selective", "--recompute-granularity", granularity)
        if modules is not None:
            listed = [modules] if isinstance(modules, str) else list(modules)
            known = [m for m in listed if m != "moe_router"]
            build.set("training.recompute_modules", sorted(set(known), key=listed.index), "--recompute-modules",
                      listed)
        return
    if granularity != "full":
        raise ConfigError("--recompute-granularity", granularity, "'full' or 'selective'")
    build.set("training.recompute", "full", "--recompute-granularity", granularity)
    method = args.take("--recompute-method")
    n = args.int("--recompute-num-layers")
    if method == "block" and n is not None:
        build.set("training.recompute_layers", n, "--recompute-num-layers", n, why="--recompute-method block")
    elif method == "uniform" and n not in (None, 1):
        ledger.not_modelled("--recompute-method uniform --recompute-num-layers", n,
                            f"checkpoints every {n} layers as one unit; estimated as each layer checkpointed")
    elif method is not None:
        ledger.mapped("--recompute-method", method, "every layer recomputed")


def _kernels(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    backend = str(args.take("--attention-backend", "auto")).removeprefix("AttnBackend.")
    if backend in _EAGER_BACKENDS:
        build.set("training.attention", "eager", "--attention-backend", backend)
    elif "--attention-backend" in args.values:
        ledger.mapped("--attention-backend", backend, "training.attention = \"flash\" (no s x s scores kept)")
    if args.on("--use-flash-attn"):
        ledger.mapped("--use-flash-attn", "", "training.attention = \"flash\"")
    hidden = to_float("--hidden-dropout", args.take("--hidden-dropout", 0.1))  # TransformerConfig defaults: 0.1
    attention = to_float("--attention-dropout", args.take("--attention-dropout", 0.1))
    eager = build.get("training.attention") == "eager"
    dropout = max(hidden, attention) if eager else hidden
    if eager and hidden != attention:
        ledger.not_modelled("--attention-dropout / --hidden-dropout", f"{attention} / {hidden}",
                            f"one dropout probability for both: {dropout}")
    if dropout:
        given = "--hidden-dropout" in args.values
        build.set("training.dropout", dropout, "--hidden-dropout" if given else "(no --hidden-dropout)", hidden,
                  why="" if given else "Megatron's default 0.1")
    else:
        ledger.mapped("--hidden-dropout / --attention-dropout", f"{hidden} / {attention}", "training.dropout = 0")
    if args.on("--no-masked-softmax-fusion"):
        build.set("training.attention_softmax_fusion", False, "--no-masked-softmax-fusion", "")
    if args.on("--cross-entropy-loss-fusion"):
        build.set("training.loss", "fused", "--cross-entropy-loss-fusion", "")
        impl = args.take("--cross-entropy-fusion-impl", "native")
        if impl != "native":
            build.set("training.cross_entropy_impl", impl, "--cross-entropy-fusion-impl")
    elif "--cross-entropy-fusion-impl" in args.values:
        ledger.mapped("--cross-entropy-fusion-impl", args.take("--cross-entropy-fusion-impl"),
                      "read only with --cross-entropy-loss-fusion")
    if args.on("--defer-embedding-wgrad-compute"):
        build.set("training.defer_embedding_wgrad_compute", True, "--defer-embedding-wgrad-compute", "")
        limit = args.int("--wgrad-deferral-limit", low=0)
        if limit:
            build.set("training.wgrad_deferral_limit", limit, "--wgrad-deferral-limit")
    group = args.int("--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None:
        build.set("training.microbatch_group_size", group, "--microbatch-group-size-per-virtual-pipeline-stage")
    if build.get("model.num_experts"):
        _moe_runtime(args, build, ledger)


def _moe_runtime(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    dispatcher = args.take("--moe-token-dispatcher-type", "allgather")  # TransformerConfig default: allgather
    if dispatcher == "flex":
        backend = args.take("--moe-flex-dispatcher-backend", "deepep")
        if backend == "deepep" or args.on("--moe-enable-deepep"):
            build.set("training.moe_dispatcher", "deepep", "--moe-token-dispatcher-type", "flex (DeepEP)")
        else:
            ledger.not_modelled("--moe-flex-dispatcher-backend", backend, "estimated as DeepEP's buffers")
            build.put("training.moe_dispatcher", "deepep")
    elif dispatcher in ("alltoall", "allgather"):
        build.set("training.moe_dispatcher", dispatcher, "--moe-token-dispatcher-type", dispatcher,
                  why="Megatron-Core's default" if "--moe-token-dispatcher-type" not in args.values else "")
    else:
        raise ConfigError("--moe-token-dispatcher-type", dispatcher, "'allgather', 'alltoall' or 'flex'")
    if args.on("--moe-enable-deepep") and dispatcher != "flex":
        ledger.mapped("--moe-enable-deepep", "", "read only with --moe-token-dispatcher-type flex")
    if args.on("--moe-grouped-gemm"):
        build.set("training.moe_grouped_gemm", True, "--moe-grouped-gemm", "")
    router = args.take("--moe-router-dtype")
    if router is not None:
        build.set("training.moe_router_dtype", router, "--moe-router-dtype")
    capacity = args.take("--moe-expert-capacity-factor")
    if capacity is not None:
        build.set("training.moe_capacity_factor", to_float("--moe-expert-capacity-factor", capacity),
                  "--moe-expert-capacity-factor")


def _optimizer(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    name = args.take("--optimizer", "adam")
    if name == "adam":  # Megatron's "adam" is AdamW (decoupled weight decay)
        if "--optimizer" in args.values:
            ledger.mapped("--optimizer", name, "training.optimizer = \"adamw\"")
    elif name == "sgd":
        momentum = to_float("--sgd-momentum", args.take("--sgd-momentum", 0.9))
        build.set("training.optimizer", "sgd_momentum" if momentum else "sgd", "--optimizer", name)
    elif name in ("muon", "dist_muon"):
        build.set("training.optimizer", "muon", "--optimizer", name)
    else:
        raise ConfigError("--optimizer", name, "'adam', 'sgd', 'muon' or 'dist_muon'")
    if args.on("--optimizer-cpu-offload"):
        build.set("training.offload_optimizer", "cpu", "--optimizer-cpu-offload", "")
        fraction = to_float("--optimizer-offload-fraction", args.take("--optimizer-offload-fraction", 1.0))
        if fraction != 1.0:
            ledger.not_modelled("--optimizer-offload-fraction", fraction, "estimated with all of it offloaded")


# --- the layout ---------------------------------------------------------------------------------

def _parallel(args: _Args, build: ConfigBuilder, ledger: Ledger, world: int | None) -> None:
    tp = args.int("--tensor-model-parallel-size", default=1)
    pp = args.int("--pipeline-model-parallel-size", default=1)
    cp = args.int("--context-parallel-size", default=1)
    for flag, path, value in (("--tensor-model-parallel-size", "parallel.tp", tp),
                              ("--pipeline-model-parallel-size", "parallel.pp", pp),
                              ("--context-parallel-size", "parallel.cp", cp)):
        if flag in args.values:
            build.set(path, value, flag)
    if world is None:
        raise ConfigError("--gpus", None, "the number of GPUs: the command line has no torchrun prefix "
                          "(--nproc_per_node, --nnodes) to give the world size", "missing")
    if world % (tp * pp * cp):
        raise ConfigError("--gpus", world, f"a multiple of tp x pp x cp = {tp * pp * cp}",
                          "Megatron's data-parallel size is world / (tp x pp x cp)")
    build.put("parallel.dp", world // (tp * pp * cp))
    ledger.note(f"data parallel {world // (tp * pp * cp)} = {world} GPUs / (tp {tp} x pp {pp} x cp {cp})")
    ep = args.int("--expert-model-parallel-size")
    if ep is not None:
        build.set("parallel.ep", ep, "--expert-model-parallel-size")
    etp = args.int("--expert-tensor-parallel-size")
    if etp is not None:
        build.set("parallel.etp", etp, "--expert-tensor-parallel-size")
    sp = args.on("--sequence-parallel")
    if tp > 1:  # Megatron's default is off; ours follows TP, so it is written either way
        build.set("parallel.sequence_parallel", sp, "--sequence-parallel" if sp else "(no --sequence-parallel)", "",
                  why="" if sp else "Megatron's default is off")
    elif sp:
        ledger.mapped("--sequence-parallel", "", "off: validate_args turns it off when TP is 1")
    _pipeline(args, build, pp)
    _sharding(args, build, ledger)


def _pipeline(args: _Args, build: ConfigBuilder, pp: int) -> None:
    layout = args.take("--pipeline-model-parallel-layout")
    if layout is not None:
        build.set("parallel.pp_layout", str(layout), "--pipeline-model-parallel-layout")
    stages = args.int("--num-virtual-stages-per-pipeline-rank")
    per_stage = args.int("--num-layers-per-virtual-pipeline-stage")
    if stages is not None and stages > 1:
        build.set("parallel.vpp", stages, "--num-virtual-stages-per-pipeline-rank")
    elif per_stage is not None:  # validate_args: (layers [+1 embedding] [+1 loss]) / pp / per_stage
        layers = build.get("model.num_layers") or 0
        layers += int(args.on("--account-for-embedding-in-pipeline-split"))
        layers += int(args.on("--account-for-loss-in-pipeline-split"))
        if layers % pp or (layers // pp) % per_stage:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", per_stage,
                              f"a divisor of the layers per pipeline stage ({layers} / {pp})")
        vpp = layers // pp // per_stage
        if vpp > 1:
            build.set("parallel.vpp", vpp, "--num-layers-per-virtual-pipeline-stage", per_stage)
    for flag, path in (("--decoder-first-pipeline-num-layers", "parallel.pp_first_stage_layers"),
                       ("--decoder-last-pipeline-num-layers", "parallel.pp_last_stage_layers")):
        value = args.int(flag, low=0)
        if value is not None:
            build.set(path, value, flag)
    for flag, path in (("--account-for-embedding-in-pipeline-split", "parallel.pp_account_for_embedding"),
                       ("--account-for-loss-in-pipeline-split", "parallel.pp_account_for_loss")):
        if args.on(flag):
            build.set(path, True, flag, "")


def _sharding(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    distributed = args.on("--use-distributed-optimizer")
    if args.on("--use-megatron-fsdp"):
        strategy = args.take("--data-parallel-sharding-strategy", "no_shard")
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy)
        if stage is None:
            raise ConfigError("--data-parallel-sharding-strategy", strategy,
                              "'no_shard', 'optim', 'optim_grads' or 'optim_grads_params'")
        build.set("parallel.zero_stage", stage, "--use-megatron-fsdp --data-parallel-sharding-strategy", strategy)
    elif distributed:
        build.set("parallel.zero_stage", 1, "--use-distributed-optimizer", "")
    if args.on("--use-torch-fsdp2"):
        ledger.not_modelled("--use-torch-fsdp2", "", "Megatron on PyTorch FSDP2; estimated with Megatron's own "
                                                     "buffers and the ZeRO stage above")
    grads, params = args.on("--overlap-grad-reduce"), args.on("--overlap-param-gather")
    # comm_overlap: the share of data-parallel traffic hidden behind compute. Under the distributed
    # optimizer the reduce-scatter and the all-gather move the same bytes, so one of the two is half.
    sharded = build.get("parallel.zero_stage", 0) not in (0, None)
    share = (1.0 if grads and (params or not sharded) else 0.5 if (grads or params) and sharded else
             1.0 if grads else 0.0)
    if share != 1.0:
        build.put("parallel.comm_overlap", share)
    label = " ".join(f for f, on in (("--overlap-grad-reduce", grads), ("--overlap-param-gather", params)) if on)
    ledger.mapped(label or "(no --overlap-grad-reduce, --overlap-param-gather)", "",
                  f"parallel.comm_overlap = {share} (the data-parallel traffic hidden behind compute)")


def _account_rest(args: _Args, ledger: Ledger) -> None:
    """Every flag not read above: ignored (no effect on memory or speed) or not modelled."""
    for flag, value in args.values.items():
        if flag in args.used:
            continue
        group = _group(flag)
        reason = _IGNORED.get(flag)
        if reason is None and group in _IGNORED_GROUPS:
            reason = _IGNORED_GROUPS[group]
        value = "" if value is True else value  # a switch shows no value
        if reason is not None:
            ledger.ignore(flag, value, reason or "read with another flag")
        else:
            ledger.not_modelled(flag, value, f"a {VERSION} flag ({group}) the estimate does not model")


def _allocator(env: dict[str, str], build: ConfigBuilder) -> None:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, set in the script or before the command."""
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if re.search(r"expandable_segments:\s*True", conf):
        build.set("hardware.expandable_segments", True, "PYTORCH_CUDA_ALLOC_CONF", conf)
