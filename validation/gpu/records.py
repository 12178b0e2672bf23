"""A real-GPU run's lines (`python -m validation.gpu run`) as records beside the fake-tensor ones:
tests/data/measured/gpu/<id>.json, each with the contract configuration of its case (the GPU it ran
on, its allocator setting), what the device reported, and the software it ran with."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..core.record import write_record
from .cases import CASES, MEASURED

GPU_RECORDS = MEASURED / "gpu"
GPU_IDS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-80"}
METHOD = (
    "a real training step on the GPU: the fake-tensor harness's own model build and step (validation/step.py "
    "for the HF Trainer's, validation/peft/step.py for peft's; QLoRA with bitsandbytes Linear4bit layers, "
    "validation/gpu/bnb.py), each case in a fresh process; step 1 creates the optimizer states, step 2 is "
    "measured: torch.cuda.max_memory_allocated per phase (reset at each phase's start), max_memory_reserved, "
    "torch.cuda.mem_get_info at the start (CUDA context) and the end, nvidia-smi's used memory, and the cuBLAS "
    "workspaces (allocated bytes freed by torch._C._cuda_clearCublasWorkspaces). Model weights are random "
    "(from the config): memory does not depend on their values.")


def config_of(case, gpu: str, bitsandbytes: str | None = None) -> dict:
    """The case's contract configuration on `gpu`; a bitsandbytes QLoRA case names the release it ran."""
    from ..hf.cases import contract_config as hf_config
    from ..peft.cases import contract_config as peft_config

    config = hf_config(case.run) if case.harness == "hf" else peft_config(case.run)
    config["hardware"] = {"gpu": gpu, "expandable_segments": case.allocator == "expandable"}
    if case.harness == "bnb":
        config["training"]["adapter"]["bitsandbytes_version"] = bitsandbytes
    if "adapter" in config["training"] and getattr(case, "wrapper", ""):  # through Accelerate: the Trainer's loop
        config["training"]["training_loop"] = "trainer"
    return config


WRAPPED = {"accelerate": "the model prepared by a real accelerate Accelerator(mixed_precision=\"bf16\") as the HF "
                          "Trainer does (forward = convert_outputs_to_fp32(autocast(forward)))"}


def description_of(case, device: str) -> str:
    from ..hf.cases import describe as hf_describe
    from ..peft.cases import describe as peft_describe

    text = hf_describe(case.run) if case.harness == "hf" else peft_describe(case.run)
    if case.harness == "bnb":
        text = text.replace("torchao NF4, double-quantized scales",
                            "bitsandbytes Linear4bit NF4, " + ("double-quantized" if case.run.double_quant
                                                               else "fp32 absmax, no double quantization"))
    allocator = " with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" if case.allocator == "expandable" else ""
    wrapped = f"; {WRAPPED[case.wrapper]}" if case.wrapper else ""
    if case.run.__class__.__name__ == "Run" and case.run.optimizer.startswith("paged"):
        text = text.replace("SGD with momentum (foreach)", f"bitsandbytes {case.run.optimizer}")
    return f"{text}{wrapped}; measured on a real {device}{allocator}"


def measured_of(m: dict) -> dict:
    return {
        "peak_bytes": m["peak_bytes"], "peak_phase": m["peak_phase"],
        "reserved_peak_bytes": m["reserved_peak_bytes"],
        "device_used_bytes": m["device_used_end_bytes"], "nvidia_smi_bytes": m["nvidia_smi_used_end_bytes"],
        "cuda_context_bytes": m["context_used_bytes"] - m["context_reserved_bytes"],
        "outside_allocator_bytes": m["device_used_end_bytes"] - m["reserved_end_bytes"],
        "cublas_workspace_bytes": m["cublas_workspace_bytes"],
        "parameters": m["parameters"], "optimizer_states": m["optimizer_states"],
        "trainable_parameters": m["trainable_parameters"],
        "phases": m["phases"], "allocator_stats": m["stats"], "step2_seconds": round(m["step2_seconds"], 3),
    } | ({"segments": m["segments"]} if "segments" in m else {}) \
      | ({"vision_attention": m["vision_attention"]} if "vision_attention" in m else {})


KERNEL_METHOD = ("one framework kernel run for real on the GPU (validation/gpu/kernels.py): bf16 logits as a leaf "
                 "tensor, each implementation called twice (the first call compiles), the second measured with "
                 "torch.cuda.memory_allocated / max_memory_allocated around its forward and its backward")


def kernel_record_of(line: dict) -> dict:
    case, versions = CASES[line["id"]], line["versions"]
    run = case.run
    return {"id": line["id"], "kernel": run.kernel,
            "run": {"seq_len": run.seq_len, "micro_batch_size": run.micro_batch_size, "vocab": run.vocab},
            "measured": line["measured"], "method": KERNEL_METHOD, "versions": versions,
            "command": f"python -m validation.gpu run --out DIR --case {line['id']}; "
                       "python -m validation.gpu records --from DIR/runs.jsonl"}


def as_ran(case, measured: dict):
    """The case as the GPU ran it: a vision-language run's tower on the attention the machine had
    (validation/gpu/measure.py vision_attention: SDPA without flash-attn)."""
    ran = measured.get("vision_attention")
    if case.harness != "hf" or not ran or ran == case.run.vision_attention:
        return case
    return replace(case, run=replace(case.run, vision_attention=ran))


