"""The configuration's fields as the app shows them, and their URL form. No Streamlit here.

Every field of `Training`, `Parallel` and `Hardware` has a `Field`: its widget, label and help in
users' terms, and how a widget value maps to the contract's value (``../shared/CONTRACT.md``).
The widget key is the field's name, which is also its URL parameter (the contract's field name
without its section). A field whose default is ``None`` ("decided by the framework") is a select
with an ``auto`` option, or a number input that may be left empty.

The model is kept apart (`ModelChoice`): a bundled preset, a Hugging Face id, or a custom
architecture; in the URL ``model=<preset id>``, ``model=<org/name>`` or ``model=custom`` followed
by the architecture's fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field as dc_field
from typing import Any

from estimator.architecture import ARCHITECTURE_FIELDS, Architecture
from estimator.config import SECTIONS, architecture_to_dict, build_section
from estimator.dtypes import INFERENCE_WEIGHT_DTYPES, TRAINING_DTYPES
from estimator.errors import ConfigError
from estimator.hardware import GPUS, Hardware
from estimator.parallel import Parallel
from estimator.training import (ATTENTION, FP8_RECIPES, FRAMEWORKS, KV_CACHE_DTYPES, LOSSES, MODES,
                                MOE_DISPATCHERS, OPTIMIZERS, RECOMPUTE, RECOMPUTE_MODULES, Training)

AUTO = "auto"
TRISTATE = (AUTO, "true", "false")
DEFAULT_MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class Field:
    name: str
    section: str  # training, parallel, hardware (or model for the architecture editor)
    kind: str  # select, multi, int, float, bool, text
    label: str
    help: str
    group: str
    options: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    step: float | None = None
    optional: bool = False  # an int/float that may be left empty (None)

    @property
    def default(self) -> Any:
        """The widget's default: the dataclass default in the widget's terms."""
        return from_contract(self, _dataclass_default(self.section, self.name))


def _dataclass_default(section: str, name: str) -> Any:
    cls = {"training": Training, "parallel": Parallel, "hardware": Hardware, "model": Architecture}[section]
    for f in dataclasses.fields(cls):
        if f.name == name:
            return None if f.default is dataclasses.MISSING else f.default
    raise KeyError(name)


_DTYPES = tuple(dict.fromkeys(TRAINING_DTYPES + INFERENCE_WEIGHT_DTYPES))
_GROUPS = ("Run", "Precision", "Optimizer and memory savers", "Inference", "Parallel layout", "GPU")


def _f(name, section, kind, label, help, group, **kw) -> Field:
    return Field(name, section, kind, label, help, group, **kw)


FIELDS: tuple[Field, ...] = (
    # ---- training: the run
    _f("mode", "training", "select", "Mode", "Training keeps gradients and optimizer states; inference keeps the "
       "weights and a KV cache only.", "Run", options=MODES),
    _f("framework", "training", "select", "Framework", "The training stack. It sets the default precision recipe "
       "(which copies of the weights exist, in which dtype) and what ZeRO stage means: megatron = Megatron-LM/NeMo, "
       "fsdp2 = PyTorch FSDP2 (torchtitan), deepspeed = DeepSpeed ZeRO, hf = Hugging Face Trainer with torch.optim.",
       "Run", options=FRAMEWORKS),
    _f("seq_len", "training", "int", "Sequence length (tokens)", "Tokens per sample. Activation memory grows "
       "linearly with it (quadratically with eager attention).", "Run", min=1, step=1024),
    _f("micro_batch_size", "training", "int", "Micro-batch size", "Samples per forward/backward pass on each "
       "data-parallel rank. Activations scale with it.", "Run", min=1, step=1),
    _f("global_batch_size", "training", "int", "Global batch size", "Samples per optimizer step over all data-"
       "parallel ranks. Empty = micro-batch size x DP (one micro-batch per step); more means gradient "
       "accumulation over several micro-batches.", "Run", min=1, step=1, optional=True),
    # ---- precision
    _f("param_dtype", "training", "select", "Weights dtype", "The dtype the parameters are stored and used in. "
       "Inference also accepts int8/int4/mxfp4 weights.", "Precision", options=_DTYPES),
    _f("grad_dtype", "training", "select", "Gradients dtype", "The dtype gradients are accumulated and reduced in. "
       "auto = the framework's default (fp32 for Megatron and FSDP2).", "Precision",
       options=(AUTO, "fp32", "bf16", "fp16")),
    _f("master_weights", "training", "select", "fp32 master weights", "Keep an fp32 master copy of weights stored "
       "in a lower precision (4 bytes per parameter). auto = the framework's default.", "Precision",
       options=TRISTATE),
    _f("optimizer_dtype", "training", "select", "Optimizer states dtype", "The dtype of the optimizer's moments. "
       "auto = the framework's default (fp32 with master weights).", "Precision",
       options=(AUTO, "fp32", "bf16", "fp16")),
    _f("compute_dtype", "training", "select", "Compute dtype", "The dtype of activations and matrix multiplies. "
       "bf16 over fp32 weights is autocast (mixed precision).", "Precision", options=("fp32", "bf16", "fp16")),
    _f("fp8", "training", "bool", "FP8 training", "FP8 matmuls (Transformer Engine recipe) on top of the weights "
       "dtype: adds FP8 weight copies and scales.", "Precision"),
    _f("fp8_recipe", "training", "select", "FP8 scaling recipe", "With FP8 training: tensorwise (per-tensor "
       "scales, Hopper), mxfp8 (1x32 blocks, Blackwell) or blockwise (DeepSeek-V3's 128x128 weight blocks).",
       "Precision", options=FP8_RECIPES),
    # ---- optimizer and memory savers
    _f("optimizer", "training", "select", "Optimizer", "adamw/adam8bit keep two moments per parameter; "
       "sgd none; sgd_momentum, lion and muon one; adafactor factored second moments.",
       "Optimizer and memory savers", options=OPTIMIZERS),
    _f("recompute", "training", "select", "Activation recomputation", "none keeps every activation; selective "
       "recomputes the attention core (Korthikanti et al. 2022); full keeps only each layer's input and recomputes "
       "the layer in backward.", "Optimizer and memory savers", options=RECOMPUTE),
    _f("recompute_modules", "training", "multi", "Recomputed modules (selective)", "With selective recomputation: "
       "which parts of each layer are recomputed in backward instead of kept (Megatron's --recompute-modules). "
       "core_attn = the attention core; mlp, moe, moe_act, layernorm, mla_up_proj, shared_experts as named.",
       "Optimizer and memory savers", options=RECOMPUTE_MODULES),
    _f("recompute_layers", "training", "int", "Recomputed layers per stage", "With full recomputation: how many "
       "layers of each stage are recomputed. Empty = all.", "Optimizer and memory savers", min=1, step=1,
       optional=True),
    _f("attention", "training", "select", "Attention kernel", "flash keeps no s x s score matrix; eager "
       "materialises the scores (memory grows with the square of the sequence length).",
       "Optimizer and memory savers", options=ATTENTION),
    _f("loss", "training", "select", "Loss computation", "standard keeps the full logits and an fp32 softmax; "
       "fused (e.g. Liger/Apex cross-entropy) and chunked avoid most of that.", "Optimizer and memory savers",
       options=LOSSES),
    _f("dropout", "training", "float", "Dropout", "Dropout probability; above 0 the masks are kept for backward.",
       "Optimizer and memory savers", min=0.0, max=0.99, step=0.05),
    _f("moe_capacity_factor", "training", "float", "MoE capacity factor", "Routed tokens per expert relative to a "
       "perfect balance (1.0). Larger values reserve room for imbalance.", "Optimizer and memory savers",
       min=1.0, step=0.25),
    _f("moe_dispatcher", "training", "select", "MoE token dispatcher", "alltoall = Megatron-Core's all-to-all "
       "dispatcher (a send buffer per MoE layer); deepep = the flex dispatcher with DeepEP, whose fixed NVLink/RDMA "
       "buffers count as communication memory.", "Optimizer and memory savers", options=MOE_DISPATCHERS),
    # ---- inference
    _f("kv_cache_tokens", "training", "int", "KV cache tokens", "Inference: cached context per sequence. "
       "Empty = the sequence length.", "Inference", min=1, step=1024, optional=True),
    _f("kv_cache_dtype", "training", "select", "KV cache dtype", "Inference: the dtype of the cached keys and "
       "values. auto = the weights dtype.", "Inference", options=(AUTO,) + KV_CACHE_DTYPES),
    # ---- parallel layout
    _f("tp", "parallel", "int", "Tensor parallel (TP)", "GPUs that split every layer's matrices (Megatron tensor "
       "parallelism). Usually within a node.", "Parallel layout", min=1, step=1),
    _f("pp", "parallel", "int", "Pipeline stages (PP)", "GPUs that split the layers into consecutive stages. Each "
       "stage has its own memory; the busiest one decides the fit.", "Parallel layout", min=1, step=1),
    _f("vpp", "parallel", "int", "Virtual stages per rank (VPP)", "Interleaved 1F1B: model chunks per pipeline "
       "rank (> 1 needs PP > 1). Cuts the bubble, adds in-flight activations.", "Parallel layout", min=1, step=1),
    _f("dp", "parallel", "int", "Data parallel (DP)", "Replicas of the model; ZeRO/FSDP shards states over them.",
       "Parallel layout", min=1, step=1),
    _f("cp", "parallel", "int", "Context parallel (CP)", "GPUs that split each sequence (ring attention); divides "
       "activations by CP.", "Parallel layout", min=1, step=1),
    _f("ep", "parallel", "int", "Expert parallel (EP)", "MoE: GPUs that split the routed experts. Carved out of "
       "DP x CP x TP, so it does not add GPUs.", "Parallel layout", min=1, step=1),
    _f("etp", "parallel", "int", "Expert tensor parallel (ETP)", "MoE: tensor parallelism inside each expert. "
       "Empty = TP.", "Parallel layout", min=1, step=1, optional=True),
    _f("zero_stage", "parallel", "select", "ZeRO / sharding stage", "0 = no sharding; 1 = optimizer states "
       "sharded over DP (Megatron's distributed optimizer); 2 = + gradients; 3 = + parameters (FSDP full shard). "
       "auto = the framework's default.", "Parallel layout", options=(AUTO, "0", "1", "2", "3")),
    _f("comm_overlap", "parallel", "float", "Communication overlap", "Roofline: the fraction of data-parallel "
       "(DP/FSDP) and pipeline communication hidden behind compute (1.0 = all of it).", "Parallel layout",
       min=0.0, max=1.0, step=0.1),
    _f("sequence_parallel", "parallel", "select", "Sequence parallelism", "Shard norm and dropout activations over "
       "TP. auto = on when TP > 1.", "Parallel layout", options=TRISTATE),
    _f("pp_first_stage_layers", "parallel", "int", "Layers on the first stage", "Uneven pipeline: layers on "
       "stage 0 (it also holds the embedding). Empty = an even split.", "Parallel layout", min=1, step=1,
       optional=True),
    _f("pp_last_stage_layers", "parallel", "int", "Layers on the last stage", "Uneven pipeline: layers on the "
       "last stage (it also holds the LM head and the loss). Empty = an even split.", "Parallel layout", min=1,
       step=1, optional=True),
    # ---- hardware
    _f("gpu", "hardware", "select", "GPU", "The GPU the run is checked against (its capacity as CUDA reports it).",
       "GPU", options=tuple(GPUS)),
    _f("expandable_segments", "hardware", "bool", "Expandable segments",
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less allocator fragmentation.", "GPU"),
)

# Fields of the dataclasses the app does not offer as widgets (checks, not settings).
NOT_WIDGETS = {"world_size"}


def _fallback_fields() -> tuple[Field, ...]:
    """Widgets for fields added to the dataclasses after this table was written, by type."""
    known = {f.name for f in FIELDS} | NOT_WIDGETS
    extra = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name in known:
                continue
            kind = str(f.type).replace(" ", "")
            optional = "None" in kind
            if kind.startswith("bool"):
                extra.append(Field(f.name, section, "select" if optional else "bool", f.name, f.name, "More",
                                   options=TRISTATE if optional else ()))
            elif kind.startswith("int"):
                extra.append(Field(f.name, section, "int", f.name, f.name, "More", step=1, optional=optional))
            elif kind.startswith("float"):
                extra.append(Field(f.name, section, "float", f.name, f.name, "More", optional=optional))
            elif kind.startswith("str"):
                extra.append(Field(f.name, section, "text", f.name, f.name, "More"))
    return tuple(extra)


ALL_FIELDS: tuple[Field, ...] = FIELDS + _fallback_fields()
BY_NAME: dict[str, Field] = {f.name: f for f in ALL_FIELDS}
GROUPS: tuple[str, ...] = _GROUPS + (("More",) if any(f.group == "More" for f in ALL_FIELDS) else ())


# --- the custom architecture editor -----------------------------------------------------------

def _a(name, kind, label, help, group, **kw) -> Field:
    return Field(name, "model", kind, label, help, group, **kw)


ARCH_FIELDS: tuple[Field, ...] = (
    _a("hidden_size", "int", "Hidden size (h)", "Width of the residual stream.", "Shape", min=1, step=128),
    _a("num_layers", "int", "Layers", "Transformer layers.", "Shape", min=1, step=1),
    _a("num_attention_heads", "int", "Attention heads", "Query heads.", "Shape", min=1, step=1),
    _a("num_kv_heads", "int", "KV heads", "Key/value heads (GQA/MQA). Empty = attention heads.", "Shape",
       min=1, step=1, optional=True),
    _a("head_dim", "int", "Head dim", "Per-head width. Empty = hidden size / heads.", "Shape", min=1, step=1,
       optional=True),
    _a("intermediate_size", "int", "MLP width", "Dense MLP intermediate size (empty only if every layer is MoE).",
       "Shape", min=1, step=256, optional=True),
    _a("vocab_size", "int", "Vocabulary", "Vocabulary size before padding.", "Shape", min=1, step=1),
    _a("tie_embeddings", "bool", "Tied embeddings", "The LM head shares the embedding matrix.", "Details"),
    _a("gated_mlp", "bool", "Gated MLP (SwiGLU)", "Three MLP matrices instead of two.", "Details"),
    _a("norm", "select", "Norm", "RMSNorm or LayerNorm (LayerNorm has a bias).", "Details",
       options=("rmsnorm", "layernorm")),
    _a("linear_bias", "bool", "Biases on linear layers", "GPT-2 / Megatron default.", "Details"),
    _a("qkv_bias", "bool", "QKV bias", "Biases on q, k, v only (Qwen2).", "Details"),
    _a("qk_norm", "bool", "QK norm", "Per-head norm on q and k (Qwen3).", "Details"),
    _a("position_embedding", "select", "Positions", "RoPE or a learned position table.", "Details",
       options=("rope", "learned")),
    _a("max_position_embeddings", "int", "Position table rows", "Required with learned positions.", "Details",
       min=1, step=1024, optional=True),
    _a("num_experts", "int", "Routed experts", "Experts per MoE layer; 0 = dense.", "Mixture of experts", min=0,
       step=1),
    _a("num_experts_per_token", "int", "Experts per token (top-k)", "Required with experts.",
       "Mixture of experts", min=1, step=1, optional=True),
    _a("moe_intermediate_size", "int", "Expert width", "Intermediate size of one routed expert.",
       "Mixture of experts", min=1, step=128, optional=True),
    _a("num_shared_experts", "int", "Shared experts", "Always-on experts per MoE layer.", "Mixture of experts",
       min=0, step=1),
    _a("shared_expert_intermediate_size", "int", "Shared expert width", "Empty = the expert width.",
       "Mixture of experts", min=1, step=128, optional=True),
    _a("first_dense_layers", "int", "Leading dense layers", "Layers before the first MoE layer (DeepSeek).",
       "Mixture of experts", min=0, step=1),
    _a("moe_layer_frequency", "int", "MoE every N layers", "Every N-th layer is MoE.", "Mixture of experts",
       min=1, step=1),
    _a("q_lora_rank", "int", "q LoRA rank", "Multi-head latent attention (DeepSeek-V2/V3).",
       "Latent attention (MLA)", min=1, step=64, optional=True),
    _a("kv_lora_rank", "int", "kv LoRA rank", "Set to use MLA.", "Latent attention (MLA)", min=1, step=64,
       optional=True),
    _a("qk_nope_head_dim", "int", "qk no-RoPE head dim", "MLA.", "Latent attention (MLA)", min=1, step=1,
       optional=True),
    _a("qk_rope_head_dim", "int", "qk RoPE head dim", "MLA.", "Latent attention (MLA)", min=1, step=1,
       optional=True),
    _a("v_head_dim", "int", "v head dim", "MLA.", "Latent attention (MLA)", min=1, step=1, optional=True),
    _a("mtp_layers", "int", "MTP modules", "Multi-token-prediction modules (DeepSeek-V3).", "More", min=0,
       step=1),
    _a("sliding_window", "int", "Sliding window", "Local attention window in tokens.", "More", min=1,
       step=1024, optional=True),
    _a("sliding_window_pattern", "int", "Global layer every N", "0 = every layer uses the window.", "More",
       min=0, step=1),
    _a("norms_per_layer", "int", "Norms per layer", "Gemma-2/3 and OLMo-2 differ from the usual 2.", "More",
       min=0, step=1),
    _a("qk_norm_full_width", "bool", "Full-width QK norm", "OLMo-2.", "More"),
    _a("attention_sinks", "bool", "Attention sinks", "gpt-oss.", "More"),
    _a("router_bias", "bool", "Router bias", "DeepSeek-V3.", "More"),
    _a("shared_expert_gate", "bool", "Shared expert gate", "Qwen2-MoE.", "More"),
    _a("name", "text", "Name", "A name for this architecture.", "More"),
)
ARCH_BY_NAME = {f.name: f for f in ARCH_FIELDS}
ARCH_GROUPS = ("Shape", "Details", "Mixture of experts", "Latent attention (MLA)", "More")
ARCH_REQUIRED = ("hidden_size", "num_layers", "num_attention_heads", "vocab_size")

LABELS = {f.name: f.label for f in ALL_FIELDS} | {f.name: f.label for f in ARCH_FIELDS} | {
    "model": "Model", "config": "Configuration", "world_size": "World size"}


# --- widget value <-> contract value ----------------------------------------------------------

def to_contract(f: Field, ui: Any) -> Any:
    """The contract's value for a widget value (None: the field is left to its default)."""
    if ui is None:
        return None
    if f.kind == "multi":
        return list(ui)
    if f.kind == "select":
        if ui == AUTO:
            return None
        if f.options == TRISTATE:
            return ui == "true"
        if f.name == "zero_stage":
            return int(ui)
        return ui
    if f.kind == "int":
        return int(ui)
    if f.kind == "float":
        return float(ui)
    if f.kind == "bool":
        return bool(ui)
    return ui


