"""SDPA with a 4-D mask on the GPU: what transformers' masked attention call keeps and allocates (issue 23,
estimator/memory/activations/sdpa_mask.py).

Gemma 3's sliding layers under transformers' SDPA get a b x 1 x s x s bool mask once the sequence reaches the window
(masking_utils.py sdpa_mask, the non-vmap path: a 1 x 1 x s x s comparison expanded to the batch), so
integrations/sdpa_attention.py repeats k and v to every query head (use_gqa_in_sdpa needs no mask) and torch's SDPA
turns the mask into an additive bias of the query's dtype and runs a fused kernel that takes one: cuDNN's where torch
puts it first (sm90/sm100 from torch 2.9; from 2.10 with a cuDNN above 9.15.0), else the memory-efficient (CUTLASS)
one (sdpa_mask.py `sdpa_backend`), whose buffers for the call no CPU run can check. The H200's run (torch
2.11.0+cu130, cuDNN 9.19; tests/data/measured/gpu/experiments/sdpa-mask-h200.json) ran cuDNN for every Gemma call.
Each case calls SDPA as transformers does, on bf16 leaves laid out as the projections make them (b x s x heads x d,
transposed):
- `sliding`: `sdpa_attention_forward` (transformers' own function where it imports, else `_mirror`, the same
  steps) with the sliding-window bool mask;
- `causal`: the same call without a mask (the layers below the window, and the unmasked control: is_causal and,
  with grouped heads, enable_gqa);
- `falcon`: FalconAttention's own call (transformers 5.23 modeling_falcon.py lines 333-342): q at 71 heads, k and v
  at one, a causal bool mask (FalconModel builds it with allow_is_causal_skip=False), is_causal False, no
  enable_gqa: unequal head counts rule out the fused kernels (sdp_utils_cpp.h check_batch_size_and_num_heads_dense),
  so the math backend runs.
Each case runs twice in its own allocator state (the cache emptied, the peak reset; the first call loads the
kernels and cuBLAS's workspace), the second measured: torch.cuda.max_memory_allocated over what was allocated
before the call (the inputs, and the cuBLAS workspace) for the forward and, from the forward's end with the
output's gradient made, for the backward; what autograd saved (torch.autograd.graph.saved_tensors_hooks: each
tensor's shape, dtype and storage bytes, storages counted once); what reached torch's SDPA (the heads of k and v,
the mask's shape, dtype and strides, is_causal, enable_gqa) and the grad_fn of its output (which backend ran);
the kernels the profiler saw in a third call (cuDNN's generated kernels, or the CUTLASS variant's name). Beside each: the estimator's own ledger
for the layer (`prediction`). An error or an out-of-memory is recorded, not fatal; the sub-run stops starting
cases at its deadline.

`python -m validation.gpu.sdpa_mask GROUP DEVICE DEADLINE_S`: one JSON line. On the CPU (the CI stand-in) the
`tiny` group runs the same code, its memory read by validation/core/tracker.py's StorageTracker (rounded as the
caching allocator rounds).
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace

import torch

KINDS = ("sliding", "causal", "falcon")


@dataclass(frozen=True)
class Case:
    model: str  # the layer's model: "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "falcon-7b" or "tiny"
    kind: str  # KINDS
    heads: int
    kv_heads: int
    head_dim: int
    seq: int
    batch: int
    window: int | None = None  # the sliding window (the `sliding` kind)
    backends: str | None = None  # None: torch's own order; NO_CUDNN: flash, efficient, math (`backends_of`)

    @property
    def id(self) -> str:
        return f"{self.model}-{self.kind}-s{self.seq}-b{self.batch}" + ("-nocudnn" if self.backends else "")


NO_CUDNN = "no-cudnn"


def backends_of(case: Case):
    """The context a case's calls run in: torch's own order, or (NO_CUDNN) torch.nn.attention.sdpa_kernel over flash,
    memory-efficient and math, the order torch keeps where cuDNN is not first (an A100, a cuDNN up to 9.15.0, torch
    up to 2.8: estimator/memory/activations/sdpa_mask.py sdpa_backend), so an H200 runs the masked call on the
    memory-efficient kernel and the unmasked one on FlashAttention-2."""
    if case.backends is None:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _gemma(model: str, heads: int, kv_heads: int, head_dim: int, shapes, backends: str | None = None
           ) -> tuple[Case, ...]:
    """A sliding case and its unmasked control per (seq, batch): Gemma 3's window is 1,024 tokens (config.json
    sliding_window of google/gemma-3-4b-pt, -12b-pt, -27b-pt)."""
    return tuple(Case(model, kind, heads, kv_heads, head_dim, s, b, 1024 if kind == "sliding" else None, backends)
                 for s, b in shapes for kind in ("sliding", "causal"))


# the sub-runs, a process each: Gemma 3 4B (8 heads, 4 KV heads, d 256), 12B (16, 8, 256) and 27B (32, 16, 128: the
# CUTLASS k128 variant where d 256 takes the k65536 one); Falcon-7B (71 heads, 1 KV head, d 64) apart, its math
# backend's fp32 scores (b x 71 x s^2 x 4 B, 4.8 GB at s 4096) the largest allocations here
GROUPS: dict[str, tuple[Case, ...]] = {
    "gemma-3": (_gemma("gemma-3-4b", 8, 4, 256, ((2048, 1), (2048, 2), (4096, 1), (8192, 1), (8192, 2)))
                + _gemma("gemma-3-12b", 16, 8, 256, ((4096, 1), (8192, 1), (8192, 2)))
                + _gemma("gemma-3-27b", 32, 16, 128, ((4096, 1),))),
    "falcon-7b": tuple(Case("falcon-7b", "falcon", 71, 1, 64, s, 1) for s in (2048, 4096)),
    # the same calls without cuDNN (the H200 ran cuDNN for every Gemma call): the memory-efficient kernel's k65536 and
    # k128 variants and their workspaces (sdpa_mask.py backward_workspace), FlashAttention-2 for the controls
    "gemma-3-nocudnn": (_gemma("gemma-3-4b", 8, 4, 256, ((2048, 1), (2048, 2), (8192, 1)), NO_CUDNN)
                        + _gemma("gemma-3-12b", 16, 8, 256, ((8192, 2),), NO_CUDNN)
                        + _gemma("gemma-3-27b", 32, 16, 128, ((4096, 1),), NO_CUDNN)),
    # the CPU stand-in (tests/test_gpu_experiments.py)
    "tiny": (Case("tiny", "sliding", 4, 2, 16, 64, 2, 16), Case("tiny", "causal", 4, 2, 16, 64, 2),
             Case("tiny", "falcon", 5, 1, 16, 64, 1)),
}
GPU_GROUPS = ("gemma-3", "falcon-7b", "gemma-3-nocudnn")


# --- the masks, as transformers 5.23 masking_utils.py builds them --------------------------------------------------

def bool_mask(seq: int, batch: int, window: int | None, device: str) -> torch.Tensor:
    """sdpa_mask's non-vmap path without a padding mask: causal_mask_function (kv_idx <= q_idx) and, with a window,
    sliding_window_overlay (kv_idx > q_idx - window) over broadcast aranges, 1 x 1 x s x s, then
    `.expand(batch_size, -1, q_length, kv_length)`."""
    q = torch.arange(seq, device=device)[None, None, :, None]
    kv = torch.arange(seq, device=device)[None, None, None, :]
    allowed = kv <= q
    if window is not None:
        allowed = allowed & (kv > q - window)
    return allowed.expand(batch, -1, seq, seq)


# --- the call, as transformers makes it ---------------------------------------------------------------------------

class _Layer:
    """What sdpa_attention_forward reads of its module (num_key_value_groups, is_causal, layer_idx)."""

    def __init__(self, groups: int):
        self.num_key_value_groups = groups
        self.is_causal = True
        self.layer_idx = 0
        self.training = True


def _mirror(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers 5.23 integrations/sdpa_attention.py sdpa_attention_forward's steps for a training call (no cache,
    no position bias, q_length > 1), where that function does not import."""
    sdpa_kwargs = {}
    groups = module.num_key_value_groups
    if groups > 1:
        if attention_mask is None and key.shape[-1] == value.shape[-1] <= 256:  # use_gqa_in_sdpa on CUDA
            sdpa_kwargs["enable_gqa"] = True
        else:  # repeat_kv
            b, g, s, d = key.shape
            key = key[:, :, None].expand(b, g, groups, s, d).reshape(b, g * groups, s, d)
            value = value[:, :, None].expand(b, g, groups, s, d).reshape(b, g * groups, s, d)
    is_causal = query.shape[2] > 1 and attention_mask is None and (module.is_causal if is_causal is None else is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=is_causal,
                                                           **sdpa_kwargs)
    return out.transpose(1, 2).contiguous(), None


