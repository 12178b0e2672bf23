"""Writes tests/data/measured/published_finetune/{qwen,torchtune,litgpt}.json: the GPU memory that Qwen's README,
torchtune's README and lit-gpt's resource tables publish for fine-tuning runs, one JSON per source. Each row was read
by hand from the cited table; what the table leaves out was read from the scripts and configs at the cited commit.
Each row carries its setup, the published figure, which number that figure is, and our configuration of the run
(the estimator's JSON config). The JSONs are the evidence; this script is how they were written, kept so that a
correction is one edit. tests/test_published_finetune.py holds the estimator to them.
"""
import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent
GB, GIB = 10**9, 2**30

# ====================================================================================== Qwen (QwenLM/Qwen README)
QWEN_COMMIT = "2df8e8ac450fa185c421a08b0090ef81826caa6e"  # main; the table as added in e8e15962 (2023-11-30)
QWEN_ARCH_NOTE = (
    "Qwen-1 (QWenLMHeadModel, trust_remote_code): RMSNorm, RoPE, multi-head attention with a bias on c_attn only, "
    "SwiGLU MLP whose w1/w2 are intermediate_size/2 wide (config.json intermediate_size 11008/22016/27392/49152), "
    "untied head. Dimensions from each model's config.json on the Hugging Face Hub (Qwen-72B's as mirrored in "
    "mapengAdam/qianwen-72B@3334bfe3d6d9d445cbe54185cd6aaef7e1e3c068 config.json: hidden 8192, 80 layers, 64 heads, "
    "intermediate 49152, vocab 152064).")
QWEN_ARCH = {
    "1.8B": dict(hidden_size=2048, num_layers=24, num_attention_heads=16, intermediate_size=5504, vocab_size=151936),
    "7B": dict(hidden_size=4096, num_layers=32, num_attention_heads=32, intermediate_size=11008, vocab_size=151936),
    "14B": dict(hidden_size=5120, num_layers=40, num_attention_heads=40, intermediate_size=13696, vocab_size=152064),
    "72B": dict(hidden_size=8192, num_layers=80, num_attention_heads=64, intermediate_size=24576, vocab_size=152064),
}
QWEN_SEQ = (256, 512, 1024, 2048, 4096, 8192)
# (size, method, GPUs, figures as printed, "G" per sequence length; None = "-" in the table)
QWEN_TABLE = [
    ("1.8B", "LoRA", 1, (6.7, 7.4, 8.4, 11.0, 16.2, 21.8)),
    ("1.8B", "LoRA (emb)", 1, (13.7, 14.0, 14.0, 15.1, 19.7, 27.7)),
    ("1.8B", "Q-LoRA", 1, (5.8, 6.0, 6.6, 7.8, 10.2, 15.8)),
    ("1.8B", "Full-parameter", 1, (43.5, 43.5, 43.5, 43.5, 47.1, 48.3)),
    ("7B", "LoRA", 1, (20.1, 20.4, 21.5, 23.8, 29.7, 36.6)),
    ("7B", "LoRA (emb)", 1, (33.7, 34.1, 35.2, 35.1, 39.2, 48.5)),
    ("7B", "Q-LoRA", 1, (11.5, 11.5, 12.3, 13.9, 16.9, 23.5)),
    ("7B", "Full-parameter", 2, (139.2, 148.0, 162.0, None, None, None)),
    ("14B", "LoRA", 1, (34.6, 35.1, 35.3, 37.4, 42.5, 55.2)),
    ("14B", "LoRA (emb)", 1, (51.2, 51.1, 51.5, 54.1, 56.8, 67.7)),
    ("14B", "Q-LoRA", 1, (18.7, 18.4, 18.9, 19.9, 23.0, 27.9)),
    ("72B", "LoRA + Deepspeed Zero3", 4, (215.4, 217.7, 222.6, 228.8, 249.0, 289.2)),
    ("72B", "Q-LoRA", 1, (61.4, 61.4, 62.9, 64.1, 68.0, 75.6)),
]
QWEN_ADAPTER = {"method": "lora", "rank": 64, "alpha": 16, "target_modules": ["all-linear"], "dropout": 0.05}


