"""A hash of every output the estimator gives, to prove a restructure changes no byte of them.

Run from the repository root, before and after the change, and compare the two files:
    python bench/output_hashes.py /tmp/before.json      (then /tmp/after.json; cmp them)
Add any second argument to print each error met (an error is an output too: its message is hashed).

What is hashed: each bundled preset estimated for training and inference and served on vLLM and SGLang
(`serve --json`); each recipe through `estimate --json` and the text report (the plan to fit included);
every measured record's config the accuracy tests replay (tests/data/measured); SGLang's pool records
(tests/data/serving); the practical guide's RL comparison (references.guide_rl); the roofline's step
time (`roofline --json` and its text) of each preset for training and inference, of each recipe, and of
attention variants (flash/eager x training/inference, CP 2, TP 2) on three models; and a sweep of every
setting's values (each choice, both booleans, a few numbers) over eight base configs, and of every
serving setting over two. About 3,500 outputs, in under a minute."""
import contextlib
import copy
import hashlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
from estimator import estimate_config
from estimator.cli import main as cli_main
from estimator.models.presets import list_recipes, preset_ids, get_recipe, get_architecture, get_hf_config
from estimator.spec.fields import SETTINGS, SERVING_FIELDS

out: dict[str, str] = {}  # output's name -> its hash ("E:" before an error's)
CONFIG_FILE = Path(tempfile.mkdtemp()) / "config.json"  # what the CLI calls read
DEBUG = len(sys.argv) > 2


def h(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(name, fn):
    try:
        v = fn()
    except Exception as exc:  # an error is an output too: its type and message
        v = f"ERROR {type(exc).__name__}: {exc}"
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=repr)
    out[name] = ("E:" if text.startswith("ERROR") else "") + h(text)
    if DEBUG and text.startswith("ERROR"):
        print(name, text[:200])


def est(cfg):
    return lambda: estimate_config(copy.deepcopy(cfg)).to_json()

def cli(args, cfg):
    """The CLI's exit code, standard output and error for `cfg` (in this process: the same main())."""
    def run():
        p = CONFIG_FILE
        p.write_text(json.dumps(cfg))
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            try:
                rc = cli_main(args + ["--config", str(p)])
            except SystemExit as x:
                rc = x.code
        return f"{rc}\n{o.getvalue()}\n{e.getvalue()}"
    return run


def put(cfg, path, value):
    parts = path.split(".")
    d = cfg
    for k in parts[:-1]:
        d = d.setdefault(k, {})
    d[parts[-1]] = value
    return cfg


t0 = time.time()
# presets: default training, inference, serving on both engines
for pid in preset_ids():
    record(f"preset/{pid}/train", est({"model": pid}))
    record(f"preset/{pid}/infer", est({"model": pid, "training": {"mode": "inference"}}))
    for eng in ("vllm", "sglang"):
        record(f"preset/{pid}/serve-{eng}", cli(["serve", "--json"], {"model": pid, "training": {"mode": "inference"},
                                                                       "serving": {"engine": eng}}))
# recipes through the CLI (plan_to_fit included)
for r in list_recipes():
    record(f"recipe/{r.id}/cli", cli(["estimate", "--json"], r.config))
    record(f"recipe/{r.id}/text", cli(["estimate"], r.config))
# the roofline's step time: each preset, each recipe, and attention variants (a restructure of speed/ shows here)
for pid in preset_ids():
    for mode in ("training", "inference"):
        record(f"roofline/preset/{pid}/{mode}", cli(["roofline", "--json"], {"model": pid, "training": {"mode": mode}}))
for r in list_recipes():
    record(f"roofline/recipe/{r.id}/json", cli(["roofline", "--json"], r.config))
    record(f"roofline/recipe/{r.id}/text", cli(["roofline"], r.config))
for model in ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3"):
    for attention in ("flash", "eager"):
        for mode in ("training", "inference"):
            for name, par in (("single", {}), ("cp2", {"cp": 2}), ("tp2", {"tp": 2})):
                cfg = {"model": model, "training": {"mode": mode, "attention": attention}, "parallel": par}
                record(f"roofline/attention/{model}/{attention}/{mode}/{name}", cli(["roofline", "--json"], cfg))
# every measured record the accuracy tests replay
for p in sorted((ROOT / "tests/data/measured").rglob("*.json")):
    d = json.loads(p.read_text())
    if isinstance(d, dict) and "config" in d:
        record(f"measured/{p.relative_to(ROOT)}", est(d["config"]))
# SGLang's records
from estimator.serving.sglang_engine import estimate_sglang
from estimator.spec.serving import Serving
from estimator.spec.parallel import Parallel
from estimator.spec.hardware import Hardware
for i, rec in enumerate(json.loads((ROOT / "tests/data/serving/sglang-0.5.23.json").read_text())["records"]):
    c = rec["case"]
    record(f"sglang/{i}", lambda c=c: repr(estimate_sglang(get_architecture(c["model"]), Serving(**c["serving"]),
                                       Parallel(tp=c["tp"], pp=c["pp"]), Hardware(c["gpu"]), get_hf_config(c["model"]))))
# guide_rl
from estimator.memory import references
for s in ("A", "B"):
    record(f"guide_rl/{s}", lambda s=s: repr(references.guide_rl(s)))
# field sweep: each option of each choice/bool field, and a few values of each number, on base configs
bases = {r: get_recipe(r).config for r in ("llama-3.1-8b-full-ft-8xa100", "llama-3.1-70b-pretrain-64xh100",
                                           "deepseek-v3-as-reported", "llama-3.1-8b-lora-24gb",
                                           "qwen2-7b-grpo-8xh100", "qwen2.5-7b-grpo-slime-4xh100")}
bases["nemotron"] = {"model": "nemotron-h-8b", "parallel": {"pp": 2, "dp": 2}}
bases["gemma-vl"] = {"model": "gemma-3-27b", "training": {"images_per_sample": 2}, "parallel": {"tp": 2}}
serving_bases = {e: {"model": "qwen3-30b-a3b", "training": {"mode": "inference"}, "serving": {"engine": e}}
                 for e in ("vllm", "sglang")}


def values(f):
    if f.kind == "bool": return [True, False]
    if f.kind == "choice": return list(f.options)
    if f.kind == "choices": return [[o] for o in f.options] + [list(f.options)]
    if f.kind == "int": return sorted({v for v in (f.min, 2, 3, 8) if v is not None})
    if f.kind == "float": return sorted({v for v in (f.min, 0.5, 1.0) if v is not None})
    return []


for f in SETTINGS:
    for bname, base in bases.items():
        for v in values(f):
            record(f"sweep/{bname}/{f.path}={v}", est(put(copy.deepcopy(base), f.path, v)))
for f in SERVING_FIELDS:
    for bname, base in serving_bases.items():
        for v in values(f):
            record(f"serve-sweep/{bname}/{f.path}={v}", cli(["serve", "--json"], put(copy.deepcopy(base), f.path, v)))
json.dump(out, open(sys.argv[1], "w"), indent=0, sort_keys=True)
print(len(out), "outputs", round(time.time() - t0), "s", sum(v.startswith("E:") for v in out.values()))
