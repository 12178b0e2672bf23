"""What differs between the torchtitan releases the estimator offers (training.framework_version under
fsdp2; spec/versions.py names each release's tag and commit).

Each rule names the commit that introduced or ended it. The releases before 0.3.0 are those of
torchtitan's published benchmarks (tests/data/measured/published/torchtitan): "2024-12" is main at
9dec370 (2024-12-26; assets/version.txt still read 0.0.2, unchanged since April 2024), "0.1.0" the
v0.1.0 tag (f7084fc7; the Trainy run's e7c0cae, six days earlier, has the same rules), "0.2.0" the
v0.2.0 tag (29624e37; torchao's B200 run at 6fc499f6 has its rules).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.training import Training
from ..spec.versions import release


@dataclass(frozen=True)
class TitanRules:
    # compile compiles the loss with the model by default: 9dec370's train.py leaves it commented out
    # (e8977b00 "turning off compile on loss function", 2024-12-18); bbb1b616 (2025-04-02, #1033,
    # components/loss.py build_cross_entropy_loss) compiles it whenever training.compile is on
    loss_compiled: bool
    # the loss can stay eager under compile: compile.components without "loss" (08b8b24f, 2025-08-20,
    # #1608 "support compile model and loss separately"; v0.2.0 components/loss.py)
    loss_compile_optional: bool
    # the root FSDP unit holds tok_embeddings, norm and output, gathered from the start of forward to
    # the end of backward (FSDP2 keeps the root's parameters after forward): 9dec370 parallelize_llama.py
    # apply_fsdp `fully_shard(model, ...)` over the blocks' units; 83e69410 (2025-07-28, #1094) gave the
    # embedding and [norm, output] units of their own
    root_unit_has_embedding_and_head: bool
    # TP's cross-entropy runs under torch's loss_parallel() (train.py get_train_context), whose DTensor
    # handlers make the log-softmax op by op (torch/distributed/tensor/parallel/loss.py `_log_softmax`,
    # `_nll_loss_and_log_softmax_backward`); 0.3.0's components/loss.py replaced it
    tp_loss_parallel_dtensor: bool
    # which pipeline stages keep every micro-batch's output to the step's end (torch pipelining's
    # output_chunks, memory/pp_buffers.py): "every stage" before pytorch#153383 (merged 2025-05-13), "last stage"
    # from it (v0.1.0, 2025-06-17); None: not modelled (later torch made it optional, pytorch#159251, and
    # which releases turn it off was not read)
    pp_kept_outputs: str | None = None
    # the stage input's gradient stays on each activation receive buffer (.grad) until the next step's
    # clear_runtime_states (memory/pp_receive.py): torch 2.6.0, 2.8.0 and 2.9.0 _backward.py
    # stage_backward; pytorch#164329 (first in torch 2.10.0, _backward.py 376) sets it to None once read. The
    # torch each release ran: 9dec370 the nightly of Dec 2024 (2.6), v0.1.0 (2025-06-17) the 2.8 nightlies,
    # v0.2.0 (2025-10-17) 2.9; 0.3.0 and main validate against torch 2.14.0 (assets/release_versions.json,
    # 053a7830, 2026-08-18)
    pp_recv_grads_kept: bool = False
    # RoPE: "per model": one freqs_cis buffer per model chunk, [seq_len, d/2] complex64 (9dec370
    # models/llama/model.py Transformer._precompute_freqs_cis over max_seq_len = training.seq_len, train.py;
    # v0.1.0 and v0.2.0 models/llama3/model/model.py register_buffer("freqs_cis")); "per layer": a RoPE module
    # per attention layer (models/common/rope.py, 9810191b, 2026-02-23)
    rope: str = "per layer"
    # under CP, torch's context_parallel clones every buffer it restores after the step (torch 2.6 and 2.13
    # tensor/experimental context_parallel: original_buffers = b.clone()): "model": 9dec370's train.py hands it
    # the whole model's freqs_cis, on the GPU without PP and on the meta device with it (only the stages are
    # materialised); "chunks": v0.1.0's and v0.2.0's train.py hand it every model part's; None: not modelled
    cp_rope_clone: str | None = None
    # context parallelism's attention: "sdpa ring": torch's context_parallel ring attention over SDPA (9dec370,
    # memory/cp_ring.py); "flex all-gather": K/V all-gathered for flex attention (v0.3.0, activations/attention.py;
    # 0.1.0 and 0.2.0 keep the rule they had, their CP was not read)
    cp_attention: str = "flex all-gather"
    # torch's AdamW runs its foreach implementation (sqrt of the second moment materialised for the whole
    # parameter group, memory/transients.py): 9dec370's config_manager.py `--optimizer.fused` (store_true, off)
    # and optimizer.py `"fused": fused, "foreach": not fused`; 6e498855 (#881, 2025-02-24) made fused the default
    adamw_foreach: bool = False


RULES: dict[str, TitanRules] = {
    "2024-12": TitanRules(loss_compiled=False, loss_compile_optional=False, root_unit_has_embedding_and_head=True,
                          tp_loss_parallel_dtensor=True, pp_kept_outputs="every stage", rope="per model",
                          pp_recv_grads_kept=True, cp_rope_clone="model", cp_attention="sdpa ring", adamw_foreach=True),
    "0.1.0": TitanRules(loss_compiled=True, loss_compile_optional=False, root_unit_has_embedding_and_head=True,
                        tp_loss_parallel_dtensor=True, pp_kept_outputs="last stage", rope="per model",
                        pp_recv_grads_kept=True, cp_rope_clone="chunks"),
    "0.2.0": TitanRules(loss_compiled=True, loss_compile_optional=True, root_unit_has_embedding_and_head=False,
                        tp_loss_parallel_dtensor=True, rope="per model", cp_rope_clone="chunks",
                        pp_recv_grads_kept=True),
    "0.3.0": TitanRules(loss_compiled=True, loss_compile_optional=True, root_unit_has_embedding_and_head=False,
                        tp_loss_parallel_dtensor=False),
    "main": TitanRules(loss_compiled=True, loss_compile_optional=True, root_unit_has_embedding_and_head=False,
                       tp_loss_parallel_dtensor=False),
}

SOURCES = {
    "loss_compiled": "torchtitan 9dec370 train.py (loss compile commented out by e8977b00, 2024-12-18); bbb1b616 "
                     "(#1033, 2025-04-02) components/loss.py build_cross_entropy_loss compiles it with the model",
    "loss_compile_optional": "torchtitan 08b8b24f (#1608, 2025-08-20) compile.components; v0.2.0 components/loss.py",
    "root_unit": "torchtitan 9dec370 parallelisms/parallelize_llama.py and v0.1.0 models/llama3/infra/parallelize.py "
                 "apply_fsdp (the root unit holds tok_embeddings, norm and output; FSDP2 keeps a root's parameters "
                 "gathered after forward); split by 83e69410 (#1094, 2025-07-28)",
    "loss_parallel": "torch 2.13 torch/distributed/tensor/parallel/loss.py _log_softmax and "
                     "_nll_loss_and_log_softmax_backward (unchanged since torch 2.3), under torchtitan train.py "
                     "get_train_context(loss_parallel) at 9dec370, v0.1.0 and v0.2.0",
    "rope": "torchtitan 9dec370 models/llama/model.py (Transformer.freqs_cis, max_seq_len positions) and train.py "
            "(max_seq_len = training.seq_len; cp_buffers [input_ids, labels, model.freqs_cis]); v0.1.0 and v0.2.0 "
            "models/llama3/model/model.py and train.py (cp_buffers: every model part's freqs_cis); torch 2.6.0 and "
            "2.13 tensor/experimental context_parallel (original_buffers = b.clone() of each buffer it restores)",
    "adamw_foreach": "torchtitan 9dec370 config_manager.py (--optimizer.fused, store_true) and optimizer.py "
                     "build_optimizers (foreach = not fused); 6e498855 (#881, 2025-02-24) 'use Fused AdamW as default'",
    "pp_recv_grads_kept": "torch 2.6.0, 2.8.0, 2.9.0 distributed/pipelining/_backward.py stage_backward (the receive "
                          "buffers' .grad kept until clear_runtime_states); pytorch#164329, torch 2.10.0 _backward.py "
                          "376 (set to None once read)",
    "pp_kept_outputs": "torch distributed/pipelining/stage.py forward_one_chunk output_chunks; pytorch#138504 "
                       "(2024-10-21), pytorch#153383 (merged 2025-05-13: the last stage's only), pytorch#159251",
}


def titan_rules(training: Training) -> TitanRules | None:
    """The rules of the torchtitan release a fsdp2 setup names (its default when none), else None."""
    if training.framework != "fsdp2":
        return None
    return RULES[release("fsdp2", training.framework_version).version]
