"""The profiling run's forward peak where the model, not the sampler, sets it (vLLM 0.19 on an H100), computed by
hand from each model's dims: T = 8,192 batched tokens, bf16 (2 B).

Compiled (the default): the attention's output buffer o (held by the split graph through the next piece), the
incoming residual and the o_proj output (2 x T x h), the MLP's gate-up output and SiLU-and-mul output (T x 3I),
the autotuner's L2 flush buffer (50 MiB on an H100) and the cuBLAS workspace (32 MiB on Hopper)
(serving/activations.py, serving/profile_buffers.py). The published logs (tests/test_serving_published.py) print
0.77 GiB for CodeLlama-7B and 1.05 GiB for Llama-3.1-8B's middle pipeline stages."""

from __future__ import annotations

from estimator.models.loading import architecture_from_model
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
T = 8192
CUBLAS_HOPPER = 4096 * 8 * 1024  # CublasHandlePool.cpp parseChosenWorkspaceSize, compute capability 9.x
L2_H100 = 50 * MiB  # the flush buffer: L2_cache_size // 4 int32
CODELLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32016, "max_position_embeddings": 16384,
             "rope_theta": 1000000, "torch_dtype": "bfloat16", "tie_word_embeddings": False, "rms_norm_eps": 1e-05}


def _codellama(version: str = "0.19.0", gpu: str = "h100-80", **serving):
    serving = Serving(engine_version=version, max_model_len=8192, gpu_memory_utilization=0.95, **serving)
    return estimate_vllm(architecture_from_model(CODELLAMA), serving, Parallel(), Hardware(gpu), CODELLAMA)


def test_compiled_dense_forward_holds_the_attention_output_the_flush_buffer_and_the_workspace():
    """CodeLlama-7B (h 4096, 32 heads of 128, I 11008): T x (o + 2h + 3I) x 2 B + 50 MiB + 32 MiB = 0.7715 GiB; its
    sampler (32,016-token vocabulary) is 0.52 GiB, so the forward sets the peak (0.77 GiB printed)."""
    h, o, inter = 4096, 32 * 128, 11008
    stage = _codellama().limiting
    assert stage.activation == T * (o + 2 * h + 3 * inter) * 2 + L2_H100 + CUBLAS_HOPPER == 828_375_040
    formula = {c.key: c for c in stage.components}["activation_peak"].formula
    assert "cuBLAS workspace 32 MiB" in formula and "L2 flush buffer 50 MiB" in formula


def test_eager_forward_has_no_compiled_pieces():
    """--enforce-eager (cuda_graphs off) turns torch.compile off too (config/vllm.py, 0.19.0): the eager live set
    2 x T x h + T x 3I, no attention buffer across a split, no autotuning; the cuBLAS workspace stays."""
    h, inter = 4096, 11008
    assert _codellama(cuda_graphs=False).limiting.activation == T * (2 * h + 3 * inter) * 2 + CUBLAS_HOPPER


def test_flush_buffer_is_keyed_on_0_19():
    """Before 0.19 (whose torch was not read) the compiled forward holds the attention's output but no flush
    buffer: 0.17.0 gives T x (o + 2h + 3I) x 2 B + 32 MiB."""
    h, o, inter = 4096, 32 * 128, 11008
    assert _codellama("0.17.0").limiting.activation == T * (o + 2 * h + 3 * inter) * 2 + CUBLAS_HOPPER


def test_gpu_without_a_known_l2_says_the_buffer_is_not_modelled():
    """B200's L2 size is not in the table: the peak leaves the buffer out and the formula says so; the
    workspace is the catalog's Blackwell one (32 MiB)."""
    h, o, inter = 4096, 32 * 128, 11008
    stage = _codellama(gpu="b200").limiting
    assert stage.activation == T * (o + 2 * h + 3 * inter) * 2 + CUBLAS_HOPPER
    assert "not modelled on this GPU" in {c.key: c for c in stage.components}["activation_peak"].formula


def test_middle_pipeline_stage_adds_its_receive_buffers():
    """Llama-3.1-8B under PP 4 (h 4096, 32 heads of 128, I 14336): a middle stage keeps the received hidden states
    and residual (2 x T x h) beside the compiled forward: 1.0488 GiB (1.05 GiB printed for stages 1 and 2)."""
    h, o, inter = 4096, 32 * 128, 14336
    e = estimate_vllm(get_architecture("llama-3.1-8b"),
                      Serving(engine_version="0.19.0", max_model_len=8192, gpu_memory_utilization=0.95),
                      Parallel(pp=4), Hardware("h100-80"), get_hf_config("llama-3.1-8b"))
    middle = T * (o + 2 * h + 3 * inter) * 2 + 2 * T * h * 2 + L2_H100 + CUBLAS_HOPPER
    assert e.stages[1].activation == e.stages[2].activation == middle == 1_126_170_624


def test_the_component_shows_the_buffers_as_parts():
    """The activation component's parts: the model's tensors, the cuBLAS workspace, and the flush buffer only where
    the compiled MLP sets the peak (CodeLlama-7B); Llama-3.1-8B's sampler sets its peak, so no flush buffer there."""
    h, o, inter = 4096, 32 * 128, 11008
    parts = {c.key: c for c in _codellama().limiting.components}["activation_peak"].parts
    assert [p.bytes for p in parts] == [T * (o + 2 * h + 3 * inter) * 2, CUBLAS_HOPPER, L2_H100]
    llama = estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version="0.19.0", max_model_len=8192),
                          Parallel(), Hardware("h100-80"), get_hf_config("llama-3.1-8b")).limiting
    sampler = 1024 * 128256 * 14 + 132 * 128256 * 4 + (T + 2 * 1024) * h * 2  # 0.19's Triton sampler rule
    parts = {c.key: c for c in llama.components}["activation_peak"].parts
    assert [p.bytes for p in parts] == [sampler, CUBLAS_HOPPER]