# finetune/ds_config_zero2.json and ds_config_zero3.json name an optimizer (type AdamW, 'auto' parameters): DeepSpeed
# builds it (engine.py _configure_basic_optimizer: FusedAdam without offload) and the Trainer's --optim is not used
DS_OPTIMIZER = ("DeepSpeed's FusedAdam (the ds_config's optimizer section, type AdamW, takes the place of the Trainer's "
                "adamw_torch); in place: our adamw_implementation 'fused', the default")


# The DeepSpeed the runs used: the Docker file installs it unpinned (docker/Dockerfile `pip3 install deepspeed`); the 7B
# and 14B rows were measured in October 2023 (b5fad3d, 0b55158: 2023-10-07; the 7B full-parameter rows e6f2a7a,
# 2023-10-11: DeepSpeed 0.11.0 of 2023-10-06 and 0.11.1 of 2023-10-09 the newest), the 1.8B and 72B rows added on
# 2023-11-30 (e8e15962; 0.12.3 of 2023-11-10 the newest, 0.12.4 came on 2023-12-01). 0.12.3 stands for both: the rules
# the estimator keys on the DeepSpeed release (ZeRO's optimizer step at initialisation, removed in 0.13.2; the
# coordinator's reset at the end of backward, moved in 0.15.4) read the same at 0.11.0 and 0.11.1 (stage3.py
# initialize_optimizer_states `self._optimizer_step(i)`, _create_fp32_partitions `.clone().float()`).
QWEN_DEEPSPEED = "0.12.3"
DS_RELEASE = ("0.12.3: docker/Dockerfile installs deepspeed unpinned; the newest release when the rows were measured "
              "(0.11.0-0.11.1 in October 2023 for 7B and 14B, 0.12.3 on 2023-11-30 for 1.8B and 72B), the estimator's "
              "rules keyed on it the same at both")


def qwen_setup(size, method, gpus):
    """What the scripts at QWEN_COMMIT run for the row (finetune.py and finetune/*.sh), with the README's batch."""
    lora = {"rank": 64, "alpha": 16, "dropout": 0.05, "target_modules": "c_attn, c_proj (attention and MLP), w1, w2",
            "source": "finetune.py LoraArguments (lora_r 64, lora_alpha 16, lora_dropout 0.05, lora_target_modules)"}
    base = {"micro_batch_size": 1, "gradient_accumulation": 8, "gradient_checkpointing": True,
            "attention": "FlashAttention 2", "gpus": gpus, "gpu": "A100-SXM4-80G", "torch": "2.0", "cuda": "11.8",
            "optimizer": "torch AdamW (the HF Trainer's default, adamw_torch)"}
    if method in ("LoRA", "LoRA (emb)"):
        chat = method == "LoRA"
        return {**base, "method": "lora", "adapter": lora, "precision": "bf16 weights (modeling_qwen.py autoset "
                "precision) under the HF Trainer's bf16 autocast (--bf16 True)",
                "model": f"Qwen-{size}{'-Chat' if chat else ''}",
                "trainable_embeddings": not chat,
                "script": "finetune/finetune_lora_single_gpu.sh (no DeepSpeed)",
                "peft": "0.5.x: README.md pins peft>=0.5.0,<0.6.0 with torch>=2.0,<2.1 (the table's PyTorch 2.0); its "
                        "LoRA layers take the base weight's bf16",
                "embeddings_note": "finetune.py: modules_to_save ['wte', 'lm_head'] when the model name has no 'chat'"}
    if method == "Q-LoRA":
        return {**base, "method": "qlora", "adapter": lora, "model": f"Qwen-{size}-Chat-Int4",
                "base": "GPTQ 4-bit (auto-gptq, GPTQConfig(bits=4, disable_exllama=True))",
                "precision": "fp16 (--fp16 True) through DeepSpeed ZeRO-2, no autocast",
                "deepspeed": "finetune/ds_config_zero2.json: stage 2, overlap_comm true, reduce_bucket_size 2e8",
                "prepare_model_for_kbit_training": "called (finetune.py), but DeepSpeed's fp16 engine casts the "
                "module back to fp16 (DeepSpeedEngine._configure_distributed_model: module.half())",
                "script": "finetune/finetune_qlora_single_gpu.sh", "optimizer": DS_OPTIMIZER,
                "deepspeed_release": DS_RELEASE}
    if method == "LoRA + Deepspeed Zero3":
        return {**base, "method": "lora", "adapter": lora, "model": f"Qwen-{size}-Chat",
                "precision": "bf16 through DeepSpeed ZeRO-3 (bf16 enabled: auto)",
                "deepspeed": "finetune/ds_config_zero3.json: stage 3, overlap_comm true, 'auto' buckets",
                "script": "finetune/finetune_lora_ds.sh --deepspeed finetune/ds_config_zero3.json (README)", "optimizer": DS_OPTIMIZER,
                "deepspeed_release": DS_RELEASE}
    return {**base, "method": "full", "model": f"Qwen-{size}", "precision": "bf16 through DeepSpeed ZeRO-3",
            "deepspeed": "finetune/ds_config_zero3.json: stage 3, overlap_comm true, 'auto' buckets",
            "script": "finetune/finetune_ds.sh", "optimizer": DS_OPTIMIZER, "deepspeed_release": DS_RELEASE}


