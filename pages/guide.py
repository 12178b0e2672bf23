"""How to read this: what each number means, for someone new, and ready answers for serving."""

import pandas as pd
import streamlit as st

from estimator.spec.gpus import GPUS
from ui import compute, state, keys as K

cur = state.current()
gpu_id = cur.values.get("gpu") or "h100-80"
gpu_name = GPUS[gpu_id].name if gpu_id in GPUS else gpu_id

st.title("How to read this")
st.caption("What the estimate counts, how it compares with what PyTorch and nvidia-smi report, and why some "
           "runs that look fine on paper do not fit.")

COMPONENTS = [
    ("Parameters (weights)", "The model's weights on this GPU: its share of the layers after tensor, pipeline and "
     "expert parallelism split them, in the weights dtype (2 bytes per parameter in bf16). ZeRO-3 / FSDP also "
     "shards them over data parallelism.", "model size; / TP, / PP, / (EP x ETP) for experts"),
    ("Gradients", "One gradient per trainable parameter, built in backward, in the gradients dtype (Megatron keeps "
     "them in fp32). ZeRO-2 and -3 shard them.", "parameters on this GPU"),
    ("Master weights", "An fp32 copy of weights stored in a lower precision, which the optimizer updates (mixed "
     "precision). 4 bytes per parameter; ZeRO-1 and up shard it.", "parameters on this GPU"),
    ("Optimizer states", "What the optimizer keeps per parameter: AdamW two moments (8 bytes in fp32), 8-bit Adam "
     "about 2 bytes, SGD none. ZeRO-1 and up shard them over data parallelism.", "parameters on this GPU"),
    ("Activations", "What the forward pass saves for backward: every layer's inputs and intermediate tensors, for "
     "every micro-batch still in flight. Usually the part that grows fastest.",
     "sequence length x micro-batch x layers; / TP with sequence parallelism, / CP; recompute cuts it"),
    ("Logits and loss", "The output layer's scores over the whole vocabulary for every token, and the loss's "
     "softmax, often in fp32: large for big vocabularies. Fused or chunked losses avoid most of it.",
     "tokens x vocabulary; on the last pipeline stage"),
    ("KV cache (inference)", "The keys and values of every token already seen, kept so that each new token "
     "attends to them without recomputing. Grouped-query attention and an fp8 cache shrink it.",
     "context x batch x layers x KV heads"),
    ("Transient buffers", "Short-lived memory: FSDP's gathered layers, DDP and DeepSpeed buckets, the optimizer "
     "step's temporaries. Only alive at some moments, but they add to the peak.", "layer size, bucket sizes"),
    ("NCCL buffers (communication)", "Buffers NCCL allocates for every group of GPUs that communicates (tensor, "
     "pipeline, data parallel...), outside PyTorch's allocator: about 0.5 GiB per communicator of several GPUs, "
     "388 MiB per communicator of one GPU and 170 MiB of NCCL's kernels. Megatron-Core's step also makes the "
     "world's, the gradient norm's and, interleaved, one per pipeline neighbour.", "parallel groups"),
    ("CUDA context (runtime)", "The CUDA context and the kernel modules loaded into it (PyTorch's, cuBLAS's, "
     "FlashAttention's) as a run first uses them: on an H200 0.73-0.75 GiB after a training step with lazy module "
     "loading (the default), 1.71 GiB with CUDA_MODULE_LOADING=EAGER; about 0.5 GiB on other GPUs.",
     "module loading, the libraries a run uses"),
    ("Fragmentation", "Memory PyTorch's caching allocator has reserved but cannot hand out, because free blocks "
     "are the wrong size: 10% of the peak here (5% with expandable segments).", "the allocated peak"),
]

ALLOCATED = """
Three numbers describe a GPU's memory, each larger than the one before:

1. **Allocated** - `torch.cuda.max_memory_allocated()`: the largest total of live tensors at any moment of a
   step. The estimate's *Allocated peak* is this number: parameters, gradients, optimizer states, activations,
   logits and transient buffers, at the worst moment of the forward, backward or optimizer step.
2. **Reserved** - `torch.cuda.max_memory_reserved()`: what PyTorch's caching allocator holds from the driver,
   allocated plus cached blocks it keeps for reuse. The difference is *fragmentation*. For an HF Trainer run
   on one GPU the estimate replays PyTorch's caching allocator over the step's allocations, built from the
   activation ledger (its segment sizes, best-fit reuse and splitting rules, `CUDACachingAllocator.cpp`, with
   default or expandable segments); so it does over DeepSpeed ZeRO-2/3's order on one GPU and over
   Megatron-Core's for dense models without context parallelism (its contiguous gradient buffer, distributed
   optimizer and 1F1B pipeline; default segments); elsewhere it takes a measured 10% of the allocated peak (5%
   with expandable segments). The *fragmentation* component's formula says which, and why.
3. **What nvidia-smi shows** - reserved memory plus what lives outside PyTorch's allocator: the *CUDA context*
   and the *NCCL buffers*. The estimate's *Device total per GPU* is this number, and it is what must fit in the
   GPU's capacity (as CUDA reports it: an "80 GB" H100 has 79.6 GiB).
"""

