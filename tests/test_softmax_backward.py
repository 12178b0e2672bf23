"""CUDA's softmax-backward temporary (PyTorch SoftMax.cu softmax_backward_cuda_out: `tmp = grad * output`) in the
estimate, where attention runs torch's softmax on the scores: beside a recomputed layer of transformers' eager
attention, and in Megatron-Core's unfused softmax's backward moment (estimator/memory/softmax_backward.py), each
checked by hand and against the harness record that shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from validation.core.report import tensors_peak

MEASURED = Path(__file__).parent / "data" / "measured"
TEMPORARY = "CUDA softmax backward's temporary (tmp = grad * output)"


def load(name: str) -> dict:
    return json.loads((MEASURED / name).read_text())


def backward_parts(stage) -> dict[str, int]:
    """label -> bytes of every component and part of the stage's backward phase."""
    phase = next(p for p in stage.phases if p.name == "backward")
    out: dict[str, int] = {}
    todo = list(phase.components)
    while todo:
        c = todo.pop()
        out[c.label] = c.bytes
        todo += list(c.parts)
    return out


def test_hf_eager_recomputed_layer_holds_the_temporary():
    """Llama-3.1-8B, eager attention, every layer recomputed, s = 2048, b = 1: transformers' eager attention
    softmaxes in fp32, so the recomputed layer's softmax backward makes 4 B x b x a x s^2 = 4 x 32 x 2048^2 =
    536,870,912 bytes more. The harness record grew by exactly that when it counted the temporary. The first
    layer's recomputation at backward's end holds that layer's whole softmax backward (the fp32 gradients of the
    probabilities and the scores beside the temporary, less what the layer's backward has freed by then: as the
    PEFT record peft/llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager shows), and the estimate's backward
    phase comes to within 0.2% of the record (0.63% under with the temporary alone beside the layer's ledger,
    1.45% under without it)."""
    record = load("llama-3.1-8b-bf16-adamw-recompute-eager-s2048-b1.json")
    stage = estimate_config(record["config"]).stages[0]
    parts = backward_parts(stage)
    assert parts[TEMPORARY] == 4 * 32 * 2048**2 == 536_870_912
    # the residual stream's and the expanded v's gradients (16-bit, s*h and s*a*d_head: 2 x 2 x 2048 x 4096)
    assert parts["Gradients alive at the moment (residual stream, expanded v)"] == 2 * 2 * 2048 * 4096
    backward = next(p.allocated_bytes for p in stage.phases if p.name == "backward")
    measured = record["measured"]["phases"]["backward"]["total"]
    assert backward == pytest.approx(measured, rel=0.002)
    assert (backward - 536_870_912) / measured - 1 < -0.006  # the temporary is still most of the gap


def test_no_temporary_without_a_torch_softmax_on_the_scores():
    """Flash attention runs no torch softmax on the scores; without recompute at 2,048 tokens the HF eager
    backward peaks at the loss, where no layer's softmax backward runs (the last layer's softmax moment is
    smaller: test_hf_eager_last_layer_softmax_moment); torchtune is left out (the same run with recompute under
    HF holds it)."""
    for name in ("llama-3.1-8b-bf16-adamw-norecompute-eager-s2048-b1.json",):
        config = load(name)["config"]
        assert TEMPORARY not in backward_parts(estimate_config(config).stages[0])
        flash = dict(config, training=dict(config["training"], attention="flash", recompute="full"))
        assert TEMPORARY not in backward_parts(estimate_config(flash).stages[0])
        # torchtune's layers attend through SDPA: its eager ledger is transformers', the temporary unmeasured there
        tune = dict(config, training=dict(config["training"], framework="torchtune", recompute="full"))
        assert TEMPORARY not in backward_parts(estimate_config(tune).stages[0])
        hf = dict(config, training=dict(config["training"], recompute="full"))
        assert backward_parts(estimate_config(hf).stages[0])[TEMPORARY] == 4 * 32 * 2048**2


