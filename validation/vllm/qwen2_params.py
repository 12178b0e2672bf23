"""Record the parameters and buffers vLLM's parallel layers build for one Qwen2 decoder layer, the embedding
and the LM head, per TP rank, on CPU (meta tensors).

Run inside a venv holding vLLM (see kv_records.py):

    /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.qwen2_params --out tests/data/serving/vllm-0.11.0-qwen2-weights.json

The layers are the ones models/qwen2.py builds, in its construction order: VocabParallelEmbedding,
QKVParallelLinear (with bias), RowParallelLinear (o_proj), get_rope (the cos/sin cache; default RoPE,
max_position = the checkpoint's max_position_embeddings), MergedColumnParallelLinear (gate_up_proj),
RowParallelLinear (down_proj), RMSNorm, ParallelLMHead; bf16 as the model dtype. The TP group is a stand-in
of the given world size (rank 0; every rank holds the same shapes), the rest as in weight_records.py. The
record is each tensor's shape, dtype and bytes, which tests/test_serving_weight_blocks.py holds our
per-rank allocation requests (serving/weight_blocks.py) to.
"""

from __future__ import annotations

import argparse
import sys
import types

from validation.core.record import write_json
from validation.vllm.weight_records import _pretend_hopper, _stand_ins

# Qwen2.5-7B-Instruct and Qwen2.5-72B-Instruct (config.json: max_position_embeddings 32768)
MODELS = {"qwen2.5-7b": dict(hidden=3584, heads=28, kv_heads=4, intermediate=18944, vocab=152064, positions=32768),
          "qwen2.5-72b": dict(hidden=8192, heads=64, kv_heads=8, intermediate=29568, vocab=152064, positions=32768)}
TP = {"qwen2.5-7b": (1, 2, 4), "qwen2.5-72b": (1, 2, 4, 8)}  # vLLM asserts heads % TP == 0: 28 heads stop at 4


def _tp_group(tp: int) -> None:
    import vllm.distributed.parallel_state as parallel_state
    import vllm.model_executor.parameter as parameter
    parallel_state._TP = types.SimpleNamespace(world_size=tp, rank_in_group=0, rank=0)
    parameter.get_tensor_model_parallel_world_size = lambda: tp


def build(m: dict) -> list[dict]:
    import torch
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    h, head_dim = m["hidden"], m["hidden"] // m["heads"]
    makers = [
        ("embed_tokens", lambda: VocabParallelEmbedding(m["vocab"], h)),
        ("qkv_proj", lambda: QKVParallelLinear(h, head_dim, m["heads"], m["kv_heads"], bias=True)),
        ("o_proj", lambda: RowParallelLinear(m["heads"] * head_dim, h, bias=False)),
        ("rotary_emb", lambda: get_rope(head_dim, rotary_dim=head_dim, max_position=m["positions"], base=1e6)),
        ("gate_up_proj", lambda: MergedColumnParallelLinear(h, [m["intermediate"]] * 2, bias=False)),
        ("down_proj", lambda: RowParallelLinear(m["intermediate"], h, bias=False)),
        ("input_layernorm", lambda: RMSNorm(h)),
        ("lm_head", lambda: ParallelLMHead(m["vocab"], h)),
    ]
    tensors = []
    with torch.device("meta"):
        for module, make in makers:
            layer = make()
            for name, t in list(layer.named_parameters()) + list(layer.named_buffers()):
                tensors.append({"module": module, "name": name, "shape": list(t.shape),
                                "dtype": str(t.dtype).replace("torch.", ""), "bytes": t.numel() * t.element_size()})
    return tensors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch
    import vllm
    _pretend_hopper()
    import vllm.model_executor.layers.linear  # noqa: F401  (imported before the stand-ins patch its config lookups)
    import vllm.model_executor.layers.rotary_embedding  # noqa: F401
    import vllm.model_executor.layers.vocab_parallel_embedding  # noqa: F401
    _stand_ins()
    torch.set_default_dtype(torch.bfloat16)
    records = []
    for model, shape in MODELS.items():
        for tp in TP[model]:
            _tp_group(tp)
            records.append({"model": model, "tp": tp, **shape, "tensors": build(shape)})
    command = f"{sys.executable} -m validation.vllm.qwen2_params --out {args.out}  (vllm=={vllm.__version__}; CPU)"
    write_json(args.out, {"command": command, "vllm_version": vllm.__version__, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
