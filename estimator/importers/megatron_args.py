"""A Megatron-LM command line as parsed arguments: each flag's arity and group (megatron_flags),
the flags read and those that do not change memory.
"""

from __future__ import annotations

from . import megatron_flags
from .build import to_int

VERSION = "Megatron-LM core_v0.16.1"

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
