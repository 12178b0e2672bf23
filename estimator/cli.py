"""Command line: ``python -m estimator estimate --config FILE [--json]``, ``presets``, ``gpus``.

Bad input prints one line on stderr naming the field, the value and what is allowed, and exits
with status 2; nothing goes to stdout then.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

from .spec.errors import REDACTED, ConfigError, looks_secret, redact
from .spec.adapter import base_dtype as adapter_base_dtype
from .spec.fields import SERVING_FIELDS, SETTINGS
from .spec.values import parse_text, set_in
from .spec.gpus import GPUS
from .spec.wording import counted, verdict_word

GiB = 1024**3


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every bad input
        raise _ArgumentError(message)


def _override_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("field overrides (any field of training, parallel, hardware; "
                                      "docs/config.md lists them)")
    for f in SETTINGS:
        group.add_argument(f.flag, dest=f.path, metavar="VALUE", default=None, help=f"{f.label}: {f.allowed()}")


def _serving_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving fields (the config's serving object; docs/config.md lists them)")
    for f in SERVING_FIELDS:
        group.add_argument(f.flag, dest=f.path, metavar="VALUE", default=None, help=f"{f.label}: {f.allowed()}")


def _apply_overrides(config: dict, args: argparse.Namespace) -> dict:
    """Each given flag's text parsed as its field's type (estimator/spec/fields.py) into its section."""
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for f in SETTINGS + SERVING_FIELDS:
        text = getattr(args, f.path, None)
        if text is None:
            continue
        set_in(config, f, parse_text(f, text))
    return config


def _gib(n: int) -> str:
    return f"{n / GiB:9.2f}"


def _framework_text(result) -> str:
    """The framework and, where its rules are versioned, the release they come from."""
    release = result.framework_release_json()["framework_release"]
    return f"{result.training.framework}, {release}" if release else result.training.framework


def render_text(result) -> str:
    lines = []
    arch = result.architecture
    trainable = (f", trainable {result.parameters_trainable:,}"
                 if result.parameters_trainable not in (0, result.parameters_total) else "")
    lines.append(f"Model: {arch.name}  parameters {result.parameters_total:,} (active {result.parameters_active:,}"
                 f"{trainable})")
    tr = result.training
    if tr.adapter:
        a = tr.adapter
        lines.append(f"Adapter: {a.method}, rank {a.rank}, targets {', '.join(a.target_modules)}, base "
                     f"{adapter_base_dtype(a, tr.param_dtype)}, dropout {a.dropout:g}"
                     + (", embeddings and LM head trained" if a.trainable_embeddings else ""))
    par, tr = result.parallel, result.training
    lines.append(f"Layout: TP {par.tp}{' +SP' if par.sequence_parallel else ''}, PP {par.pp}"
                 f"{f' x VPP {par.vpp}' if par.vpp > 1 else ''}, DP {par.dp}, CP {par.cp}, EP {par.ep}, "
                 f"ZeRO {result.zero_stage} ({_framework_text(result)}); {counted(par.gpus, 'GPU')}; "
                 f"{counted(result.microbatches, 'micro-batch')}")
    lines.append(f"Step: {tr.mode}, seq {tr.seq_len}, micro-batch {tr.micro_batch_size}, {tr.optimizer}, "
                 f"recompute {tr.recompute}, {tr.attention} attention, loss {tr.loss}")
    for stage in result.stages:
        marker = "  <- peak" if stage.stage == result.peak_stage else ""
        lines.append("")
        lines.append(f"Stage {stage.stage}: {stage.layers} layers, peak in {stage.peak_phase}{marker}")
        lines.append(f"  {'component':<22}{'GiB':>9}  formula")
        for c in stage.components:
            lines.append(f"  {c.key:<22}{_gib(c.bytes)}  {c.formula}")
        lines.append(f"  {'allocated peak':<22}{_gib(stage.allocated_peak_bytes)}  torch.cuda.max_memory_allocated")
        lines.append(f"  {'reserved peak':<22}{_gib(stage.reserved_peak_bytes)}  torch.cuda.max_memory_reserved")
        lines.append(f"  {'device total':<22}{_gib(stage.device_total_bytes)}  nvidia-smi")
    fit = result.fit
    lines.append("")
    lines += _rl_lines(result)
    lines.append(f"{peak_text(result)}: allocated {result.allocated_peak_bytes / GiB:.2f} GiB, "
                 f"reserved {result.reserved_peak_bytes / GiB:.2f} GiB, "
                 f"device total {result.device_total_bytes / GiB:.2f} GiB")
    lines.append(f"Fit on {fit.gpu} ({fit.capacity_bytes / GiB:.1f} GiB): {verdict_word(fit.verdict)} "
                 f"({fit.utilization:.0%} of capacity)")
    lines += _host_lines(result)
    lines += [f"Note: {note}" for note in result.notes]
    return "\n".join(lines)


def peak_text(result) -> str:
    """Where the totals come from: the peak stage, or for an RL run the largest phase of its step
    (memory._rl_estimate: that phase decides the fit; the stages show the training phase)."""
    if result.rl_phases:
        peak = max(result.rl_phases, key=lambda p: p.device_total_bytes)
        return f"Largest RL phase, {peak.name}"
    return f"Peak stage {result.peak_stage}"


def _rl_lines(result) -> list[str]:
    """RL: each phase of the step on the busiest GPU, its components and its device total."""
    lines = []
    for phase in result.rl_phases:
        lines += ["", f"RL phase {phase.name}: device total {phase.device_total_bytes / GiB:.2f} GiB"]
        lines += [f"  {c.key:<22}{_gib(c.bytes)}  {c.formula}" for c in phase.components]
    return lines + ([""] if lines else [])


def _host_lines(result) -> list[str]:
    """Offloaded states: the host memory (and NVMe) each GPU's process needs."""
    stage = result.host_stage
    if not stage.host and not stage.nvme:
        return []
    lines = [f"Host memory per GPU process (stage {stage.stage}): {stage.host_bytes / GiB:.2f} GiB"
             + (f"; NVMe {stage.nvme_bytes / GiB:.2f} GiB" if stage.nvme else "")]
    for where, parts in (("host", stage.host), ("nvme", stage.nvme)):
        lines += [f"  {where:<5}{_gib(c.bytes)}  {c.label}: {c.formula}" for c in parts]
    return lines


MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config is a few KB; a larger file is not one (and is not read)


# `estimate`'s search for the nearest fitting layout (search/advice.py): a trillion-parameter model asked on one GPU
# searches two plans (the user's GPUs, then the fewest that fit) for 20-30 s on one core; the answer comes within this
ADVICE_BUDGET_S = 10.0
STDIN = "-"  # --config -: the JSON comes on standard input (`... | llm-memory estimate --config -`)


def _read_config(path: str) -> str:
    """The config file's text (standard input's for ``-``); bad input (unreadable, too large, not
    UTF-8) as a ConfigError."""
    try:
        if path == STDIN:
            too_large, raw = False, sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)  # bounded as a pipe is below
        else:
            with open(path, "rb") as fh:
                too_large = os.fstat(fh.fileno()).st_size > MAX_CONFIG_BYTES  # then refused unread
                raw = b"" if too_large else fh.read(MAX_CONFIG_BYTES + 1)  # bounded: a pipe or device has size 0
    except OSError as exc:
        raise ConfigError("--config", path, "a readable JSON file", exc.strerror or "cannot read") from None
    if too_large or len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("--config", path, f"a JSON file of at most {MAX_CONFIG_BYTES // 2**20} MiB", "too large")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", path, "a UTF-8 encoded JSON file",
                          f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def _parse_json(text: str, path: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("--config", path, "valid JSON",
                          f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError:  # json parses integers with int(), which refuses more than 4300 digits
        raise ConfigError("--config", path, "valid JSON with integers of at most "
                          f"{sys.get_int_max_str_digits()} digits", "an integer too long to read") from None


def _load(args: argparse.Namespace):
    from .models.loading import load_config
    text = _read_config(args.config)
    try:
        data = _parse_json(text, args.config)
        data = _apply_overrides(data, args) if isinstance(data, dict) else data
        return load_config(data)
    except RecursionError:  # json.loads or a later walk of the data: nesting deeper than the stack
        raise ConfigError("--config", args.config, "JSON nested a few hundred levels deep at most",
                          "nested too deeply") from None


def _cmd_estimate(args: argparse.Namespace) -> int:
    from .search.advice import plan_to_fit
    from .search.watch import Watch
    from .memory.memory import estimate
    budget = _time_budget(args.time_budget)
    cfg = _load(args)
    serving = _serving_result(cfg) if cfg.serving is not None else None  # its input refused before any search
    result = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    watch = Watch(budget_s=budget)
    plan = plan_to_fit(cfg, watch=watch) if result.fit.verdict != "fits" else []
    if watch.reason:
        print(f"note: the planner's search for the nearest fitting layout stopped after {budget:g} s "
              "(--time-budget); the plan below is what was found by then", file=sys.stderr)
    if args.json:
        out = result.to_json()
        if serving is not None:
            out["serving"] = serving.to_json()
        if plan:  # an optional key: what to change, step by step, when the run does not fit comfortably
            out["plan_to_fit"] = [{"change": s.description, "config": s.config.to_dict(),
                                   "device_total_bytes": s.device_total_bytes, "verdict": s.verdict,
                                   "gpus": s.gpus} for s in plan]
        print(json.dumps(out))
    else:
        text = render_text(result)
        if plan:
            text += "\nWhat to change (each step a full estimate, applied one after another):"
            for i, s in enumerate(plan, 1):
                text += (f"\n  {i}. {s.description}: {s.device_total_bytes / GiB:.2f} GiB, {verdict_word(s.verdict)}"
                         + (f" on {counted(s.gpus, 'GPU')}" if s.gpus != cfg.parallel.gpus else ""))
        if serving is not None:
            from .serving.service import render_text as render_serving
            text += "\n\n" + render_serving(serving, cfg.parallel.dp)
        print(text)
    return 0


def _serving_result(cfg):
    from .serving.service import serving_config
    return serving_config(cfg)


def _time_budget(budget: float) -> float:
    if not 0 < budget < float("inf"):
        raise ConfigError("--time-budget", budget, "a positive number of seconds")
    return budget


def _cmd_serve(args: argparse.Namespace) -> int:
    from .memory.memory import estimate
    from .serving.service import render_text as render_serving
    cfg = _load(args)
    if args.emit:
        from .importers.emit import emit
        print(emit(args.emit, cfg.to_dict()), end="")
        return 0
    serving = _serving_result(cfg)
    if args.json:
        out = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware).to_json()
        out["serving"] = serving.to_json()
        print(json.dumps(out))
    else:
        print(render_serving(serving, cfg.parallel.dp))
    return 0


def _cmd_serve_plan(args: argparse.Namespace) -> int:
    from .serving.planner import render_plan_text, serve_plan
    from .spec.serving import Serving
    cfg = _load(args)
    from .serving.service import checkpoint_of
    plan = serve_plan(cfg.architecture, cfg.serving or Serving(), cfg.hardware, args.users, args.context,
                      checkpoint_of(cfg.model), args.gpus_per_node, args.limit)
    print(json.dumps(plan.to_json()) if args.json else render_plan_text(plan))
    return 0


def _cmd_roofline(args: argparse.Namespace) -> int:
    from .speed.roofline import render_roofline_text, roofline_config
    result = roofline_config(_load(args))
    print(json.dumps(result.to_json()) if args.json else render_roofline_text(result))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from .search.planner import no_fit_text, plan, render_plan_text
    from .search.watch import Watch
    budget = None if args.time_budget is None else _time_budget(args.time_budget)
    cfg = _load(args)
    result = plan(cfg.architecture, cfg.training, cfg.hardware, args.gpus, args.gpus_per_node, args.margin,
                  comm_overlap=cfg.parallel.comm_overlap, limit=args.limit, watch=Watch(budget_s=budget))
    if args.emit:  # the fastest fitting layout as the framework's launch configuration (importers/emit.py)
        from .importers.commands import emit_plan
        return emit_plan(args, cfg, result)
    print(json.dumps(result.to_json()) if args.json else render_plan_text(result))
    if not result.layouts:  # an answer, not an error: exit 0, the way out on stderr
        print(no_fit_text(result), file=sys.stderr)
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    """One line per bundled model: id, name, the publisher's count and the estimator's (labelled:
    they differ where the publisher counts otherwise, which the last column says), family."""
    from .spec.architecture import parameter_counts
    from .models.presets import counting_note, get_architecture, get_hf_config, list_presets
    rows = []
    for p in list_presets():
        computed = parameter_counts(get_architecture(p.id))
        active = computed.active if computed.active != computed.total else None
        rows.append((p.id, p.name, "published " + _billions(p.published_total, p.published_active),
                     "computed " + _billions(computed.total, active), get_hf_config(p.id).get("model_type", ""),
                     counting_note(p)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4]
        print(line + (" " * (widths[4] - len(row[4])) + f"  ({row[5]})" if row[5] else ""))
    return 0


def _billions(total: int, active: int | None) -> str:
    """The published parameter count, "8.03B"; a mixture of experts also shows its active count."""
    text = f"{total / 1e9:.2f}B"
    return f"{text} ({active / 1e9:.2f}B active)" if active else text


def _cmd_gpus(args: argparse.Namespace) -> int:
    for gpu in GPUS.values():
        print(f"{gpu.id:<12} {gpu.capacity_bytes / GiB:7.1f} GiB  {gpu.name}")
    return 0


def _cmd_fields(args: argparse.Namespace) -> int:
    from .spec.fields import ALL
    from .spec.reference import reference_markdown
    if args.markdown:
        print(reference_markdown())
        return 0
    for f in ALL:
        print(f"{f.path:<42} {f.label:<34} {f.allowed()}")
    return 0


# what --help points at: the repository's own pages (README.md's "Command line", docs/config.md)
CONFIG_HELP = ("a JSON config file, or - for standard input: {\"model\": ..., \"training\": {...}, \"parallel\": "
               "{...}, \"hardware\": {...}}; docs/config.md describes every field, README.md the format")


def build_parser() -> argparse.ArgumentParser:
    from .importers.emit import EMIT_KINDS, SERVE_EMIT_KINDS
    parser = _Parser(prog="llm-memory", description="GPU memory per pipeline stage for LLM training and inference")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    est = sub.add_parser("estimate", help="estimate the memory of a configuration")
    est.add_argument("--config", required=True, help=CONFIG_HELP)
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.add_argument("--time-budget", type=float, default=ADVICE_BUDGET_S, metavar="SECONDS",
                     help="when the run does not fit, the most seconds the planner may search for the nearest "
                          f"fitting layout (default {ADVICE_BUDGET_S:g}; then what it found by then, with a note)")
    _override_flags(est)
    _serving_flags(est)
    est.set_defaults(handler=_cmd_estimate)
    srv = sub.add_parser("serve", help="serving capacity on vLLM/SGLang: KV cache, concurrency, longest context")
    srv.add_argument("--config", required=True, help="a JSON config with an optional serving object")
    srv.add_argument("--json", action="store_true", help="print one JSON object")
    srv.add_argument("--emit", choices=SERVE_EMIT_KINDS, help="print the configuration as that engine's serve "
                     "command line (read back through its importer before it is printed)")
    _override_flags(srv)
    _serving_flags(srv)
    srv.set_defaults(handler=_cmd_serve)
    sp = sub.add_parser("serve-plan", help="N users at context L: the fewest GPUs and their layouts")
    sp.add_argument("--config", required=True, help="a JSON config: the model, GPU and serving object")
    sp.add_argument("--users", required=True, type=int, help="concurrent sequences to serve")
    sp.add_argument("--context", required=True, type=int, help="tokens per sequence (max_model_len)")
    sp.add_argument("--gpus-per-node", type=int, default=8, help="TP stays within one node (default 8)")
    sp.add_argument("--limit", type=int, default=10, help="options listed (default 10)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    _override_flags(sp)
    _serving_flags(sp)
    sp.set_defaults(handler=_cmd_serve_plan)
    roof = sub.add_parser("roofline", help="per-operation roofline and step time of a configuration")
    roof.add_argument("--config", required=True, help=CONFIG_HELP)
    roof.add_argument("--json", action="store_true")
    _override_flags(roof)
    roof.set_defaults(handler=_cmd_roofline)
    pl = sub.add_parser("plan", help="every parallel layout on N GPUs: those that fit, fastest first")
    pl.add_argument("--config", required=True, help=CONFIG_HELP + "; the planner reads its model, training setup "
                    "and GPU")
    pl.add_argument("--gpus", required=True, type=int, help="number of GPUs")
    pl.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node; TP stays within one (default 8)")
    pl.add_argument("--margin", type=float, default=0.8,
                    help="largest share of the GPU's memory a layout may use (default 0.8: the 'fits' verdict)")
    pl.add_argument("--limit", type=int, default=50, help="fastest fitting layouts listed, besides the Pareto front")
    pl.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="stop the search after this many seconds and list the best layouts found, with a note of "
                         "what was not searched (default: no limit)")
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.add_argument("--emit", choices=EMIT_KINDS, help="print the fastest fitting layout that framework can express "
                    "as its launch configuration (read back through its importer before it is printed)")
    _override_flags(pl)
    pl.set_defaults(handler=_cmd_plan)
    sub.add_parser("presets", help="list the bundled model ids").set_defaults(handler=_cmd_presets)
    sub.add_parser("gpus", help="list the GPU catalog").set_defaults(handler=_cmd_gpus)
    ref = sub.add_parser("fields", help="every configuration field with its label and allowed values")
    ref.add_argument("--markdown", action="store_true", help="print docs/config.md")
    ref.set_defaults(handler=_cmd_fields)
    from .importers.commands import add_commands  # import, check: launch configurations (importers/)
    add_commands(sub)
    return parser


def _say(message: str, argv: list[str], field: str = "") -> None:
    """One line on stderr that never shows a credential: an argument that looks like one is
    replaced wherever a message quotes it, and a line that still looks like one is withheld."""
    for token in argv:
        if looks_secret(token):
            message = message.replace(token, REDACTED)
    line = " ".join(message.split())
    if looks_secret(line):  # the field name itself may be a key the user typed
        line = f"{field}: {REDACTED}" if field and not looks_secret(field) else REDACTED
    print(f"error: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        from .importers.commands import split_tail
        head, tail = split_tail(argv)  # import/check: the words after -- are a launch command line
        args = build_parser().parse_args(head)
        args.tail = tail
        return args.handler(args)
    except ConfigError as exc:
        _say(str(exc), argv, exc.field)
        return 2
    except _ArgumentError as exc:
        _say(str(exc), argv)
        return 2
    except BrokenPipeError:  # the reader (`| head`) closed the pipe: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # never a traceback for the user; a bug is still reported as one line
        detail = redact(" ".join(str(exc).split()))[:300]  # it may carry a whole input, or a token
        _say(f"internal error ({type(exc).__name__}: {detail}); please report it", argv)
        return 1


def run() -> None:
    """The command's entry point (`python -m estimator`, `llm-memory`): `main`, then out at once.
    A plan leaves the estimator's memos holding millions of small records (estimator/spec/memo.py);
    freeing them one by one as the interpreter exits took seconds after the answer was printed
    (DeepSeek-V3 on 2,048 GPUs: 4 s), and the operating system takes the process back whole. For
    the same reason the cyclic garbage collector stays off in this one-shot process: the planner
    pauses it for its search (planner._cyclic_gc_paused), and switching it back on made its first
    collection walk every record the memos had gathered (about 1 s of a DeepSeek-V3 plan's CPU) for
    a process about to end; one command's objects in cycles are a bounded few, freed with the process."""
    gc.disable()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