def test_megatron_unfused_softmax_backward_moment():
    """GPT-3 175B's first stage at TP 8, PP 8, s = 2048, b = 1, no recompute, fused softmax off: Megatron's
    FusedScaleMaskSoftmax runs torch's softmax in fp32 over 96/8 = 12 heads' scores (Sa = 12 x 2048^2 =
    50,331,648 elements per GPU). The last layer's softmax backward holds the fp32 gradient of the
    probabilities, CUDA's tmp and the fp32 gradient of the scores (3 x 4 B x Sa) less the bf16 probabilities
    scores x V kept (2 B x Sa): 10 x 50,331,648 = 503,316,480 bytes, less the layer's tensors freed by their
    backward by then (softmax_backward.py _layer_parts): v, the attention output, the MLP norm's input
    and fc1's (each 2 B x 2048 x 12288 / 8 = 6,291,456 under sequence parallelism or TP) and fc1's output and
    GeLU's (2 B x 2048 x 49152 / 8 each), plus two hidden-sized gradients alive then: 440,401,920 bytes beside
    every kept activation. The re-measured harness record peaks there: 446,691,840 bytes over the activations
    at backward's start (6.3 MB more; 56.6 MB fewer before the freed tensors were taken out), and the estimate
    is within 1% of its peak."""
    record = load("megatron/gpt3-175b-tp8-pp8-first-s2048-b1-unfused.json")
    result = estimate_config(record["config"])
    stage = result.stages[record.get("stage", result.peak_stage)]
    parts = backward_parts(stage)
    Sa = 96 // 8 * 2048**2
    assert parts[TEMPORARY] == 4 * Sa == 201_326_592
    assert parts["fp32 gradient of the probabilities (the cast's backward)"] == 4 * Sa
    assert parts["fp32 gradient of the scores (the softmax's backward output)"] == 4 * Sa
    assert parts["The 16-bit tensor scores x V kept, freed by its backward"] == -2 * Sa
    transient = next(c for p in stage.phases if p.name == "backward" for c in p.components if c.key == "transient")
    hidden, mlp = 2 * 2048 * 12288 // 8, 2 * 2048 * 49152 // 8
    assert parts["The layer's MLP (dense), attention output and v, freed by their backward"] == \
        -(4 * hidden + 2 * mlp) == -75_497_472
    assert parts["Gradients alive at the moment (residual stream, output projection input)"] == 2 * hidden
    assert transient.bytes == 10 * Sa - 4 * hidden - 2 * mlp + 2 * hidden == 440_401_920
    assert "The last layer's softmax backward (unfused softmax, no recompute)" in transient.formula
    measured = record["measured"]
    over = measured["phases"]["backward"]["activations"] - measured["activations_at_start"] \
        - measured["activations_kept_by_forward"]
    assert over == 446_691_840
    assert tensors_peak(stage) == pytest.approx(measured["peak_bytes"], rel=0.01)
    # with the fused kernel (16-bit scores, 12 heads a multiple of 4, s <= 4096) no torch softmax runs
    fused = dict(record["config"], training=dict(record["config"]["training"], attention_softmax_fusion=True))
    assert TEMPORARY not in backward_parts(estimate_config(fused).stages[0])


def test_megatron_unfused_recomputed_layer_holds_its_softmax_backward():
    """The same stage with full recompute: the recomputed layer's whole softmax backward (the fp32 gradients of the
    probabilities and of the scores, CUDA's tmp, less the bf16 cast freed: 10 x Sa) beside it, as the harness
    record llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused measured (tests/test_megatron_softmax_moment.py);
    not the no-recompute moment."""
    config = load("megatron/gpt3-175b-tp8-pp8-first-s2048-b1-unfused.json")["config"]
    config = dict(config, training=dict(config["training"], recompute="full"))
    parts = backward_parts(estimate_config(config).stages[0])
    Sa = 96 // 8 * 2048**2
    assert parts[TEMPORARY] == 4 * Sa
    assert parts["fp32 gradient of the probabilities (the cast's backward)"] == 4 * Sa
    assert parts["The 16-bit tensor scores x V kept, freed by its backward"] == -2 * Sa
    transient = next(c for p in estimate_config(config).stages[0].phases if p.name == "backward"
                     for c in p.components if c.key == "transient")
    assert "The recomputed layer's softmax backward (unfused softmax)" in transient.formula
    assert "The last layer's softmax backward" not in transient.formula


HF_MOMENT = "The last layer's softmax backward (eager attention, no recompute)"


def backward_transient(stage):
    """The backward phase's transient component (its largest moment)."""
    return next(c for p in stage.phases if p.name == "backward" for c in p.components if c.key == "transient")


