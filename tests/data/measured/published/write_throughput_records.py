"""Writes tests/data/measured/published/throughput/*.json: one record per published run, each read by hand
from its cited source (a table row, and the recipe or config at the cited commit for what the table leaves out).
The JSONs are the evidence; this script is how they were written, kept so that a correction is one edit."""
import json, pathlib

OUT = pathlib.Path(__file__).resolve().parent / "throughput"
records = []

def rec(id, source, stack, model, hardware, layout, batch, precision, compile, ac, async_tp, measured, notes="",
        extra=None):
    r = {"id": id, "source": source, "stack": stack, "model": model, "hardware": hardware, "layout": layout,
         "batch": batch, "precision": precision, "compile": compile, "activation_checkpointing": ac,
         "async_tp": async_tp, "measured": measured}
    if extra:
        r["other_settings"] = extra
    if notes:
        r["notes"] = notes
    records.append(r)

def lay(tp=1, pp=1, vpp=1, cp=1, dp=1, ep=1, etp=None, fsdp=False, schedule="1f1b", **kw):
    d = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "dp": dp, "ep": ep, "fsdp": fsdp, "pp_schedule": schedule}
    if etp is not None:
        d["etp"] = etp
    d.update(kw)
    return d

# ---------------------------------------------------------------- Megatron-LM README (H100, MCore r0.8.0)
MLM_COMMIT = "f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4"
MLM_SRC = lambda row: {"repo": "NVIDIA/Megatron-LM", "path": "README.md and images/model_table.png", "commit": MLM_COMMIT,
                       "where": f"'Training Speed and Scalability', model table row {row} (image read by eye)"}
MLM_STACK = {"framework": "megatron", "version": "Megatron-Core r0.8.0 (images/strong_scaling.png legend)",
             "te": True}
MLM_FORMULA = ("megatron/training/training.py num_floating_point_operations at " + MLM_COMMIT
               + ": per token 6N + 12*L*s*h*(q/h) (full attention, not causally halved), N = the matmul weights with an "
               "untied output layer (V*h)")
