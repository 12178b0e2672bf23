"""The PEFT harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF records (validation/record.py): the real "
    "transformers model code wrapped by the real peft LoRA layers runs one HF-Trainer training "
    "step under torch FakeTensorMode on CPU; every tensor storage is logged when an op creates it "
    "and when it is freed, rounded up to 512 bytes as the CUDA caching allocator does. The model "
    "is built on the meta device, wrapped by get_peft_model there (adapters in fp32, peft's "
    "default for a bf16 base), then given fake CPU storage. QLoRA: every nn.Linear inside the "
    "decoder layers is bitsandbytes' Linear4bit as transformers' load_in_4bit builds it and peft's "
    "lora.bnb.Linear4bit wraps it, emulated from their source (validation/peft/bnb.py: Params4bit's "
    "packed codes and quantization state, MatMul4Bit's dequantized weight in forward and backward "
    "and what it keeps, by bitsandbytes release), equal byte for byte to real bitsandbytes 0.49.2 on "
    "tiny CPU runs. CUDA behaviour emulated: "
    "FlashAttention-2 allocations for SDPA, dropout as the fused native_dropout (bool mask), "
    "fused AdamW (the Trainer's default) over the trainable parameters with its step counters on "
    "the device, grad-norm clipping to 1.0, host scalars not counted. Gradient checkpointing as "
    "the Trainer turns it on (non-reentrant per layer; input embeddings require grad). Step 2 is "
    "measured; the logits are dropped before backward. Categories: parameters (frozen and "
    "trainable, 4-bit codes and quantization states included; split in parameter_bytes), gradients, "
    "optimizer_states (exp_avg, exp_avg_sq, step), activations (everything else). "
    "parameter_counts.trainable is peft's get_nb_trainable_parameters(). Validated byte for "
    "byte against real CPU runs of tiny models (tests/test_harness_peft.py)."
)

HARNESS = Harness(
    name="peft", title="PEFT", order=(3, 1), method=METHOD, distributions=("torch", "transformers", "peft"),
    report="report:report", trace="step:traced_step")
