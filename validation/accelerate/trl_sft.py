"""TRL's SFTTrainer step in the Accelerate harness: the real `trl.SFTTrainer.training_step` (its `compute_loss`
and, for loss_type "chunked_nll", its patched forward), TRL 1.9.0.

`sft_trainer_of` builds a real SFTTrainer around the prepared model without its dataset machinery: the Trainer
`trainer_of` makes (validation/accelerate/harness.py) given an SFTConfig, its class made SFTTrainer, and the
attributes SFTTrainer.__init__ sets that training_step and compute_loss read (trl 1.9.0 trainer/sft_trainer.py
`__init__`: `num_virtual_tokens`, `maybe_activation_offload_context`, `aux_loss_enabled`, `_metrics`,
`_total_train_tokens`). For "chunked_nll", `patch_head` is TRL's own `_patch_chunked_ce_lm_head` on the causal LM
(a PeftModel's base model), called before `accelerator.prepare` as SFTTrainer.__init__ calls it before
`Trainer.__init__` (so Accelerate wraps the patched forward).

The batch is what TRL's collator gives a micro-batch of full-length sequences (`DataCollatorForLanguageModeling`,
padding_free False): input_ids, labels equal to them (no -100: every token is a target) and an all-ones
attention_mask.

Under fake tensors TRL's reads of values fail (DataDependentOutputException) and transformers' takes another path;
`sft_emulation` answers them with what the batch has, in fake runs only, and leaves every op that makes a tensor as
it is:
1. transformers' `_ignore_causal_mask_sdpa` gives up on a fake padding mask (`is_tracing`) and would build a 4-D
   mask; a GPU run reads `fast_all(padding_mask)` (all ones) and skips the mask. The patch makes fast_all's
   tensors, then answers as the function does for an all-ones mask (transformers 5.23 masking_utils.py).
2. `_chunked_cross_entropy_loss`'s `if n_valid_tensor == 0` (never: every label is a target) and
   `range(0, n_padded, chunk_size)` (n_padded = ceil(valid / chunk_size) * chunk_size, the valid tokens being
   all of the shifted labels: `labels.numel()`), rewritten in a copy of the function (each rewrite names the text
   it replaces; the copy refuses to run when a text is missing).
3. SFTTrainer.compute_loss's metric reads (`.item()` and `> 0` of the entropy, accuracy and token counts, on
   tensors compute_loss makes and drops): each rewritten to `_read(tensor, value)`, which makes the same tensor
   and answers the count the batch has, or 0.0 for a metric's value (kept in `_metrics` only).
The real CPU runs TRL's own code unchanged; tests/test_harness_accelerate.py checks that both allocate alike,
byte for byte, for both loss types.
"""

from __future__ import annotations

import contextlib
import inspect
import tempfile
import textwrap
from collections import defaultdict
from contextlib import ExitStack, contextmanager

from torch._subclasses.fake_tensor import FakeTensor

RELEASE = "1.9.0"
LOSS_TYPES = ("nll", "chunked_nll")
_MODULE = "trl.trainer.sft_trainer"

# (function, [(TRL 1.9.0's text, the fake run's)]): the data reads of note 2 and 3 above
_LOSS_REWRITES = [
    ("if n_valid_tensor == 0:", "if _read(n_valid_tensor == 0, False):"),
    ("range(0, n_padded, chunk_size)", "range(0, -(-labels.numel() // chunk_size) * chunk_size, chunk_size)"),
]
_COMPUTE_LOSS_REWRITES = [
    # the copy is compiled outside the class: zero-argument super() has no __class__ cell there
    ("super().compute_loss(", "super(SFTTrainer, self).compute_loss("),
    # chunked_nll
    ("(entropy_sum / num_valid).item() if num_valid > 0 else 0.0",
     "_read(entropy_sum / num_valid, 0.0) if _read(num_valid > 0, True) else 0.0"),
    ("(correct / num_valid).item() if num_valid > 0 else 0.0",
     "_read(correct / num_valid, 0.0) if _read(num_valid > 0, True) else 0.0"),
    # nll
    ("(entropy_sum / total_tokens).item() if total_tokens > 0 else 0.0",
     "_read(entropy_sum / total_tokens, 0.0) if _read(total_tokens > 0, True) else 0.0"),
    ("(correct_tokens.sum() / total_sum).item() if total_sum > 0 else 0.0",
     "_read(correct_tokens.sum() / total_sum, 0.0) if _read(total_sum > 0, True) else 0.0"),
    # the tokens of the micro-batch (all of them: the attention mask is all ones)
    ('self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()',
     '_read(self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum(), '
     'inputs["attention_mask"].numel())'),
]