for size, heads, h, L, tp, pp, dp, gpus, batch, tflops in [
        ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
        ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
        ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
        ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
        ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9)]:
    rec(f"megatron-lm-readme-gpt-{size.lower()}-h100-{gpus}", MLM_SRC(size), MLM_STACK,
        {"architecture": {"name": f"gpt-{size.lower()} (Megatron-LM README)", "hidden_size": h, "num_layers": L,
                          "num_attention_heads": heads, "intermediate_size": 4 * h, "vocab_size": 131072,
                          "gated_mlp": False, "norm": "layernorm", "linear_bias": True,
                          "position_embedding": "rope", "tie_embeddings": False}},
        {"gpu": "NVIDIA H100 SXM 80GB (DGX H100)", "catalog_id": "h100-80", "gpus": gpus},
        lay(tp=tp, pp=pp, dp=dp), {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": batch},
        {"compute": "bf16", "fp8": None}, False, "none", True,
        {"model_tflops_per_gpu": tflops, "mfu": None, "flops_formula": MLM_FORMULA},
        "README: vocabulary 131,072, sequence 4,096, --overlap-grad-reduce --overlap-param-gather (distributed "
        "optimizer), --tp-comm-overlap (TE userbuffers: TP collectives overlapped with the GEMMs), PP overlap. "
        "Architecture: GPT-3 style (parameter counts match 12*L*h^2 + 2*V*h: 4h MLP, MHA, untied output layer); "
        "norm, position embedding and micro-batch size are not stated (assumed LayerNorm, RoPE, 1); "
        "precision not stated, MFU = TFLOP/s / 989 (bf16 peak), so bf16; recompute not stated (none assumed).",
        {"sequence_parallel": tp > 1, "distributed_optimizer": True})

# ---------------------------------------------------------------- Llama 3 paper, Table 4
L3_SRC = lambda row: {"url": "https://arxiv.org/abs/2407.21783", "title": "Grattafiori et al. 2024, The Llama 3 Herd of Models",
                      "where": f"section 3.3.2, Table 4, row {row}"}
for gpus, cp, dp, seq, tflops, mfu in [(8192, 1, 64, 8192, 430, 0.43), (16384, 1, 128, 8192, 400, 0.41),
                                       (16384, 16, 8, 131072, 380, 0.38)]:
    rec(f"llama3-paper-405b-{gpus}gpu-cp{cp}-s{seq}", L3_SRC(f"{gpus} GPUs, CP {cp}, seq {seq}"),
        {"framework": "megatron", "version": "Meta internal 4D-parallel stack (not Megatron); modelled as Megatron-style TP/PP/CP",
         "te": None},
        {"preset": "llama-3.1-405b"},
        {"gpu": "NVIDIA H100 SXM 80GB HBM3 at 700 W (Meta Grand Teton)", "catalog_id": "h100-80", "gpus": gpus},
        lay(tp=8, pp=16, vpp=4, cp=cp, dp=dp, schedule="interleaved", pp_first_stage_layers=7, pp_last_stage_layers=7),
        {"seq_len": seq, "micro_batch_size": 1, "global_batch_size": 16 * 2**20 // seq, "tokens_per_batch": 16 * 2**20},
        {"compute": "bf16", "fp8": None}, False, "none", False,
        {"model_tflops_per_gpu": tflops, "mfu": mfu,
         "flops_formula": "not stated in the paper; converted with PaLM appendix B 6N + 12*L*H*Q*T with the attention "
                          "term causally halved (estimator model_flops_per_token). The CP-16 row at 131k tokens "
                          "depends on it: counted unhalved it would be about 1.4x fewer tokens/s"},
        "Paper: TP 8, PP 16 with interleaving and the first and last stages one layer short (7 + 8 x 14 + 7 "
        "layers), CP by all-gather of K/V, FSDP/ZeRO-1-like DP, 16M tokens a batch, BF16 MFU against 989 TFLOP/s. "
        "Virtual stages per rank and the micro-batch size are not stated (4 and 1 assumed, as tests/test_roofline.py).",
        {"zero_stage": 1})

# ---------------------------------------------------------------- torchtitan 2024-12 (H100 96GB HBM2e, 500 W)
TT1 = "benchmarks/llama3_h100_202412_torchtitan.md"
TT1_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
TT_STACK = {"framework": "torchtitan", "version": "torchtitan 9dec370 (2024-12-26), torch 1963fc8, torchao eab345c"}
H100_500W = {"gpu": "NVIDIA H100 SXM 96GB HBM2e 2.4 TB/s at its default 500 W power limit (Meta Grand Teton), "
                    "400 Gb/s RDMA per GPU", "catalog_id": "h100-96-500w", "gpus": None}
def tt_src(table, row):
    return {"repo": "pytorch/torchtitan", "path": TT1, "commit": TT1_COMMIT, "where": f"Table {table}, row '{row}'"}
def hw(base, gpus):
    d = dict(base); d["gpus"] = gpus; return d
FP8_TT = {"compute": "bf16", "fp8": "tensorwise", "fp8_all_gather": None,
          "note": "torchao Float8Linear, dynamic tensorwise scaling (config_manager defaults at 9dec370); whether "
                  "FSDP float8 all-gather was on is not stated"}
BF16 = {"compute": "bf16", "fp8": None}
for gpus, table in ((8, 1), (128, 3)):
    for row, tps, comp, fp8 in (("FSDP", {8: 5762, 128: 5605}, False, False),
                                ("FSDP + torch.compile", {8: 6667, 128: 6514}, True, False),
                                ("FSDP + torch.compile + Float8", {8: 8532, 128: 8380}, True, True)):
        tag = "fsdp" + ("-compile" if comp else "") + ("-fp8" if fp8 else "")
        rec(f"torchtitan-2412-llama3-8b-{gpus}gpu-{tag}", tt_src(table, row), TT_STACK, {"preset": "llama-3.1-8b"},
            hw(H100_500W, gpus), lay(dp=gpus, fsdp=True), {"seq_len": 8192, "micro_batch_size": 2, "global_batch_size": 2 * gpus},
            FP8_TT if fp8 else BF16, comp, "selective-op", False, {"tokens_per_s_per_gpu": tps[gpus]},
            "seq_len 8192 from train_configs/llama3_8b.toml at 9dec370; selective AC = selective_ac_option 'op' (the toml)")
for fsdp, cp, seq, tps in ((8, 1, 32768, 3890), (4, 2, 65536, 2540), (2, 4, 131072, 1071), (1, 8, 262144, 548)):
    rec(f"torchtitan-2412-llama3-8b-8gpu-cp{cp}-s{seq}", tt_src(2, f"FSDP {fsdp}, CP {cp}"), TT_STACK,
        {"preset": "llama-3.1-8b"}, hw(H100_500W, 8), lay(dp=fsdp, cp=cp, fsdp=True),
        {"seq_len": seq, "micro_batch_size": 1, "global_batch_size": fsdp}, FP8_TT, True, "full", False,
        {"tokens_per_s_per_gpu": tps}, "Table 2: FSDP + CP + torch.compile + Float8, local batch 1, full AC")
for row, tps, atp in (("2D", 829, False), ("2D + AsyncTP", 876, True)):
    rec(f"torchtitan-2412-llama3-70b-256gpu-fsdp32-tp8{'-asynctp' if atp else ''}", tt_src(4, row), TT_STACK,
        {"preset": "llama-3.1-70b"}, hw(H100_500W, 256), lay(tp=8, dp=32, fsdp=True),
        {"seq_len": 8192, "micro_batch_size": 16, "global_batch_size": 512}, FP8_TT, True, "full", atp,
        {"tokens_per_s_per_gpu": tps}, "Table 4: FSDP 32 x TP 8 + torch.compile + Float8, local batch 16, full AC")
for row, tps, sched, vpp in (("1F1B", 100, "1f1b", 1), ("Interleaved 1F1B", 128, "interleaved", 2)):
    rec(f"torchtitan-2412-llama3-405b-512gpu-{sched}", tt_src(5, row), TT_STACK, {"preset": "llama-3.1-405b"},
        hw(H100_500W, 512), lay(tp=8, pp=8, vpp=vpp, dp=8, fsdp=True, schedule=sched, pp_first_stage_layers=15,
                                pp_last_stage_layers=15),
        {"seq_len": 8192, "micro_batch_size": 4, "global_batch_size": 256, "microbatches": 8},
        dict(FP8_TT, fp8_all_gather=True), True, "full", True, {"tokens_per_s_per_gpu": tps},
        "Table 5: FSDP 8 x TP 8 x PP 8, local batch 32 -> 8 micro-batches of 4 (pipeline_parallel_microbatches "
        "defaults to the PP degree, torchtitan/parallelisms/pipelining_utils.py at 9dec370); stages per rank for "
        "interleaving: 2 when no split points are given (generate_split_points in torchtitan/parallelisms/pipelining_utils.py at 9dec370), which splits 126 layers into stages of 7, 14 x 8 and 7 (15 per end rank, 16 per middle rank; 1F1B: 15, 6 x 16, 15); float8 all-gather on in train_configs/llama3_405b.toml")
for fsdp, cp, seq, tps in ((8, 1, 32768, 76), (4, 2, 65536, 47), (2, 4, 131072, 31), (1, 8, 262144, 16)):
    rec(f"torchtitan-2412-llama3-405b-512gpu-cp{cp}-s{seq}", tt_src(6, f"FSDP {fsdp}, CP {cp}"), TT_STACK,
        {"preset": "llama-3.1-405b"}, hw(H100_500W, 512),
        lay(tp=8, pp=8, cp=cp, dp=fsdp, fsdp=True, pp_first_stage_layers=15, pp_last_stage_layers=15),
        {"seq_len": seq, "micro_batch_size": 1, "global_batch_size": 8 * fsdp, "microbatches": 8},
        dict(FP8_TT, fp8_all_gather=True), True, "full", True, {"tokens_per_s_per_gpu": tps},
        "Table 6: TP 8 x PP 8 (1F1B) + FSDP + CP, local batch 8 -> 8 micro-batches of 1; generate_split_points: "
        "15, 6 x 16, 15 layers")

# ---------------------------------------------------------------- torchtitan async TP 2025-06
TT2 = "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
TT2_STACK = {"framework": "torchtitan", "version": "torchtitan 820504e (2025-06-13), torch 38410cf9"}
for model, gpus, tp, dp, mbs, ac, rows in (
        ("llama-3.1-70b", 256, 8, 32, 16, "full", (("bf16", 597.3, 652.4), ("tensorwise", 809.8, 942.4),
                                                    ("rowwise", 599.6, 624.8))),
        ("llama-3.1-8b", 64, 8, 8, 12, "selective-op", (("bf16", 4378, 4809.4), ("tensorwise", 5078.1, 5570.1),
                                                         ("rowwise", 3708.5, 3914.9)))):
    for quant, vanilla, asyn in rows:
        for atp, tps in ((False, vanilla), (True, asyn)):
            prec = BF16 if quant == "bf16" else {"compute": "bf16", "fp8": quant, "fp8_all_gather": None}
            rec(f"torchtitan-2506-{model.split('-')[-1]}-{gpus}gpu-tp{tp}-{quant}-{'asynctp' if atp else 'tp'}",
                {"repo": "pytorch/torchtitan", "path": TT2, "commit": TT1_COMMIT,
                 "where": f"{model} table, row '{quant}', column '{'Async' if atp else 'Vanilla'} TP tokens/sec'"},
                TT2_STACK, {"preset": model}, hw(H100_500W, gpus), lay(tp=tp, dp=dp, fsdp=True),
                {"seq_len": 8192, "micro_batch_size": mbs, "global_batch_size": mbs * dp}, prec, True, ac, atp,
                {"tokens_per_s_per_gpu": tps},
                "seq_len 8192 from the llama3 train_configs at 820504e; per op SAC = selective_ac_option 'op'")

# ---------------------------------------------------------------- torchtitan H200 (Trainy on WhiteFiber)
for nodes, tps in ((4, 10938), (8, 10753)):
    rec(f"torchtitan-2506-trainy-llama3-8b-h200-{nodes * 8}gpu",
        {"repo": "pytorch/torchtitan", "path": "benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
         "commit": TT1_COMMIT, "where": f"Results, NUM_NODES {nodes}"},
        {"framework": "torchtitan", "version": "torchtitan e7c0cae (2025-06-13), torch 2.8.0a0+5228986c39"},
        {"preset": "llama-3.1-8b"}, {"gpu": "NVIDIA H200 SXM 141GB, 400 Gb/s CX-7 per GPU", "catalog_id": "h200",
                                     "gpus": nodes * 8},
        lay(dp=nodes * 8, fsdp=True), {"seq_len": 8192, "micro_batch_size": 2, "global_batch_size": 2 * nodes * 8},
        {"compute": "bf16", "fp8": "tensorwise", "fp8_all_gather": True}, True, "selective-op", False,
        {"tokens_per_s_per_gpu": tps},
        "llama3_8b.toml (e7c0cae): seq 8192, selective op AC; CLI: local batch 2, compile, float8 converter with "
        "FSDP float8 all-gather and precomputed dynamic scales")

# ---------------------------------------------------------------- Megatron-Bridge performance summary
MB_DOC = "docs/performance-summary-archive.md"
MB_HEAD = "067f987df03b8355b03192d88d70f1709fedf51a"
TAGS = {"26.06": ("v0.5.0", "fcbb6031103d0ca845c1a54d4fee55ecfcca17b6"),
        "26.04.01": ("v0.4.2", "c810129341a84e58f4cbed3093f70668a088c028"),
        "25.11": ("v0.2.2", "0465189601951c14ad592bd8eefbb673929e25bc")}
SYSTEM = {"DGX-H100": ("NVIDIA DGX H100 (H100 SXM 80GB, 700 W)", "h100-80"),
          "DGX-B200": ("NVIDIA DGX B200", "b200"), "DGX-B300": ("NVIDIA DGX B300", "b300"),
          "DGX-GB200": ("NVIDIA GB200 NVL72 (72-GPU NVLink domain)", "gb200")}
PREC = {"BF16": {"compute": "bf16", "fp8": None},
        "FP8": {"compute": "bf16", "fp8": "tensorwise", "te_recipe": "FP8 current scaling (Float8CurrentScaling), "
                "bf16_with_fp8_current_scaling_mixed, first/last layers in fp8 (scripts/performance/utils/precision.py)"},
        "FP8-CS": {"compute": "bf16", "fp8": "tensorwise", "te_recipe": "FP8 current scaling"},
        "MXFP8": {"compute": "bf16", "fp8": "mxfp8", "te_recipe": "MXFP8BlockScaling (bf16_with_mxfp8_mixed)"}}
MODEL = {"LLAMA3_8B": "llama-3.1-8b", "LLAMA3_70B": "llama-3.1-70b", "LLAMA3.1_405B": "llama-3.1-405b",
         "DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
         "Qwen3_235B_a22B": "qwen3-235b-a22b"}
SETTINGS = {  # what the recipes at the container's tag add (recompute, TP overlap, dispatcher), read by hand
    "LLAMA3_70B": ("none", True, "src/megatron/bridge/recipes/llama/llama3.py llama3_70b_pretrain_config: "
                   "recompute None, CommOverlapConfig(tp_comm_overlap=True) with userbuffers, TE cross-entropy fusion, "
                   "distributed optimizer with grad-reduce and param-gather overlap"),
    "LLAMA3_8B": ("none", False, "recipes/llama/llama3.py llama3_8b_pretrain_config: recompute None, no TP"),
    "LLAMA3.1_405B": ("none", True, "recipes/llama/llama3.py llama31_405b_pretrain_config: recompute None, "
                      "tp_comm_overlap=True (userbuffers), TE cross-entropy fusion"),
    "Qwen3_30B_a3B": ("none", False, "scripts/performance/configs/qwen/qwen3_llm_pretrain.py: recompute None, "
                      "moe_router_force_load_balancing=True, flex dispatcher with the workload's HybridEP backend; "
                      "the FP8_MX workloads on GB200/B300 also moe_a2a_overlap; no TP"),
    "Qwen3_235B_a22B": ("none", True, "configs/qwen/qwen3_llm_pretrain.py: recompute None, force-balanced router; "
                        "CommOverlapConfig(tp_comm_overlap=True)"),
    "GPT OSS 120B": ("none", False, "recipes/gpt_oss/gpt_oss.py: recompute None (the workloads may set "
                     "recompute_modules), force-balanced router, native cross-entropy fusion"),
    "DeepSeekV3": ("selective:core_attn", False, "configs/deepseek/deepseek_llm_pretrain.py: recompute_granularity selective, "
                   "force-balanced router, MTP 1 layer (recipes/deepseek/deepseek_v3.py), no TP overlap (TP 1)"),
}
def split(model, pp, vp, container):
    """How the recipe splits the layers when pp x vp does not divide them."""
    if model in ("LLAMA3.1_405B", "Qwen3_235B_a22B") and pp > 1:
        # recipes/llama/llama3.py llama31_405b_pretrain_config and recipes/qwen/qwen3_moe.py
        # qwen3_235b_a22b_pretrain_config: account_for_embedding/loss_in_pipeline_split = True
        return {"pp_account_for_embedding": True, "pp_account_for_loss": True}
    if model == "DeepSeekV3" and pp > 1:
        # recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_layout (layout_map)
        last = "tL" if container == "25.11" else "tmL"
        if pp * vp == 16:
            return {"pp_layout": "Et*4|" + "t*4|" * 14 + last}
        if pp * vp == 8:
            return {"pp_layout": "Et*8|" + "t*8|" * 6 + "t*5" + last[1:]}
    return {}


def mb(container, model, system, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep, tps, tflops, fsdp=0, extra_note="", ac=None,
       dispatcher=None, a2a_overlap=False):
    sysname, cat = SYSTEM[system]
    tag, commit = TAGS[container]
    default_ac, tpo, how = SETTINGS[model]
    ac = ac or default_ac
    bf16_reduce = not (model.startswith("Qwen3") and container == "26.06")
    dp = gpus // (tp * pp * cp)
    moe = MODEL[model] in ("deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b")
    layout = lay(tp=tp, pp=pp, vpp=vp or 1, cp=cp, dp=dp, ep=ep or 1, etp=1 if moe else None, fsdp=bool(fsdp),
                 schedule="interleaved" if (vp or 1) > 1 else "1f1b", **split(model, pp, vp or 1, container))
    rec(f"megatron-bridge-{container}-{MODEL[model]}-{system.lower()}-{gpus}gpu-{prec.lower()}",
        {"repo": "NVIDIA-NeMo/Megatron-Bridge", "path": MB_DOC, "commit": MB_HEAD,
         "where": f"'{container} NeMo Container', Pre-Training, {model}, {system} {prec} row"},
        {"framework": "megatron", "version": f"NeMo container {container} (Megatron-Bridge {tag}, {commit[:8]})",
         "te": True},
        dict({"preset": MODEL[model]}, **({"overrides": {"mtp_layers": 0}} if "w/o MTP" in extra_note else {})),
        {"gpu": sysname, "catalog_id": cat, "gpus": gpus}, layout,
        {"seq_len": seq, "micro_batch_size": mbs, "global_batch_size": gbs}, PREC[prec], False,
        ac, tpo and tp > 1, {"tokens_per_s_per_gpu": tps, "model_tflops_per_gpu": tflops},
        ("MoE: 'we force-balance the token distribution among experts and all benchmarks are token-dropless'. "
         if moe else "") + f"Settings at {tag}: {how}." + (" " + extra_note if extra_note else ""),
        dict({"megatron_fsdp": bool(fsdp), "sequence_parallel": tp > 1,
              "cross_entropy_fusion": "native" if model == "GPT OSS 120B" else "te",
              # grad_reduce_in_fp32 = False in the perf scripts' common configs (not the 26.06 Qwen3 one)
              "grad_reduce_dtype": "bf16" if bf16_reduce else "fp32"},
             **({"moe_grouped_gemm": True, "moe_router_force_load_balancing": True,
                 "moe_dispatcher": dispatcher or "alltoall", "moe_a2a_overlap": a2a_overlap} if moe else {})))

mb("26.06", "LLAMA3.1_405B", "DGX-H100", 1024, "FP8", 1536, 1, 8192, 8, 8, 2, 8, None, 326, 822)
mb("26.06", "LLAMA3.1_405B", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 4, 16, 1, 4, None, 843, 2129)
mb("26.06", "LLAMA3.1_405B", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 4, 16, 1, 8, None, 783, 1976)
mb("26.06", "DeepSeekV3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 1, 4, 1, 4, 64, 4969, 1292, ac="selective:mlp",
   extra_note="Workload DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1: recompute_modules [mlp], HybridEP dispatcher.", dispatcher="hybridep")
mb("26.06", "DeepSeekV3", "DGX-B300", 256, "MXFP8", 4096, 2, 4096, 1, 8, 1, None, 8, 3541, 920,
   ac="selective:mla_up_proj", extra_note="Workload B300_V1: recompute_modules [mla_up_proj], HybridEP.", dispatcher="hybridep")
mb("26.06", "GPT OSS 120B", "DGX-GB200", 64, "MXFP8", 1280, 4, 4096, 1, 1, 1, None, 64, 28947, 943, dispatcher="hybridep", a2a_overlap=True,
   extra_note="Workload GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2: EP 64, HybridEP, moe_a2a_overlap, no recompute.")
mb("26.06", "GPT OSS 120B", "DGX-B300", 64, "MXFP8", 1280, 4, 4096, 1, 1, 1, None, 8, 18534, 604, dispatcher="hybridep",
   extra_note="Workload B300_BF16_V2 (FP8_MX aliases it): EP 8, HybridEP, no recompute.")
mb("26.06", "Qwen3_30B_a3B", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 1, 1, 1, None, 8, 40706, 936, dispatcher="hybridep", a2a_overlap=True)
mb("26.06", "Qwen3_30B_a3B", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 1, 1, 1, None, 8, 40769, 938, dispatcher="hybridep", a2a_overlap=True)
mb("26.06", "Qwen3_30B_a3B", "DGX-H100", 16, "FP8", 1024, 1, 4096, 1, 1, 1, None, 16, 8826, 203, dispatcher="hybridep")
mb("26.06", "Qwen3_235B_a22B", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 1, 8, 1, 3, 32, 7376, 1092, dispatcher="hybridep", a2a_overlap=True,
   extra_note="Workload GB200_FP8_MX_V2: EP 32, VP 3, HybridEP (V1), moe_a2a_overlap.")
mb("26.04.01", "LLAMA3_70B", "DGX-H100", 64, "FP8", 256, 1, 8192, 4, 8, 1, 5, None, 1664, 731)
mb("26.04.01", "LLAMA3_70B", "DGX-GB200", 64, "MXFP8", 256, 1, 8192, 2, 4, 1, 5, None, 3712, 1664)
mb("26.04.01", "GPT OSS 120B", "DGX-H100", 64, "BF16", 1280, 1, 4096, 1, 4, 1, None, 8, 5824, 158, ac="selective:layernorm,moe_act",
   extra_note="Workload H100_BF16_V1/V2: PP 4, recompute_modules [layernorm, moe_act], alltoall dispatcher.")
mb("26.04.01", "GPT OSS 120B", "DGX-B200", 64, "BF16", 1280, 4, 4096, 1, 1, 1, None, 8, 13568, 369, ac="selective:layernorm,moe_act",
   extra_note="Workload B200_BF16_V2: EP 8, recompute_modules [layernorm, moe_act], alltoall dispatcher.")
mb("26.04.01", "DeepSeekV3", "DGX-B200", 256, "MXFP8", 4096, 1, 4096, 1, 8, 1, 2, 32, 3328, 864,
   ac="selective:mla_up_proj", extra_note="Workload B200_V1: recompute_modules [mla_up_proj], HybridEP.", dispatcher="hybridep")
mb("26.04.01", "Qwen3_30B_a3B", "DGX-B200", 8, "MXFP8", 512, 4, 4096, 1, 1, 1, None, 8, 27136, 619, dispatcher="hybridep")
mb("26.04.01", "Qwen3_235B_a22B", "DGX-H100", 256, "FP8", 8192, 1, 4096, 2, 8, 1, 4, 32, 1712, 253, a2a_overlap=True,
   extra_note="Workload H100_FP8_CS_V1: alltoall dispatcher, moe_a2a_overlap.")
mb("26.04.01", "Qwen3_235B_a22B", "DGX-B200", 256, "MXFP8", 8192, 1, 4096, 1, 8, 1, None, 8, 3776, 560, extra_note="Workload B200 V1: EP 8, alltoall dispatcher, no a2a overlap.")
mb("25.11", "LLAMA3_8B", "DGX-B200", 8, "FP8-CS", 128, 2, 8192, 1, 1, 1, None, None, 30624, 1576)
mb("25.11", "LLAMA3_8B", "DGX-GB200", 8, "FP8-CS", 128, 2, 8192, 1, 1, 1, None, None, 31508, 1622)
mb("25.11", "LLAMA3_8B", "DGX-H100", 8, "FP8-CS", 128, 1, 8192, 1, 1, 1, None, None, 14451, 744, fsdp=8,
   extra_note="Megatron FSDP 8 (the table's FSDP column).")
mb("25.11", "LLAMA3.1_405B", "DGX-B200", 128, "FP8-CS", 64, 1, 8192, 4, 8, 2, 8, None, 661, 1667)
mb("25.11", "DeepSeekV3", "DGX-GB200", 256, "BF16", 4096, 1, 4096, 1, 4, 1, 4, 64, 3139, 782,
   ac="selective:mla_up_proj", extra_note="Table: 'DeepSeekV3 (w/o MTP)'. Workload (v0.2.2 configs/deepseek/"
   "workload_base_configs.py) GB200: recompute_modules [mla_up_proj], HybridEP.", dispatcher="hybridep")

OUT.mkdir(parents=True, exist_ok=True)
for old in OUT.glob("*.json"):
    old.unlink()
ids = set()
for r in records:
    assert r["id"] not in ids, r["id"]
    ids.add(r["id"])
    (OUT / f"{r['id']}.json").write_text(json.dumps(r, indent=2) + "\n")
print(len(records))
