"""What an estimate says about its numbers: each formula shows the divisions its bytes went
through, and each component cites the source of its own figure."""

from __future__ import annotations

import pytest

from canonical import LLAMA_31_8B
from estimator import Hardware, Parallel, Training, estimate
from estimator.spec.architecture import Architecture
from estimator.spec.gpus import GPUS

MIB = 2**20

# A small MoE layer with a shared expert, so the ledger has every kind of entry
MOE = Architecture(name="moe", hidden_size=1024, num_layers=4, num_attention_heads=16, num_kv_heads=4,
                   intermediate_size=2048, vocab_size=32000, num_experts=8, num_experts_per_token=2,
                   moe_intermediate_size=512, num_shared_experts=1, first_dense_layers=1, qk_norm=True)


def ledger(arch, training, par) -> dict:
    return {(line.kind, line.name): line for line in estimate(arch, training, par).activation_ledger}


CASES = [
    # (model, training, sequence parallelism): Megatron's fused kernels; transformers' eager PyTorch
    # modules with dropout (scores, masks, fp32 norms), under DeepSpeed (the HF Trainer's DDP splits no layer)
    (LLAMA_31_8B, Training(), True),
    (LLAMA_31_8B, Training(), False),
    (LLAMA_31_8B, Training(framework="deepspeed", attention="eager", dropout=0.1, seq_len=1024), True),
    (LLAMA_31_8B, Training(framework="deepspeed", attention="eager", dropout=0.1, seq_len=1024), False),
    (MOE, Training(), True),
    (MOE, Training(framework="deepspeed", seq_len=1024), True),
]


@pytest.mark.parametrize("arch, training, sp", CASES)
def test_a_ledger_line_shows_t_exactly_where_tp_divides_its_bytes(arch, training, sp):
    # etp 1 keeps the routed tokens' gather out of the comparison: only t changes between the two.
    etp = 1 if arch.is_moe else None
    one = ledger(arch, training, Parallel(tp=1, etp=etp))
    four = ledger(arch, training, Parallel(tp=4, etp=etp, sequence_parallel=sp))
    assert one.keys() == four.keys()
    divided = 0
    for key, line in four.items():
        if line.bytes == one[key].bytes:
            assert "/t" not in line.formula, (key, line.formula)
        else:
            assert line.bytes * 4 == pytest.approx(one[key].bytes, abs=4), key  # divided by t = 4
            assert line.formula.endswith("/t"), (key, line.formula)
            divided += 1
        assert "/t" not in one[key].formula  # t = 1 divides nothing
    # Korthikanti et al. 2022 section 4.2.2: with sequence parallelism every tensor of the layer is
    # split over t; without it the norms' and dropout's inputs are replicated
    assert (divided == len(four)) == sp


def test_a_ledger_line_shows_cp_where_context_parallelism_splits_it():
    one = ledger(LLAMA_31_8B, Training(), Parallel(tp=2))
    two = ledger(LLAMA_31_8B, Training(), Parallel(tp=2, cp=2))
    for key, line in two.items():
        assert line.bytes * 2 == one[key].bytes  # every saved tensor holds tokens: cp halves it
        assert line.formula == one[key].formula.replace("/t", "/cp/t")


def test_the_kept_layer_input_of_full_recompute_shows_its_division():
    # Korthikanti section 5: full recompute keeps each layer's input, 2sbh, /t with SP only
    training = Training(recompute="full")
    for sp, formula in ((True, "B*s*b*h/t"), (False, "B*s*b*h")):
        est = estimate(LLAMA_31_8B, training, Parallel(tp=4, sequence_parallel=sp))
        kept = next(p for p in est.stages[0].component("activations").parts if "keep their input" in p.label)
        assert f"({formula})" in kept.formula
        assert kept.bytes == 32 * 2 * 4096 * 4096 // (4 if sp else 1)  # 32 layers x B*s*b*h (/t)


@pytest.mark.parametrize("gpu", ["h100-80", "a100-80", "h200", "b200"])
def test_the_cuda_context_cites_its_measurement_not_the_gpu_datasheet(gpu):
    runtime = estimate(LLAMA_31_8B, hardware=Hardware(gpu=gpu)).stages[0].component("runtime")
    if gpu == "a100-80":  # hardware.py: the low end of the 0.5-2 GB measured by Bekman
        assert runtime.bytes == 512 * MIB
        assert "ml-engineering" in runtime.source and "Preloaded CUDA kernels memory usage" in runtime.source
    else:  # measured on an H200 (tests/data/measured/gpu): 766.8 MiB outside the allocator
        assert runtime.bytes == 804_061_184 and "tests/data/measured/gpu" in runtime.source
    assert "datasheet" not in runtime.source and runtime.source != GPUS[gpu].source


@pytest.mark.parametrize("gpu, mode, framework, each, count", [
    ("h100-80", "training", "hf", 32 * MIB, 2), ("a100-80", "training", "fsdp2", 8 * MIB + 128 * 1024, 2),
    ("h200", "inference", "hf", 32 * MIB, 1)])
def test_the_cublas_workspaces_are_in_the_allocated_peak(gpu, mode, framework, each, count):
    """PyTorch's cuBLAS workspace, one per (handle, stream): the forward's thread and autograd's backward
    thread in training, one in inference (CublasHandlePool.cpp; measured 2 x 32 MiB on an H200)."""
    training = Training(mode=mode, framework=framework)
    stage = estimate(LLAMA_31_8B, training, hardware=Hardware(gpu=gpu)).stages[0]
    workspace = stage.component("workspace")
    assert workspace.bytes == count * each and "CublasHandlePool.cpp" in workspace.source
    tensors = sum(c.bytes for c in stage.components if c.key not in ("communication", "runtime", "fragmentation"))
    assert tensors == stage.allocated_peak_bytes


def test_megatron_adds_transformer_engines_workspaces():
    """TransformerEngine's own workspace (32 MiB + 1 KiB on Hopper), and one per stream (4) for its grouped
    GEMM on MoE stages with moe_grouped_gemm (TE 2.x cpp_extensions/gemm.py get_cublas_workspace)."""
    dense = estimate(LLAMA_31_8B, Training(framework="megatron")).stages[0].component("workspace")
    assert dense.bytes == 2 * 32 * MIB + (32 * MIB + 1024) and "TransformerEngine" in dense.source
    from canonical import MIXTRAL_8X7B

    par = Parallel(tp=2, ep=4, dp=4)
    grouped = estimate(MIXTRAL_8X7B, Training(framework="megatron", moe_grouped_gemm=True), par).stages[0]
    assert grouped.component("workspace").bytes == 2 * 32 * MIB + 5 * (32 * MIB + 1024)
    plain = estimate(MIXTRAL_8X7B, Training(framework="megatron"), par).stages[0]
    assert plain.component("workspace").bytes == dense.bytes
