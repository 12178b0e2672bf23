"""A real Megatron-Core 0.16.1 training step on one GPU (issue 22: real Megatron runs read 3-8% above our
estimate, and no real-GPU Megatron step had been measured).

What Megatron-LM's pretrain_gpt runs on one GPU without TransformerEngine or Apex (the GPU machine has
neither): a world of one rank (NCCL), parallel_state at TP 1, PP 1; `GPTModel` from the local layer spec
(`get_gpt_layer_local_spec`: torch.nn.RMSNorm through WrappedTorchNorm, Megatron's own unfused
DotProductAttention with its causal mask and torch softmax, ColumnParallel/RowParallelLinear), parameters
made on the GPU (use_cpu_initialization off) and wrapped in `Float16Module` (bf16) as Megatron-LM's
get_model does; Megatron's DDP with an fp32 gradient buffer (`grad_reduce_in_fp32`); the distributed
optimizer over the one rank (`get_megatron_optimizer`, which without TE/Apex falls back to
torch.optim.AdamW, foreach on CUDA: its temporaries show in the optimizer phase, where TE's or Apex's
FusedAdam makes none; fp32 main parameters). The TransformerConfig is the fake-tensor harness's
(validation/megatron/harness.py `transformer_config`: bias-SwiGLU fusion on, compiled by `jit_fuser` =
torch.compile, gradient-accumulation and RoPE fusions off, no dropout); the loss is pretrain_gpt's
loss_func (per-token losses x loss mask, summed, / tokens).
Phases of step 2: forward, backward, optimizer (finish_grad_sync, step, zero_grad_buffer). The allocator's
history is recorded and the blocks live at step 2's peak are kept (framework_step.peak_blocks), so what the
real step holds beyond the fake-tensor run of the same Setup can be named.

The configuration is that of the harness's Setup (dp 1, unfused attention, `layers` built), so
`python -m validation.megatron` can measure the same Setup under fake tensors; its contract configuration
is validation/megatron/cases.py `contract_config` (attention "eager").
On the CPU (the self-test) the same build and steps run over gloo inside the harness's CPU shims
(validation/megatron/shims.py: current_device -> cpu, the compiled fusions' stand-ins).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MegatronRun:
    arch: str  # validation/megatron/cases.py ARCHS
    layers: int  # transformer layers built
    seq_len: int
    micro_batch_size: int = 1
    recompute: str = "none"  # or "full" (uniform, every layer: --recompute-granularity full)

    def setup(self):
        from ..megatron.cases import ARCHS
        from ..megatron.harness import Setup

        arch = ARCHS[self.arch] if self.arch in ARCHS else tiny_arch()
        return Setup(arch, self.seq_len, self.micro_batch_size, tp=1, pp=1, dp=1, layers=self.layers,
                     attention="unfused", recompute=self.recompute, recompute_method="uniform",
                     recompute_num_layers=1)

    @property
    def id(self) -> str:
        from ..megatron.cases import ARCHS, case_id

        if self.arch not in ARCHS:
            return f"megatron-{self.arch}-s{self.seq_len}-b{self.micro_batch_size}"
        return f"megatron-{case_id(self.setup())}-{self.layers}layers"


def tiny_arch():
    """tiny-llama's shape (validation/hf/models.py) in Megatron's terms: the CPU self-test's model."""
    from ..megatron.harness import Arch

    return Arch(hidden_size=64, num_layers=2, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                ffn_hidden_size=160, vocab_size=1000)


