"""vLLM's FlashInfer all-reduce + RMSNorm fusion workspace: the bulk of non-torch memory under TP > 1.

From 0.17 vLLM's default compilation passes include AllReduceFusionPass whenever TP > 1, PP = 1 and DP = 1 on
sm90 or sm100 with FlashInfer installed, which the wheel requires (0.17.0 / 0.19.0 / 0.20.0 config/vllm.py
enable_allreduce_rms_fusion; METADATA flashinfer-python 0.6.4 / 0.6.6 / 0.6.8.post1; 0.15.0 leaves
fuse_allreduce_rms False at every level). The pass is built while the model compiles inside the profiling run,
after the worker's start-up snapshot, so its workspace is counted in the printed non_torch_memory.

Sizes (0.19.0 compilation/passes/fusion/allreduce_rms_fusion.py AllReduceFusionPass.__init__):
tokens T = min(max_size // (hidden x 2 B), max_num_batched_tokens), max_size from FI_ALLREDUCE_FUSION_MAX_SIZE_MB
by compute capability and TP. FlashInfer's TRT-LLM workspace (flashinfer/comm/trtllm_ar.py
trtllm_create_ipc_workspace_for_all_reduce_fusion) allocates three buffers per rank: tp x T x h x 2 B,
flags tp x 256 x 4 B and the Lamport buffer 3 x tp x T x h x 2 B, each through SymmDeviceMemory
(flashinfer/comm/mnnvl.py _get_allocation_prop): + a 2 KiB signal pad, rounded to the allocation granularity,
then, in FlashInfer 0.6.4 to 0.6.8, to cuMulticastGetGranularity(CU_MULTICAST_GRANULARITY_RECOMMENDED) though
this workspace binds no multicast object. FlashInfer 0.7.2 (vLLM 0.33) applies the multicast rounding only with
enable_multicast, which the TRT-LLM workspace passes as False.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.architecture import Architecture
from .vllm_versions import VllmRules

MiB = 1024**2
SIGNAL_PAD = 2048  # flashinfer/comm/mnnvl.py SIGNAL_PAD_SIZE
ALLOCATION_GRANULARITY = 2 * MiB  # cuMemGetAllocationGranularity(RECOMMENDED), device memory (H100/H200 driver)
# The recommended multicast granularity: the SymmDeviceMemory debug log in sglang PR #18341 maps each rank's
# buffer 512 MiB apart (uc_ptrs[i] = base + allocation_size x i: 0x5360000000, 0x5380000000) for buffers of 24,
# 2 and 68 MiB. Taken as the same on Blackwell (not measured there).
MULTICAST_GRANULARITY = 512 * MiB
FLAG_COUNT = 256  # flashinfer/comm/trtllm_ar.py BarrierFlagCount
# GPUs whose driver reports multicast support (NVSwitch baseboards); elsewhere SymmDeviceMemory refuses and
# vLLM disables the pass ("multicast" in the error, flashinfer_all_reduce.py _create_workspace).
CAPABILITY = {"h100-80": 90, "h800": 90, "h100-96-500w": 90, "h200": 90, "b200": 100, "gb200": 100, "b300": 103}
# FI_ALLREDUCE_FUSION_MAX_SIZE_MB (MiB by capability, then TP): 0.17.0 and 0.19.0; 0.19.0 adds sm103
# (is_device_capability_family(100) where 0.17.0 asks is_device_capability(100)); 0.33.0 takes 4 MiB at sm103 TP 8.
MAX_SIZE_MIB = {90: {2: 64, 4: 2, 8: 0.5}, 100: {2: 64, 4: 32, 8: 1}, 103: {2: 64, 4: 64, 8: 2}}
MAX_SIZE_MIB_0_33 = {**MAX_SIZE_MIB, 103: {2: 64, 4: 64, 8: 4}}


@dataclass(frozen=True)
class FusionWorkspace:
    bytes: int
    formula: str
    source: str
    tokens: int = 0  # max_token_num: sizes up to it run the fused kernel (config/vllm.py _set_compile_ranges)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _max_size(rules: VllmRules, capability: int, tp: int) -> int | None:
    if capability == 103 and rules.version < (0, 19):  # the 0.19 record: capability family 100
        return None
    table = MAX_SIZE_MIB_0_33 if rules.version >= (0, 33) else MAX_SIZE_MIB
    mib = table.get(capability, {}).get(tp)
    return None if mib is None else int(mib * MiB)


def fusion_workspace(rules: VllmRules, gpu_id: str, arch: Architecture, tp: int, pp: int,
                     max_num_batched_tokens: int) -> FusionWorkspace | None:
    """The workspace one rank allocates, or None where vLLM builds no AllReduceFusionPass."""
    capability = CAPABILITY.get(gpu_id)
    if rules.allreduce_fusion is None or capability is None or tp == 1 or pp > 1:
        return None
    max_size = _max_size(rules, capability, tp)
    if max_size is None:
        return None
    h = arch.hidden_size
    tokens = min(max_size // (h * 2), max_num_batched_tokens)
    sizes = (tp * tokens * h * 2, tp * FLAG_COUNT * 4, 3 * tp * tokens * h * 2)
    granularity = MULTICAST_GRANULARITY if rules.allreduce_fusion == "multicast" else ALLOCATION_GRANULARITY
    pre_round = ALLOCATION_GRANULARITY if rules.allreduce_fusion == "multicast" else 16  # trtllm_ar.py round_up
    allocated = sum(_round_up(_round_up(_round_up(s, pre_round) + SIGNAL_PAD, ALLOCATION_GRANULARITY), granularity)
                    for s in sizes)
    formula = (f"3 buffers (tp x T x h x 2, tp x 256 x 4, 3 x tp x T x h x 2 B; T = {tokens:,}) each rounded up "
               f"to {granularity // MiB} MiB")
    source = (f"vLLM {rules.label} AllReduceFusionPass + FlashInfer TRT-LLM workspace (SymmDeviceMemory rounds "
              f"to the {'recommended multicast' if rules.allreduce_fusion == 'multicast' else 'allocation'} "
              "granularity; estimator/serving/allreduce_fusion.py)")
    return FusionWorkspace(allocated, formula, source, tokens)
