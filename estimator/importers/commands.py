"""The ``import`` and ``check`` commands (CONTRACT.md "Additions: launch configurations").

    python -m estimator import FILE|- [--from KIND] [--gpus N] [--gpu ID] [-- COMMAND LINE...]
    python -m estimator check FILE|- [--from KIND] [--gpu ID] [--gpus N] [--allow-tight] [--json]

``import`` prints our JSON config on stdout. ``check`` prints one line per pipeline stage and the
verdict, and exits 0 when the run fits, 1 when it does not (out of memory, or tight unless
``--allow-tight``). Both print the settings they ignored, did not model or did not know on stderr,
one a line. Words after ``--`` are a command line to read (without FILE) or the framework's own
flags given beside FILE, which win over the file's.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..spec.errors import ConfigError

GiB = 1024**3
COMMANDS = ("import", "check")


def split_tail(argv: list[str]) -> tuple[list[str], list[str]]:
    """The words before and after the first ``--`` of an import/check command line."""
    if argv and argv[0] in COMMANDS and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def add_commands(sub) -> None:
    """Add ``import`` and ``check`` to the CLI's subcommands."""
    from . import KINDS
    for name, text in (("import", "read a launch configuration (a framework's config file or command line) into a "
                                  "JSON config"),
                       ("check", "estimate a launch configuration and exit 0 when it fits, 1 when it does not")):
        cmd = sub.add_parser(name, help=text, description=text + "; words after -- are a command line, or flags "
                                                                 "that win over the file's")
        cmd.add_argument("file", nargs="?", help="the file, - for standard input (or none, with a command after --)")
        cmd.add_argument("--from", dest="kind", choices=KINDS, help="the kind of file (guessed when not given)")
        cmd.add_argument("--gpus", type=int, help="the world size, where the file leaves it to the launcher")
        cmd.add_argument("--gpu", help="the GPU to check against (python -m estimator gpus lists them)")
        cmd.add_argument("--training-args", metavar="FILE", help="deepspeed, accelerate: the Trainer's arguments "
                         "(TrainingArguments or a TRL config: JSON, YAML or command-line flags)")
        cmd.add_argument("--peft", metavar="FILE", help="deepspeed, accelerate: a PEFT LoraConfig (JSON or YAML)")
        if name == "check":
            cmd.add_argument("--allow-tight", action="store_true", help="exit 0 for a tight fit too")
            cmd.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
            cmd.set_defaults(handler=_cmd_check)
        else:
            cmd.set_defaults(handler=_cmd_import)


def _imported(args: argparse.Namespace):
    from . import import_config, load
    tail = list(getattr(args, "tail", []))
    if args.file is None:
        if not tail:
            raise ConfigError("file", None, "a file, - for standard input, or a command line after --", "missing")
        import shlex
        text, name, overrides = shlex.join(tail), "", ()
    else:
        text, name = load(args.file)
        overrides = tuple(tail)
    from .source import read_text
    extra = {k: read_text(v) for k, v in (("training_args", args.training_args), ("peft", args.peft)) if v is not None}
    return import_config(text, args.kind, name=name, gpus=args.gpus, gpu=args.gpu, overrides=overrides, **extra)


def _warn(imported) -> None:
    for line in imported.warning_lines():
        print(" ".join(line.split()), file=sys.stderr)


def _cmd_import(args: argparse.Namespace) -> int:
    imported = _imported(args)
    print(json.dumps(imported.config, indent=2))
    _warn(imported)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from . import estimate_imported
    imported = _imported(args)
    result = estimate_imported(imported)
    verdict = result.fit.verdict
    if args.json:
        out = result.to_json()
        out["launch"] = {k: v for k, v in imported.to_json().items() if k != "config"}
        out["launch"]["config"] = imported.config
        print(json.dumps(out))
    else:
        print(stage_lines(result))
    _warn(imported)
    return 0 if verdict == "fits" or (verdict == "tight" and args.allow_tight) else 1


def stage_lines(result) -> str:
    """One line per pipeline stage, then the verdict."""
    cap = result.fit.capacity_bytes
    lines = [f"stage {s.stage}: {s.layers} layers, {s.device_total_bytes / GiB:.2f} GiB of {cap / GiB:.1f} GiB "
             f"({s.device_total_bytes / cap:.0%}), peak in {s.peak_phase}" for s in result.stages]
    lines.append(f"{result.fit.verdict.upper()} on {result.fit.gpu}: {result.device_total_bytes / GiB:.2f} GiB at the "
                 f"peak (stage {result.peak_stage}), {result.fit.utilization:.0%} of capacity")
    return "\n".join(lines)


def emit_plan(args: argparse.Namespace, cfg, result) -> int:
    """``plan --emit KIND``: the fastest fitting layout that KIND can express, written as its launch
    configuration on stdout; exit 1 (and the planner's answer on stderr) when no layout fits, 2 with
    the first reason when KIND can express none of them."""
    from ..spec.config import Config
    from ..search.planner import no_fit_text
    from .emit import emit
    if not result.layouts:
        print(no_fit_text(result), file=sys.stderr)
        return 1
    first_refusal = None
    for layout in result.layouts:  # fastest first: the first that the framework can express
        config = Config(cfg.architecture, layout.training, layout.parallel, cfg.hardware, cfg.model).to_dict()
        try:
            text = emit(args.emit, config, args.gpus_per_node)
        except ConfigError as exc:
            first_refusal = first_refusal or exc
            text = _with_liger(args, cfg, layout)
            if text is None:
                continue
        print(text, end="")
        return 0
    raise first_refusal


def _with_liger(args: argparse.Namespace, cfg, layout) -> str | None:
    """LLaMA-Factory states no fused loss but Liger's defaults (enable_liger_kernel: training.liger_kernel and, in
    the pt and sft stages, its fused linear cross-entropy, importers/liger.py): a layout the planner gave a fused or
    chunked loss, written with Liger's kernels where its own estimate is no larger (so it fits as the layout did);
    None where that does not hold or the model's Liger patch is refused."""
    from dataclasses import replace

    from ..memory.memory import device_total
    from ..spec.config import Config
    from .emit import emit
    tr = layout.training
    if args.emit != "llama-factory" or tr.loss == "standard" or tr.liger_kernel:
        return None
    liger = replace(tr, liger_kernel=True, loss="chunked" if tr.rl is None else "standard")
    try:
        total = device_total(cfg.architecture, liger, layout.parallel, cfg.hardware)
        if total > layout.device_total_bytes:
            return None
        config = Config(cfg.architecture, liger, layout.parallel, cfg.hardware, cfg.model).to_dict()
        text = emit(args.emit, config, args.gpus_per_node)
    except ConfigError:
        return None
    print(f"layout with the planner's {tr.loss!r} loss written with Liger's kernels (enable_liger_kernel): "
          f"{total / 2**30:.2f} GiB per GPU, the layout's {layout.device_total_bytes / 2**30:.2f}", file=sys.stderr)
    return text