def qwen_config(size, method, gpus, seq):
    # fused_qkv: modeling_qwen.py QWenAttention's c_attn = nn.Linear(hidden_size, 3 * projection_size), one of the
    # LoRA targets (finetune.py LoraArguments: c_attn, c_proj, w1, w2)
    model = {"name": f"qwen-{size.lower()}", "qkv_bias": True, "loss_in_logits_dtype": True, "fused_qkv": True,
             **QWEN_ARCH[size]}
    # torch_version: the README's "Pytorch 2.0" (docker/Dockerfile pins torch==2.0.1; README.md pins torch>=2.0,<2.1
    # with peft>=0.5.0,<0.6.0)
    training = {"framework": "hf", "training_loop": "trainer", "seq_len": seq, "micro_batch_size": 1,
                "global_batch_size": 8 * gpus, "param_dtype": "bf16", "compute_dtype": "bf16", "recompute": "full",
                "attention": "flash", "optimizer": "adamw", "torch_version": "2.0"}
    parallel = {"dp": gpus}
    adapter = dict(QWEN_ADAPTER)
    if method == "LoRA (emb)":
        adapter["trainable_embeddings"] = True
    if method in ("LoRA", "LoRA (emb)"):  # the README's pins for PyTorch 2.0: peft>=0.5.0,<0.6.0
        adapter["peft_version"] = "0.5.0"
    if method == "Q-LoRA":  # GPTQ int4 base (not bitsandbytes NF4): our int4 base under method lora
        adapter["base_dtype"] = "int4"
        training.update(framework="deepspeed", framework_version=QWEN_DEEPSPEED, param_dtype="fp16",
                        compute_dtype="fp16", reduce_bucket_size=200_000_000, overlap_comm=True)
        del training["training_loop"]
        parallel["zero_stage"] = 2
    if method in ("Full-parameter", "LoRA + Deepspeed Zero3"):
        training.update(framework="deepspeed", framework_version=QWEN_DEEPSPEED, overlap_comm=True)
        del training["training_loop"]
        parallel["zero_stage"] = 3
    if method != "Full-parameter":
        training["adapter"] = adapter
    return {"model": model, "training": training, "parallel": parallel, "hardware": {"gpu": "a100-80"}}


def qwen_rows():
    rows = []
    for size, method, gpus, figures in QWEN_TABLE:
        for seq, g in zip(QWEN_SEQ, figures):
            if g is None:
                continue
            slug = method.lower().replace(" + deepspeed zero3", "-zero3").replace(" (emb)", "-emb").replace(
                "full-parameter", "full").replace("q-lora", "qlora")
            per_gpu = g / gpus
            rows.append({
                "id": f"qwen-{size.lower()}-{slug}-s{seq}",
                "group": "full" if method == "Full-parameter" else "lora",
                "table_row": f"{size} / {method} / #GPUs {gpus} / sequence length {seq}",
                "setup": {**qwen_setup(size, method, gpus), "seq_len": seq},
                "published": {"text": f"{g}G" + (f" (sum over {gpus} GPUs)" if gpus > 1 else ""),
                              "value": g, "unit": "GB", "gpus_summed": gpus},
                "measured": {"metric": "device_total", "bytes": round(per_gpu * GB)},
                "config": qwen_config(size, method, gpus, seq),
            })
    return rows