def test_hf_eager_last_layer_softmax_moment():
    """Llama-3.2-1B, pure bf16, eager attention, no recompute, s = 8192, b = 1: the last layer's softmax backward
    (transformers 5.23 eager_attention_forward) holds the fp32 gradient of the probabilities, CUDA's tmp and the
    fp32 gradient of the scores, 3 x 4 B x Sa with Sa = 32 x 8192^2 = 2,147,483,648, less the bf16 probabilities
    scores x V kept (2 B x Sa), beside every kept activation and the gradients made before it: 2 B x (the tied
    embedding 128,256 x 2,048 + the final norm 2,048 + o_proj 2,048^2 + the MLP 3 x 2,048 x 8,192 + the
    post-attention norm 2,048) = 2 x 317,198,336 = 634,396,672. Inside the last layer autograd has run its MLP's,
    post-attention norm's, o_proj's and scores x V's backward, each releasing what it saved: v expanded and the
    attention output (2 x 2 B x 8192 x 2048), the MLP norm's fp32 upcast, rsqrt and normalised input (4 B x 8192 x
    2048 + 4 B x 8192 + 2 B x 8192 x 2048), fc1's input (2 B x 8192 x 2048), gate and up (2 x 2 B x 8192 x 8192),
    the SiLU output and the down_proj input (2 x 2 B x 8192 x 8192): 738,230,272 bytes gone, while the residual
    stream's gradient and v's (2 x 2 B x 8192 x 2048 = 67,108,864) are alive (`python -m validation explain --case`
    of the record: 2 of 32 gate/up outputs, 1 of 16 SiLU and product, 2 of 33 norm upcasts gone; an add.Tensor
    (1, 8192, 2048) and a bmm (32, 8192, 64) there). The harness record peaks there (its 109,060,096 bytes of
    gradients: o_proj's, the MLP's and both norms'; the tied embedding's is still autograd's buffer, counted among
    the activations), and the estimate is 2.1 MB under it (+0.27% with the freed tensors left in; 3.5% under
    without the moment)."""
    record = load("llama-3.2-1b-bf16-adamw-norecompute-eager-s8192-b1.json")
    stage = estimate_config(record["config"]).stages[0]
    parts = backward_parts(stage)
    Sa = 32 * 8192**2
    assert parts[TEMPORARY] == 4 * Sa == 8_589_934_592
    assert parts["fp32 gradient of the probabilities (the cast's backward)"] == 4 * Sa
    assert parts["fp32 gradient of the scores (the softmax's backward output)"] == 4 * Sa
    assert parts["The 16-bit tensor scores x V kept, freed by its backward"] == -2 * Sa
    grads = 2 * (128_256 * 2_048 + 2_048 + 2_048**2 + 3 * 2_048 * 8_192 + 2_048)
    assert grads == 634_396_672
    assert parts["Gradients made before the last layer's attention backward (HF: none before backward)"] == grads
    h, f, T = 2_048, 8_192, 8_192
    freed = 2 * 2 * T * h + 4 * T * h + 4 * T + 2 * T * h + 2 * T * h + 2 * 2 * T * f + 2 * 2 * T * f
    assert freed == 738_230_272
    assert parts["The layer's MLP (dense), attention output and v, freed by their backward"] == -freed
    assert parts["Gradients alive at the moment (residual stream, expanded v)"] == 2 * 2 * T * h == 67_108_864
    transient = backward_transient(stage)
    assert transient.bytes == 10 * Sa + grads - freed + 2 * 2 * T * h == 21_438_111_744
    assert HF_MOMENT in transient.formula
    measured = record["measured"]
    assert measured["gradients"] == 2 * (2_048**2 + 3 * 2_048 * 8_192 + 2 * 2_048) == 109_060_096
    assert tensors_peak(stage) - measured["peak_bytes"] == -2_099_200
    assert (tensors_peak(stage) - transient.bytes) / measured["peak_bytes"] - 1 < -0.03  # the loss's moment


def test_hf_eager_loss_moment_larger():
    """Qwen2.5-0.5B at the same length: 14 heads and a 151,936-token vocabulary make the loss's moment the larger
    (10 x 4 B x 14 x 8192^2 = 9.4 GB of softmax moment, less than the loss's fp32 logits and their gradients beside
    the head's input): the record peaks at the loss (no gradient exists yet), and the estimate keeps it to 0.1%."""
    record = load("qwen2.5-0.5b-bf16-adamw-norecompute-eager-s8192-b1.json")
    stage = estimate_config(record["config"]).stages[0]
    assert record["measured"]["gradients"] == 0
    assert HF_MOMENT not in backward_transient(stage).formula
    assert tensors_peak(stage) == pytest.approx(record["measured"]["peak_bytes"], rel=0.001)