def _read(tensor, value):
    """What a GPU run reads from `tensor` (`.item()`, or its truth): the tensor's own value when it has one, else
    `value`, known from the batch (every label a target, every mask entry 1)."""
    return value if isinstance(tensor, FakeTensor) else tensor.item()


def check_release() -> None:
    from importlib.metadata import version

    if version("trl") != RELEASE:  # the rewrites are of this release's source
        raise RuntimeError(f"trl {version('trl')} installed; the SFTTrainer cases measure trl {RELEASE}")


def patch_head(model) -> None:
    """SFTTrainer.__init__'s chunked_nll patch (trl 1.9.0 sft_trainer.py): TRL's `_patch_chunked_ce_lm_head` on the
    causal LM, the PeftModel's base model for LoRA, with TRL's chunk size (`_CHUNKED_LM_HEAD_CHUNK_SIZE`, 256)."""
    from trl.trainer import sft_trainer as sft

    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    sft._patch_chunked_ce_lm_head(target, chunk_size=sft._CHUNKED_LM_HEAD_CHUNK_SIZE)


def sft_config(loss_type: str, micro_batch: int):
    """The SFTConfig of the step: bf16 on the CPU device, no reports, clipping to 1.0 (as trainer_of's
    TrainingArguments), the model left where it is (`place_model_on_device` False)."""
    from trl import SFTConfig

    if loss_type not in LOSS_TYPES:
        raise ValueError(f"trl_sft: {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")

    class Arguments(SFTConfig):
        @property
        def place_model_on_device(self):
            return False

    return Arguments(output_dir=tempfile.mkdtemp(), bf16=True, use_cpu=True, report_to=[],
                     per_device_train_batch_size=micro_batch, max_grad_norm=1.0, loss_type=loss_type)


def sft_trainer_of(trainer):
    """A real SFTTrainer from `trainer` (trainer_of's Trainer, built with `sft_config`'s arguments): its state, and
    what SFTTrainer.__init__ sets for a causal LM without prompt tuning, activation offloading or MoE."""
    from trl import SFTTrainer

    sft = SFTTrainer.__new__(SFTTrainer)
    sft.__dict__.update(trainer.__dict__)
    sft.num_virtual_tokens = 0
    sft.maybe_activation_offload_context = contextlib.nullcontext()
    sft.aux_loss_enabled = False
    sft._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    sft._total_train_tokens = 0
    return sft


def batch(input_ids):
    """TRL's collator's micro-batch of full-length sequences: every token a target, no padding."""
    import torch

    return {"input_ids": input_ids, "labels": input_ids, "attention_mask": torch.ones_like(input_ids)}


@contextmanager
def _rewritten(owner, name: str, rewrites, extra: dict):
    """`owner.name` replaced by a copy of its source with each text rewritten (each must occur), compiled in its
    module's namespace plus `extra`."""
    import importlib

    original = owner.__dict__[name]
    source = textwrap.dedent(inspect.getsource(original))
    if source.lstrip().startswith("@"):
        raise RuntimeError(f"{name} is decorated: its copy would lose the decorator")
    for old, new in rewrites:
        if old not in source:
            raise RuntimeError(f"trl {RELEASE}'s {name} no longer has {old!r}")
        source = source.replace(old, new)
    scope = {**vars(importlib.import_module(original.__module__)), **extra}
    exec(compile(source, inspect.getsourcefile(original), "exec"), scope)
    setattr(owner, name, scope[name])
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def _all_ones_padding_mask():
    """Note 1 of the module docstring."""
    import transformers.masking_utils as masking

    original = masking._ignore_causal_mask_sdpa

    def ignore_causal_mask_sdpa(padding_mask, *args, **kwargs):
        if isinstance(padding_mask, FakeTensor):
            masking.fast_all(padding_mask)  # the GPU run's read, its tensors made and dropped
            return original(None, *args, **kwargs)  # the answer for an all-ones mask
        return original(padding_mask, *args, **kwargs)

    masking._ignore_causal_mask_sdpa = ignore_causal_mask_sdpa
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = original


@contextmanager
def sft_emulation(fake: bool):
    """The module docstring's notes 1-3 for a fake run; nothing for a real one."""
    if not fake:
        yield
        return
    import importlib

    from trl import SFTTrainer

    module = importlib.import_module(_MODULE)
    with ExitStack() as stack:
        stack.enter_context(_all_ones_padding_mask())
        stack.enter_context(_rewritten(module, "_chunked_cross_entropy_loss", _LOSS_REWRITES, {"_read": _read}))
        stack.enter_context(_rewritten(SFTTrainer, "compute_loss", _COMPUTE_LOSS_REWRITES, {"_read": _read}))
        yield