QWEN = {
    "source": {"repo": "QwenLM/Qwen", "path": "README.md", "commit": QWEN_COMMIT,
               "table": "Finetuning > Profiling of Memory and Speed (added in e8e15962d897714944773cca57fa2e460a3655e8)",
               "setup_files": ["finetune.py", "finetune/finetune_lora_single_gpu.sh",
                               "finetune/finetune_qlora_single_gpu.sh", "finetune/finetune_lora_ds.sh",
                               "finetune/finetune_ds.sh", "finetune/ds_config_zero2.json",
                               "finetune/ds_config_zero3.json"]},
    "stated": ("single A100-SXM4-80G, CUDA 11.8, PyTorch 2.0, Flash attention 2, batch size 1, gradient "
               "accumulation 8; memory (GB) and s/iter at 256..8192 tokens; full-parameter Qwen-7B on 2 A100s; 72B: "
               "LoRA + DeepSpeed ZeRO-3 on 4 A100s, Q-LoRA (int4) on one"),
    "metric": {
        "reported": "'G', its kind unstated",
        "unit": "GB (10^9 bytes): the 7B full-parameter row on 2 x A100-80G reads 162.0G, 81.0 per GPU, more than "
                "an A100's 80 GiB could hold were it GiB",
        "per_gpu": "rows on several GPUs print the sum over the GPUs (139.2G for 7B on 2): divided by the GPU count",
        "compared_with": "device_total_bytes (nvidia-smi): the 1.8B full-parameter row is flat (43.5G) from 256 to "
                         "2048 tokens, so it is not the live tensors' peak (which grows with the logits) but what "
                         "the process holds on the device",
    },
    "architecture": QWEN_ARCH_NOTE,
    "framework_mapping": ("LoRA and LoRA (emb): hf with the Trainer's loop (finetune.py runs transformers' Trainer "
                          "without DeepSpeed, --bf16 True); Q-LoRA, full-parameter and 72B LoRA: deepspeed with the "
                          "scripts' ZeRO stage and buckets. The GPTQ int4 base of Q-LoRA is our int4 base dtype "
                          "under method lora (our qlora method is bitsandbytes NF4). Qwen-1's fused c_attn (q, k, v "
                          "in one linear) gets one adapter of rank 64 where our all-linear puts one on each of q, k "
                          "and v: 0.5M more adapter parameters a layer (16.8M of 7B's 160M), kept as it is. The "
                          "model's own loss runs on 16-bit logits (loss_in_logits_dtype: modeling_qwen.py "
                          "CrossEntropyLoss without .float())."),
    "not_used": {"LoRA (multinode)": "2 nodes x 2 GPUs summed; whether it trains the embeddings (finetune_lora_ds.sh "
                                     "on the base model does) is not stated"},
    "rows": qwen_rows(),
}

# ====================================================================================== torchtune (README)
TUNE_COMMIT = "1814feb17a9038e1a8053ce93111bd26774a8db6"  # "add flags to readme (#2003)", 2024-11-18
LLAMA32_3B = "llama-3.2-3b"
# (label, figure GiB, overrides) each added on top of the previous row; LoRA and QLoRA without optimizer_in_bwd and
# 8-bit AdamW (the README's note)
TUNE_TABLE = [
    ("+ Packed Dataset", 60.0, {}),
    ("+ Compile", 51.0, {"compile": True}),
    ("+ Chunked Cross Entropy", 42.9, {"loss": "chunked"}),
    ("+ Activation Checkpointing", 24.9, {"recompute": "full"}),
    ("+ Fuse optimizer step into backward", 23.1, {"optimizer_in_backward": True}),
    ("+ Activation Offloading", 21.8, {"offload_activations": True}),
    ("+ 8-bit AdamW", 17.6, {"optimizer": "adam8bit"}),
]
EIGHT_BIT = (
    "an 8-bit AdamW whose states stay in PyTorch's allocator: torchao.prototype.low_bit_optim.AdamW8bit, the first "
    "of the two the docs name (docs/source/tutorials/memory_optimizations.rst 'Lower precision optimizers'). The "
    "table does not say which; bitsandbytes' PagedAdamW8bit (the other, and the recipe config's default) allocates "
    "its states with cudaMallocManaged, outside the allocator, so 'active' memory would drop by all 12 GiB of bf16 "
    "moments; it drops by 4.2 GiB (21.8 -> 17.6), as 8-bit states in the allocator do")
TUNE_LORA = {"method": "lora", "rank": 64, "alpha": 128, "target_modules": ["q", "v", "o", "gate", "up", "down"],
             "dropout": 0.0}


