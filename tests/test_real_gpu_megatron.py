"""The terms a real GPU allocates under Megatron-LM that the fake-tensor harness cannot see, and the
rules the published runs showed (issue 22; tests/test_published_megatron.py holds the runs), each
checked by hand: TransformerEngine's cached dummy weight gradients, CUBLAS_WORKSPACE_CONFIG, the local
layer spec, interleaved chunks of unequal layers, multi-token prediction, the Megatron importer."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from estimator import ConfigError, estimate, estimate_config
from estimator.importers import import_config
from estimator.memory.activations.attention import attention_entries
from estimator.memory.activations.layer import layer_bytes
from estimator.memory.pipeline import in_flight_per_rank, interleaved_chunk_peak, interleaved_microbatches_error
from estimator.memory.workspaces import cublas_workspace_bytes
from estimator.models.presets import get_architecture
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training
from validation.core.report import tensors_peak

MiB = 2**20
LLAMA_70B = {"model": "llama-3.1-70b", "parallel": {"tp": 8, "dp": 1}, "training": {"seq_len": 4096}}


def stage_component(config: dict, key: str, stage: int = -1) -> int:
    component = estimate_config(config).stages[stage].component(key)
    return component.bytes if component else 0


def with_fields(config: dict, section: str, **fields) -> dict:
    return {**config, section: {**config.get(section, {}), **fields}}


def test_te_dummy_weight_gradients_one_per_linear_shape():
    """Llama-3.1-70B on TP 8: linear_qkv [(64 + 2 x 8) x 128 / 8, 8192], linear_proj [8192, 64 x 128 / 8],
    fc1 [2 x 28672 / 8, 8192], fc2 [8192, 28672 / 8], and the output layer [128,256 padded to a multiple of
    128 x 8 = 129,024 / 8, 8192], each once in bf16 (80 layers share them)."""
    rows_cols = [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584), (129024 // 8, 8192)]
    assert stage_component(LLAMA_70B, "wgrad_cache") == 2 * sum(r * c for r, c in rows_cols) == 478_150_656
    # without gradient-accumulation fusion the weight gradients are transient tensors: no cache
    off = with_fields(LLAMA_70B, "training", gradient_accumulation_fusion=False)
    assert stage_component(off, "wgrad_cache") == 0
    # the first of two pipeline stages has no output layer: four shapes
    piped = with_fields(LLAMA_70B, "parallel", pp=2)
    assert stage_component(piped, "wgrad_cache", 0) == 2 * sum(r * c for r, c in rows_cols[:4])
    # not a Megatron term
    assert stage_component({"model": "llama-3.1-8b", "training": {"framework": "fsdp2"}}, "wgrad_cache") == 0


def test_te_dummy_weight_gradients_count_an_expert_shape_once():
    """Mixtral-8x7B on EP 8 (one local expert) and on EP 1 (eight): the experts' fc1 [2 x 14336, 4096] and
    fc2 [4096, 14336] are cached once either way (TE's cache is keyed by shape)."""
    base = {"model": "mixtral-8x7b", "parallel": {"tp": 1, "dp": 8, "ep": 8}, "training": {"moe_grouped_gemm": True}}
    one_each = stage_component(base, "wgrad_cache")
    assert one_each == stage_component(with_fields(base, "parallel", ep=1), "wgrad_cache")
    attention = (32 + 2 * 8) * 128 * 4096 + 4096 * 32 * 128
    assert one_each == 2 * (attention + 2 * 14336 * 4096 + 4096 * 14336 + 32000 * 4096)


def test_the_fake_tensor_peak_leaves_the_gpu_only_terms_out():
    stage = estimate_config(LLAMA_70B).stages[0]
    gpu_only = stage.component("workspace").bytes + stage.component("wgrad_cache").bytes
    assert tensors_peak(stage) == stage.allocated_peak_bytes - gpu_only


def test_cublas_workspace_config():
    """PyTorch sums SIZE KiB x COUNT over the :SIZE:COUNT pairs."""
    assert cublas_workspace_bytes(":4096:8") == 32 * MiB
    assert cublas_workspace_bytes(":4096:2:16:8") == 2 * 4 * MiB + 8 * 16 * 1024
    a100 = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80"}}
    # two threads (forward, autograd's backward) x PyTorch's pre-Hopper default, plus TE's 4 MiB on Ampere
    assert stage_component(a100, "workspace") == 2 * (8 * MiB + 128 * 1024) + 4 * MiB
    deterministic = with_fields(a100, "hardware", cublas_workspace_config=":4096:8")
    assert stage_component(deterministic, "workspace") == 2 * 32 * MiB + 4 * MiB
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG"):
        estimate_config(with_fields(a100, "hardware", cublas_workspace_config="4096"))


def test_the_local_spec_runs_eager_attention_without_te():
    local = {"model": "llama-3.2-1b", "training": {"transformer_impl": "local", "attention": "eager"}}
    assert stage_component(local, "workspace") == 2 * 32 * MiB  # cuBLAS only: no TransformerEngine GEMM
    with pytest.raises(ConfigError, match=r"training.attention.*transformer_impl 'local'"):
        estimate_config({"model": "llama-3.2-1b", "training": {"transformer_impl": "local"}})
    with pytest.raises(ConfigError, match="transformer_impl"):
        estimate_config({"model": "llama-3.2-1b", "training": {"framework": "fsdp2", "transformer_impl": "local"}})


def test_attention_dropout_frees_the_16_bit_softmax_copy():
    """Megatron's unfused softmax in fp32: without dropout scores x V keeps the 16-bit copy of the
    probabilities; with dropout it keeps the dropout's output and the dropout its mask."""
    arch = get_architecture("llama-3.2-1b")
    names = {d: [e.name for e in attention_entries(arch, Training(attention="eager", dropout=d,
                                                                  attention_softmax_fusion=False), Parallel())]
             for d in (0.0, 0.1)}
    assert "softmax output cast to the compute dtype" in names[0.0]
    assert "softmax output cast to the compute dtype" not in names[0.1]
    assert {"attention dropout mask", "attention dropout output"} <= set(names[0.1])


def weighted_peak_from_megatron(code, p: int, v: int, m: int, g: int, rank: int, sizes: tuple[int, ...]) -> int:
    """The most layers held at once on `rank`, from Megatron-Core 0.16.1's own get_schedule_table and
    get_pp_rank_microbatches: the warm-up's forwards, then forward W + k before backward k (the chunk
    reversed for a backward)."""
    table = code.get_schedule_table(m, v, g)
    code.state.size, code.state.rank, code.state.virtual = p, rank, v
    total, _, warmup, remaining = code.get_pp_rank_microbatches(m, v, g)
    held = sum(sizes[c] for _, c in table[:warmup])
    peak = held
    for k in range(remaining):
        held += sizes[table[warmup + k][1]]
        peak = max(peak, held)
        held -= sizes[v - 1 - table[k][1]]
    return peak


def test_interleaved_chunks_of_unequal_layers_against_megatron_s_schedule():
    from validation.megatron import schedules
    try:
        code = schedules.schedule_code("0.16")
    except FileNotFoundError as missing:
        pytest.skip(f"Megatron-Core 0.16.1's schedules.py is not here ({missing})")
    rng = random.Random(22)
    checked = 0
    for p, v in itertools.product(range(2, 7), range(2, 5)):
        for m in range(p, 3 * p + 1):
            for g in range(p, m + 1):
                if interleaved_microbatches_error(p, m, g):
                    continue
                rank = rng.randrange(p)
                sizes = tuple(rng.randrange(0, 4) for _ in range(v))
                assert interleaved_chunk_peak(rank, p, v, m, g, sizes) == \
                    weighted_peak_from_megatron(code, p, v, m, g, rank, sizes), (p, v, m, g, rank, sizes)
                checked += 1
    assert checked == 291  # every layout Megatron accepts up to PP 6, VPP 4, 3 PP micro-batches


def test_the_loss_chunk_counted_in_the_split_holds_no_layers():
    """PP 4 x VPP 2 with the embedding and the loss counted in the split (6 layers + 2 = 8 units): the
    last rank holds layer 5 in its first chunk and only the loss in its second. It warms up (v - 1) x 4 =
    4 forwards of its first chunk, then runs its second chunk's first forward: 4 micro-batches of its one
    layer, 4 stacks, where chunks of 1/v each would give (4 + 1) / 2 = 2.5 (golden values of Megatron-LM's
    gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split: -13% before, -0.7% now)."""
    par = Parallel(pp=4, vpp=2)
    uneven = [(range(0, 0), range(3, 4))] + [(range(i, i + 1), range(i + 3, i + 4)) for i in range(2)] + \
             [(range(5, 6), range(6, 6))]
    assert in_flight_per_rank(par, 4, uneven)[3] == 4.0
    assert in_flight_per_rank(par, 4, [()] * 4)[3] == 2.5
    assert in_flight_per_rank(par, 4, uneven)[1] == in_flight_per_rank(par, 4, [()] * 4)[1]  # even chunks


def test_multi_token_prediction_counts_one_more_layer_and_loss_on_the_last_stage():
    """Qwen3-30B-A3B given one MTP module on the last of two stages: one MoE layer's kept tensors, enorm's
    input and eh_proj's input (3 x 2 s b h / t under sequence parallelism), and the loss's saved tensors again."""
    arch = replace(get_architecture("qwen3-30b-a3b"), mtp_layers=1)
    training, par = Training(seq_len=4096), Parallel(tp=2, pp=2, dp=2)
    result = estimate(arch, training, par)
    last = result.stages[-1]
    extras = 3 * 2 * 4096 * arch.hidden_size / 2
    layer = layer_bytes(arch, training, par, "moe")
    assert last.component("mtp").bytes == pytest.approx(layer + extras + last.component("logits").bytes, abs=2)
    assert result.stages[0].component("mtp") is None
    # under full recompute the module keeps its two inputs
    last = estimate(arch, replace(training, recompute="full"), par).stages[-1]
    assert last.component("mtp").bytes == pytest.approx(extras * 2 / 3 + last.component("logits").bytes, abs=2)


def test_the_importer_reads_the_flags_the_golden_runs_use():
    launch = ("export CUBLAS_WORKSPACE_CONFIG=:4096:8\n"
              "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
              "--seq-length 512 --max-position-embeddings 512 --tokenizer-type NullTokenizer --vocab-size 1000 "
              "--transformer-impl local --no-gradient-accumulation-fusion --recompute-granularity full "
              "--recompute-method block --recompute-num-layers 0 --bf16\n")
    imported = import_config(launch, "megatron")
    training, hardware = imported.config["training"], imported.config["hardware"]
    assert training["transformer_impl"] == "local" and training["attention"] == "eager"
    assert training["gradient_accumulation_fusion"] is False and "recompute" not in training
    assert hardware["cublas_workspace_config"] == ":4096:8" and "cuda_module_loading" not in hardware
    eager = import_config("export CUDA_MODULE_LOADING=EAGER\n" + launch, "megatron").config["hardware"]
    assert eager["cuda_module_loading"] == "eager"
    assert "cuda_module_loading" not in import_config("export CUDA_MODULE_LOADING=DEFAULT\n" + launch,
                                                      "megatron").config["hardware"]
    assert imported.config["model"]["vocab_size"] == 1001  # NullTokenizer: --vocab-size + its end-of-document id
    with pytest.raises(ConfigError, match="--recompute-num-layers"):
        import_config(launch.replace("--recompute-method block", "--recompute-method uniform"), "megatron")
