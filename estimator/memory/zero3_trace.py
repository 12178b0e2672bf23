"""The order in which DeepSpeed ZeRO-3's module hooks meet a Hugging Face decoder's parameters in one
training micro-batch: the trace its coordinator records and replays (zero3_replay.py).

DeepSpeed puts hooks on every module, containers and modules without parameters included
(parameter_offload.py _register_hooks_recursively, v0.12.3 and v0.19.5): before a module's forward it
gathers the module's own parameters and prefetches; before its backward (the gradient reaching its
output, PreBackwardFunction) it does the same; after each it releases. A container's backward hook
fires before its children's, which run in reverse. The decoder is modelled as transformers writes it:
the model and decoder containers; the embedding; per layer the layer, its input norm, the mixer
(a container and its projections), the post-mixer norm and the MLP (a container, gate and up as two
modules, down; a MoE layer's router and fused experts); the final norm and the head. PEFT's LoRA layer
(peft tuners/lora) runs the base linear, then its lora_dropout, lora_A and lora_B modules.

Under gradient checkpointing a layer's forward runs again when the gradient reaches its output, its
backward right after. The embedding's backward hook fires when it trains, or in an adapter run under
gradient checkpointing (``enable_input_require_grads``: PEFT and Qwen's finetune.py), and no hook
releases it after: the token ids need no gradient, so PostBackwardFunction never runs. Through v0.19.2 it stays
gathered until the optimizer step (stage3.py step: _partition_all_parameters); from v0.19.3 the backward's end
releases it (stage3.py backward_epilogue -> release_backward_leftovers, v0.19.5 l. 2772; versions.py
DEEPSPEED_RELEASE_LEFTOVERS). The trace marks its step in `keeps` either way: no hook of the trace releases it.
"""

from __future__ import annotations

from typing import NamedTuple

from .adapters import adapted_modules
from ..spec.versions import DEEPSPEED_RELEASE_LEFTOVERS, DEEPSPEED_RESET_AT_FORWARD, release
from .zero3_replay import Gathered, Trace, replay

SOURCE = ("DeepSpeed v0.12.3 and v0.19.5 runtime/zero/parameter_offload.py (_register_hooks_recursively, "
          "PreBackwardFunction, PostBackwardFunction), stage3.py step (_partition_all_parameters), v0.19.5 stage3.py "
          "backward_epilogue (release_backward_leftovers, from v0.19.3: a31eb316, #8148); peft 0.5.0 "
          "tuners/lora.py Linear.forward; QwenLM/Qwen finetune.py@2df8e8ac (enable_input_require_grads under "
          "gradient checkpointing)")

# our tensor names -> the adapter module names of adapters.layer_modules
_ADAPTER_NAME = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "fc1.gate": "gate", "fc1.up": "up",
                 "fc2": "down", "router": "router", "expert_fc1": "experts", "expert_fc2": "experts",
                 "shared_expert_fc1.gate": "gate", "shared_expert_fc1.up": "up", "shared_expert_fc2": "down"}
_MLP_START = ("fc1", "router", "expert_fc1", "shared_expert_fc1")


class Node(NamedTuple):
    """A hooked module: its own gathered parameters as (key, elements), its children, and the steps
    its backward takes in place of the reversed forward (PEFT's LoRA layer)."""

    name: str
    params: tuple[tuple[tuple, int], ...] = ()
    children: tuple["Node", ...] = ()
    backward_order: tuple[int, ...] | None = None  # children's order in backward, when not reversed


def forward_steps(node: Node) -> list[tuple[str, tuple]]:
    return [(node.name, node.params)] + [s for c in node.children for s in forward_steps(c)]


def backward_steps(node: Node) -> list[tuple[str, tuple]]:
    order = node.backward_order if node.backward_order is not None else range(len(node.children) - 1, -1, -1)
    return [(node.name, node.params)] + [s for i in order for s in backward_steps(node.children[i])]


def _weight(key: tuple, name: str, n: int, threshold: int) -> Node:
    return Node(name, ((key, n),) if n > threshold else ())


def _linear(layer: int, name: str, n: int, lora: tuple[int, int] | None, threshold: int) -> Node:
    params = (((layer, name), n),) if n > threshold else ()
    name = f"layer {layer} {name}"
    if not lora:
        return Node(name, params)
    a, b = lora
    children = (Node(name + " lora_dropout"), _weight((layer, name, "A"), name + " lora_A", a, threshold),
                _weight((layer, name, "B"), name + " lora_B", b, threshold))
    return Node(name, params, children, backward_order=(2, 1, 0))