def tune_rows():
    rows, training = [], {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 2, "param_dtype": "bf16",
                          "compute_dtype": "bf16", "optimizer": "adamw", "recompute": "none", "attention": "flash",
                          "loss": "standard"}
    steps = []
    for label, gib, over in TUNE_TABLE:
        training = {**training, **over}
        steps.append(label)
        rows.append(_tune_row(label, gib, "full", dict(training), list(steps), "full_finetune_single_device"))
    lora_training = {**training, "optimizer": "adamw", "optimizer_in_backward": False}
    for label, gib, method in (("LoRA", 8.5, "lora"), ("QLoRA", 4.6, "qlora")):
        t = {**lora_training, "adapter": {**TUNE_LORA, "method": method}}
        rows.append(_tune_row(label, gib, "lora", t, steps[:-2] + ["+ Activation Offloading", label],
                              "lora_finetune_single_device"))
    return rows


def _tune_row(label, gib, group, training, steps, recipe):
    slug = label.lower().lstrip("+ ").replace(" ", "-")
    return {"id": f"torchtune-llama-3.2-3b-{slug}", "group": group,
            "table_row": f"Optimization flags: {label}",
            "setup": {"recipe": recipe, "model": "Llama 3.2 3B", "batch_size": 2, "seq_len": 4096, "packed": True,
                      "precision": "bf16", "gpu": "A100", "techniques": steps,
                      "optimizer": {"adamw": "torch.optim.AdamW", "adam8bit": EIGHT_BIT}[training["optimizer"]]},
            "published": {"text": f"{gib}", "value": gib, "unit": "GiB"},
            "measured": {"metric": "allocated_peak", "bytes": round(gib * GIB)},
            "config": {"model": LLAMA32_3B, "training": training, "parallel": {"dp": 1},
                       "hardware": {"gpu": "a100-80"}}}


TORCHTUNE = {
    "source": {"repo": "pytorch/torchtune", "path": "README.md", "commit": TUNE_COMMIT,
               "table": "Optimization flags (Llama 3.2 3B)",
               "setup_files": ["recipes/configs/llama3_2/3B_full_single_device.yaml",
                               "recipes/configs/llama3_2/3B_lora_single_device.yaml",
                               "recipes/configs/llama3_2/3B_qlora_single_device.yaml"]},
    "stated": ("Recipe full_finetune_single_device, Llama 3.2 3B, batch size 2, max sequence length 4096, bf16, A100; "
               "each technique on top of the previous one, except LoRA and QLoRA, which do not use optimizer_in_bwd or "
               "AdamW8bit; LoRA config: rank 64, alpha 128, q/v/output_proj and the MLP, dropout 0"),
    "metric": {"reported": "Peak Memory Active (GiB): torchtune's training.get_memory_stats peak_memory_active, "
                           "torch.cuda.memory_stats()['active_bytes.all.peak'] / 1024**3",
               "unit": "GiB", "compared_with": "allocated_peak_bytes (active bytes are the allocated blocks)"},
    "framework_mapping": "torchtune",
    "not_used": {
        "Baseline (25.5 GiB)": "not packed: alpaca samples padded to the longest of each batch, shorter than 4096",
        "Memory and training speed (Llama 3.1 8B/70B/405B)": (
            "the same method on two GPUs gives two peaks (8B full: 18.9 GiB on a 4090, 37.4 GiB on an A6000) and "
            "the levers that differ between them (activation checkpointing, offloading, the optimizer) are not stated"),
    },
    "rows": tune_rows(),
}

