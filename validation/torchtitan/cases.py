"""The torchtitan cases, and each one's configuration in the contract's JSON format."""

from __future__ import annotations

from dataclasses import dataclass

# torchtitan flavor -> the estimator's model: a bundled preset id where the architecture is the
# same (checked in tests/test_harness_torchtitan.py by parameter count), else the contract's
# canonical object written from torchtitan's config registry.
DEEPSEEK_16B = {  # torchtitan/models/deepseek_v3/__init__.py `_16b` (DeepSeek-V2-Lite's shape)
    "name": "torchtitan-deepseek-v3-16b", "hidden_size": 2048, "num_layers": 27,
    "num_attention_heads": 16, "intermediate_size": 10944, "vocab_size": 102400,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "num_experts": 64, "num_experts_per_token": 6, "moe_intermediate_size": 1408,
    "num_shared_experts": 2, "first_dense_layers": 1,
}
MODELS = {
    ("llama3", "8B"): ("llama-3.1-8b", "Llama-3.1-8B"),
    ("llama3", "70B"): ("llama-3.1-70b", "Llama-3.1-70B"),
    ("qwen3", "8B"): ("qwen3-8b", "Qwen3-8B"),
    ("qwen3", "32B"): ("qwen3-32b", "Qwen3-32B"),
    ("qwen3", "30B-A3B"): ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
    ("deepseek_v3", "16B"): (DEEPSEEK_16B, "DeepSeek-V3 architecture at torchtitan's 16B size"),
}


@dataclass(frozen=True)
class Case:
    family: str
    flavor: str
    world: int
    seq_len: int
    local_batch: int = 1
    tp: int = 1
    cp: int = 1
    ac: str = "none"  # "none", "full", "op", "layer"
    ac_every: int = 1
    float8: str = "none"
    reshard: str = "default"
    fp8_all_gather: bool = False

    def run(self):
        from .step import Run

        return Run(self.family, self.flavor, self.world, self.seq_len, self.local_batch,
                   tp=self.tp, cp=self.cp, ac=self.ac, ac_every=self.ac_every,
                   float8=self.float8, reshard=self.reshard, fp8_all_gather=self.fp8_all_gather)

    @property
    def fsdp(self) -> int:
        return self.world // (self.tp * self.cp)


def case_id(c: Case) -> str:
    model = MODELS[(c.family, c.flavor)][0]
    model = model if isinstance(model, str) else model["name"]
    ac = {"none": "noac", "full": "fullac", "op": "opac", "layer": f"ac-every{c.ac_every}"}[c.ac]
    parts = [f"titan-{model}", f"w{c.world}"]
    parts += [f"tp{c.tp}"] if c.tp > 1 else []
    parts += [f"cp{c.cp}"] if c.cp > 1 else []
    parts += [ac]
    parts += [f"fp8-{c.float8}"] if c.float8 != "none" else []
    parts += ["allgather"] if c.fp8_all_gather else []
    parts += [f"reshard-{c.reshard}"] if c.reshard != "default" else []
    return "-".join(parts + [f"s{c.seq_len}", f"b{c.local_batch}"])


def _cases() -> list[Case]:
    C = Case
    return [
        # Llama-3.1-8B: torchtitan's llama3_8b recipe (seq 8192, op-selective AC) and each saver
        C("llama3", "8B", 8, 8192, 2, ac="op"),
        C("llama3", "8B", 8, 8192, 2, ac="full"),
        C("llama3", "8B", 8, 8192, 1),
        C("llama3", "8B", 8, 8192, 1, ac="layer", ac_every=2),
        C("llama3", "8B", 8, 4096, 2, ac="op", reshard="never"),
        C("llama3", "8B", 64, 8192, 1, ac="op"),
        C("llama3", "8B", 512, 8192, 1, ac="full"),
        C("llama3", "8B", 8, 8192, 2, tp=2, ac="op"),
        C("llama3", "8B", 8, 8192, 1, ac="op", float8="rowwise"),
        C("llama3", "8B", 64, 2048, 4, float8="rowwise"),
        # torchao's tensorwise recipe, with and without FSDP2 float8 all-gather (step._float8_all_gather)
        C("llama3", "8B", 8, 8192, 2, ac="full", float8="tensorwise"),
        C("llama3", "8B", 8, 8192, 2, ac="full", float8="tensorwise", fp8_all_gather=True),
        # Llama-3.1-70B: torchtitan's llama3_70b recipe (TP 8, full AC) and variants
        C("llama3", "70B", 64, 8192, 1, tp=8, ac="full"),
        C("llama3", "70B", 64, 8192, 1, tp=8, ac="op"),
        C("llama3", "70B", 512, 8192, 2, tp=8, ac="full", reshard="never"),
        C("llama3", "70B", 64, 4096, 1, ac="full"),
        C("llama3", "70B", 512, 8192, 1, tp=8, ac="full", float8="rowwise"),
        # Qwen3 dense
        C("qwen3", "8B", 8, 4096, 2, ac="op"),
        C("qwen3", "8B", 8, 8192, 1, ac="full"),
        C("qwen3", "8B", 64, 2048, 4),
        C("qwen3", "8B", 8, 4096, 1, tp=2, ac="layer", ac_every=2),
        C("qwen3", "32B", 64, 8192, 1, ac="op"),
        C("qwen3", "32B", 64, 8192, 1, tp=4, ac="full"),
        C("qwen3", "32B", 512, 4096, 1, tp=8, reshard="never"),
        # Context parallelism: torchtitan's flex path all-gathers K/V over the CP group (step.py)
        C("llama3", "8B", 64, 16384, 1, cp=2, ac="full"),
        C("qwen3", "8B", 64, 32768, 1, cp=4, ac="op"),
        C("llama3", "8B", 64, 16384, 1, cp=2),
        # Mixture of experts
        C("deepseek_v3", "16B", 8, 4096, 1, ac="op"),
        C("deepseek_v3", "16B", 64, 4096, 2, ac="full"),
        C("deepseek_v3", "16B", 8, 2048, 1),
        C("qwen3", "30B-A3B", 64, 4096, 1, ac="op"),
    ]


