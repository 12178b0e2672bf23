"""Liger-Kernel as the fine-tuning front ends turn it on: the HF Trainer's use_liger_kernel (with its
liger_kernel_config), LLaMA-Factory's enable_liger_kernel, axolotl's Liger plugin, OpenRLHF's
--ds.use_liger_kernel. Each maps to training.liger_kernel (Liger's RMSNorm, SwiGLU, RoPE: memory/liger.py)
and, where Liger's fused linear cross-entropy runs, training.loss = "chunked"."""

from __future__ import annotations

from .build import ConfigBuilder, FlatDoc
from .result import Ledger

LAYERS = "Liger's RMSNorm, SwiGLU and RoPE (liger-kernel 0.8.5 apply_liger_kernel_to_<model_type> defaults)"
FLCE = "Liger's fused linear cross-entropy"


def liger_defaults(build: ConfigBuilder, name: str, given: object, flce: bool = True) -> None:
    """liger-kernel's defaults for the model type: its layer kernels and (unless `flce` is off) its loss."""
    build.set("training.liger_kernel", True, name, given, why=LAYERS)
    if flce:
        build.set("training.loss", "chunked", name, given, why=FLCE)


def trainer_liger(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """The Trainer's use_liger_kernel: transformers 5.23 integrations/liger.py passes liger_kernel_config as the
    keyword arguments of apply_liger_kernel_to_<model_type> (rope, swiglu, rms_norm, cross_entropy,
    fused_linear_cross_entropy; a key the function lacks is dropped)."""
    flce = doc.get("liger_kernel_config.fused_linear_cross_entropy", True) is not False
    norm = doc.get("liger_kernel_config.rms_norm", True) is not False
    swiglu = doc.get("liger_kernel_config.swiglu", True) is not False
    rope = doc.get("liger_kernel_config.rope", True)
    if doc.given("liger_kernel_config.rope"):
        ledger.mapped("liger_kernel_config.rope", rope, "Liger's RoPE rotates in place: no tensor kept changes")
    if norm and swiglu:
        liger_defaults(build, "use_liger_kernel", True, flce)
    else:
        if norm or swiglu:
            off = "liger_kernel_config.rms_norm" if not norm else "liger_kernel_config.swiglu"
            ledger.not_modelled(off, False, "Liger's layer kernels are modelled together (RMSNorm and SwiGLU): "
                                            "estimated with transformers' own layers")
        if flce:
            build.set("training.loss", "chunked", "use_liger_kernel", True, why=FLCE)
    if not flce:
        ledger.mapped("liger_kernel_config.fused_linear_cross_entropy", False,
                      "transformers' own loss (training.loss = \"standard\")")
    if doc.get("liger_kernel_config.cross_entropy") and (norm or swiglu or flce):
        ledger.not_modelled("liger_kernel_config.cross_entropy", True, "Liger's cross-entropy kernel beside its "
                                                                       "other kernels; estimated as transformers' loss")
    elif doc.get("liger_kernel_config.cross_entropy"):  # as axolotl's liger_cross_entropy (axolotl_liger)
        build.set("training.loss", "fused", "liger_kernel_config.cross_entropy", True,
                  why="Liger's cross-entropy kernel alone")


def axolotl_liger(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """axolotl's Liger plugin (axolotl 0.19.0 integrations/liger/plugin.py pre_model_load): the model type's
    apply_liger_kernel_to_<model_type> with each kernel from its own flag (unset = off): liger_rms_norm,
    liger_glu_activation (liger_swiglu, deprecated), liger_rope, liger_fused_linear_cross_entropy,
    liger_cross_entropy."""
    norm = bool(doc.get("liger_rms_norm"))
    glu_key = "liger_glu_activation" if doc.given("liger_glu_activation") else "liger_swiglu"
    glu = bool(doc.get(glu_key))
    if doc.given("liger_rope"):
        ledger.mapped("liger_rope", doc.get("liger_rope"), "Liger's RoPE rotates in place: no tensor kept changes")
    if norm and glu:
        build.set("training.liger_kernel", True, "liger_rms_norm", True, why=LAYERS)
        ledger.mapped(glu_key, True, "training.liger_kernel = true (with liger_rms_norm)")
    elif norm or glu:
        ledger.not_modelled("liger_rms_norm" if norm else glu_key, True, "Liger's layer kernels are modelled "
                            "together (liger_rms_norm and liger_glu_activation): estimated with transformers' layers")
    if doc.get("liger_fused_linear_cross_entropy"):
        build.set("training.loss", "chunked", "liger_fused_linear_cross_entropy", True, why=FLCE)
    elif doc.get("liger_cross_entropy") and norm and glu:
        ledger.not_modelled("liger_cross_entropy", True, "Liger's cross-entropy kernel beside its layer kernels: "
                                                         "estimated as transformers' loss")
    elif doc.get("liger_cross_entropy"):
        build.set("training.loss", "fused", "liger_cross_entropy", True)


def trainer_lines(liger: bool, loss: str) -> list[str]:
    """The TrainingArguments lines that give `liger` (training.liger_kernel) and `loss` (read back by
    trainer_liger); ConfigError where the Trainer has no such setting."""
    from ..spec.errors import ConfigError
    if loss == "fused" and liger:
        raise ConfigError("training.loss", loss, "'standard' or 'chunked' with liger_kernel", "Liger's cross-entropy "
                          "kernel beside its layer kernels is not modelled")
    if loss == "fused":  # Liger's cross-entropy kernel alone, read back as axolotl's liger_cross_entropy is
        return ["use_liger_kernel: true", "liger_kernel_config:", "  rms_norm: false", "  swiglu: false",
                "  fused_linear_cross_entropy: false", "  cross_entropy: true"]
    if liger and loss == "chunked":
        return ["use_liger_kernel: true"]
    if liger:
        return ["use_liger_kernel: true", "liger_kernel_config:", "  fused_linear_cross_entropy: false"]
    if loss == "chunked":
        return ["use_liger_kernel: true", "liger_kernel_config:", "  rms_norm: false", "  swiglu: false"]
    return []


def axolotl_lines(liger: bool, loss: str) -> list[str]:
    """axolotl's Liger plugin lines for `liger` and `loss` (read back by axolotl_liger)."""
    flags = (["liger_rms_norm: true", "liger_glu_activation: true"] if liger else []) + \
        (["liger_fused_linear_cross_entropy: true"] if loss == "chunked" else []) + \
        (["liger_cross_entropy: true"] if loss == "fused" else [])
    return ["plugins:", "  - axolotl.integrations.liger.LigerPlugin"] + flags if flags else []
