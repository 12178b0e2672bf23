"""torchtitan's published peak-memory figures as records (GitHub issue #22).

Every row of a table that pytorch/torchtitan (or torchao, for torchtitan runs) publishes with a peak
memory becomes one JSON record under tests/data/measured/published/torchtitan/: the source file and
commit, the run's torchtitan / torch / torchao commits as stated, the GPU, what the row states, what
we took from the run's own config file at its commit (and why), the measured figure and which
number it is, and our configuration of the run (the contract's JSON).

Which number: torchtitan's console line "memory: X GiB(Y%)" is `max_reserved_gib` of
components/metrics.py (DeviceMemoryMonitor.get_peak_stats: ``torch.cuda.memory_stats()
["reserved_bytes.all.peak"]`` / 2**30, peak statistics reset after every logged step), the same at
every commit read here (9dec370 torchtitan/metrics.py, e7c0cae and 6fc499f6 and b5bcd76
torchtitan/components/metrics.py). The tables quote that line; torchao's benchmark script
(benchmarks/float8/training/parse_torchtitan_logs.py) takes the largest "memory:" of every logged
step, step 1 included.

    python -m validation.published_torchtitan      # (re)writes the records
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "published" / "torchtitan"
GIB = 2**30
REPO = "pytorch/torchtitan"

# the source files, each at the last commit that changed it (pytorch/torchtitan main at b5bcd76c)
H100_2412 = {"repo": REPO, "path": "benchmarks/llama3_h100_202412_torchtitan.md",
             "commit": "820504e20d1149fbf0b98c567af24c4b0433b22d",
             "first_published": "docs/performance.md at d4c86e375 (2025-01-30)"}
H200_2506 = {"repo": REPO, "path": "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
             "commit": "4a61bd87d3c7e92bcfeb5d5464d9e6bd13ef440a"}
B200_MXFP8 = {"repo": "pytorch/ao", "path": "torchao/prototype/mx_formats/README.md",
              "commit": "09f13255fdcdb9d3a1b3c5c1c723cd9e41e2d5cb",
              "quoted_by": "pytorch/torchtitan torchtitan/components/quantization/mxfp8.md at 5b5f578a (4 of its 5 rows)"}
B200_NVFP4 = {"repo": REPO, "path": "torchtitan/components/quantization/nvfp4.md",
              "commit": "73aed7f6c09c04041dae2d2c185bb4c6384ebb3f"}

RUN_2412 = {"torchtitan_commit": "9dec370ad26b5f8e9a7333a0e36165018262644b", "torchtitan_version": "2024-12",
            "torch_commit": "1963fc83a1c32e162162e2414f78b043f0674bae",
            "torchao_commit": "eab345c2268a7506355d506ebfc27b5d28e5e7d0", "date": "2024-12-26",
            "version_source": "assets/version.txt at 9dec370 reads 0.0.2 (unchanged since April 2024, b889f3d5): "
                              "the release key is the commit's month"}
RUN_2506 = {"torchtitan_commit": "e7c0cae934df78d6e9c2835f42ff1f757dc3fddc", "torchtitan_version": "0.1.0",
            "torch": "2.8.0a0+5228986c39 (NGC 25.05)", "torchao_commit": "0afa4c1bd28c82921e360ddbd1b27c9d6da5b947",
            "date": "2025-06-13", "version_source": "assets/version.txt at e7c0cae reads 0.1.0 (tag v0.1.0 is f7084fc7, "
                                                     "2025-06-17)"}
RUN_2508 = {"torchtitan_commit": "6fc499f6f5b32151a799188be2208cfb09faed30", "torchtitan_version": "0.2.0",
            "torch": "2.9.0.dev20250815+cu128", "torchao": "0.13.0+gite4e681be6", "date": "2025-08-15",
            "version_source": "assets/version.txt at 6fc499f6 reads 0.1.0, but the rules are v0.2.0's (29624e37, "
                              "2025-10-17): FSDP2 units split by 83e69410 (2025-07-28, 'Improve reshard_after_forward "
                              "logic'), after the v0.1.0 tag"}
RUN_2608 = {"torchtitan_commit": "not stated: the rows were added with commit bcc09297 (2026-08-05, #3914) and "
                                 "reworded by 73aed7f6 (2026-08-20)", "torchtitan_version": "main",
            "torch": "2.14.0a0+gitd9abf9e", "torchao": "0.18.0+gitcb76f29", "date": "2026-08"}

H100_96 = ("NVIDIA H100 SXM with 96 GB HBM2e at 500 W (Meta Grand Teton), 8 per host over NVLink; hardware.gpu "
           "h100-80 stands in: the same Hopper (sm90) libraries and workspaces, the capacity only decides the fit")
METRIC_RESERVED = {"metric": "max_reserved",
                   "reads": "torch.cuda.memory_stats()['reserved_bytes.all.peak'] / 2**30, logged as 'memory: X GiB'",
                   "source": "torchtitan components/metrics.py DeviceMemoryMonitor.get_peak_stats (torchtitan/metrics.py "
                             "at 9dec370); train.py logs max_reserved_gib on the console line"}


def _training(**kw) -> dict:
    base = {"mode": "training", "framework": "fsdp2", "param_dtype": "bf16", "grad_dtype": "fp32",
            "master_weights": True, "optimizer_dtype": "fp32", "compute_dtype": "bf16", "optimizer": "adamw",
            "attention": "flash", "dropout": 0.0, "loss": "standard"}
    base.update(kw)
    return base


def _config(model: str, gpu: str, training: dict, expandable: bool = False, **parallel) -> dict:
    par = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "zero_stage": 3}
    par.update(parallel)
    hardware = {"gpu": gpu, **({"expandable_segments": True} if expandable else {})}
    return {"model": model, "training": training, "parallel": par, "hardware": hardware}


def _record(rid: str, source: dict, table: str, row: str, run: dict, gpu: str, stated: dict, assumed: dict,
            gib: float, config: dict, metric: dict = METRIC_RESERVED, notes: str = "") -> dict:
    decimals = len(repr(gib).split(".")[1]) if "." in repr(gib) else 0
    return {"id": rid, "source": {**source, "table": table, "row": row}, "run": run, "gpu": gpu,
            "stated": stated, "assumed": assumed,
            "measured": {"gib": gib, "bytes": round(gib * GIB), "precision_gib": 0.5 * 10 ** -decimals,
                         "rank": "the largest over all GPUs (footnote 1)" if source is H100_2412 else "rank 0's log",
                         **metric},
            "config": config, "notes": notes}


# --- benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, Dec 2024) ---------------------------

_TOML_2412 = "train_configs/llama3_{size}.toml at 9dec370"
_FLOAT8_2412 = ("Float8 = docs/float8.md's command at 9dec370: --float8.enable_float8_linear "
                "--float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp (tensorwise, "
                "dynamic scaling), as llama3_405b.toml at 9dec370 sets them")
_COMMON_2412 = {"optimizer": "AdamW, foreach implementation (9dec370 config_manager.py --optimizer.fused store_true, "
                             "off; optimizer.py foreach = not fused; fused became the default in 6e498855, #881, "
                             "2025-02-24), fp32 states",
                "mixed_precision": "FSDP2 MixedPrecisionPolicy(param bfloat16, reduce float32) (config_manager.py defaults)",
                "attention": "F.scaled_dot_product_attention(is_causal=True) after repeat_kv (models/llama/model.py)",
                "loss": "cross_entropy(pred.flatten(0, 1).float(), labels): not compiled at 9dec370 (train.py; "
                        "e8977b0 'turning off compile on loss function', 2024-12-18)",
                "selective_ac_option": "op (llama3_8b.toml)",
                "allocator": "default segments, as stated by nothing: the benchmark names no launcher or environment; "
                             "at 9dec370 run_llama_train.sh (torchrun on one host) sets "
                             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a5e57e4a, 2024-10-22) and "
                             "multinode_trainer.slurm (AWS EFA) does not, and neither is written for Meta's Grand "
                             "Teton hosts the runs used"}


def _h100_rows() -> list[dict]:
    rows = []
    t1 = [("fsdp", "FSDP", 82.4, False, False), ("fsdp-compile", "FSDP + torch.compile", 77.0, True, False),
          ("fsdp-compile-float8", "FSDP + torch.compile + Float8", 76.8, True, True)]
    for gpus, table, values in ((8, "Table 1", (82.4, 77.0, 76.8)), (128, "Table 3", (67.0, 62.0, 61.8))):
        for (tag, row, _, compiled, float8), gib in zip(t1, values):
            training = _training(framework_version="2024-12", seq_len=8192, micro_batch_size=2,
                                 global_batch_size=2 * gpus, recompute="selective", compile=compiled)
            if float8:
                training.update(fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True)
            assumed = {"seq_len": f"8192 ({_TOML_2412.format(size='8b')})", **_COMMON_2412}
            if float8:
                assumed["float8"] = _FLOAT8_2412
            rows.append(_record(
                f"titan-h100-2412-llama3.1-8b-w{gpus}-sac-{tag}", H100_2412, table, row, RUN_2412, H100_96,
                {"model": "Llama 3.1 8B", "gpus": gpus, "parallelism": f"FSDP {gpus}", "local_batch_size": 2,
                 "global_batch_size": 2 * gpus, "activation_checkpointing": "selective", "compile": compiled,
                 "float8": float8}, assumed, gib,
                _config("llama-3.1-8b", "h100-80", training, dp=gpus)))
    for fsdp, cp, seq, gib in ((8, 1, 32768, 83.9), (4, 2, 65536, 84.2), (2, 4, 131072, 84.0), (1, 8, 262144, 84.5)):
        training = _training(framework_version="2024-12", seq_len=seq, micro_batch_size=1, global_batch_size=fsdp,
                             recompute="full", compile=True, fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True)
        rows.append(_record(
            f"titan-h100-2412-llama3.1-8b-fsdp{fsdp}-cp{cp}-fullac-s{seq}", H100_2412, "Table 2",
            f"FSDP {fsdp}, CP {cp}", RUN_2412, H100_96,
            {"model": "Llama 3.1 8B", "gpus": 8, "parallelism": f"FSDP {fsdp}, CP {cp}", "seq_len": seq,
             "local_batch_size": 1, "activation_checkpointing": "full", "compile": True, "float8": True},
            {**_COMMON_2412, "float8": _FLOAT8_2412,
             "context_parallel": "torch.distributed.tensor.experimental.context_parallel over SDPA (ring attention, "
                                 "train.py at 9dec370)"},
            gib, _config("llama-3.1-8b", "h100-80", training, dp=fsdp, cp=cp)))
    for tag, row, gib in (("2d", "2D", 71.9), ("2d-asynctp", "2D + AsyncTP", 67.6)):
        training = _training(framework_version="2024-12", seq_len=8192, micro_batch_size=16, global_batch_size=512,
                             recompute="full", compile=True, fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True,
                             async_tp=tag.endswith("asynctp"))
        rows.append(_record(
            f"titan-h100-2412-llama3.1-70b-fsdp32-tp8-fullac-{tag}", H100_2412, "Table 4", row, RUN_2412, H100_96,
            {"model": "Llama 3.1 70B", "gpus": 256, "parallelism": "FSDP 32, TP 8", "local_batch_size": 16,
             "global_batch_size": 512, "activation_checkpointing": "full", "compile": True, "float8": True,
             "async_tp": tag.endswith("asynctp")},
            {"seq_len": f"8192 ({_TOML_2412.format(size='70b')})", **_COMMON_2412, "float8": _FLOAT8_2412,
             "loss_parallel": "on (TP with sequence parallel; --training.disable_loss_parallel not given)"},
            gib, _config("llama-3.1-70b", "h100-80", training, dp=32, tp=8)))
    # 405B: PP 8; the split points generated by pipelining_utils.generate_split_points at 9dec370 (126 layers):
    # 1F1B, 8 stages: 15, 16 x 6, 15; Interleaved 1F1B, 2 stages per rank (16): 7, 8 x 14, 7; micro-batches
    # default to the PP degree (pipeline_parallel_microbatches None -> 8)
    pp_assumed = {"seq_len": f"8192 ({_TOML_2412.format(size='405b')})", **_COMMON_2412, "float8": _FLOAT8_2412,
                  "loss_parallel": "on", "pipeline_microbatches": "8 = the PP degree (pipelining_utils."
                  "build_pipeline_schedule at 9dec370: pipeline_parallel_microbatches None -> pipeline_parallel_degree)",
                  "pipeline_split": "generate_split_points at 9dec370: 1F1B 15 + 6 x 16 + 15 layers; interleaved (2 "
                                    "stages per rank) 7 + 14 x 8 + 7",
                  "fsdp": "reshard_after_forward=False for every unit under PP (parallelize_llama.apply_fsdp at 9dec370: "
                          "'if pp_enabled: reshard_after_forward = False'): zero_stage 2"}
    for tag, row, gib, vpp in (("1f1b", "1F1B", 82.5, 1), ("interleaved", "Interleaved 1F1B", 72.7, 2)):
        training = _training(framework_version="2024-12", seq_len=8192, micro_batch_size=4, global_batch_size=256,
                             recompute="full", compile=True, fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True,
                             async_tp=True)
        layers = {"pp_first_stage_layers": 15, "pp_last_stage_layers": 15} if vpp == 1 else \
            {"pp_layout": "Et*7|" + "t*8|" * 14 + "t*7L"}  # 16 virtual stages, rank r holding r and r + 8
        rows.append(_record(
            f"titan-h100-2412-llama3.1-405b-fsdp8-tp8-pp8-{tag}", H100_2412, "Table 5", row, RUN_2412, H100_96,
            {"model": "Llama 3.1 405B", "gpus": 512, "parallelism": "FSDP 8, TP 8, PP 8", "local_batch_size": 32,
             "global_batch_size": 256, "activation_checkpointing": "full", "compile": True, "float8": True,
             "async_tp": True, "schedule": row},
            pp_assumed, gib,
            _config("llama-3.1-405b", "h100-80", training, dp=8, tp=8, pp=8, vpp=vpp, zero_stage=2,
                    pp_schedule="1f1b" if vpp == 1 else "interleaved", **layers)))
    for fsdp, cp, seq, gib in ((8, 1, 32768, 75.3), (4, 2, 65536, 75.9), (2, 4, 131072, 77.1), (1, 8, 262144, 84.9)):
        training = _training(framework_version="2024-12", seq_len=seq, micro_batch_size=1, global_batch_size=8 * fsdp,
                             recompute="full", compile=True, fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True,
                             async_tp=True)
        rows.append(_record(
            f"titan-h100-2412-llama3.1-405b-fsdp{fsdp}-cp{cp}-tp8-pp8-s{seq}", H100_2412, "Table 6",
            f"FSDP {fsdp}, CP {cp}", RUN_2412, H100_96,
            {"model": "Llama 3.1 405B", "gpus": 512, "parallelism": f"FSDP {fsdp}, CP {cp}, TP 8, PP 8",
             "seq_len": seq, "local_batch_size": 8, "activation_checkpointing": "full", "compile": True,
             "float8": True, "async_tp": True, "schedule": "1F1B"},
            {**pp_assumed, "seq_len": "stated"}, gib,
            _config("llama-3.1-405b", "h100-80", training, dp=fsdp, cp=cp, tp=8, pp=8, pp_schedule="1f1b", zero_stage=2,
                    pp_first_stage_layers=15, pp_last_stage_layers=15)))
    return rows


# --- Trainy on WhiteFiber, H200 (torchtitan e7c0cae, Jun 2025) -----------------------------------------------

def _h200_rows() -> list[dict]:
    rows = []
    for nodes, gib in ((4, 47.96), (8, 46.97)):
        gpus = 8 * nodes
        training = _training(framework_version="0.1.0", seq_len=8192, micro_batch_size=2, global_batch_size=2 * gpus,
                             recompute="selective", compile=True, fp8=True, fp8_recipe="tensorwise",
                             fp8_all_gather=True)
        rows.append(_record(
            f"titan-h200-2506-llama3.1-8b-w{gpus}-sac-compile-float8", H200_2506, "Results", f"NUM_NODES {nodes}",
            RUN_2506, "NVIDIA H200 (141 GB), 8 per host over NVLink, 400 Gb/s CX-7 between hosts",
            {"model": "Llama 3.1 8B", "gpus": gpus, "command": "torchtitan/train.py --job.config-file "
             "torchtitan/models/llama3/train_configs/llama3_8b.toml --training.local_batch_size=2 --training.compile "
             "--model.converters=float8 --float8.enable_fsdp_float8_all_gather "
             "--float8.precompute_float8_dynamic_scale_for_fsdp --float8.force_recompute_fp8_weight_in_bwd"},
            {"seq_len": "8192 (torchtitan/models/llama3/train_configs/llama3_8b.toml at e7c0cae)",
             "activation_checkpointing": "selective, op (the same toml)", "parallelism": f"FSDP {gpus} "
             "(data_parallel_shard_degree -1)", "loss": "cross_entropy(pred.float()) compiled with the model "
             "(components/loss.py build_cross_entropy_loss at e7c0cae)",
             "attention": "SDPA after repeat_kv (models/llama3/model.py at e7c0cae, use_flex_attn false)",
             "metric": "the table's Memory(GiB), sampled at step 100 from the run's WandB report; torchtitan logs "
                       "max_reserved on its console line and both max_reserved and max_active to WandB; taken as "
                       "max_reserved",
             "allocator": "default segments: the stated command is torchrun with no PYTORCH_CUDA_ALLOC_CONF (run_train.sh, "
                          "which sets expandable_segments:True at e7c0cae, is not the stated launcher)"},
            gib, _config("llama-3.1-8b", "h200", training, dp=gpus)))
    return rows


# --- torchao MX formats README, B200 (torchtitan 6fc499f6, Aug 2025) ----------------------------------------

def _b200_mxfp8_rows() -> list[dict]:
    rows = []
    recipes = (("bf16", "none (bfloat16)", 33.71, {}),
               ("float8-tensorwise", "float8 tensorwise (f8 all-gather)", 33.38,
                {"fp8": True, "fp8_recipe": "tensorwise", "fp8_all_gather": True}),
               ("mxfp8-cublas", "mxfp8_cublas", 33.88, {"fp8": True, "fp8_recipe": "mxfp8"}),
               ("mxfp8-cublas-rceil", "mxfp8_cublas_rceil", 33.88, {"fp8": True, "fp8_recipe": "mxfp8"}),
               ("float8-rowwise", "float8 rowwise", 33.72, {"fp8": True, "fp8_recipe": "rowwise"}))
    for tag, row, gib, fp8 in recipes:
        training = _training(framework_version="0.2.0", seq_len=8192, micro_batch_size=1, global_batch_size=8,
                             recompute="selective", compile=True, **fp8)
        rows.append(_record(
            f"titan-b200-2508-llama3-8b-w8-sac-compile-{tag}", B200_MXFP8, "Training e2e benchmarks on NVIDIA B200",
            row, RUN_2508, "8 x NVIDIA B200 (power limited), one node",
            {"model": "Llama3-8b", "gpus": 8, "local_batch_size": 1, "seq_len": 8192, "steps": 100,
             "compile": True, "parallelism": "FSDP2", "activation_checkpointing": "per-op SAC", "scaling": row},
            {"config": "torchtitan/models/llama3/train_configs/llama3_8b.toml at 6fc499f6 via torchao "
                       "benchmarks/float8/training/llama3.sh (--training.compile, local batch 1)",
             "float8_flags": "tensorwise: --float8.enable_fsdp_float8_all_gather "
                             "--float8.precompute_float8_dynamic_scale_for_fsdp; rowwise: --float8.recipe_name=rowwise; "
                             "mx: --model.converters=mx --mx.recipe_name=<recipe> (llama3.sh)",
             "loss": "cross_entropy(pred.float()) compiled with the model (components/loss.py at 6fc499f6)",
             "attention": "SDPA after repeat_kv (models/llama3/model/model.py at 6fc499f6)",
             "metric": "parse_torchtitan_logs.py: the largest 'memory: X GiB' over the logged steps, step 1 included; "
                       "the table's unit 'GB' is the log's GiB",
             "allocator": "expandable segments: llama3.sh launches torchtitan's run_train.sh, which at 6fc499f6 sets "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torchrun"},
            gib, _config("llama-3.1-8b", "b200", training, expandable=True, dp=8)))
    return rows


# --- torchtitan nvfp4.md, B200 (torchtitan main, Aug 2026) --------------------------------------------------

def _b200_nvfp4_rows() -> list[dict]:
    rows = []
    common = {"loss": "ChunkedLossWrapper(CrossEntropyLoss) of the config registry, not compiled: the NVFP4 and MXFP8 "
                      "configs set CompileConfig(enable=True, components=['model'])",
              "activation_checkpointing": "SelectiveAC (per-op) of the config registry",
              "allocator": "default segments: nvfp4.md's command is torchrun -m torchtitan.train with no "
                           "PYTORCH_CUDA_ALLOC_CONF, and torchtitan.train sets none at 73aed7f6",
              "compile": "the model, per block, not the loss: components=['model'] as the NVFP4 and MXFP8 configs set it "
                         "(the doc: 'All runs use eager execution with model compilation'; the BF16 run's components "
                         "are not stated otherwise)"}
    for model, preset, table, tokens, mbs, seq, values in (
            ("Llama 3 8B", "llama-3.1-8b", "Llama 3 8B 200M-Token Evidence", 65536, 32, 2048,
             (("bf16", "BF16", 174.49, {}), ("mxfp8", "MXFP8", 179.94, {"fp8": True, "fp8_recipe": "mxfp8"}))),
            ("Qwen3 8B", "qwen3-8b", "Qwen3 8B 200M-Token Evidence, Random Initialization", 32768, 16, 2048,
             (("bf16", "BF16", 112.88, {}), ("mxfp8", "MXFP8", 112.63, {"fp8": True, "fp8_recipe": "mxfp8"})))):
        for tag, row, gib, fp8 in values:
            training = _training(framework_version="main", seq_len=seq, micro_batch_size=mbs,
                                 global_batch_size=4 * mbs, recompute="selective", compile=True, compile_loss=False,
                                 loss="chunked", **fp8)
            rows.append(_record(
                f"titan-b200-2608-{preset}-w4-sac-compile-{tag}", B200_NVFP4, table, row, RUN_2608,
                "4 x NVIDIA B200 (184.3 GiB each: 174.49 GiB is 94.7%)",
                {"model": model, "gpus": 4, "parallelism": "FSDP 4", "local_batch_size": mbs,
                 "global_batch_size": 4 * mbs, "seq_len": seq, "tokens_per_microbatch": tokens, "compile": True,
                 "precision": row},
                {**common, "config": "llama3_8b / llama3_8b_mxfp8 (models/llama3/config_registry.py at b5bcd76c)"
                 if preset.startswith("llama") else "sft_qwen3_8b_math with attn_backend varlen (models/qwen3/"
                 "config_registry.py at b5bcd76c); the BF16 and MXFP8 variants are not named"},
                gib, _config(preset, "b200", training, dp=4),
                notes="the table's Memory / Peak Reserved Memory column with its % of the device"))
    return rows


def records() -> list[dict]:
    return _h100_rows() + _h200_rows() + _b200_mxfp8_rows() + _b200_nvfp4_rows()


def write() -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    paths = []
    for rec in records():
        path = OUT / f"{rec['id']}.json"
        path.write_text(json.dumps(rec, indent=2) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write():
        print(p)