def transformers_call():
    """(sdpa_attention_forward, where it comes from): transformers' own where it imports and runs a tiny masked
    call on the CPU (a release whose function reads more of its module than `_Layer` has falls back too)."""
    try:
        import transformers
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        tiny = GROUPS["tiny"][0]
        call(tiny, inputs(tiny, "cpu"), sdpa_attention_forward)
        return sdpa_attention_forward, f"transformers {transformers.__version__} sdpa_attention_forward"
    except Exception as error:  # noqa: BLE001 - any failure: the mirror, and why
        return _mirror, f"validation/gpu/sdpa_mask.py _mirror (transformers 5.23's steps; {type(error).__name__})"


def inputs(case: Case, device: str, generator: torch.Generator | None = None) -> dict:
    """bf16 leaves in the projections' layout (b x s x heads x d, transposed to b x heads x s x d), and the mask."""
    def leaf(heads):
        return torch.randn(case.batch, case.seq, heads, case.head_dim, device=device, dtype=torch.bfloat16,
                           generator=generator).transpose(1, 2).requires_grad_()

    made = {"q": leaf(case.heads), "k": leaf(case.kv_heads), "v": leaf(case.kv_heads)}
    if case.kind == "sliding":
        made["mask"] = bool_mask(case.seq, case.batch, case.window, device)
    elif case.kind == "falcon":
        made["mask"] = bool_mask(case.seq, case.batch, None, device)
    else:
        made["mask"] = None
    return made