def ran_ssm_kernels(config: dict, versions: dict) -> dict:
    """The configuration as the GPU ran a model with Mamba-2 mixers: without mamba-ssm (no version recorded: the lent
    machines have none, cases.py FALLBACK_ONLY_MODELS) transformers ran its torch fallback, ssm_kernels 'torch_5.17'
    up to transformers 5.17 (broadcast products), 'torch' from 5.18 (einsums)."""
    model = config["model"]
    if (model.get("parallel_mamba") or "M" in (model.get("hybrid_override_pattern") or "")) \
            and not versions.get("mamba_ssm"):
        release = tuple(int(x) for x in versions["transformers"].split(".")[:2])
        config["training"]["ssm_kernels"] = "torch_5.17" if release <= (5, 17) else "torch"
    return config


def fallback_id(case_id: str, config: dict, versions: dict) -> str:
    """A run of transformers' newer torch fallback (ssm_kernels 'torch', from 5.18) is the same case on other code
    than the first records' (5.17's): its record keeps both, named <case>-transformers-<x.y>."""
    if config["training"].get("ssm_kernels") != "torch":
        return case_id
    return f"{case_id}-transformers-{'.'.join(versions['transformers'].split('.')[:2])}"


def fake_record_of(case, line: dict, config: dict) -> Path:
    """The fake record of what ran: the torch fallback's own (tests/data/measured/ssm_torch, the harness without the
    fused kernels' emulation) for a run of it from transformers 5.18; where the harness has none (Gemma 3 on SDPA,
    whose masked path it does not emulate), the case's own, and the record's vision_attention says what differs."""
    fallback = MEASURED / "ssm_torch" / f"{line['id']}.json"
    if config["training"].get("ssm_kernels") == "torch" and fallback.exists():
        return fallback
    return case.fake_record if case.fake_record.exists() else CASES[line["id"]].fake_record


def record_of(line: dict) -> dict:
    case, versions = as_ran(CASES[line["id"]], line["measured"]), line["versions"]
    gpu = GPU_IDS[versions["gpu"]]
    config = ran_ssm_kernels(config_of(case, gpu, versions.get("bitsandbytes")), versions)
    fake = fake_record_of(case, line, config)
    record_id = fallback_id(line["id"], config, versions)
    return {
        "id": record_id, **({"case": line["id"]} if record_id != line["id"] else {}),
        "description": description_of(case, versions["gpu"]), "config": config,
        "measured": measured_of(line["measured"]), "method": METHOD, "versions": versions,
        "fake_tensor_record": str(fake.relative_to(MEASURED)) if fake.exists() else None,
        **({"wrapper": case.wrapper} if case.wrapper else {}),
        "command": f"python -m validation.gpu run --out DIR --case {line['id']}; "
                   "python -m validation.gpu records --from DIR/runs.jsonl",
    }


PROBE_METHOD = ("a fresh process: the allocated bytes each cuBLAS use leaves behind (bf16 matmul, linear with bias, "
                "backward on the autograd thread, fp32 matmul) and what clearCublasWorkspaces frees")
# what the probe itself runs on: a new probe line always says these (measure.py versions, workspace_probe)
PROBE_RUNS_ON = ("python", "torch", "cuda", "gpu", "capability", "gpu_total_bytes", "cudnn", "driver")


def probe_record(line: dict) -> dict:
    """The workspace probe's record, over the one already written for its GPU: the probe's numbers and the
    software it runs on are the new line's; a package the probe does not import (bitsandbytes, flash-attn...:
    None where the run had it off its path, as a run without the QLoRA wheel carried in) keeps the version the
    record holds, and so does any field the record has that a probe line does not make."""
    new = {"id": f"cublas-workspace-probe-{GPU_IDS[line['versions']['gpu']]}", "probe": line["probe"],
           "versions": line["versions"], "command": "python -m validation.gpu.measure probe", "method": PROBE_METHOD}
    path = GPU_RECORDS / f"{new['id']}.json"
    if not path.exists():
        return new
    old = json.loads(path.read_text())
    versions = dict(old.get("versions", {}))
    versions.update({k: v for k, v in line["versions"].items() if v is not None or k in PROBE_RUNS_ON
                     or versions.get(k) is None})
    return {**old, **new, "versions": versions}


def write_records(source: Path) -> list[Path]:
    from .experiments import EXPERIMENT_RECORDS, write_experiment_records

    written, experiments = [], []
    for text in source.read_text().splitlines():
        line = json.loads(text)
        if "experiment" in line:
            experiments.append(line)
        elif "probe" in line:
            written.append(write_record(probe_record(line), GPU_RECORDS))
        elif CASES[line["id"]].harness in ("megatron", "deepspeed"):
            from .framework_records import framework_record_of

            written.append(write_record(framework_record_of(line), GPU_RECORDS / CASES[line["id"]].harness))
        elif CASES[line["id"]].harness == "kernel":
            written.append(write_record(kernel_record_of(line), GPU_RECORDS / "kernels"))
        else:
            written.append(write_record(record_of(line), GPU_RECORDS))
    return written + write_experiment_records(experiments, EXPERIMENT_RECORDS)