FIRST_STAGE = """
With pipeline parallelism (PP > 1) every stage holds its own layers, but not the same activations. In the
1F1B schedule (Narayanan et al. 2021) stage *r* of *p* runs *p - r* forward passes before its first backward,
so it holds the activations of up to *p - r* micro-batches at once: the **first stage holds *p***, the last
only one. The first stage also holds the embedding table. Interleaving (VPP > 1) cuts the pipeline bubble but
adds in-flight activations: the first stage holds about *p (1 + (p - 1)/(p v))* layer stacks' worth.
The last stage has fewer activations but the output layer, the logits and the loss: with a large vocabulary it
can be the peak instead. The Memory page shows every stage; the busiest one decides the fit.

This needs at least *p* micro-batches per step: with fewer, most of the step is pipeline bubble. The Memory page
shows how many micro-batches the estimate assumes next to the totals.
"""

EIGHTY = """
The verdict is **Fits** below 80% of the GPU's capacity, **Tight** between 80% and 100%, **OOM** (out of memory)
above.
Why 80%: Fujii et al. (2024, arXiv 2411.06465) estimated the memory of 454 training runs on A100 and H100 GPUs
and ran them: **no run whose estimate was below 80% of the GPU's memory went out of memory.** Above 80%, some
did: allocator behaviour, memory spikes and library workspaces that no formula captures exactly. Treat *Tight*
as "may work; try it before you book the cluster", and *Fits* as safe.
"""


def _serving() -> None:
    st.subheader("Serving: ready answers")
    models = compute.SERVING_MODELS
    st.caption(f"Inference on one {gpu_name} (TP 1, bf16 weights): the prompt fills the context, every sequence of "
               "the batch keeps its KV cache. Every number is the estimator's (the same as the Memory page with "
               "Mode = inference and these settings); change the GPU in the sidebar to check another one.")
    try:
        rows = compute.serving_scenarios(tuple(models), gpu_id)
    except Exception as exc:  # never a traceback
        st.info(f"The serving table is not available ({type(exc).__name__}).", icon=":material/info:")
        return
    df = pd.DataFrame(rows)
    st.dataframe(df, hide_index=True, width="stretch", key=K.SERVING_TABLE, column_config={
        "Context (tokens)": st.column_config.NumberColumn(format="localized"),
        "Weights (GiB)": st.column_config.NumberColumn(format="%.2f"),
        "KV cache (GiB)": st.column_config.NumberColumn(format="%.2f"),
        "Total per GPU (GiB)": st.column_config.NumberColumn(format="%.2f"),
        "Use": st.column_config.ProgressColumn(f"Use of {gpu_id}", format="percent", min_value=0.0,
                                               max_value=1.0),
    })


st.markdown("Every number in this app is **per GPU**: what one GPU of the run must hold. With pipeline "
            "parallelism each stage is different, and **the busiest stage decides** whether the run fits.")

if cur.mode == "inference":
    _serving()

st.subheader("What each part is")
st.table(pd.DataFrame(COMPONENTS, columns=["Component", "What it is", "Grows with"]), hide_index=True)

st.subheader("Allocated, reserved, and what nvidia-smi shows")
st.markdown(ALLOCATED)

st.subheader("Why the first pipeline stage peaks")
st.markdown(FIRST_STAGE)

st.subheader("The 80% rule")
st.markdown(EIGHTY)

st.subheader("Fine-tuning with adapters, and RL")
st.markdown(
    "With an **adapter** (LoRA, QLoRA, DoRA; the *Fine-tuning* group) the base weights are frozen: they keep no "
    "gradient and no optimizer state, and the layers do not save what only their weights' gradients would read. "
    "What trains is the adapters (the *trainable* parameter count), which the HF Trainer keeps in fp32 with PEFT. "
    "QLoRA stores the frozen base in 4-bit NF4, about half a byte per weight. Calculators that count the frozen "
    "weights as trainable over-estimate such runs several times over.\n\n"
    "With **RL** (the *RL* group) the trainer and an inference engine (vLLM, SGLang) take turns on the same GPUs: "
    "each step generates rollouts, scores them, then trains. Each phase holds different things: the engine's "
    "weights and KV cache during the rollout, the models' forward passes while scoring, the training step last. "
    "The largest phase decides the fit, and the Memory page shows all three.")



def _references() -> None:
    st.subheader("Other calculators' examples, reproduced")
    st.caption("The worked examples other calculators and a practical guide print, beside this estimate of the same "
               "runs: which figures it reproduces, which it does not, and why. 'Their arithmetic' is the rule that "
               "gives the printed figure; a figure within 10% counts as reproduced.")
    try:
        tables = compute.reference_comparisons()
    except Exception as exc:  # never a traceback
        st.info(f"The comparisons are not available ({type(exc).__name__}).", icon=":material/info:")
        return
    for i, table in enumerate(tables):
        with st.expander(table["title"], expanded=i == 0):
            st.caption(f"Source: {table['source']}." + (f" Recipe: {table['recipe']} (the Presets page loads it)."
                                                        if table["recipe"] else ""))
            st.dataframe(pd.DataFrame(table["rows"]), hide_index=True, width="stretch", key=K.reference_table(i),
                         column_config={"Reproduced": st.column_config.CheckboxColumn()})
            for note in table["notes"]:
                st.markdown(f"- {note}")


_references()

if cur.mode != "inference":
    _serving()