def from_contract(f: Field, value: Any) -> Any:
    """The widget value for a contract value (None: the widget's 'auto' or empty)."""
    if value is None:
        return AUTO if f.kind == "select" and AUTO in f.options else None
    if f.kind == "multi":
        return list(value)
    if f.kind == "select":
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    if f.kind == "float":
        return float(value)
    return value


def url_text(value: Any) -> str | list[str]:
    """A contract value as a URL parameter's text (the form a bound widget writes); a list is a
    repeated parameter."""
    if isinstance(value, (list, tuple)):
        return [url_text(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_text(f: Field, text: str | list[str]) -> Any:
    """A URL parameter's text as a widget value; ValueError with a message when it is not one."""
    if f.kind == "multi":
        items = [t.strip() for t in ([text] if isinstance(text, str) else text) if t.strip()]
        wrong = [t for t in items if t not in f.options]
        if wrong or not items:
            raise ValueError(f"one or more of {', '.join(f.options)}")
        return list(dict.fromkeys(items))
    if isinstance(text, list):
        text = text[-1] if text else ""
    text = text.strip()
    if f.kind == "select":
        if text not in f.options:
            raise ValueError(f"one of {', '.join(f.options)}")
        return text
    if f.kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError("true or false")
        return text.lower() == "true"
    if f.kind == "int":
        try:
            value = int(text)
        except ValueError:
            raise ValueError("a whole number") from None
    elif f.kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError("a number") from None
    else:
        return text
    if f.min is not None and value < f.min:
        raise ValueError(f"a number >= {f.min:g}")
    if f.max is not None and value > f.max:
        raise ValueError(f"a number <= {f.max:g}")
    return value


# --- the model ------------------------------------------------------------------------------------

@dataclass
class ModelChoice:
    """Which model the configuration uses: source is preset, hub or custom."""

    source: str = "preset"
    preset: str = DEFAULT_MODEL
    hub_id: str = ""
    arch: dict = dc_field(default_factory=dict)  # canonical architecture (custom, or the fetched hub model)

    def config_model(self) -> str | dict:
        """The contract's ``model`` for the estimator and the JSON export."""
        if self.source == "preset":
            return self.preset
        return dict(self.arch)

    def url_params(self) -> dict[str, str]:
        if self.source == "preset":
            return {"model": self.preset}
        if self.source == "hub":
            return {"model": self.hub_id}
        out = {"model": "custom"}
        for name, value in self.arch.items():
            out[name] = url_text(value)
        return out


def canonical_arch(values: dict) -> dict:
    """A canonical architecture dict (only the fields that matter); raises ConfigError."""
    for key in values:
        if key not in ARCHITECTURE_FIELDS:
            raise ConfigError(f"model.{key}", values[key], "fields of the canonical architecture", "unknown field")
    try:
        arch = Architecture(**values)
    except TypeError as exc:
        raise ConfigError("model", str(exc), "the canonical architecture's fields") from None
    return architecture_to_dict(arch)


def arch_editor_values(arch: dict) -> dict:
    """Values for every editor widget from a canonical architecture dict (defaults filled in)."""
    full = {}
    for f in ARCH_FIELDS:
        value = arch.get(f.name, _dataclass_default("model", f.name))
        full[f.name] = value
    return full


# --- whole configurations -----------------------------------------------------------------------

def ui_values_from_config(config: dict) -> dict[str, Any]:
    """Widget values for every field from a contract config's sections (missing = default).

    Raises ConfigError for unknown fields or bad values (checked with the estimator's own
    dataclasses)."""
    values = {}
    for section in SECTIONS:
        given = config.get(section) or {}
        build_section(section, given)  # unknown keys and bad values raise here
        for name in given:
            if name not in BY_NAME and name not in NOT_WIDGETS:
                raise ConfigError(f"{section}.{name}", given[name], "a field the app can show")
    for f in ALL_FIELDS:
        given = config.get(f.section) or {}
        values[f.name] = from_contract(f, given.get(f.name)) if f.name in given else f.default
    return values


def sections_from_ui(values: dict[str, Any]) -> dict[str, dict]:
    """The contract's sections from widget values: only fields that differ from their defaults."""
    out: dict[str, dict] = {}
    for f in ALL_FIELDS:
        ui = values.get(f.name, f.default)
        if ui == f.default:
            continue
        value = to_contract(f, ui)
        if value is None:
            continue
        out.setdefault(f.section, {})[f.name] = value
    return {s: out[s] for s in SECTIONS if s in out}


def config_dict(model: ModelChoice, values: dict[str, Any]) -> dict:
    """The contract's JSON for the current configuration."""
    return {"model": model.config_model(), **sections_from_ui(values)}


def url_params(model: ModelChoice, values: dict[str, Any]) -> dict[str, str | list[str]]:
    """The shareable URL's parameters: model first, then every field that differs from its default."""
    params = model.url_params()
    for section, fields_ in sections_from_ui(values).items():
        for name, value in fields_.items():
            params[name] = url_text(value)
    return params


def config_key(config: dict) -> str:
    """A stable text form of a config, for caching."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass
class UrlState:
    model: ModelChoice | None  # None: take the default model
    values: dict[str, Any]  # widget values taken from the URL (only the valid ones)
    warnings: list[str]
    bad: list[str]  # parameters to drop from the URL
    hub_id: str | None = None  # a Hub id to fetch


def parse_url(params: dict[str, str | list[str]]) -> UrlState:
    """Read a shareable URL's parameters; every bad one becomes a warning and is dropped."""
    warnings: list[str] = []
    bad: list[str] = []
    values: dict[str, Any] = {}
    model: ModelChoice | None = None
    hub_id = None
    raw_model = params.get("model")
    arch_params = {k: v for k, v in params.items() if k in ARCH_BY_NAME}

    if raw_model is not None:
        raw_model = raw_model.strip()
        if raw_model == "custom":
            arch, arch_warnings, arch_bad = _parse_arch(arch_params)
            warnings += arch_warnings
            bad += arch_bad
            if arch is not None:
                model = ModelChoice(source="custom", arch=arch)
            else:
                bad.append("model")
        elif "/" in raw_model:
            hub_id = raw_model
        else:
            from estimator.presets import preset_ids
            if raw_model in preset_ids():
                model = ModelChoice(source="preset", preset=raw_model)
            else:
                warnings.append(f"Unknown model '{raw_model}' in the link: it is not a bundled preset, a Hugging "
                                f"Face id (org/name) or 'custom'. Showing the default model, {DEFAULT_MODEL}.")
                bad.append("model")
    if raw_model != "custom":
        for name in arch_params:
            warnings.append(f"Link parameter '{name}' is an architecture field; it applies only with model=custom "
                            "and was ignored.")
            bad.append(name)

    for name, text in params.items():
        if name == "model" or name in arch_params:
            continue
        f = BY_NAME.get(name)
        if f is None:
            warnings.append(f"Unknown link parameter '{name}' was ignored.")
            bad.append(name)
            continue
        try:
            values[name] = parse_text(f, text)
        except ValueError as exc:
            warnings.append(f"Link parameter {name}={text!r} is not valid for {f.label} (expected {exc}); "
                            f"using the default, {_shown(f.default)}.")
            bad.append(name)

    # the estimator's own checks, section by section; drop the named field and try again
    for section in SECTIONS:
        while True:
            given = {f.name: to_contract(f, values[f.name]) for f in ALL_FIELDS
                     if f.section == section and f.name in values}
            given = {k: v for k, v in given.items() if v is not None}
            try:
                build_section(section, given)
                break
            except ConfigError as exc:
                name = exc.field.split(".")[-1]
                if name not in values:  # an error not about one of the given fields
                    break
                f = BY_NAME[name]
                warnings.append(f"Link parameter {name}={params.get(name)!r} was ignored: {friendly_message(exc)} "
                                f"Using the default, {_shown(f.default)}.")
                bad.append(name)
                values.pop(name)
    return UrlState(model=model, values=values, warnings=warnings, bad=bad, hub_id=hub_id)


def _parse_arch(params: dict[str, str]) -> tuple[dict | None, list[str], list[str]]:
    warnings, bad, values = [], [], {}
    for name, text in params.items():
        f = ARCH_BY_NAME[name]
        try:
            values[name] = parse_text(f, text)
        except ValueError as exc:
            warnings.append(f"Link parameter {name}={text!r} is not valid for {f.label} (expected {exc}); ignored.")
            bad.append(name)
    while True:
        try:
            return canonical_arch(values), warnings, bad
        except ConfigError as exc:
            name = exc.field.split(".")[-1]
            if name in values and name not in ARCH_REQUIRED:
                warnings.append(f"Link parameter {name}={params.get(name)!r} was ignored: {friendly_message(exc)}")
                bad.append(name)
                values.pop(name)
                continue
            warnings.append(f"The custom architecture in the link is not usable ({friendly_message(exc)}). "
                            f"Showing the default model, {DEFAULT_MODEL}.")
            return None, warnings, bad + list(params)


def _shown(value: Any) -> str:
    return "empty" if value is None else str(value)


# --- messages -------------------------------------------------------------------------------------

def field_label(path: str) -> str:
    name = path.split(".")[-1]
    return LABELS.get(name, name)


def friendly_message(exc: ConfigError) -> str:
    """A ConfigError in users' words: the field's label, the value, why, what is allowed."""
    label = field_label(exc.field or "")
    value = exc.value
    shown = "empty" if value is None else (f"'{value}'" if isinstance(value, str) else str(value))
    reason = f" {exc.reason[0].upper()}{exc.reason[1:]}." if exc.reason else ""
    return f"{label} = {shown} is not possible.{reason} Allowed: {exc.allowed}."


def error_group(exc: ConfigError) -> str:
    """The sidebar group the offending field lives in ('Model' for the architecture and the model)."""
    path = exc.field or ""
    name = path.split(".")[-1]
    if path.startswith("model") or name in ARCH_BY_NAME:
        return "Model"
    f = BY_NAME.get(name)
    return f.group if f else "Model"
