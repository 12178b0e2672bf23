"""`plan --emit KIND` for the fine-tuning front ends, torchtune and the serving engines: each written
configuration reads back, through the importer of its kind, to the configuration it was written from
(the same estimate), and what a format cannot express is refused by name."""

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit_finetune import emit_axolotl, emit_llama_factory
from estimator.importers.emit_serve import emit_serve
from estimator.importers.emit_torchtune import emit_torchtune

QLORA = {"model": "llama-3.1-8b",
         "training": {"framework": "hf", "seq_len": 4096, "micro_batch_size": 2, "global_batch_size": 64,
                      "recompute": "full", "adapter": {"method": "qlora", "rank": 32, "alpha": 16,
                                                       "target_modules": "all-linear", "dropout": 0.05}},
         "parallel": {"dp": 8}}
LORA_8BIT = {"model": "llama-3.1-8b",
             "training": {"framework": "hf", "seq_len": 4096, "micro_batch_size": 2, "global_batch_size": 64,
                          "recompute": "full", "optimizer": "adam8bit",
                          "adapter": {"method": "lora", "rank": 32, "alpha": 16, "target_modules": ["q", "v"],
                                      "base_dtype": "int8", "trainable_embeddings": True}},
             "parallel": {"dp": 8}}
ZERO3 = {"model": "qwen3-8b", "training": {"framework": "deepspeed", "seq_len": 8192, "recompute": "full",
                                           "loss": "chunked", "liger_kernel": True},
         "parallel": {"dp": 8, "zero_stage": 3}}
ZERO2_OFFLOAD = {"model": "qwen3-8b", "training": {"framework": "deepspeed", "seq_len": 4096, "micro_batch_size": 4,
                                                   "offload_optimizer": "cpu"},
                 "parallel": {"dp": 4, "zero_stage": 2}}
FSDP2 = {"model": "qwen3-8b", "training": {"framework": "hf_fsdp2", "seq_len": 8192, "recompute": "full",
                                           "attention": "eager"}, "parallel": {"dp": 8, "zero_stage": 2}}
DPO = {"model": "qwen3-8b",
       "training": {"framework": "hf", "seq_len": 2048, "recompute": "full",
                    "rl": {"algorithm": "dpo", "max_prompt_len": 1024, "max_response_len": 1024,
                           "reference_model": True},
                    "adapter": {"method": "lora", "rank": 8, "alpha": 16, "target_modules": "all-linear"}},
       "parallel": {"dp": 8}}
TORCHTUNE = [
    {"model": "llama-3.1-8b", "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 2,
                                           "global_batch_size": 64, "recompute": "full", "loss": "chunked"},
     "parallel": {"dp": 8}},
    {"model": "qwen3-8b", "training": {"framework": "torchtune", "seq_len": 2048, "recompute": "full",
                                       "adapter": {"method": "lora", "rank": 16, "alpha": 32,
                                                   "target_modules": "all-linear"}},
     "parallel": {"dp": 4}},
    {"model": "llama-3.1-8b", "training": {"framework": "torchtune", "seq_len": 8192,
                                           "adapter": {"method": "qlora", "rank": 8, "alpha": 16,
                                                       "target_modules": ["q", "v"]}}},
    {"model": "llama-3.1-70b", "training": {"framework": "torchtune", "seq_len": 4096, "offload_optimizer": "cpu",
                                            "offload_parameters": "cpu", "recompute": "full", "recompute_every": 2,
                                            "compile": True, "optimizer_in_backward": True},
     "parallel": {"dp": 8}},
    {"model": "llama-3.2-3b", "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 4,
                                           "recompute": "full", "optimizer_in_backward": True,
                                           "optimizer": "paged_adamw8bit", "loss": "chunked"}},
    {"model": "llama-3.2-3b", "training": {"framework": "torchtune", "seq_len": 4096, "optimizer": "adam8bit"}},
]
SERVING = [
    ("vllm", {"model": "llama-3.1-405b", "training": {"mode": "inference", "seq_len": 8192, "kv_cache_tokens": 8192},
              "serving": {"engine": "vllm", "cuda_graphs": False, "max_model_len": 8192},
              "parallel": {"tp": 8, "pp": 2}}),
    ("vllm", {"model": "qwen2.5-7b", "training": {"mode": "inference", "seq_len": 16384, "kv_cache_tokens": 16384,
                                                  "param_dtype": "int4", "kv_cache_dtype": "fp8"},
              "serving": {"engine": "vllm", "gpu_memory_utilization": 0.8, "weight_format": "awq_int4",
                          "kv_cache_dtype": "fp8", "max_model_len": 16384, "prefix_caching": True,
                          "max_num_seqs": 128, "block_size": 32},
              "parallel": {"dp": 2}}),
    ("sglang", {"model": "qwen3-32b", "training": {"mode": "inference", "kv_cache_dtype": "fp8", "seq_len": 40960,
                                                   "kv_cache_tokens": 40960},
                "serving": {"engine": "sglang", "mem_fraction_static": 0.85, "max_num_seqs": 64,
                            "kv_cache_dtype": "fp8_e5m2", "max_model_len": 40960},
                "parallel": {"tp": 2}}),
]