def test_hf_eager_moment_under_autocast():
    """Llama-3.1-8B under bf16 autocast (fp32 weights, gradients and AdamW states), eager attention, no
    recompute, s = 2048: at the last layer's softmax backward the gradients made before it are fp32,
    4 B x (lm_head 128,256 x 4,096 + final norm 4,096 + o_proj 4,096^2 + MLP 3 x 4,096 x 14,336 + norm 4,096) =
    2,873,131,008 bytes (the harness's trace holds exactly these gradients there), and the bf16 autocast copies of
    the same weights, kept by their matmuls, are freed: 2 B x 718,282,752 = 1,436,565,504. The moment by hand:
    the estimate's kept tensors (parameters, states, activations, every autocast copy) + 10 B x 32 x 2048^2 +
    2,873,131,008 - 1,436,565,504 = 156,564,537,344 bytes; the harness's trace (HF harness traced_step, the live
    total at the first _softmax_backward_data of backward) measured 156,247,877,632 there (+0.2%: this count leaves
    in the layer's tensors freed by then, which the estimate's moment takes out). The loss's moment is larger
    (the record's backward peak), and the estimate's backward phase stays the loss's."""
    record = load("llama-3.1-8b-amp-adamw-norecompute-eager-s2048-b1.json")
    stage = estimate_config(record["config"]).stages[0]
    assert HF_MOMENT not in backward_transient(stage).formula
    phase = next(p for p in stage.phases if p.name == "backward")
    kept = sum(c.bytes for c in phase.components if c.key in ("parameters", "optimizer_states", "activations"))
    copies = backward_parts(stage)["Autocast copies of the weights"]
    grads = 4 * (128_256 * 4_096 + 4_096 + 4_096**2 + 3 * 4_096 * 14_336 + 4_096)
    assert grads == 2_873_131_008
    Sa = 32 * 2048**2
    moment = kept + copies + (3 * 4 - 2) * Sa + grads - grads // 2
    assert moment == 156_564_537_344
    assert moment / 156_247_877_632 - 1 == pytest.approx(0.002, abs=0.0005)
    measured = record["measured"]["phases"]["backward"]["total"]
    assert phase.allocated_bytes - 67_108_864 == pytest.approx(measured, rel=1e-4)  # less the cuBLAS workspaces
    assert moment < measured


def test_megatron_moment_where_the_freed_tensors_outweigh_the_scores():
    """At 128 tokens Llama-3.1-8B's layer frees more by its softmax backward than the scores' three fp32 tensors
    bring (32 heads x 128^2 x (3 x 4 - 2) B = 5,242,880 B against its MLP's, attention output's and v's
    2 B x 128 x (2 x 4096 + 3 x 14336 + 2 x 4096) = 15,204,352 B): no moment beyond the ledger, with or without
    recompute; at 4,096 tokens the moment stands (tests/test_gpu_megatron_records.py)."""
    from estimator.memory.resolved import resolve
    from estimator.memory.softmax_backward import softmax_backward_moment
    from estimator.models.loading import load_config

    for seq_len, expected in ((128, False), (4096, True)):
        for recompute in ("none", "full"):
            c = load_config({"model": "llama-3.1-8b", "training": {
                "framework": "megatron", "transformer_impl": "local", "attention": "eager", "seq_len": seq_len,
                "attention_softmax_fusion": False, "recompute": recompute}})
            r = resolve(c.architecture, c.training, c.parallel)
            moment = softmax_backward_moment(r.architecture, r.training, r.parallel, recomputed=recompute == "full",
                                             stage=r.stages[0])
            assert bool(moment) == expected, (seq_len, recompute)


FREED = "The layer's MLP (dense), attention output and v, freed by their backward"


@pytest.mark.parametrize("case, under", [("fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-eager", 2_140_672),
                                         ("fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-shardgradop-eager",
                                          2_140_672),
                                         ("fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-noshard-eager", 2_173_952)])
def test_fsdp1_eager_moment_frees_the_same_layer_tensors(case, under):
    """FSDP1 runs the same transformers layers: its harness's trace of the FULL_SHARD record (python -m
    validation.fsdp1 explain) has at the backward peak the same tensors of the last layer gone as HF's (2 of 32
    gate/up outputs, 1 of 16 SiLU outputs and products, 1 of 16 o_proj inputs, 1 of 32 expanded k/v) and the
    same add.Tensor and bmm gradients there: each record's moment takes out the 738,230,272 bytes of
    `test_hf_eager_last_layer_softmax_moment` and holds the 67,108,864 bytes of gradients, and the estimate is
    about 2 MB under each record (it was 0.26-0.27% over with them left in)."""
    record = load(f"fsdp1/{case}.json")
    stage = estimate_config(record["config"]).stages[0]
    parts = backward_parts(stage)
    assert parts[FREED] == -738_230_272
    assert parts["Gradients alive at the moment (residual stream, expanded v)"] == 67_108_864
    assert HF_MOMENT in backward_transient(stage).formula
    assert tensors_peak(stage) - record["measured"]["peak_bytes"] == -under


