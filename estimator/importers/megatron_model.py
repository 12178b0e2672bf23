"""The model a Megatron-LM command line describes: shape, attention, embeddings, vocabulary, MoE."""

from __future__ import annotations

import ast
import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, to_int
from .models import is_hub_id, preset_for
from .result import Ledger
from .megatron_args import _Args, _TOKENIZER_VOCAB


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


def _sparse_attention(args: _Args, build: ConfigBuilder, ledger: Ledger) -> None:
    """DeepSeek Sparse Attention on MLA (Megatron-Core 0.16.1 TransformerConfig: the indexer's heads, head dim
    and top-k have no default; a missing one is named by the architecture's check)."""
    args.take("--experimental-attention-variant")
    ledger.mapped("--experimental-attention-variant", "dsa", "DeepSeek Sparse Attention (the index fields below)")
    for flag, field in (("--dsa-indexer-n-heads", "index_n_heads"), ("--dsa-indexer-head-dim", "index_head_dim"),
                        ("--dsa-indexer-topk", "index_topk")):
        value = args.int(flag)
        if value is not None:
            build.set(f"model.{field}", value, flag)
    for flag in ("--dsa-indexer-loss-coeff", "--dsa-indexer-use-sparse-loss"):
        if flag in args.values:
            ledger.mapped(flag, args.take(flag), "no memory effect: the KL loss keeps its tensors whatever its "
                          "coefficient, and the sparse loss only masks them (memory/activations/sparse.py)")


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
        if args.values.get("--experimental-attention-variant") == "dsa":
            _sparse_attention(args, build, ledger)
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
    if vocab is not None and args.values.get("--tokenizer-type") == "NullTokenizer":
        # tokenizer.py _NullTokenizer.vocab_size: --vocab-size + 1 (its end-of-document id), padded after
        vocab += 1
        ledger.mapped("--tokenizer-type", args.take("--tokenizer-type"), f"{vocab:,} tokens: --vocab-size + 1, "
                      "the NullTokenizer's end-of-document id")
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
            from ..models.presets import get_architecture
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
