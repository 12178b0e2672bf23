"""Command line: ``python -m estimator estimate --config FILE [--json]``, ``presets``, ``gpus``.

Bad input prints one line on stderr naming the field, the value and what is allowed, and exits
with status 2; nothing goes to stdout then.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from .errors import ConfigError
from .hardware import GPUS
from .parallel import Parallel
from .training import Training
from .hardware import Hardware

GiB = 1024**3
SECTION_CLASSES = (("training", Training), ("parallel", Parallel), ("hardware", Hardware))


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every bad input
        raise _ArgumentError(message)


def _parse_value(text: str, annotation: str, flag: str):
    kind = annotation.replace(" ", "")
    if kind.startswith("bool"):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(flag, text, "true or false")
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(flag, text, "an integer") from None
    if kind.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(flag, text, "a number") from None
    return text


def _override_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("field overrides (any field of training, parallel, hardware)")
    for section, cls in SECTION_CLASSES:
        for f in fields(cls):
            group.add_argument("--" + f.name.replace("_", "-"), dest=f"{section}.{f.name}", metavar="VALUE",
                               default=None, help=f"{section}.{f.name}")


def _apply_overrides(config: dict, args: argparse.Namespace) -> dict:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for section, cls in SECTION_CLASSES:
        for f in fields(cls):
            text = getattr(args, f"{section}.{f.name}")
            if text is None:
                continue
            value = _parse_value(text, str(f.type), f"{section}.{f.name}")
            config.setdefault(section, {})
            if not isinstance(config[section], dict):
                raise ConfigError(section, config[section], "an object of fields")
            config[section][f.name] = value
    return config


def _gib(n: int) -> str:
    return f"{n / GiB:9.2f}"


def render_text(result) -> str:
    lines = []
    arch = result.architecture
    lines.append(f"Model: {arch.name}  parameters {result.parameters_total:,} (active {result.parameters_active:,})")
    par, tr = result.parallel, result.training
    lines.append(f"Layout: TP {par.tp}{' +SP' if par.sequence_parallel else ''}, PP {par.pp}"
                 f"{f' x VPP {par.vpp}' if par.vpp > 1 else ''}, DP {par.dp}, CP {par.cp}, EP {par.ep}, "
                 f"ZeRO {result.zero_stage} ({tr.framework}); {par.gpus} GPUs; {result.microbatches} micro-batches")
    lines.append(f"Step: {tr.mode}, seq {tr.seq_len}, micro-batch {tr.micro_batch_size}, {tr.optimizer}, "
                 f"recompute {tr.recompute}, {tr.attention} attention, loss {tr.loss}")
    for stage in result.stages:
        marker = "  <- peak" if stage.stage == result.peak_stage else ""
        lines.append("")
        lines.append(f"Stage {stage.stage}: {stage.layers} layers, peak in {stage.peak_phase}{marker}")
        lines.append(f"  {'component':<22}{'GiB':>9}  formula")
        for c in stage.components:
            lines.append(f"  {c.key:<22}{_gib(c.bytes)}  {c.formula}")
        lines.append(f"  {'allocated peak':<22}{_gib(stage.allocated_peak_bytes)}")
        lines.append(f"  {'device total':<22}{_gib(stage.device_total_bytes)}")
    fit = result.fit
    lines.append("")
    lines.append(f"Peak stage {result.peak_stage}: allocated {result.allocated_peak_bytes / GiB:.2f} GiB, "
                 f"device total {result.device_total_bytes / GiB:.2f} GiB")
    lines.append(f"Fit on {fit.gpu} ({fit.capacity_bytes / GiB:.1f} GiB): {fit.verdict.upper()} "
                 f"({fit.utilization:.0%} of capacity)")
    lines += [f"Note: {note}" for note in result.notes]
    return "\n".join(lines)


def _load(args: argparse.Namespace):
    from .config import load_config
    try:
        with open(args.config, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError("--config", args.config, "a readable JSON file", exc.strerror or "cannot read") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("--config", args.config, "valid JSON",
                          f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    data = _apply_overrides(data, args) if isinstance(data, dict) else data
    return load_config(data)


def _cmd_estimate(args: argparse.Namespace) -> int:
    from .advice import plan_to_fit
    from .memory import estimate
    cfg = _load(args)
    result = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    plan = plan_to_fit(cfg) if result.fit.verdict != "fits" else []
    if args.json:
        out = result.to_json()
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
                text += (f"\n  {i}. {s.description}: {s.device_total_bytes / GiB:.2f} GiB, {s.verdict}"
                         + (f" on {s.gpus} GPUs" if s.gpus != cfg.parallel.gpus else ""))
        print(text)
    return 0


def _cmd_roofline(args: argparse.Namespace) -> int:
    from .roofline import render_roofline_text, roofline_config
    result = roofline_config(_load(args))
    print(json.dumps(result.to_json()) if args.json else render_roofline_text(result))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from .presets import list_presets
    for p in list_presets():
        print(p.id)
    return 0


def _cmd_gpus(args: argparse.Namespace) -> int:
    for gpu in GPUS.values():
        print(f"{gpu.id:<12} {gpu.capacity_bytes / GiB:7.1f} GiB  {gpu.name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llm-memory", description="GPU memory per pipeline stage for LLM training and inference")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    est = sub.add_parser("estimate", help="estimate the memory of a configuration")
    est.add_argument("--config", required=True, help="a JSON config (see CONTRACT.md)")
    est.add_argument("--json", action="store_true", help="print one JSON object")
    _override_flags(est)
    est.set_defaults(handler=_cmd_estimate)
    roof = sub.add_parser("roofline", help="per-operation roofline and step time of a configuration")
    roof.add_argument("--config", required=True)
    roof.add_argument("--json", action="store_true")
    _override_flags(roof)
    roof.set_defaults(handler=_cmd_roofline)
    sub.add_parser("presets", help="list the bundled model ids").set_defaults(handler=_cmd_presets)
    sub.add_parser("gpus", help="list the GPU catalog").set_defaults(handler=_cmd_gpus)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except _ArgumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader (`| head`) closed the pipe: not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # never a traceback for the user; a bug is still reported as one line
        print(f"error: internal error ({type(exc).__name__}: {exc}); please report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
