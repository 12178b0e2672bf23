"""A real DeepSpeed 0.19.5 ZeRO-3 / ZeRO-2 training step of an HF model on one GPU (issue 23: Qwen's published
full-parameter rows, ZeRO-3 on one GPU at Qwen-1.8B's shape, read about 4 GB above our estimate, cause unknown;
tests/test_published_finetune.py MEDIAN_MISSES).

The model: transformers' Qwen2ForCausalLM with Qwen-1-1.8B's sizes (hidden 2048, 24 layers, 16 heads without
GQA, SwiGLU 5504 wide, vocabulary 151,936, untied head, bias on q/k/v as Qwen-1's c_attn), random weights
from the config (no download), bf16, SDPA attention, gradient checkpointing on (Qwen's finetune_ds.sh
`--gradient_checkpointing True`, transformers' own gradient_checkpointing_enable()), use_cache off.
DeepSpeed's configuration is Qwen's (finetune/ds_config_zero3.json, ds_config_zero2.json: overlap_comm,
contiguous gradients, ZeRO-3's sub_group_size 1e9 and max live / reuse distance 1e9) with the "auto" values the
HF integration resolves (transformers integrations/deepspeed.py: reduce_bucket_size hidden^2,
stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden; gradient_clipping 1.0
from max_grad_norm), bf16 on, one micro-batch per step.

The optimizer: Qwen's json names DeepSpeed's "AdamW", which DeepSpeed builds as its FusedAdam, a CUDA op it
compiles (ninja + nvcc, absent on the GPU machine). Here the client optimizer is torch.optim.AdamW with the
HF Trainer's two parameter groups (weight decay 0.1 except biases and norms; Qwen's --weight_decay 0.1), given
to deepspeed.initialize with zero_allow_untested_optimizer. How ZeRO wraps it: ZeRO-3
(runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3) flattens each group's bf16 partitions into sub-groups of
at most sub_group_size elements, keeps an fp32 copy of each sub-group (`fp32_partitioned_groups_flat`) and puts
that flat fp32 tensor in the torch optimizer's param_groups in place of the model's parameters
(`_setup_for_real_optimizer`); its step copies the sub-group's gradients into the flat tensor's .grad (fp32),
calls the torch optimizer's step on it, and copies the result back to the bf16 partition. ZeRO-1/2
(stage_1_and_2.py DeepSpeedZeroOptimizer) does the same with one flat fp32 partition per group
(`single_partition_of_fp32_groups`). So torch's AdamW sees one or two large fp32 tensors; `optimizer`
picks its implementation: "foreach" (what torch picks on CUDA by default, the Trainer's adamw_torch; its
_multi_tensor_adamw makes temporaries the size of the flat tensor) or "fused" (torch's fused CUDA kernel,
which like DeepSpeed's FusedAdam updates in place without temporaries).
Phases of step 2: forward (engine(...) with labels: transformers' loss on the fp32-upcast logits), backward
(engine.backward), optimizer (engine.step). The allocator's history is recorded and the blocks live at step
2's peak are kept (framework_step.peak_blocks): what DeepSpeed holds there, by the line that allocated it.
On the CPU (the self-test) the same build and steps run on DeepSpeed's CPU accelerator over gloo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODELS = {
    # Qwen-1-1.8B (config.json: intermediate_size 11008 is w1 + w2, each 5504 wide)
    "qwen-1.8b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                      intermediate_size=5504, vocab_size=151936, max_position_embeddings=8192),
    # tiny-llama's sizes (validation/hf/models.py), the CPU self-test
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=160, vocab_size=1000, max_position_embeddings=256),
}


@dataclass(frozen=True)
class DeepSpeedRun:
    model: str  # MODELS
    zero_stage: int  # 2 or 3
    seq_len: int
    micro_batch_size: int = 1
    optimizer: str = "foreach"  # torch.optim.AdamW's implementation: "foreach" or "fused"

    @property
    def id(self) -> str:
        return (f"deepspeed-{self.model}-zero{self.zero_stage}-{self.optimizer}-adamw-recompute"
                f"-s{self.seq_len}-b{self.micro_batch_size}")


def ds_config(run: DeepSpeedRun) -> dict:
    h = MODELS[run.model]["hidden_size"]
    if run.zero_stage == 3:  # ds_config_zero3.json, "auto" as transformers resolves it
        zero = {"stage": 3, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"},
                "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": int(1e9),
                "reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
                "stage3_param_persistence_threshold": 10 * h, "stage3_max_live_parameters": int(1e9),
                "stage3_max_reuse_distance": int(1e9), "stage3_gather_16bit_weights_on_model_save": True}
    else:  # ds_config_zero2.json
        zero = {"stage": 2, "offload_optimizer": {"device": "none"}, "allgather_partitions": True,
                "allgather_bucket_size": int(2e8), "overlap_comm": True, "reduce_scatter": True,
                "reduce_bucket_size": int(2e8), "contiguous_gradients": True}
    return {"train_micro_batch_size_per_gpu": run.micro_batch_size, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": zero,
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def build_model(run: DeepSpeedRun, device: str):
    """Made in bf16 where it runs; under ZeRO-3 inside deepspeed.zero.Init, each module's parameters
    partitioned as they are made, as transformers' from_config / from_pretrained do when ZeRO-3 is on
    (modeling_utils.py: `deepspeed.zero.Init(config_dict_or_path=deepspeed_config())`)."""
    import contextlib

    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**MODELS[run.model], tie_word_embeddings=False, use_cache=False,
                         attn_implementation="sdpa", dtype=torch.bfloat16)
    zero_init = deepspeed.zero.Init(config_dict_or_path=ds_config(run), dtype=torch.bfloat16) \
        if run.zero_stage == 3 else contextlib.nullcontext()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # no fp32 copy of the model is ever made
    try:
        with torch.device(device), zero_init:
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.gradient_checkpointing_enable()
    model.train()
    return model


def trainer_groups(model, weight_decay: float = 0.1) -> list[dict]:
    """The HF Trainer's two groups (Trainer.get_decay_parameter_names: not biases, not norms)."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (rest if name.endswith("bias") or "norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _init_one_rank(device: str) -> None:
    import deepspeed

    if device != "cuda":
        # the CPU accelerator JIT-compiles its shared-memory all-reduce (comm/torch.py build_shm_op, a C++ op)
        # for every process group; a world of one rank never uses it, and CI should not compile it
        # by name: `import deepspeed.comm.torch as m` binds deepspeed.comm's attribute `torch`, torch itself
        import importlib

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed("nccl" if device == "cuda" else "gloo", auto_mpi_discovery=False)