def call(case: Case, t: dict, forward) -> torch.Tensor:
    """The attention output as the o_proj reads it (b x s x heads x d)."""
    scale = case.head_dim ** -0.5  # Gemma 3: query_pre_attn_scalar ** -0.5 with query_pre_attn_scalar = head_dim
    with backends_of(case):  # the backend is chosen in the forward; its backward node follows
        if case.kind == "falcon":  # modeling_falcon.py FalconAttention.forward, the SDPA branch (lines 333-342)
            out = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=t["mask"],
                                                                   dropout_p=0.0, is_causal=False)
            return out.transpose(1, 2)  # FalconAttention: attn_output.transpose(1, 2) then reshape (a view or copy)
        out, _ = forward(_Layer(case.heads // case.kv_heads), t["q"], t["k"], t["v"], t["mask"], dropout=0.0,
                         scaling=scale)
    return out


@contextmanager
def sdpa_seen(seen: list):
    """Record what reaches torch's SDPA and what its output's grad_fn is (the backend that ran)."""
    original = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, **kwargs):
        out = original(q, k, v, attn_mask=attn_mask, **kwargs)
        mask = None if attn_mask is None else {"shape": list(attn_mask.shape), "dtype": str(attn_mask.dtype)[6:],
                                               "stride": list(attn_mask.stride())}
        seen.append({"q_heads": q.shape[1], "k_heads": k.shape[1], "v_heads": v.shape[1], "mask": mask,
                     "is_causal": bool(kwargs.get("is_causal", False)),
                     "enable_gqa": bool(kwargs.get("enable_gqa", False)),
                     "grad_fn": type(out.grad_fn).__name__ if out.grad_fn is not None else None,
                     "output_stride": list(out.stride())})
        return out

    torch.nn.functional.scaled_dot_product_attention = recorded
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


