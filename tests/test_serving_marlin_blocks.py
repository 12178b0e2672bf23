"""gpt-oss's MXFP4 experts on vLLM 0.11's Marlin path, in the caching allocator's blocks
(estimator/serving/marlin_blocks.py): the load replayed against what vLLM printed for it."""

from __future__ import annotations

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

GiB = 2**30


def weights(version: str, gpu: str = "h100-80"):
    e = estimate_vllm(get_architecture("gpt-oss-120b"), Serving(engine_version=version, max_model_len=8192),
                      Parallel(), Hardware(gpu), get_hf_config("gpt-oss-120b"))
    return e.limiting.components[0]


def test_the_replayed_load_is_the_printed_one():
    """vllm#23278 (vLLM 0.10.1, one H100, 'Weight-only FP4 compression will be used leveraging the Marlin
    kernel'): 'Model loading took 65.9651 GiB'. The padded tensors alone are 65.9285 GiB (0.19's Marlin on an
    A100, not replayed: the same padding); the replay adds the blocks: 1 MiB on each 69 MiB w13 scale
    (128 x 5,888 x 96 B in a 70 MiB segment, the 1 MiB rest not split) and the rest of the small blocks."""
    replayed = weights("0.11")
    tensors = weights("0.19", "a100-80")
    assert round(replayed.bytes / GiB, 4) == 65.9651
    assert round(tensors.bytes / GiB, 4) == 65.9285
    assert 35 * 2**20 < replayed.bytes - tensors.bytes < 38 * 2**20
    assert "Marlin's repack replayed" in replayed.formula_text
    assert "replayed" not in tensors.formula_text


def test_the_workspace_follows_the_sm_count():
    """marlin_make_workspace_new: SMs x 4 int32 a MoE layer: 132 x 16 B -> a 2,560 B block on an H100 and
    108 x 16 B -> 2,048 B on an A100, 36 layers; everything else is the same on both."""
    assert weights("0.11").bytes - weights("0.11", "a100-80").bytes == 36 * (2560 - 2048)