CASES: dict[str, Case] = {case_id(c): c for c in _cases()}


def contract_config(c: Case) -> dict:
    model = MODELS[(c.family, c.flavor)][0]
    training = {
        "mode": "training", "framework": "fsdp2", "seq_len": c.seq_len,
        "micro_batch_size": c.local_batch,
        # TrainingConfig: dtype fp32 sharded parameters (the master copy), mixed_precision_param
        # bf16 (what FSDP2 all-gathers and computes with), reduce fp32, AdamW states in fp32: the
        # contract's fsdp2 recipe with bf16 parameters (estimator/spec/training.py)
        "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": True,
        "optimizer_dtype": "fp32", "compute_dtype": "bf16", "optimizer": "adamw",
        "recompute": {"none": "none", "full": "full", "op": "selective", "layer": "full"}[c.ac],
        "attention": "flash", "dropout": 0.0,
        "loss": "chunked",  # ChunkedLossWrapper, 8 chunks, the default of every recipe
    }
    if c.ac == "layer":
        training["recompute_every"] = c.ac_every
    if c.float8 != "none":
        training.update(fp8=True, fp8_recipe=c.float8, fp8_all_gather=c.fp8_all_gather)
    parallel = {"tp": c.tp, "pp": 1, "dp": c.fsdp, "cp": c.cp,
                "zero_stage": 2 if c.reshard == "never" else 3}
    return {"model": model, "training": training, "parallel": parallel,
            "hardware": {"gpu": "h100-80"}}


def describe(c: Case) -> str:
    name = MODELS[(c.family, c.flavor)][1]
    ac = {"none": "no activation checkpointing", "full": "full AC (every block)",
          "op": "operator-level selective AC (SelectiveAC: save matmuls except every second, "
                "attention, reductions)",
          "layer": f"full AC on every {c.ac_every}-th block (layer-level selective)"}[c.ac]
    par = f"FSDP2 {c.fsdp}" + (f" x TP {c.tp} (sequence parallel)" if c.tp > 1 else "") \
        + (f" x CP {c.cp} (FSDP shards over the {c.fsdp * c.cp} ranks of dp x cp; each rank keeps "
           f"s/cp tokens, head-tail load balanced, and all-gathers K/V over CP for flex attention)"
           if c.cp > 1 else "")
    fp8 = f", torchao float8 linears ({c.float8} scaling)" if c.float8 != "none" else ""
    if c.float8 == "tensorwise":
        fp8 += (" (recipe name passed to Float8LinearConverter, whose config type lists the rowwise recipes; "
                "torchao's Float8LinearConfig.from_recipe_name builds it)")
    if c.fp8_all_gather:
        fp8 += (", FSDP2 float8 all-gather (torchao enable_fsdp_float8_all_gather: weights wrapped in "
                "WeightWithDynamicFloat8CastTensor as Float8Linear.from_float does; torchtitan 0.3.0 no longer "
                "does it)")
    reshard = {"default": "reshard after forward (default)", "always": "reshard after forward",
               "never": "no reshard after forward"}[c.reshard]
    return (f"{name}, torchtitan 0.3.0 {c.family} `{c.flavor}` on rank 0 of {c.world}: {par}, "
            f"{reshard}, bf16 params / fp32 reduce, fp32 master params and AdamW (fused), "
            f"{ac}{fp8}, flex attention, chunked loss (8), seq {c.seq_len}, local batch "
            f"{c.local_batch}")


def measure(c: Case) -> dict:
    """The record's measurement of a case (validation/torchtitan/step.py)."""
    from .step import measure as measure_run

    return measure_run(c.run())
