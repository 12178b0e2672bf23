"""Memory outside the profiled tensors: non-torch memory and CUDA graphs (vLLM V1; modelled).

Non-torch memory, as vLLM counts it, is the growth of (device used - torch reserved) from the worker's
start-up snapshot to the end of the profiling run (utils memory_profiling ``non_torch_increase``). The
snapshot is taken after the CUDA context and vLLM's own NCCL communicators exist (gpu_worker.py init_device:
"Initialize the distributed environment BEFORE taking memory snapshot"), so those sit outside the budget;
what grows inside it is cuBLAS handles, lazily loaded kernels and, from 0.18, what the CUDA-graph memory
profile leaves behind (vLLM 0.19.0 gpu_worker.py runs profile_cudagraph_memory() inside memory_profiling).
No formula exists for that part: it is a constant per release and layout, read from public start-up logs
(serving/vllm_versions.py VllmRules.non_torch_single / non_torch_distributed). Under TP > 1 from 0.17
FlashInfer's all-reduce fusion workspace joins it (serving/allreduce_fusion.py) and, from 0.19 to 0.26, the NCCL
communicator torch builds for the TP group while that workspace's handles are exchanged (serving/nccl_comm.py).

CUDA graphs: serving/cuda_graphs.py (the shared pool and the graph executables' driver memory, graph_nodes.py and
graph_driver.py; from 0.20 vLLM's own estimate, taken from the budget before the KV cache is sized:
gpu_worker.py determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1).
"""

from __future__ import annotations

from .vllm_versions import VllmRules

MiB = 1024**2
_LOGS = {"0.11": "0.16 GiB at TP 1 (vLLM PR #12126), 0.20 GiB a worker of 4 GPUs (vLLM PR #14447)",
         "0.15": "0.13 GiB at TP 1 (Qwen3-14B under 0.15.0 / 0.16.0, llm-d-planner PR #205); distributed: 0.20 GiB "
                 "(vLLM PR #14447)",
         "0.17": "0.13 GiB at TP 1 (Qwen3-14B under 0.17.0, llm-d-planner PR #205); distributed: 0.20 GiB "
                 "(vLLM PR #14447)",
         "0.18": "0.25 GiB at TP 1 (Qwen3-14B under 0.18.0, llm-d-planner PR #205; the CUDA-graph memory profile "
                 "now runs inside memory_profiling); distributed: 0.20 GiB (vLLM PR #14447)",
         "0.19": "0.25 GiB at TP 1 (0.19.0 sweep of llm-d-planner PR #205: 0.24-0.26 GiB in 38 of its 42 TP-1 runs, "
                 "0.27 for Qwen3-30B-A3B, 0.46 for three Granite-3 models), 0.07 GiB "
                 "a worker of a multi-GPU run (its PP 2 and PP 4 runs, every stage)",
         "0.20": "none of this release; 0.18 / 0.19's 0.25 GiB at TP 1 (the CUDA-graph profile still inside "
                 "memory_profiling, 0.20.0 gpu_worker.py) and 0.19's 0.07 GiB a worker of a multi-GPU run (the TP "
                 "group's NCCL communicator and the fusion workspace modelled apart, as in 0.19)",
         "0.21": "none of this release; 0.18 / 0.19's 0.25 GiB at TP 1 (the CUDA-graph profile still inside "
                 "memory_profiling, 0.21.0 and 0.25.0 gpu_worker.py) and 0.19's 0.07 GiB a worker of a multi-GPU run "
                 "(the TP group's NCCL communicator and the fusion workspace modelled apart, as in 0.19)",
         "0.25": "none of this release; as 0.21's record (0.25.0 gpu_worker.py still profiles the CUDA graphs inside "
                 "memory_profiling): 0.25 GiB at TP 1 (0.18 / 0.19), 0.07 GiB a worker of a multi-GPU run (0.19)",
         "0.33": "none of this release; 0.15-0.17's 0.13 GiB at TP 1 (0.33.0 gpu_worker.py profiles the CUDA graphs "
                 "after memory_profiling, as before 0.18), 0.20 GiB distributed (vLLM PR #14447)"}


def non_torch_base(rules: VllmRules, tp: int, pp: int) -> tuple[int, str]:
    """The measured constant for this release and layout, and where it was read."""
    single = tp * pp == 1
    value = rules.non_torch_single if single else rules.non_torch_distributed
    cited = _LOGS[rules.label]
    return value, ("growth of device memory outside torch from vLLM's start-up snapshot to the end of profiling "
                   f"(utils memory_profiling); vLLM {rules.label} start-up logs: {cited}")

