"""Writes estimator/importers/torchtune_models.py from torchtune's own model builders.

    python3 validation/torchtune_builders.py TORCHTUNE_MODELS_DIR [--commit SHA] > estimator/importers/torchtune_models.py
    python3 validation/torchtune_builders.py TORCHTUNE_MODELS_DIR --skeleton OUT_DIR FAMILY ...

TORCHTUNE_MODELS_DIR is a checkout's ``torchtune/models``. Nothing there is imported or run: each
family's ``_model_builders.py`` is read with `ast`: a builder is a function that returns a call of a
component builder (``qwen2(vocab_size=151936, ...)``) with literal keyword arguments, or a name bound
to another builder (``llama3_3_70b = llama3_1_70b``) or to its ``partial`` (``qlora_llama2_7b =
partial(lora_llama2_7b, quantize_base=True)``). The component builder's own defaults come from its
signature in ``_component_builders.py`` (llama2's ``intermediate_dim=None`` is
``scale_hidden_dim_for_mlp(embed_dim)``, qwen2's ``tie_word_embeddings=False``, gemma2's soft caps and
sliding window). Each builder's shape is written as a Hugging Face ``config.json`` dict of the
``model_type`` its modelling code matches (estimator/models/hf_families.py).

``--skeleton`` writes the files of the named families cut down to what this script reads (imports,
the full builders' return calls, aliases, the component builders' signatures): tests/data/torchtune_builders
is that fixture, so tests/test_torchtune_builders.py reruns this script without a torchtune checkout.
"""

from __future__ import annotations

import argparse
import ast
import pprint
import sys
from pathlib import Path

FAMILIES = ("llama2", "llama3", "llama3_1", "llama3_2", "llama3_3", "mistral", "qwen2", "qwen2_5", "qwen3",
            "gemma", "gemma2", "phi3", "phi4")
# component builder (after lora_) -> the transformers model_type whose modelling code has the same weights
MODEL_TYPES = {"llama2": "llama", "llama3": "llama", "llama3_1": "llama", "llama3_2": "llama", "mistral": "mistral",
               "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2", "phi3": "phi3"}
# reward models and classifiers (llama2_reward_7b, mistral_reward_7b) have a score head, not a decoder's output
_SKIP_WORDS = ("reward", "classifier")
_LORA_ONLY = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank", "lora_alpha",
              "lora_dropout", "use_dora", "quantize_base", "scaler_block_size")