# ====================================================================================== lit-gpt resource tables
LIT_COMMIT = "e567dbe8e5d3125af918550254258008b9228a71"  # the last change to tutorials/resource-tables.md (2024-06-04)
LIT_RUN_COMMIT = "8641822"  # 'LitGPT version: commit 8641822' (lit-gpt, 2023-10-16): the finetune/lora.py that ran
LIT_ARCH = {  # lit_gpt/config.py at 8641822
    "phi-1.5": dict(name="phi-1_5", hidden_size=2048, num_layers=24, num_attention_heads=32, intermediate_size=8192,
                    vocab_size=51200, gated_mlp=False, norm="layernorm", linear_bias=True, norms_per_layer=1),
    "stablelm-3b": dict(name="stablelm-base-alpha-3b", hidden_size=4096, num_layers=16, num_attention_heads=32,
                        intermediate_size=16384, vocab_size=50688, gated_mlp=False, norm="layernorm",
                        linear_bias=True),
    "llama-2-7b": dict(name="Llama-2-7b-hf", hidden_size=4096, num_layers=32, num_attention_heads=32,
                       intermediate_size=11008, vocab_size=32000),
    "llama-2-13b": dict(name="Llama-2-13b-hf", hidden_size=5120, num_layers=40, num_attention_heads=40,
                        intermediate_size=13824, vocab_size=32000),
}
LIT_LONGEST = {"phi-1.5": 1044, "stablelm-3b": 1034, "llama-2-7b": 1304, "llama-2-13b": 1304}
LIT_NAMES = {"phi-1.5": "phi-1.5", "stablelm-3b": "StableLM Alpha 3B", "llama-2-7b": "Llama 2 7B",
             "llama-2-13b": "Llama 2 13B"}
# (model, quantization, micro-batch, GPUs, Max GPU RAM GB, trainable parameters as printed)
LIT_TABLE = [
    ("phi-1.5", None, 1, 1, 4.82, 1572864), ("phi-1.5", "bnb.nf4", 1, 1, 3.78, 1572864),
    ("phi-1.5", "bnb.nf4-dq", 1, 1, 3.72, 1572864), ("phi-1.5", None, 2, 1, 6.76, 1572864),
    ("phi-1.5", None, 4, 1, 10.68, 1572864),
    ("stablelm-3b", None, 1, 1, 9.69, 2097152), ("stablelm-3b", "bnb.nf4", 1, 1, 6.35, 2097152),
    ("stablelm-3b", "bnb.nf4-dq", 1, 1, 6.19, 2097152), ("stablelm-3b", None, 2, 1, 12.10, 2097152),
    ("stablelm-3b", None, 4, 1, 16.92, 2097152),
    ("llama-2-7b", None, 1, 1, 21.30, 4194304), ("llama-2-7b", "bnb.nf4", 1, 1, 14.14, 4194304),
    ("llama-2-7b", "bnb.nf4-dq", 1, 1, 13.84, 4194304), ("llama-2-7b", None, 2, 1, 29.07, 4194304),
    ("llama-2-13b", None, 1, 1, 38.12, 6553600), ("llama-2-13b", "bnb.nf4", 1, 1, 23.14, 6553600),
    ("llama-2-13b", "bnb.nf4-dq", 1, 1, 22.55, 6553600),
    ("phi-1.5", None, 1, 2, 4.86, 1572864), ("phi-1.5", None, 2, 2, 5.05, 1572864),
    ("phi-1.5", None, 4, 2, 5.88, 1572864),
    ("stablelm-3b", None, 1, 2, 12.75, 2097152), ("stablelm-3b", None, 2, 2, 12.94, 2097152),
    ("stablelm-3b", None, 4, 2, 13.45, 2097152),
    ("llama-2-7b", None, 1, 2, 22.18, 4194304), ("llama-2-7b", None, 2, 2, 22.47, 4194304),
    ("llama-2-7b", None, 4, 2, 23.39, 4194304),
    ("llama-2-13b", None, 1, 4, 35.57, 6553600),
]


def lit_config(model, quant, mb, gpus):
    training = {"framework": "hf", "training_loop": "plain", "seq_len": LIT_LONGEST[model], "micro_batch_size": mb,
                "global_batch_size": 128 * gpus, "param_dtype": "bf16", "compute_dtype": "bf16", "master_weights": False,
                "recompute": "none", "attention": "flash", "optimizer": "adamw",
                "adapter": {"method": "lora", "rank": 8, "alpha": 16, "target_modules": ["q", "v"], "dropout": 0.05}}
    parallel = {"dp": gpus}
    if quant:
        training["adapter"].update(method="qlora", base_dtype="nf4", double_quant=quant.endswith("-dq"),
                                   bitsandbytes_version="0.41.1")
        training["optimizer"] = "paged_adamw"
    if gpus > 1:
        training.update(framework="fsdp1", recompute="full")  # Fabric's own loop: training_loop plain
        parallel["zero_stage"] = 3
    return {"model": {**LIT_ARCH[model], "loss_in_logits_dtype": True}, "training": training, "parallel": parallel, "hardware": {"gpu": "a100-40"}}