def layer_node(arch, kind: str, layer: int, adapter, threshold: int) -> Node:
    """One decoder layer's hooked modules (module docstring); weights at most `threshold` elements are
    persistent (parameter_offload.py mark_persistent_parameters) and gather nothing."""
    adapters: dict[str, list[tuple[int, int]]] = {}
    for m in (adapted_modules(adapter, arch, kind) if adapter else []):
        r = adapter.rank * m.rank_factor * m.copies  # lora_A r x in, lora_B out x r (DoRA's magnitude: small)
        adapters.setdefault(m.name, []).append((r * m.in_features, r * m.out_features))
    mixer: list[Node] = []
    mlp: list[Node] = []
    for t in arch.layer_tensors(kind):
        if t.role == "vector":  # norms are modules of their own, biases part of their linear: persistent
            continue
        halves = t.name.endswith("fc1") and arch.gated_mlp and not t.is_expert  # gate_proj and up_proj
        parts = ((t.name + ".gate", t.numel // 2), (t.name + ".up", t.numel // 2)) if halves else ((t.name, t.numel),)
        for name, n in parts:
            wanted = adapters.get(_ADAPTER_NAME.get(name, ""), [])
            node = _linear(layer, name, n, wanted.pop(0) if wanted else None, threshold)
            if t.is_expert and mlp and mlp[-1].name == f"layer {layer} experts":
                # transformers 5's experts module holds gate_up_proj and down_proj: one hook gathers both
                last = mlp.pop()
                node = Node(last.name, last.params + node.params, last.children + node.children)
            elif t.is_expert:
                node = Node(f"layer {layer} experts", node.params, node.children)
            (mlp if mlp or t.name in _MLP_START else mixer).append(node)
    children = [Node(f"layer {layer} input norm"), Node(f"layer {layer} mixer", children=tuple(mixer))]
    children += [Node(f"layer {layer} norm")] * max(0, arch.norms_per_layer - 1)
    children += [Node(f"layer {layer} mlp", children=tuple(mlp))]
    return Node(f"layer {layer}", children=tuple(children))


def build_trace(arch, training, stage, threshold: int) -> Trace:
    """One micro-batch's hook order on the stage (the module docstring), one key per parameter."""
    first, last = stage.first, stage.last
    emb = arch.vocab_size * arch.hidden_size
    embedding = [_weight(("embedding",), "embedding", emb, threshold)] if first else []
    head = []
    if last:
        head = [Node("final norm"), _weight(("embedding",) if arch.tie_embeddings else ("lm_head",), "lm_head",
                                            emb, threshold)]
    recompute = training.recompute == "full"
    first_n = training.recompute_layers
    layers = []
    for position, i in enumerate(x for r in stage.chunks for x in r):
        again = recompute and (first_n is None or position < first_n)
        layers.append((layer_node(arch, arch.layer_kind(i), i, training.adapter, threshold), again))
    forward = [("model", ()), ("decoder", ())] + [s for n in embedding for s in forward_steps(n)]
    forward += [s for n, _ in layers for s in forward_steps(n)] + [s for n in head for s in forward_steps(n)]
    backward = [("model", ()), ("decoder", ())] + [s for n in reversed(head) for s in backward_steps(n)]
    for node, again in reversed(layers):
        backward += [(name + " (recomputed)", p) for name, p in forward_steps(node)] if again else []
        backward += backward_steps(node)
    keeps = set()
    if embedding and (not training.adapter or recompute):
        keeps.add(len(forward) + len(backward))
        backward += [("embedding", embedding[0].params)]
    backward = [(name if name.endswith(")") else name + " (backward)", p) for name, p in backward]
    entries = forward + backward
    ids: dict[tuple, int] = {}
    steps = tuple(tuple((ids.setdefault(key, len(ids)), n) for key, n in params) for _, params in entries)
    return Trace(steps, tuple(name for name, _ in entries), len(forward), frozenset(keeps))


# stage3_max_reuse_distance has no field: DeepSpeed's default (runtime/zero/config.py, v0.12.3 and v0.19.5), the
# value of Qwen's finetune/ds_config_zero3.json; the replays of our tests give the same peaks at 0 and at 1e9
# (the prefetcher's marks keep what the reuse window would)
MAX_REUSE_DISTANCE = 1_000_000_000


def release_rules(training) -> tuple[bool, bool]:
    """The DeepSpeed release's rules (training.framework_version): whether reset_step runs at the forward's start
    (from v0.15.4, else at the backward's end: versions.DEEPSPEED_RESET_AT_FORWARD) and whether the backward's end
    releases the embedding (from v0.19.3, else the step does: versions.DEEPSPEED_RELEASE_LEFTOVERS)."""
    version = release("deepspeed", training.framework_version).number
    return version >= DEEPSPEED_RESET_AT_FORWARD, version >= DEEPSPEED_RELEASE_LEFTOVERS


def gathered_elements(arch, training, stage, prefetch_bucket: int, max_live: int, threshold: int,
                      microbatches: int) -> Gathered:
    """The coordinator's peaks on this stage (zero3_replay.replay over `build_trace`). Through v0.19.2, with
    gradient accumulation, a micro-batch starts with the embedding still gathered from the backward before it
    (no hook released it: the module docstring), which the coordinator's count leaves out (reset_step
    sets it to 0); its release after the embedding's forward then lowers the count below what is
    gathered. With one micro-batch a step the optimizer step has released it: from v0.15.4 on
    (parameter_offload.py _start_of_forward_hook, reset_step at the forward's start) the count starts
    from there and nothing is held. Through v0.15.3 (v0.12.3 included) reset_step ran at the end of the
    backward (stage3.py backward), before the step's release, which then lowers the count the same way:
    held in every micro-batch (training.framework_version; versions.DEEPSPEED_RESET_AT_FORWARD). From
    v0.19.3 each backward's end releases it (release_backward_leftovers, versions.DEEPSPEED_RELEASE_LEFTOVERS)
    before the next forward's reset_step: nothing is held, with or without accumulation."""
    reset_at_forward, release_leftovers = release_rules(training)
    offset = not reset_at_forward or (microbatches > 1 and not release_leftovers)

    def compute() -> Gathered:
        trace = build_trace(arch, training, stage, threshold)
        held = frozenset(p for s in trace.keeps for p, _ in trace.steps[s]) if offset else frozenset()
        return replay(trace, prefetch_bucket, max_live, MAX_REUSE_DISTANCE, held)
    key = ("zero3 gathered", stage.first, stage.last, tuple((r.start, r.stop) for r in stage.chunks),
           training.adapter, training.recompute, training.recompute_layers, prefetch_bucket, max_live, threshold,
           offset)
    return arch.cached(key, compute)