def scale_hidden_dim_for_mlp(dim: int, multiple_of: int = 256) -> int:
    """torchtune/models/llama2/_model_utils.py (the same in llama3/_model_utils.py): 4 * int(2 d / 3)
    rounded up to a multiple of 256."""
    hidden = 4 * int(2 * dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _signature(fn: ast.FunctionDef) -> dict:
    """A component builder's keyword defaults (positional, then keyword-only)."""
    a = fn.args
    out = {}
    names = [x.arg for x in a.args]
    for name, default in zip(names[len(names) - len(a.defaults):], a.defaults):
        out[name] = _literal(default)
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if default is not None:
            out[arg.arg] = _literal(default)
    return out


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """name -> (torchtune family, file stem) for ``from torchtune.models.F._x import name``."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchtune.models."):
            parts = node.module.split(".")
            if len(parts) == 4:
                for alias in node.names:
                    out[alias.asname or alias.name] = (parts[2], parts[3])
    return out


def _return_call(fn: ast.FunctionDef) -> ast.Call | None:
    for node in fn.body:
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            return node.value
    return None


def read_builders(root: Path) -> dict[str, tuple[str, str, dict]]:
    """builder -> (family, component builder, its literal keyword arguments with the component's
    defaults filled in), for every decoder builder of FAMILIES; aliases and partials resolved."""
    components: dict[tuple[str, str], dict] = {}
    direct: dict[str, tuple[str, str, dict]] = {}
    aliases: dict[str, str] = {}
    for family in FAMILIES:
        path = root / family / "_model_builders.py"
        tree = ast.parse(path.read_text())
        imported = _imports(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                call = _return_call(node)
                if call is None or call.func.id not in imported:
                    continue
                home, stem = imported[call.func.id]
                if stem != "_component_builders" or call.func.id.removeprefix("lora_") not in MODEL_TYPES:
                    continue
                key = (home, call.func.id)
                if key not in components:
                    components[key] = _component_defaults(root, home, call.func.id)
                kwargs = dict(components[key])
                for kw in call.keywords:
                    value = _literal(kw.value)
                    if kw.arg is not None and value is not _NOT_LITERAL:
                        kwargs[kw.arg] = value
                direct[node.name] = (family, call.func.id.removeprefix("lora_"), kwargs)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "partial":
                    value = value.args[0] if value.args else None
                if isinstance(value, ast.Name):
                    aliases[node.targets[0].id] = value.id
    out = dict(direct)
    for name, target in aliases.items():
        seen = {name}
        while target in aliases and target not in seen:
            seen.add(target)
            target = aliases[target]
        if target in direct:
            out[name] = direct[target]
    return {k: v for k, v in out.items() if not any(w in k for w in _SKIP_WORDS)}


def _component_defaults(root: Path, family: str, component: str) -> dict:
    tree = ast.parse((root / family / "_component_builders.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == component:
            return _signature(node)
    raise SystemExit(f"{family}/_component_builders.py has no {component}")


def hf_config(component: str, kw: dict) -> dict:
    """A component builder's arguments as the config.json of the matching transformers model."""
    def need(key):
        value = kw.get(key, _NOT_LITERAL)
        if value is _NOT_LITERAL or value is None:
            raise SystemExit(f"{component}: {key} is not a literal")
        return value
    embed, heads = need("embed_dim"), need("num_heads")
    ffn = kw.get("intermediate_dim")
    if ffn is None and component.startswith("llama"):
        ffn = scale_hidden_dim_for_mlp(embed)  # llama2/llama3 component builders' default
    config = {"model_type": MODEL_TYPES[component], "vocab_size": need("vocab_size"), "hidden_size": embed,
              "intermediate_size": ffn, "num_hidden_layers": need("num_layers"), "num_attention_heads": heads,
              "num_key_value_heads": kw.get("num_kv_heads") or heads}
    head_dim = kw.get("head_dim")
    if head_dim is not None and (component in ("gemma", "gemma2", "qwen3") or head_dim != embed // heads):
        config["head_dim"] = head_dim
    elif component == "qwen3":
        config["head_dim"] = embed // heads  # Qwen3Config's head_dim default is 128, not hidden / heads
    config["max_position_embeddings"] = need("max_seq_len")
    # output projection: gemma/gemma2 always TiedLinear; llama3_2/qwen2/qwen3 by their tie_word_embeddings
    # argument; llama2, llama3, llama3_1, mistral and phi3 an nn.Linear of their own
    config["tie_word_embeddings"] = (True if component in ("gemma", "gemma2")
                                     else bool(kw.get("tie_word_embeddings", False)))
    if component in ("qwen2", "qwen3"):
        biases = {kw.get("q_proj_bias"), kw.get("k_proj_bias"), kw.get("v_proj_bias")}
        norms = {kw.get("q_norm"), kw.get("k_norm")}
        if len(biases) != 1 or len(norms) != 1:
            raise SystemExit(f"{component}: mixed q/k/v biases or q/k norms: {kw}")
        if component == "qwen2" and (biases != {True} or norms != {False}):
            raise SystemExit(f"qwen2 without q/k/v biases or with q/k norms is not Qwen2's layer: {kw}")
        if component == "qwen3":
            if norms != {True}:
                raise SystemExit(f"qwen3 without q/k norms is not Qwen3's layer: {kw}")
            config["attention_bias"] = biases == {True}
    if component == "mistral":
        config["sliding_window"] = False  # torchtune's mistral attends to the whole sequence (no window argument)
    if component == "gemma2":
        config["sliding_window"] = need("sliding_window_size")  # every other layer, from the first
        # as torchtune builds it: its gemma2_2b/9b/27b pass hidden_capping_value=30.0 (the attention's cap) and
        # final_capping_value=50.0, the other way round from Gemma2Config's 50/30; the caps keep no tensor
        config["attn_logit_softcapping"] = kw.get("hidden_capping_value")
        config["final_logit_softcapping"] = kw.get("final_capping_value")
        if kw.get("query_pre_attn_scalar") is not None:
            config["query_pre_attn_scalar"] = kw["query_pre_attn_scalar"]
    return config


def table(root: Path) -> dict[str, tuple[str, dict]]:
    """base builder (no lora_/qlora_ prefix) -> (family, config.json dict); a LoRA builder must have
    the shapes of its full builder."""
    out: dict[str, tuple[str, dict]] = {}
    builders = read_builders(root)
    for name in sorted(builders, key=lambda n: (n.startswith(("lora_", "qlora_")), n)):
        family, component, kwargs = builders[name]
        base = name.removeprefix("qlora_").removeprefix("lora_")
        entry = (family, hf_config(component, kwargs))
        if base in out and out[base][1] != entry[1]:
            raise SystemExit(f"{name} does not have the shapes of {base}: {entry[1]} != {out[base][1]}")
        out.setdefault(base, entry)
    return dict(sorted(out.items()))


HEADER = '''"""The text decoders of torchtune's model builders as Hugging Face ``config.json`` dicts.

Generated by ``python3 validation/torchtune_builders.py TORCHTUNE/torchtune/models`` from
pytorch/torchtune at commit {commit}: every builder of {families}
that returns a decoder (``lora_`` and ``qlora_`` builders have the shapes of the full one; reward models,
classifiers and the vision, Llama 4, CLIP, T5 and Flux builders are not here). Do not edit by hand.
"""

from __future__ import annotations

COMMIT = "{commit}"

# builder (no lora_/qlora_ prefix) -> (the torchtune/models folder of its _model_builders.py, config.json)
BUILDERS: dict[str, tuple[str, dict]] = '''

FOOTER = '''

def builder_config(name: str) -> tuple[str, dict] | None:
    """(torchtune family, a fresh copy of its config.json dict) for a builder name without its
    lora_/qlora_ prefix; None for a builder not listed."""
    entry = BUILDERS.get(name)
    return None if entry is None else (entry[0], dict(entry[1]))
'''


def module_text(root: Path, commit: str) -> str:
    body = pprint.pformat(table(root), width=116, sort_dicts=False)
    families = ", ".join(FAMILIES)
    return HEADER.format(commit=commit, families=families) + body + "\n" + FOOTER


def _is_component(name: str) -> bool:
    return name.removeprefix("lora_") in MODEL_TYPES


def skeleton(path: Path) -> str:
    """A builder file reduced to what read_builders reads: its imports from torchtune.models, its
    aliases, each full builder's return call with its literal arguments (the lora_ builders, which
    table() checks have the same shapes, are left out; component builders: the decoders' signatures)."""
    tree = ast.parse(path.read_text())
    components = path.name == "_component_builders.py"
    keep = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchtune.models."):
            keep.append(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            keep.append(node)
        elif isinstance(node, ast.FunctionDef):
            call = _return_call(node)
            if components and _is_component(node.name):
                node.body = [ast.Expr(ast.Constant(...))]
            elif not components and call is not None and call.func.id in MODEL_TYPES:  # lora_ builders: same shapes
                call.keywords = [k for k in call.keywords if _literal(k.value) is not _NOT_LITERAL]
                call.args = []
                node.body = [ast.Return(call)]
                node.args = ast.arguments([], [], None, [], [], None, [])
            else:
                continue
            node.returns = None
            node.decorator_list = []
            for arg in node.args.args + node.args.kwonlyargs:
                arg.annotation = None
            keep.append(node)
    return ast.unparse(ast.Module(keep, [])) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", type=Path, help="a torchtune checkout's torchtune/models folder")
    parser.add_argument("--commit", default="bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1")
    parser.add_argument("--skeleton", type=Path, help="write the named families' files, cut down, here")
    parser.add_argument("families", nargs="*")
    args = parser.parse_intermixed_args(argv)
    if args.skeleton:
        for family in args.families:
            for stem in ("_model_builders.py", "_component_builders.py"):
                source = args.models / family / stem
                if source.exists():
                    (args.skeleton / family).mkdir(parents=True, exist_ok=True)
                    (args.skeleton / family / stem).write_text(skeleton(source))
        return
    sys.stdout.write(module_text(args.models, args.commit))


if __name__ == "__main__":
    main()
