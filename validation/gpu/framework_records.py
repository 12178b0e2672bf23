"""The framework-step cases (megatron_step.py, deepspeed_step.py): running one in the case's process, and its
record (tests/data/measured/gpu/<harness>/<id>.json): the contract configuration the estimator is asked, what
the device reported (measure.py's fields, the framework's own state counts, DeepSpeed's peak blocks), the
software, and the command that made it."""

from __future__ import annotations

from .cases import MEASURED

FRAMEWORK_METHOD = {
    "megatron": ("a real Megatron-Core training step on one GPU (validation/gpu/megatron_step.py): a world of one "
                 "rank over NCCL, GPTModel from the local layer spec (no TransformerEngine, no Apex) in Float16Module, "
                 "Megatron's DDP with an fp32 gradient buffer and the distributed optimizer (torch AdamW) over the "
                 "rank; step 1 creates the optimizer states, step 2 is measured as the HF cases are "
                 "(validation/gpu/framework_step.py)"),
    "deepspeed": ("a real DeepSpeed ZeRO training step of transformers' Qwen2ForCausalLM on one GPU "
                  "(validation/gpu/deepspeed_step.py): Qwen's ds_config with the HF integration's 'auto' values, "
                  "torch.optim.AdamW as the client optimizer (DeepSpeed's FusedAdam needs a compiled op), "
                  "gradient checkpointing; step 1 creates the optimizer states, step 2 is measured as the HF "
                  "cases are, with the allocator's history replayed for the blocks live at its peak "
                  "(validation/gpu/framework_step.py)"),
}


def measure_step(case, device: str) -> dict:
    if case.harness == "megatron":
        from .megatron_step import measure_megatron

        return measure_megatron(case.run, device)
    from .deepspeed_step import measure_deepspeed

    return measure_deepspeed(case.run, device)


def megatron_config(run, gpu: str) -> dict:
    """validation/megatron/cases.py's contract configuration of the same Setup, with what this run is
    beyond the fake-tensor harness's emulation of TE: the local layer spec, no gradient-accumulation fusion, and
    neither TransformerEngine nor Apex installed (te_version "not_installed": torch's AdamW steps)."""
    from ..megatron.cases import contract_config

    config = contract_config(run.setup())
    config["training"] |= {"transformer_impl": "local", "gradient_accumulation_fusion": False, "te_version": "not_installed"}
    config["hardware"] = {"gpu": gpu}
    return config


def deepspeed_config(run, gpu: str) -> dict:
    """As Qwen's published full-parameter rows are written (tests/data/measured/published_finetune/qwen.json),
    for this run: transformers' loss upcasts the logits (no loss_in_logits_dtype)."""
    from .deepspeed_step import MODELS

    m = MODELS[run.model]
    model = {"name": run.model, "hidden_size": m["hidden_size"], "num_layers": m["num_hidden_layers"],
             "num_attention_heads": m["num_attention_heads"], "num_kv_heads": m["num_key_value_heads"],
             "intermediate_size": m["intermediate_size"], "vocab_size": m["vocab_size"], "qkv_bias": True}
    training = {"framework": "deepspeed", "seq_len": run.seq_len, "micro_batch_size": run.micro_batch_size,
                "global_batch_size": run.micro_batch_size, "param_dtype": "bf16", "compute_dtype": "bf16",
                "recompute": "full", "attention": "flash", "optimizer": "adamw", "overlap_comm": True,
                # torch's AdamW as the client optimizer, foreach or fused (deepspeed_step.py RUNS)
                "adamw_implementation": run.optimizer}
    if run.zero_stage == 2:
        training["reduce_bucket_size"] = int(2e8)
    return {"model": model, "training": training, "parallel": {"dp": 1, "zero_stage": run.zero_stage},
            "hardware": {"gpu": gpu}}


CONFIGS = {"megatron": megatron_config, "deepspeed": deepspeed_config}


def fake_record_of(case) -> str | None:
    """A fake-tensor record of the same configuration, where one exists (validation/megatron's, by the Setup's id)."""
    from ..megatron.cases import ARCHS, case_id

    if case.harness != "megatron" or case.run.arch not in ARCHS:
        return None

    path = MEASURED / "megatron" / f"{case_id(case.run.setup())}.json"
    return str(path.relative_to(MEASURED)) if path.exists() else None


def fake_tensor_measured(case) -> dict | None:
    """Megatron: the fake-tensor harness's measurement of the same Setup, made here on the CPU when the record
    is written (validation/megatron/harness.py `measure`, about 10 s a case): its peak, phase and categories
    beside the GPU's. The harness emulates TE's fused RMSNorm where the GPU ran torch's (the local spec)."""
    if case.harness != "megatron":
        return None
    from ..megatron.harness import measure

    m = measure(case.run.setup())
    keys = ("peak_bytes", "peak_phase", "parameters", "gradients", "optimizer_states", "activations",
            "activations_kept_by_forward")
    return {k: m[k] for k in keys} | {"phases": m["phases"]}


def framework_record_of(line: dict) -> dict:
    from dataclasses import asdict

    from .cases import CASES
    from .records import GPU_IDS

    case, versions = CASES[line["id"]], line["versions"]
    return {"id": line["id"], "harness": case.harness, "run": asdict(case.run),
            "config": CONFIGS[case.harness](case.run, GPU_IDS.get(versions["gpu"], versions["gpu"])),
            "measured": line["measured"], "method": FRAMEWORK_METHOD[case.harness], "versions": versions,
            "fake_tensor_record": fake_record_of(case), "fake_tensor_measured": fake_tensor_measured(case),
            "command": f"PYTHONPATH=$PWD/.whl/site python -m validation.gpu run --out DIR --case {line['id']}; "
                       "python -m validation.gpu records --from DIR/runs.jsonl"}