ADAPTER_FREED = 2 * 8192 * 2048 + 4 * 8192 * 2048 + 4 * 8192 + 2 * 2 * 8192 * 8192 + 2 * 8192 * 8192
ALL7_ADAPTERS = 3 * (4 * 8192 * 2048 + 4 * 8192 * 16) + 4 * 8192 * 8192 + 4 * 8192 * 16


@pytest.mark.parametrize("case, freed, over", [
    ("llama-3.2-1b-lora-r16-qv-norecompute-drop00-s8192-b1-eager", ADAPTER_FREED, -2_164_736),
    ("llama-3.2-1b-lora-r16-kv-norecompute-drop00-s8192-b1-eager", ADAPTER_FREED, -2_164_736),
    ("llama-3.2-1b-lora-r16-v-norecompute-drop00-s8192-b1-eager", ADAPTER_FREED, -2_164_736),
    ("llama-3.2-1b-lora-r16-all7-norecompute-drop00-s8192-b1-eager", ADAPTER_FREED + ALL7_ADAPTERS, -4_392_960),
    ("llama-3.2-1b-qlora-r16-all7-norecompute-drop00-s8192-b1-bnb0.43.1-eager", ADAPTER_FREED + ALL7_ADAPTERS,
     -4_401_152)])
def test_an_adapter_runs_moment_frees_its_kept_layer_tensors(case, freed, over):
    """Llama-3.2-1B, peft LoRA r16 over a frozen bf16 base, eager attention, no recompute, s = 8192, b = 1 (the
    PEFT harness's records peak in the last layer's softmax backward): of the layer's ledger as an adapter run keeps
    it (adapter_activations.py), autograd has freed by then v expanded (2 B x 8192 x 32 x 64), the MLP norm's fp32
    upcast and rsqrt (4 B x 8192 x 2048 + 4 B x 8192), gate and up (2 x 2 B x 8192 x 8192) and the SiLU output
    (2 B x 8192 x 8192): 503,349,248 bytes (the frozen o_proj's and down_proj's inputs are not kept at all). With
    all 7 linears adapted, also the fp32 inputs and r-wide lora_A outputs of o, gate, up (3 x (4 B x 8192 x 2048 +
    4 B x 8192 x 16)) and down (4 B x 8192 x 8192 + 4 B x 8192 x 16): 471,859,200 more (`python -m validation.peft
    explain`: 5 of 128 fp32 (8192, 2048) upcasts, 1 of 16 fp32 (8192, 8192), 4 of 112 lora_A outputs gone). The
    residual stream's and v's gradients (2 x 2 B x 8192 x 2048) are alive, as in full fine-tuning. The estimate was
    +467,630,080 B (+0.19%) and +903,706,624 B (+0.36%) over the records with those left in; now q,v (and k,v, and
    v alone) is 2.2 MB under and all 7 is 4.4 MB under (the last layer's adapter gradients made by then are left
    out). q,v was 31.4 MB over, k,v too, and v alone 8.7 GB, while the ledger counted in the first layer the
    inputs of matmuls whose other input needs no gradient there
    (adapter_activations.first_layer_matmul_inputs). Over bitsandbytes
    0.43.1's 4-bit layers the same bytes are freed: the inputs its MatMul4Bit holds in ctx.tensors for the frozen
    o, gate, up and down (2 B x 8192 x (2 x 2048 + 8192) = 201,326,592) stay with the node until the graph goes
    (explain: 16 of 16 down_proj and o_proj inputs alive there); the estimate was +0.36% over it as well."""
    assert freed == (503_349_248 if "all7" not in case else 503_349_248 + 471_859_200)
    record = load(f"peft/{case}.json")
    stage = estimate_config(record["config"]).stages[0]
    parts = backward_parts(stage)
    assert HF_MOMENT in backward_transient(stage).formula and parts[TEMPORARY] == 4 * 32 * 8192**2
    assert parts[FREED] == -freed
    assert parts["Gradients alive at the moment (residual stream, expanded v)"] == 2 * 2 * 8192 * 2048
    assert record["measured"]["peak_phase"] == "backward"
    assert tensors_peak(stage) - record["measured"]["peak_bytes"] == over