class DeepSpeedStep:
    def __init__(self, run: DeepSpeedRun, device: str):
        import deepspeed

        _init_one_rank(device)
        self.run, self.device = run, device
        model = build_model(run, device)
        implementation = {"fused": True} if run.optimizer == "fused" else {"foreach": True}
        optimizer = torch.optim.AdamW(trainer_groups(model), lr=1e-5, **implementation)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 config=ds_config(run))
        self.vocab = MODELS[run.model]["vocab_size"]

    def step(self, phase) -> float:
        ids = torch.randint(0, self.vocab, (self.run.micro_batch_size, self.run.seq_len), device=self.device)
        with phase("forward"):
            loss = self.engine(input_ids=ids, labels=ids).loss
        with phase("backward"):
            self.engine.backward(loss)
        with phase("optimizer"):
            self.engine.step()
        return float(loss.detach())

    def states(self) -> dict:
        """What ZeRO holds: the 16-bit parameters (ZeRO-3: each one's partition, `ds_tensor`), the fp32 copies
        the torch optimizer steps on, and its moments."""
        from .measure import tensor_bytes

        zero = self.engine.optimizer
        params = [getattr(p, "ds_tensor", p) for p in self.engine.module.parameters()]
        fp32 = list(getattr(zero, "fp32_partitioned_groups_flat", None)
                    or getattr(zero, "single_partition_of_fp32_groups", []))
        inner = zero.optimizer
        moments = [t for s in inner.state.values() for name, t in s.items()
                   if torch.is_tensor(t) and not (name == "step" and t.device.type == "cpu")]
        return {"parameters": tensor_bytes(params), "fp32_partitions": tensor_bytes(fp32),
                "optimizer_states": tensor_bytes(moments), "fp32_partition_numels": [t.numel() for t in fp32],
                "zero_optimizer": type(zero).__name__, "torch_optimizer": type(inner).__name__,
                "parameter_count": sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())}


def traced(run: DeepSpeedRun, device: str) -> bool:
    """The allocator's history is recorded on CUDA except under ZeRO-3 with gradient checkpointing on torch
    2.11+: there the recorder's Python stacks lose the exception non-reentrant checkpointing raises to stop a
    recomputation early, inside ZeRO-3's LinearFunctionForZeroStage3.apply ("SystemError: <built-in method
    apply of FunctionMeta object> returned NULL without setting an exception", pytorch/pytorch#179536, a
    regression from 2.10; all three ZeRO-3 cases failed so on the H200 of 2026-11-27, torch 2.11.0+cu130).
    The phases' allocated and reserved peaks are read all the same; only `peak_blocks` is left out."""
    if device != "cuda":
        return False
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return not (run.zero_stage == 3 and version >= (2, 11))


def measure_deepspeed(run: DeepSpeedRun, device: str) -> dict:
    import deepspeed
    import torch.distributed as dist

    from .framework_step import measure_framework, one_rank_environment

    try:
        with one_rank_environment(launcher=True):
            measured = measure_framework(lambda dev: DeepSpeedStep(run, dev), device, trace=traced(run, device))
    finally:
        if dist.is_initialized():  # a later run in the same process (the CPU self-test) starts its own
            dist.destroy_process_group()
    return measured | {"deepspeed": deepspeed.__version__, "ds_config": ds_config(run)}


# Qwen's 1.8B full-parameter rows (tests/data/measured/published_finetune/qwen.json: ZeRO-3, one GPU, flat at
# 43.5 GB from 256 to 2048 tokens): the shortest and a long length; the fused optimizer beside the foreach one
# (the temporaries of torch's AdamW are one suspect); ZeRO-2 (the Q-LoRA rows' stage) for the buckets.
RUNS = (DeepSpeedRun("qwen-1.8b", 3, 256), DeepSpeedRun("qwen-1.8b", 3, 256, optimizer="fused"),
        DeepSpeedRun("qwen-1.8b", 3, 4096), DeepSpeedRun("qwen-1.8b", 2, 256))
TINY = DeepSpeedRun("tiny", 3, 16, 2)
