"""Offload: which model states leave the GPU for host memory or NVMe, and what they cost there.

Each framework offloads differently (sources in OFFLOAD_SOURCES):

- deepspeed, ``offload_optimizer`` (ZeRO-Offload, Ren et al. 2021, section 4): the fp32 master
  partition, the optimizer states and the fp32 gradient partition live in pinned host memory and
  the step runs there (DeepSpeedCPUAdam, in place). The GPU keeps the 16-bit parameters and the
  reduction buckets; under ZeRO 2/3 the reduced gradient partitions are copied to the host as
  they are produced, so no gradient partition stays on the GPU (under ZeRO 1 the GPU keeps its
  full gradients until the reduction). With ``nvme`` (ZeRO-Infinity, stage 3) the same states sit
  on NVMe and the host keeps ``buffer_count`` (4) pinned fp32 swap buffers of the largest
  sub-group (``sub_group_size`` 1e9 elements). DeepSpeed's own buffers beside these (ZeRO-3's flat
  gradient partitions, ZeRO-1/2's 16-bit partition copy and staging buffers): deepspeed_offload.py.
- deepspeed, ``offload_parameters`` (stage 3): the 16-bit parameter partition lives on the host
  (or NVMe, through 5 pinned buffers of 1e8 elements); the GPU keeps only what is gathered to run.
- fsdp2 (``CPUOffloadPolicy``): the sharded fp32 parameters and their gradients live in pinned
  host memory and the optimizer steps there, so parameters, gradients and optimizer states leave
  together; the GPU keeps the units gathered in flight.
- megatron (``--optimizer-cpu-offload --optimizer-offload-fraction 1.0``, the distributed
  optimizer's HybridDeviceOptimizer): fp32 master weights and optimizer states, with fp32 copies
  of the gradients for the step, live on the host; the main-gradient buffer stays on the GPU.
"""

from __future__ import annotations

from typing import NamedTuple

from .components import Component, component
from ..spec.dtypes import bytes_per_element
from ..spec.choices import FSDP_FRAMEWORKS
from ..spec.training import Recipe, Training

OFFLOAD_SOURCES = {
    "deepspeed": ("Ren et al. 2021 (ZeRO-Offload), section 4; Rajbhandari et al. 2021 (ZeRO-Infinity); DeepSpeed "
                  "runtime/zero/offload_config.py (buffer_count 4 / 5, buffer_size 1e8) and "
                  "estimate_zero3_model_states_mem_needs (host: 16 B per parameter with optimizer offload, 18 with "
                  "parameter offload, times a 1.5 safety factor)"),
    "fsdp2": "PyTorch fully_shard CPUOffloadPolicy(pin_memory=True): sharded parameters and gradients on the host, "
             "the optimizer steps on the CPU",
    "torchtune": "torchtune fsdp_cpu_offload: PyTorch fully_shard CPUOffloadPolicy (sharded parameters and gradients on "
                 "the host, the optimizer steps on the CPU)",
    "hf_fsdp2": "accelerate 1.15.0 fsdp_offload_params: PyTorch fully_shard CPUOffloadPolicy (sharded parameters and "
                "gradients on the host, the optimizer steps on the CPU)",
    "megatron": "Megatron-Core OptimizerConfig.optimizer_cpu_offload / optimizer_offload_fraction "
                "(cpu_offloading/hybrid_optimizer.py HybridDeviceOptimizer)",
}
SWAP_BUFFERS_OPTIMIZER = 4  # DeepSpeedZeroOffloadOptimizerConfig.buffer_count
SUB_GROUP = 1e9  # DeepSpeed ZeRO-3 sub_group_size
SWAP_BUFFERS_PARAMETERS, PARAMETER_BUFFER = 5, 1e8  # DeepSpeedZeroOffloadParamConfig buffer_count, buffer_size


class Placement(NamedTuple):
    """Where one stage's model states live."""

    gpu: dict[str, float]  # bytes each model state keeps on the GPU (parameters, gradients, ...)
    moved: dict[str, str]  # state -> where it went, for the formula shown on the GPU side
    host: tuple[Component, ...]  # host (CPU) memory of this GPU's process
    nvme: tuple[Component, ...]  # bytes on NVMe for this GPU's process
    step_on_host: bool  # the optimizer step (and its temporaries) runs on the CPU


def offloads(training: Training) -> bool:
    return training.offload_optimizer != "none" or training.offload_parameters != "none"


def placement(training: Training, recipe: Recipe, states: dict[str, float], params_on_gpu: float,
              zero: int) -> Placement:
    """`states`: the stage's model states on one GPU without offload (parameters, master_weights,
    optimizer_states, gradients); `params_on_gpu`: its parameters on one GPU after ZeRO sharding of
    the optimizer (the partition the optimizer steps)."""
    gpu = dict(states)
    if not offloads(training):
        return Placement(gpu, {}, (), (), False)
    fw, where_opt, where_par = training.framework, training.offload_optimizer, training.offload_parameters
    src = OFFLOAD_SOURCES[fw]
    host: list[Component] = []
    nvme: list[Component] = []
    moved: dict[str, str] = {}
    n = params_on_gpu

    def move(key: str, label: str, nbytes: float, formula: str, where: str) -> None:
        (nvme if where == "nvme" else host).append(component(key, label, nbytes, formula, src))

    if where_opt != "none":
        for key, label in (("master_weights", "fp32 master weights"), ("optimizer_states", "Optimizer states")):
            if gpu[key]:
                move(key, label, gpu[key], f"{gpu[key] / max(n, 1):.4g} B x {n:,.0f} parameters of this GPU's "
                     "partition", where_opt)
                gpu[key], moved[key] = 0.0, where_opt
        if fw in ("deepspeed", "megatron", *FSDP_FRAMEWORKS):
            # the step reads fp32 gradients on the host: a host copy of the reduced partition (DeepSpeed ZeRO-1 too:
            # stage_1_and_2.py initialize_optimizer_states gives the fp32 partition its grad on the host)
            move("gradients", "fp32 gradient partition", 4 * n, f"4 B x {n:,.0f} parameters", where_opt)
            if fw != "megatron" and (fw != "deepspeed" or zero >= 2):  # Megatron keeps its main-gradient buffer
                # on the GPU, ZeRO-1 its whole gradients until the reduction
                gpu["gradients"], moved["gradients"] = 0.0, where_opt
        if where_opt == "nvme":
            buffers = SWAP_BUFFERS_OPTIMIZER * min(SUB_GROUP, n) * 4
            host.append(component("swap_buffers", "Pinned NVMe swap buffers (optimizer)", buffers,
                                  f"{SWAP_BUFFERS_OPTIMIZER} x 4 B x min(sub_group_size 1e9, partition)", src))
    if where_par != "none":
        move("parameters", "Parameters", gpu["parameters"], "the GPU's parameter partition", where_par)
        gpu["parameters"], moved["parameters"] = 0.0, where_par
        if where_par == "nvme":
            P = bytes_per_element(recipe.param_dtype)
            host.append(component("swap_buffers", "Pinned NVMe swap buffers (parameters)",
                                  SWAP_BUFFERS_PARAMETERS * PARAMETER_BUFFER * P,
                                  f"{SWAP_BUFFERS_PARAMETERS} x buffer_size 1e8 x {P:g} B", src))
    return Placement(gpu, moved, tuple(host), tuple(nvme), where_opt != "none")