def round_trip(kind, text, config):
    gpus = config.get("parallel", {}).get("dp", 1) * config.get("parallel", {}).get("tp", 1) * \
        config.get("parallel", {}).get("pp", 1)
    result = import_config(text, gpus=None if kind in ("vllm", "sglang") else gpus)  # the kind guessed
    assert result.kind == kind and result.unknown == (), text
    assert estimate_imported(result).to_json() == estimate_config(config).to_json(), text
    return result


@pytest.mark.parametrize("config", [QLORA, LORA_8BIT, ZERO3, ZERO2_OFFLOAD, FSDP2], ids=lambda c: str(c["training"]))
def test_axolotl_round_trip(config):
    text = emit_axolotl(config)
    round_trip("axolotl", text, config)
    assert text.startswith("# written by llm-memory plan --emit axolotl")


@pytest.mark.parametrize("config", [QLORA, LORA_8BIT, ZERO3, ZERO2_OFFLOAD, DPO], ids=lambda c: str(c["training"]))
def test_llama_factory_round_trip(config):
    round_trip("llama-factory", emit_llama_factory(config), config)


@pytest.mark.parametrize("config", TORCHTUNE, ids=lambda c: c["model"] + str(c["training"].get("adapter")))
def test_torchtune_round_trip(config):
    text = emit_torchtune(config)
    round_trip("torchtune", text, config)
    assert ("tune run --nproc_per_node" in text) == (config.get("parallel", {}).get("dp", 1) > 1)


@pytest.mark.parametrize("kind, config", SERVING, ids=lambda c: c if isinstance(c, str) else c["model"])
def test_serve_line_round_trip(kind, config):
    text = emit_serve(kind, config)
    round_trip(kind, text, config)
    assert text.startswith("vllm serve" if kind == "vllm" else "python -m sglang.launch_server")


@pytest.mark.parametrize("emit, config, field", [
    (emit_axolotl, DPO, "training.rl.algorithm"),  # axolotl's preference trainers are not read back
    (emit_llama_factory, FSDP2, "parallel.zero_stage"),  # its FSDP is Accelerate's file: the YAML runs DDP
    (emit_torchtune, {**TORCHTUNE[0], "training": {**TORCHTUNE[0]["training"], "dropout": 0.1}}, "training.dropout"),
    (emit_torchtune, {**TORCHTUNE[2], "training": {**TORCHTUNE[2]["training"], "adapter": {
        "method": "lora", "rank": 8, "alpha": 16, "target_modules": ["q", "v", "gate"]}}},
     "training.adapter.target_modules"),  # torchtune adapts the whole MLP or none of it
    (emit_torchtune, ZERO3, "--emit"),  # a torchtune recipe runs under its own framework
    (lambda c: emit_serve("vllm", c), {**SERVING[0][1], "serving": {**SERVING[0][1]["serving"], "speculative": {
        "method": "eagle", "num_speculative_tokens": 3}}}, "serving.speculative"),
    (lambda c: emit_serve("sglang", c), SERVING[0][1], "serving.engine"),
])
def test_what_a_format_cannot_write_is_refused_by_name(emit, config, field):
    with pytest.raises(ConfigError) as info:
        emit(config)
    assert info.value.field.startswith(field)