def lit_rows():
    rows = []
    for model, quant, mb, gpus, gb, trainable in LIT_TABLE:
        q = quant.replace("bnb.", "") if quant else "bf16"
        setup = {"command": "litgpt finetune_lora (finetune/lora.py at lit-gpt 8641822)", "model": LIT_NAMES[model],
                 "quantization": quant, "micro_batch_size": mb, "batch_size": 128,
                 "gradient_accumulation": f"{128 // mb} micro-batches per step on each GPU (gradient_accumulation_iters = "
                                          "batch_size // micro_batch_size; fabric.no_backward_sync while accumulating)",
                 "seq_len": f"{LIT_LONGEST[model]}: the longest Alpaca sample, forced into the first micro-batch "
                            "(get_batch longest_seq_ix) and the micro-batch padded to it",
                 "precision": "bf16-true (weights, LoRA and AdamW states in bf16, no autocast)",
                 "lora": "r 8, alpha 16, dropout 0.05, query and value (lora_query, lora_value)",
                 "trainable_parameters": trainable,
                 "optimizer": "bnb.optim.PagedAdamW" if quant else "torch.optim.AdamW",
                 "gpus": gpus, "gpu": "A100-SXM4-40GB", "torch": "2.1.0+cu121", "bitsandbytes": "0.41.1",
                 "strategy": ("FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, "
                              "limit_all_gathers=True): FSDP1, use_orig_params") if gpus > 1 else
                             "single device, no activation checkpointing"}
        rows.append({"id": f"litgpt-{model}-lora-{q}-mb{mb}-g{gpus}", "group": "lora",
                     "table_row": f"Finetuning with LoRA on {'1 GPU' if gpus == 1 else 'Multiple GPUs'}: "
                                  f"{LIT_NAMES[model]}, {quant or 'None'}, micro-batch {mb}"
                                  + (f", {gpus} x A100" if gpus > 1 else ""),
                     "setup": setup, "published": {"text": f"{gb:.2f} GB", "value": gb, "unit": "GB"},
                     "measured": {"metric": "allocated_peak", "bytes": round(gb * GB)},
                     "config": lit_config(model, quant, mb, gpus)})
    return rows


LITGPT = {
    "source": {"repo": "Lightning-AI/litgpt", "path": "tutorials/resource-tables.md", "commit": LIT_COMMIT,
               "table": "Finetuning with LoRA on 1 GPU; Finetuning with LoRA on Multiple GPUs",
               "run_commit": LIT_RUN_COMMIT,
               "setup_files": ["finetune/lora.py at 8641822", "lit_gpt/config.py at 8641822",
                               "lit_gpt/utils.py at 8641822 (chunked_cross_entropy)"]},
    "stated": ("LitGPT commit 8641822, A100-SXM4-40GB, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1, --precision "
               "bf16-true, Alpaca with its default lengths, minibatch size 128"),
    "metric": {"reported": "Max GPU RAM: finetune/lora.py prints torch.cuda.max_memory_allocated() / 1e9 GB",
               "unit": "GB", "compared_with": "allocated_peak_bytes"},
    "framework_mapping": (
        "lit-gpt's loop is a plain PyTorch loop through Lightning Fabric with bf16-true weights: hf with the plain "
        "loop, bf16 weights and no master weights (the closest), and the model's own 16-bit loss (loss_in_logits_dtype: "
        "chunked_cross_entropy on 128-token bf16 logit chunks); the LoRA weights are bf16 there, fp32 in our hf "
        "(4.2M parameters at most); the multi-GPU rows run Fabric's FSDPStrategy, torch "
        "FSDP1: our fsdp1 with the plain loop (no Accelerate autocast: Fabric's bf16-true), with gradient accumulation "
        "under no_sync (128 / micro-batch micro-batches a step)"),
    "not_used": {"Finetuning with Adapter / Adapter v2": "LLaMA-Adapter methods, which the estimator does not model",
                 "OOM and N/A rows": "no figure", "Single-GPU Inference": "not fine-tuning"},
    "rows": lit_rows(),
}

if __name__ == "__main__":
    for name, data in (("qwen", QWEN), ("torchtune", TORCHTUNE), ("litgpt", LITGPT)):
        (OUT / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(name, len(data["rows"]), "rows")
