"""Exact parameter counts, and where the parameters sit per stage and per GPU."""

import pytest

from canonical import LLAMA_31_8B, LLAMA_31_70B, LLAMA_31_405B, MIXTRAL_8X7B, QWEN3_8B, QWEN25_7B, gpt
from estimator import Parallel, parameter_counts
from estimator.memory.sharding import layers_per_stage, padded_vocab_size, stage_layer_indices, stage_parameters


@pytest.mark.parametrize("arch, published", [
    # Counts of the released checkpoints (safetensors totals on the Hub model pages)
    (LLAMA_31_8B, 8_030_261_248),
    (LLAMA_31_70B, 70_553_706_496),
    (LLAMA_31_405B, 405_853_388_800),
    (QWEN3_8B, 8_190_735_360),
    (QWEN25_7B, 7_615_616_512),
    (MIXTRAL_8X7B, 46_702_792_704),
])
def test_exact_totals(arch, published):
    assert parameter_counts(arch).total == published


def test_mixtral_active_parameters():
    # Mistral AI's "Mixtral of experts" (arXiv 2401.04088): 12.9B active; exactly the total minus
    # 6 of 8 experts in each of 32 layers, each expert 3 x 4096 x 14336.
    inactive = 32 * 6 * 3 * 4096 * 14336
    assert parameter_counts(MIXTRAL_8X7B).active == 46_702_792_704 - inactive == 12_879_925_248


def test_llama_8b_by_hand():
    h, f, g, d, v = 4096, 14336, 8, 128, 128256
    layer = h * h + 2 * h * g * d + h * h + 3 * h * f + 2 * h
    assert parameter_counts(LLAMA_31_8B).per_layer["dense"] == layer
    assert parameter_counts(LLAMA_31_8B).total == 32 * layer + 2 * v * h + h


def test_gpt_layer_is_12h2_plus_13h():
    # GPT layer with biases and LayerNorm: 12h^2 + 13h (Narayanan et al. 2021, section 5.1)
    h = 1024
    assert parameter_counts(gpt(h, 1, 16)).per_layer["dense"] == 12 * h * h + 13 * h


def test_megatron_pads_vocabulary_to_128_times_tp():
    assert padded_vocab_size(50257, 1, "megatron") == 50304  # GPT-2's 50257 -> 50304 (Megatron README)
    assert padded_vocab_size(50257, 8, "megatron") == 51200  # multiple of 1024
    assert padded_vocab_size(128256, 1, "megatron") == 128256  # 1002 x 128 already
    assert padded_vocab_size(128256, 8, "megatron") == 126 * 1024  # ceil(128256 / 1024) = 126
    assert padded_vocab_size(50257, 8, "hf") == 50257


def test_embedding_on_first_stage_head_on_last():
    h, v, layer = 4096, 128256, parameter_counts(LLAMA_31_8B).per_layer["dense"]
    stages = stage_parameters(LLAMA_31_8B, Parallel(pp=4), "megatron")
    assert [len(s.layer_indices) for s in stages] == [8, 8, 8, 8]
    assert stages[0].local == 8 * layer + v * h
    assert stages[1].local == stages[2].local == 8 * layer
    assert stages[3].local == 8 * layer + h + v * h  # final norm + LM head


def test_tied_embedding_is_copied_to_the_last_stage_under_pp():
    arch = gpt(1024, 4, 16, vocab=51200)
    h, layer, v = 1024, parameter_counts(gpt(1024, 4, 16)).per_layer["dense"], 51200
    one = stage_parameters(arch, Parallel(), "megatron")[0]
    assert one.local == 4 * layer + v * h + 2048 * h + 2 * h  # one shared matrix, positions, final LayerNorm
    first, last = stage_parameters(arch, Parallel(pp=2), "megatron")
    assert first.local == 2 * layer + v * h + 2048 * h
    assert last.local == 2 * layer + 2 * h + v * h  # its own copy of the embedding as the head


def test_tensor_parallel_divides_all_but_norms():
    h, v = 4096, 128256
    full = stage_parameters(LLAMA_31_8B, Parallel(), "hf")[0].local
    norms = 32 * 2 * h + h
    tp8 = stage_parameters(LLAMA_31_8B, Parallel(tp=8), "hf")[0].local
    assert tp8 == (full - norms) / 8 + norms
    assert full == 8_030_261_248


def test_row_parallel_biases_are_replicated():
    # GPT under TP: QKV and fc1 biases split, output-projection and fc2 biases replicated, as in Megatron
    h, t = 1024, 4
    arch = gpt(h, 1, 16)
    tp = stage_parameters(arch, Parallel(tp=t), "hf")[0]
    one_layer = 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h  # weights, split biases, kept biases, 2 LN
    embeddings = 51200 * h / t + 2048 * h  # vocab-parallel words, replicated positions
    assert tp.local == one_layer + embeddings + 2 * h


def test_uneven_pipeline_split_of_llama_405b():
    # Llama 3 (Grattafiori et al. 2024, section 3.3.2): 126 layers on 16 stages, one fewer on the ends
    par = Parallel(pp=16, vpp=4, pp_first_stage_layers=7, pp_last_stage_layers=7)
    assert layers_per_stage(LLAMA_31_405B, par) == [7] + [8] * 14 + [7]
    indices = stage_layer_indices(LLAMA_31_405B, par)
    assert sorted(i for stage in indices for i in stage) == list(range(126))
    # interleaving: rank 0's first chunk holds 1 layer (beside the embedding); the first round of
    # chunks covers 1 + 14 x 2 + 2 = 31 layers, so rank 0's second chunk starts at layer 31
    assert indices[0][:3] == [0, 31, 32]
    assert indices[15][-1] == 125 and len(indices[15]) == 7


def test_interleaved_chunks_are_dealt_round_robin():
    par = Parallel(pp=2, vpp=2)
    arch = gpt(256, 8, 4)
    assert stage_layer_indices(arch, par) == [[0, 1, 4, 5], [2, 3, 6, 7]]