@contextlib.contextmanager
def megatron_one_rank(device: str):
    """A world of one rank (NCCL on the GPU, gloo on the CPU) and parallel_state at TP 1, PP 1, ended on exit."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():  # a group an earlier step in this process left (validation/gpu/kernels.py does the same)
        dist.destroy_process_group()
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        if device == "cuda":
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(1234)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


class MegatronStep:
    """The built model, its DDP wrapper and optimizer, and one training step (framework_step's protocol)."""

    def __init__(self, run: MegatronRun, device: str):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.module import Float16Module

        from ..megatron.harness import transformer_config, wrap

        self.run, self.device = run, device
        setup = run.setup()
        # parameters made and initialised where they live (Megatron-LM's default); the CPU run keeps the
        # harness's CPU initialisation
        setup.extra.update(use_cpu_initialization=device != "cuda", perform_initialization=True)
        config = transformer_config(setup)
        a = setup.arch
        model = GPTModel(config, get_gpt_layer_local_spec(normalization=a.normalization), vocab_size=a.vocab_size,
                         max_sequence_length=max(a.max_position_embeddings, run.seq_len),
                         share_embeddings_and_output_weights=not a.untie_embeddings,
                         position_embedding_type=a.position_embedding)
        if device == "cuda":
            model.cuda(torch.cuda.current_device())
        self.model = Float16Module(config, model)
        self.ddp, self.optimizer = wrap(setup, self.model, config)

    def _batch(self):
        b, s, vocab = self.run.micro_batch_size, self.run.seq_len, self.model.module.vocab_size
        ids = torch.randint(0, vocab, (b, s), device=self.device)
        positions = torch.arange(s, device=self.device).unsqueeze(0).expand(b, s).contiguous()
        labels = torch.randint(0, vocab, (b, s), device=self.device)
        return ids, positions, labels, torch.ones(b, s, device=self.device)

    def step(self, phase) -> float:
        ids, positions, labels, mask = self._batch()
        with phase("forward"):
            losses = self.ddp(input_ids=ids, position_ids=positions, attention_mask=None, labels=labels)
            loss = torch.sum(losses.float().view(-1) * mask.view(-1)) / mask.sum()  # pretrain_gpt.loss_func
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            self.ddp.finish_grad_sync()
            self.optimizer.step()
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
        return float(loss.detach())

    def states(self) -> dict:
        from .measure import tensor_bytes

        params = list(self.ddp.module.parameters())
        grads = [buffer.grad_data for buffer in self.ddp.buffers + self.ddp.expert_parallel_buffers]
        mains, moments = [], []
        for sub in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            inner = sub.optimizer
            for group in inner.param_groups:
                for p in group["params"]:
                    mains.append(p)  # the fp32 main parameters
                    moments += [t for name, t in inner.state.get(p, {}).items()
                                if torch.is_tensor(t) and not (name == "step" and t.device.type == "cpu")]
        return {"parameters": tensor_bytes(params), "gradient_buffer": tensor_bytes(grads),
                "main_parameters": tensor_bytes(mains), "optimizer_states": tensor_bytes(moments),
                "parameter_count": sum(p.numel() for p in params)}


def measure_megatron(run: MegatronRun, device: str) -> dict:
    from .framework_step import measure_framework, one_rank_environment

    shims = contextlib.nullcontext()
    if device != "cuda":
        from ..megatron.shims import megatron_shims

        shims = megatron_shims()
    with shims, one_rank_environment(), nccl_log(device) as log, megatron_one_rank(device):
        measured = measure_framework(lambda dev: MegatronStep(run, dev), device, trace=device == "cuda")
    import megatron.core

    return measured | {"megatron_core": getattr(megatron.core, "__version__", None)} | log


@contextlib.contextmanager
def nccl_log(device: str):
    """On the GPU, NCCL's INIT and ALLOC log written to a file of this process's and summarised into the record
    on exit (framework_step.nccl_log_summary, `nccl`): how many communicators a world of one rank makes and what
    they allocate outside the caching allocator (issue 22; the H200 run of 2026-11-27: 4 communicators of 194
    allocations each, no NET buffer at one rank; tests/test_nccl_one_rank.py). Nothing on the CPU."""
    import os
    import tempfile

    out: dict = {}
    if device != "cuda":
        yield out
        return
    from .framework_step import environment, nccl_log_summary

    folder = tempfile.mkdtemp(prefix="nccl-log-")
    values = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ALLOC",
              "NCCL_DEBUG_FILE": os.path.join(folder, "nccl.%p.log")}
    try:
        with environment(values):
            yield out
    finally:
        try:  # a reading that fails leaves the record without it, never masks the step's own error
            text = "".join(open(os.path.join(folder, name), errors="replace").read()
                           for name in sorted(os.listdir(folder)))
            out["nccl"] = nccl_log_summary(text)
        except OSError as error:
            out["nccl"] = {"error": str(error)}


# Llama-3.1-8B's layers (validation/megatron/cases.py LLAMA31_8B), 4 of them, with its 128,256-token
# vocabulary: 1.92e9 parameters, 18 B each (bf16 parameter, fp32 gradient buffer, fp32 main parameter and
# two moments) = 34.6 GB of states; the unfused attention keeps 2 x 32 x 4096^2 x 2 B = 2 GiB of scores and
# probabilities a layer at 4096 tokens. Under 50 GB: an H100 holds each.
RUNS = (MegatronRun("llama-3.1-8b", 4, 4096), MegatronRun("llama-3.1-8b", 4, 4096, recompute="full"),
        MegatronRun("llama-3.1-8b", 4, 2048, 2))
TINY = MegatronRun("tiny-llama", 2, 16, 2)  # the CPU self-test (tests/test_gpu_harness.py)