# --- memory: the CUDA allocator, or the CPU stand-in ----------------------------------------------------------------

class CudaMemory:
    def __init__(self):
        self.device = "cuda"

    def fresh(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    def reset_peak(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    def reserved_peak(self) -> int:
        return torch.cuda.max_memory_reserved()

    def tracking(self):
        return nullcontext()

    def trace_start(self) -> None:
        """The allocator's history from here on, sizes only (no stacks): every alloc and free of the measured call."""
        import inspect

        self._tracing = False
        try:  # the history is a bonus: a torch without it still measures
            record = torch.cuda.memory._record_memory_history
            clear = {"clear_history": True} if "clear_history" in inspect.signature(record).parameters else {}
            record(enabled="all", context=None, stacks="python", max_entries=100_000, **clear)
            self._trace_from = len(self._events())
            self._tracing = True
        except Exception as error:  # noqa: BLE001
            self.trace_error = f"{type(error).__name__}: {str(error)[:300]}"

    def _events(self) -> list:
        return torch.cuda.memory._snapshot()["device_traces"][0]

    def trace_mark(self) -> list[list[int]] | None:
        """[+requested bytes, address] for each allocation and [-bytes, address] for each free since the last mark,
        in order (the history's sizes are the requests, `orig_size`, before the allocator rounds them)."""
        if not self._tracing:
            return None
        events = self._events()
        out = [[e["size"] if e["action"] == "alloc" else -e["size"], e["addr"]] for e in events[self._trace_from:]
               if e["action"] in ("alloc", "free_requested")]
        self._trace_from = len(events)
        return out

    def trace_stop(self) -> None:
        if getattr(self, "_tracing", False):
            torch.cuda.memory._record_memory_history(enabled=None)
            self._tracing = False


class CpuMemory:
    """The stand-in: StorageTracker's live bytes (every storage an op returns, rounded to the allocator's 512-byte
    blocks) while `tracking`, its peak replayed from the events since `reset_peak`."""

    def __init__(self):
        from ..core.tracker import StorageTracker

        self.device = "cpu"
        self.tracker = StorageTracker()
        self._mark = 0

    def fresh(self) -> None:
        self.reset_peak()

    def allocated(self) -> int:
        return sum(self.tracker._size.values())

    def reset_peak(self) -> None:
        self._mark = len(self.tracker.events)
        self._base = self.allocated()

    def peak(self) -> int:
        live = best = self._base
        for _, delta in self.tracker.events[self._mark:]:
            live += delta
            best = max(best, live)
        return best

    def reserved_peak(self) -> None:
        return None

    def tracking(self):
        return self.tracker

    def trace_start(self) -> None:
        self._trace_from = len(self.tracker.events)

    def trace_mark(self) -> list[list[int]]:
        out = [[delta, key] for key, delta in self.tracker.events[self._trace_from:]]
        self._trace_from = len(self.tracker.events)
        return out

    def trace_stop(self) -> None:
        pass


def memory_named(device: str):
    return CudaMemory() if device == "cuda" else CpuMemory()


# --- one case -------------------------------------------------------------------------------------------------------

def _saved_hooks(saved: list, device: str):
    def pack(t):
        storage = t.untyped_storage()
        saved.append({"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": t.device.type,
                      "storage": storage.data_ptr(), "storage_bytes": storage.nbytes()})
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def saved_summary(saved: list, input_storages: set[int], device: str) -> dict:
    """What autograd saved on the device, each storage once: all of it, and what is new (not an input's)."""
    unique: dict[int, dict] = {}
    for s in saved:
        if s["device"] == device and s["storage_bytes"]:
            unique.setdefault(s["storage"], s)
    total = sum(s["storage_bytes"] for s in unique.values())
    new = sum(s["storage_bytes"] for k, s in unique.items() if k not in input_storages)
    tensors = [{k: v for k, v in s.items() if k != "storage"} | {"input": s["storage"] in input_storages}
               for s in saved]
    return {"saved_bytes": total, "saved_new_bytes": new, "saved_tensors": tensors}


def run_once(case: Case, memory, forward, measured: bool) -> dict:
    """One forward and backward from a fresh allocator state; with `measured`, what it allocated and saved."""
    memory.fresh()
    trace = {}
    with memory.tracking():
        if measured:
            memory.trace_start()
        t = inputs(case, memory.device)
        if measured:
            trace["inputs"] = memory.trace_mark()
        input_storages = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in t.values()
                          if x is not None}
        inputs_bytes = sum(input_storages.values())
        base = memory.allocated()
        memory.reset_peak()
        saved: list = []
        seen: list = []
        with _saved_hooks(saved, memory.device), sdpa_seen(seen):
            out = call(case, t, forward)
        forward_peak, after_forward = memory.peak() - base, memory.allocated() - base
        if measured:
            trace["forward"] = memory.trace_mark()
        grad = torch.randn_like(out)
        before_backward = memory.allocated()
        memory.reset_peak()
        if measured:
            trace["grad_output"] = memory.trace_mark()
        out.backward(grad)
        backward_peak, after_backward = memory.peak() - before_backward, memory.allocated() - before_backward
        if measured:
            trace["backward"] = memory.trace_mark()
            memory.trace_stop()
        reserved = memory.reserved_peak()
        del out, grad
    if not measured:
        return {}
    return {"allocated_before_bytes": base, "inputs_bytes": inputs_bytes, "forward_peak_bytes": forward_peak,
            "forward_end_bytes": after_forward,
            "grad_output_bytes": before_backward - base - after_forward,
            "backward_peak_bytes": backward_peak, "backward_end_bytes": after_backward,
            "backward_reserved_peak_bytes": reserved, "sdpa_calls": seen, "allocations": trace,
            **({"trace_error": memory.trace_error} if getattr(memory, "trace_error", None) else {}),
            **saved_summary(saved, input_storages, memory.device)}


def kernels_seen(case: Case, forward, device: str) -> list[str] | None:
    """The CUDA kernels of one forward and backward, by the profiler (the attention kernels' names carry the CUTLASS
    variant); None on the CPU."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    t = inputs(case, device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = call(case, t, forward)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages()})
    wanted = ("fmha", "attention", "flash", "cutlass", "gemm", "softmax", "sm80", "sm90")
    return [n for n in names if any(w in n.lower() for w in wanted)]


def measure_case(case: Case, memory, forward) -> dict:
    start = time.perf_counter()
    try:
        run_once(case, memory, forward, measured=False)
        measured = run_once(case, memory, forward, measured=True)
    except Exception as error:  # noqa: BLE001 - an OOM or a kernel refusing the shape is a result
        measured = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
    finally:
        memory.trace_stop()
        if memory.device == "cuda":
            torch.cuda.empty_cache()
    if "error" not in measured:
        try:
            measured["kernels"] = kernels_seen(case, forward, memory.device)
        except Exception as error:  # noqa: BLE001 - the profiler is a bonus
            measured["kernels_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    measured["seconds"] = round(time.perf_counter() - start, 3)
    return measured


# --- what the estimator says --------------------------------------------------------------------------------------

def architecture(case: Case):
    """The estimator's Architecture of the case's layer: Gemma 3 4B's from its H200 record's configuration (the
    model whose record the masked path was held to), the other Gemma 3 sizes its attention shapes replaced;
    Falcon-7B's from its fake-tensor record's configuration."""
    from pathlib import Path

    from estimator import load_config

    measured = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured"
    if case.model == "falcon-7b" or case.kind == "falcon":
        config = json.loads((measured / "falcon-7b-8layers-bf16-adamw-norecompute-flash_attention_2-s2048-b1.json")
                            .read_text())["config"]
    else:
        config = json.loads((measured / "gpu" / "gemma-3-4b-bf16-adamw-norecompute-sdpa-s2048-b2-i4x896.json")
                            .read_text())["config"]
    arch = load_config(config).architecture
    changed = {"num_attention_heads": case.heads, "num_kv_heads": case.kv_heads, "head_dim": case.head_dim}
    if case.kind == "falcon":  # on SDPA, which its record (flash_attention_2) was not: the mask handed to it
        changed["sdpa_mask_always"] = True
    if case.kind == "sliding":
        changed["sliding_window"] = case.window
    return replace(arch, **changed)


def prediction(case: Case) -> dict:
    """The estimator's ledger for one layer of the case (estimator/memory/activations/attention.py and
    sdpa_mask.py): the core's entries per sliding layer (the masked entries are averaged over the layers, so divided
    by the sliding share), the attention output (o_proj's input, which is SDPA's output when its layout is
    b x s x heads x d), and what the masked path adds."""
    from estimator.memory.activations.attention import _core_entries
    from estimator.memory.activations.sdpa_mask import masked_layer_share, masked_sdpa_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    par = Parallel()
    arch = architecture(case)
    training = Training(framework="hf", seq_len=case.seq, micro_batch_size=case.batch, param_dtype="bf16")
    share = masked_layer_share(arch, training) if case.kind == "sliding" else 0.0
    masked = {e.name for e in masked_sdpa_entries(arch, training, par)}
    entries = [{"name": e.name, "bytes": e.bytes(par) / (share if e.name in masked else 1), "formula": e.formula}
               for e in _core_entries(arch, training, par, False)
               if case.kind == "sliding" or e.name not in masked]
    # the math backend's output is its .to(origin_dtype) cast, which keeps nothing (estimator/memory/activations/
    # sdpa_math.py): the ledger's attention output is dense's input, made after the call
    output = 0 if case.kind == "falcon" else case.batch * case.seq * case.heads * case.head_dim * 2
    extra = sum(e["bytes"] for e in entries if e["name"] in masked)
    return {"core_entries": entries, "core_bytes": sum(e["bytes"] for e in entries), "attention_output_bytes": output,
            "saved_bytes": sum(e["bytes"] for e in entries) + output, "masked_extra_bytes": extra,
            "sliding_share": share, "modelled": True}


def measure_group(group: str, device: str, deadline_s: float) -> dict:
    memory = memory_named(device)
    forward, via = transformers_call()
    start = time.perf_counter()
    rows, stopped = [], "done"
    for case in GROUPS[group]:
        if time.perf_counter() - start > deadline_s:
            stopped = "deadline"
            break
        torch.manual_seed(0)
        try:
            predicted = prediction(case)
        except Exception as error:  # noqa: BLE001 - the measurement is what the GPU is for
            predicted = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        rows.append({"case": case.id, **asdict(case), "measured": measure_case(case, memory, forward),
                     "estimator": predicted})
    backends = None
    if device == "cuda":
        flags = {"flash": "flash_sdp_enabled", "mem_efficient": "mem_efficient_sdp_enabled",
                 "math": "math_sdp_enabled", "cudnn": "cudnn_sdp_enabled",
                 "fp16_bf16_reduction_math": "fp16_bf16_reduction_math_sdp_allowed"}  # allow_* is the setter

        def read(f):
            try:
                return getattr(torch.backends.cuda, f)()
            except (AttributeError, TypeError):
                return None
        backends = {name: read(f) for name, f in flags.items()}
    return {"cases": rows, "stopped": stopped, "call": via, "sdp_backends_enabled": backends}


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.sdpa_mask GROUP DEVICE DEADLINE_S`: one JSON line on stdout."""
    from .devices import driver_api_version
    from .measure import versions

    group, device, deadline = argv[0], argv[1], float(argv[2])
    measured = measure_group(group, device, deadline)
    found = versions(device) | {"cuda_driver_api": driver_api_version() if device == "cuda" else None}
    print(json.dumps({"experiment": "sdpa-mask", "run": {"group": group}, "measured": measured, "versions": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
