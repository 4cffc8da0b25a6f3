"""The ``layerwatch`` command line: argument parsing and dispatch, nothing heavy.

``layerwatch --help`` must start fast (msit's CLI needs 2.1-2.5 s): this module imports only
the standard library; each command imports its implementation (and torch or Textual, if it
needs them) when it runs. A user error prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
SIDES = ("golden", "target")

_HANDLERS: dict[str, str] = {
    "demo": "layerwatch.tui.demo:demo_main",
    "dump": "layerwatch.capture.dumpcmd:run_dump",
    "run": "layerwatch.tui.frontends:run_main",
    "watch": "layerwatch.tui.frontends:watch_main",
    "open": "layerwatch.tui.frontends:open_main",
    "compare": "layerwatch.engine.runner:compare_main",
    "badcase": "layerwatch.engine.badcase:badcase_main",
    "precheck": "layerwatch.engine.precheck:precheck_main",
    "scan": "layerwatch.engine.scan_report:scan_main",
    "allreduce": "layerwatch.engine.allreduce:allreduce_main",
    "weights": "layerwatch.engine.weights:weights_main",
    "serve": "layerwatch.tui.serve:serve_main",
}


def add_dump_pair(parser: argparse.ArgumentParser, suffix: str = "") -> None:
    """The two dumps, golden first (``GOLDEN``/``TARGET`` + ``suffix`` in the usage line)."""
    for side in SIDES:
        parser.add_argument(side, metavar=side.upper() + suffix)


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """Options that mirror :class:`layerwatch.capture.DumpConfig`."""
    group = parser.add_argument_group("capture options (as DumpConfig)")
    group.add_argument(
        "--tokens", metavar="SPEC", help="tokens to dump, e.g. 0-31 or 0-7,12 (default: all)"
    )
    group.add_argument(
        "--part",
        choices=("in", "out", "both"),
        default="both",
        help="tensor_part: inputs, outputs or both",
    )
    group.add_argument(
        "--layers", metavar="GLOB", help="only nodes whose name matches (layer_name)"
    )
    group.add_argument(
        "--stats-only", action="store_true", help="statistics only, no tensor payloads"
    )
    group.add_argument(
        "--last-logits", action="store_true", help="dump only the logits of each token"
    )
    group.add_argument(
        "--format", choices=("layerwatch", "msit"), default="layerwatch", help="dump layout"
    )
    group.add_argument("--seed", type=int, help="seed_all(SEED) in the child before it runs")
    group.add_argument(
        "--weights",
        action="store_true",
        help="also dump every parameter once (dump_weight; `layerwatch precheck` needs them)",
    )
    group.add_argument(
        "--stats-first",
        action="store_true",
        help="statistics of every tensor, payloads only for the last tokens and around anomalies",
    )
    group.add_argument(
        "--keep-tokens",
        type=int,
        metavar="N",
        help="with --stats-first: keep payloads of the last N tokens (default 8)",
    )


def add_watch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--poll",
        action="store_true",
        help="poll the file system (NFS, Lustre, GPFS) instead of inotify",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.25,
        metavar="S",
        help="seconds between polls (default 0.25)",
    )


def add_compare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--map", metavar="FILE", help="name-mapping rules (TOML/JSON) or msit op_mapping_file.json"
    )
    parser.add_argument(
        "--auto-map",
        action="store_true",
        help="pair modules by identical weights when names differ",
    )
    parser.add_argument(
        "--thresholds", metavar="FILE", help="thresholds TOML overriding the defaults"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="compare processes (default 0: this one and one per core the load leaves idle)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="a sub-graph on purpose: mostly unpaired tensors are not a mismatch (exit 2)",
    )


def add_report_options(
    parser: argparse.ArgumentParser, csv: str = "", when: str = "", parquet: bool = False
) -> None:
    """``-o FILE`` (the format its suffix names: engine/outcome.py) and ``--json``, as every
    headless command takes them; ``csv`` says what the CSV holds, ``when`` qualifies both."""
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help=f"{when}write the report: .csv{f' ({csv})' if csv else ''}, .json, .jsonl"
        + (" or .parquet" if parquet else ""),
    )
    parser.add_argument(
        "--json", action="store_true", help=f"{when}print one JSON object to stdout"
    )


def add_live_report_options(parser: argparse.ArgumentParser, *, idle: bool = True) -> None:
    """Headless report options of run/watch/open (as ``compare``), and the attach idle rule."""
    add_report_options(parser, when="with --headless: ", parquet=True)
    if idle:
        parser.add_argument(
            "--idle",
            type=float,
            default=30.0,
            metavar="S",
            help="an attached dump is finished after S seconds without new files (default 30), or at its end marker",
        )


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo", help="run the demo model twice (golden, faulty target) and watch the grid"
    )
    demo.add_argument(
        "--fault",
        default=None,
        metavar="NAME",
        help="fault injected into the target (see --list-faults)",
    )
    demo.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="target dtype (golden is fp32)",
    )
    demo.add_argument(
        "--new-tokens", type=int, default=None, metavar="N", help="tokens to generate"
    )
    demo.add_argument("--list-faults", action="store_true", help="list the named faults and exit")
    demo.add_argument(
        "--out", metavar="DIR", help="keep the dumps here (default: a temporary directory)"
    )
    demo.add_argument(
        "--headless", action="store_true", help="print results instead of opening the TUI"
    )


def _add_dump(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dump = sub.add_parser("dump", help="run an inference command unmodified with capture on")
    dump.add_argument("--out", required=True, metavar="DIR", help="dump directory")
    add_capture_options(dump)
    dump.add_argument(
        "--dumper",
        choices=("layerwatch", "msit"),
        default="layerwatch",
        help="msit: launch `msit llm dump` (Ascend ATB)",
    )
    dump.add_argument(
        "--follow",
        metavar="GOLDEN_DUMP",
        help="teacher forcing: feed the target the golden dump's token at every step",
    )
    dump.add_argument(
        "--cases",
        metavar="BADCASES.json",
        help="capture only these cases (layerwatch badcase --json output, or a JSON list of keys)",
    )
    dump.add_argument("--shell", action="store_true", help="run COMMAND through /bin/sh")
    dump.add_argument(
        "--scan",
        action="store_true",
        help="scan tensors as they land (NaN, Inf, saturation, all-zero, jump; see `scan`)",
    )
    dump.add_argument(
        "--exit-on-anomaly",
        action="store_true",
        help="with --scan: stop COMMAND at the first anomaly (msit errcheck --exit)",
    )
    dump.add_argument(
        "--scan-output",
        metavar="FILE",
        help="with --scan: write the scan report (.csv, .json or .jsonl)",
    )
    add_scan_bounds(dump)
    dump.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="launch or attach to both sides and compare live")
    for side in SIDES:  # no golden side: the anomaly scan of the target, live
        group = run.add_mutually_exclusive_group(required=side == "target")
        group.add_argument(f"--{side}-cmd", metavar="CMD", help=f"{side} inference command")
        group.add_argument(
            f"--{side}", metavar="DIR", help=f"{side} dump directory (finished or being written)"
        )
    run.add_argument(
        "--out", metavar="DIR", help="where launched commands dump (default: ./layerwatch-run)"
    )
    run.add_argument("--shell", action="store_true", help="run the commands through /bin/sh")
    for side in SIDES:
        run.add_argument(
            f"--{side}-dumper",
            choices=("layerwatch", "msit"),
            default="layerwatch",
            help=f"msit: launch --{side}-cmd under `msit llm dump` (Ascend ATB)",
        )
    run.add_argument(
        "--headless", action="store_true", help="print progress lines instead of the TUI"
    )
    add_capture_options(run)
    add_watch_options(run)
    add_compare_options(run)
    add_live_report_options(run)
    add_scan_bounds(run)


def _add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = sub.add_parser(
        "watch",
        help="attach to two dumps being written by anything (one: its anomaly scan, no golden)",
    )
    watch.add_argument("golden", metavar="GOLDEN_DIR")
    watch.add_argument(
        "target", metavar="TARGET_DIR", nargs="?", help="without it: scan GOLDEN_DIR alone"
    )
    watch.add_argument(
        "--headless", action="store_true", help="print progress lines instead of the TUI"
    )
    add_watch_options(watch)
    add_compare_options(watch)
    add_live_report_options(watch)
    add_scan_bounds(watch)


def _add_open(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    open_ = sub.add_parser(
        "open",
        help="browse the comparison of two finished dumps, or one dump's precheck",
    )
    open_.add_argument("golden", metavar="GOLDEN_OR_DUMP")
    open_.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="without it: the precheck of GOLDEN_OR_DUMP alone (captured with --weights)",
    )
    open_.add_argument(
        "--headless", action="store_true", help="print the results instead of opening the TUI"
    )
    open_.add_argument(
        "--fake-quant",
        metavar="FQ_DUMP",
        help="a quantised model's fake-quant run: the grid shows the kernel part (FQ vs TARGET)",
    )
    add_compare_options(open_)
    add_live_report_options(open_, idle=False)


def _add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compare = sub.add_parser(
        "compare", help="compare two dumps headless: CSV/JSON report, exit 1 on failure"
    )
    add_dump_pair(compare)
    add_report_options(compare, "msit columns + verdicts", parquet=True)
    compare.add_argument("--tokens", metavar="SPEC", help="only these tokens, e.g. 0-7,12")
    compare.add_argument(
        "--fake-quant",
        metavar="FQ_DUMP",
        help="a quantised model's fake-quant run (dequantised weights, float kernels): each row"
        " splits into quantisation (GOLDEN vs FQ) and kernel (FQ vs TARGET) error, the verdict"
        " is the kernel part's",
    )
    compare.add_argument(
        "--nodes",
        metavar="GLOB",
        help="only nodes whose name matches, e.g. 'root.model.layers.3.*'",
    )
    compare.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="memory the compare may use, e.g. 8G (default: the free memory, MemAvailable)",
    )
    compare.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="compare each rank of a multi-rank TARGET on the Ray node that holds its rankN"
        " folder (HOST:PORT, ray://HOST:PORT or auto; needs layerwatch[ray]); the golden must"
        " be at the same path on those nodes",
    )
    add_compare_options(compare)


def _add_precheck(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    precheck = sub.add_parser(
        "precheck",
        help="recompute each operator of one dump in float64 from its own inputs and weights",
    )
    precheck.add_argument("dump", metavar="DUMP", nargs="?", help="a dump captured with --weights")
    add_report_options(precheck)
    precheck.add_argument("--tokens", metavar="SPEC", help="only these tokens, e.g. 0-7,12")
    precheck.add_argument(
        "--replay",
        action="store_true",
        help="no dump: run `-- COMMAND`, record each operator's input statistics, replay each"
        " distinct (operator, shape, dtype) on random inputs in its process at exit",
    )
    precheck.add_argument(
        "--out", metavar="DIR", help="with --replay: keep the run's log and results here"
    )
    precheck.add_argument("cmd", nargs="*", metavar="-- COMMAND ...")


def _add_badcase(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    badcase = sub.add_parser(
        "badcase",
        help="bad cases of two evaluation result files (msit bcanalyze): exit 1 when some",
    )
    badcase.add_argument("golden", metavar="GOLDEN_EVAL", help="golden results: .csv/.jsonl/.json")
    badcase.add_argument("target", metavar="TARGET_EVAL", help="target results, same dataset")
    add_report_options(badcase, "msit bcanalyze columns")


def _add_scan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    scan = sub.add_parser(
        "scan",
        help="anomalies of one dump, no golden (NaN, Inf, saturation, all-zero, jump): exit 1 when some",
    )
    scan.add_argument("dump", metavar="DUMP", help="a dump directory (any readable format)")
    add_report_options(scan)
    add_scan_bounds(scan)


def _add_allreduce(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    allreduce = sub.add_parser(
        "allreduce",
        help="tensor parallel: each rank's all-reduce output vs the reduction of every rank's"
        " input: exit 1 on a failure",
    )
    allreduce.add_argument(
        "dump",
        metavar="DUMP",
        nargs="+",
        help="the dump_path of a torchrun capture (rank0/, rank1/ ...) or an ATB dump; or one"
        " rank directory per rank, in rank order",
    )
    allreduce.add_argument("--thresholds", metavar="TOML", help="override thresholds")
    add_report_options(allreduce)


def _add_weights(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    weights = sub.add_parser(
        "weights",
        help="compare two checkpoints tensor by tensor (float/bf16/fp16/int8/fp8): exit 1 on a"
        " failure",
    )
    weights.add_argument(
        "golden", metavar="GOLDEN", help="checkpoint folder, state-dict file, dump"
    )
    weights.add_argument("target", metavar="TARGET", help="the converted or quantised checkpoint")
    add_report_options(weights, "msit -w columns")
    weights.add_argument(
        "--thresholds",
        metavar="FILE",
        help="thresholds TOML whose [weights.<kind>] tables override the defaults",
    )


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="the TUI in a browser: serve demo|run|watch|open ARGS (needs layerwatch[serve])",
        description="Serve `layerwatch demo|run|watch|open ARGS` to a browser (textual-serve):"
        " each connection starts its own app. Bound to 127.0.0.1 unless --host says otherwise;"
        " bound elsewhere, the URL carries a secret token (LAYERWATCH_SERVE_TOKEN fixes it).",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    serve.add_argument(
        "--port", type=int, default=8000, metavar="N", help="port to bind (default 8000)"
    )
    serve.add_argument(
        "served",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ARGS",
        help="demo, run, watch or open and its arguments",
    )


_COMMAND_PARSERS: dict[
    str, Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
] = {
    "demo": _add_demo,
    "dump": _add_dump,
    "run": _add_run,
    "watch": _add_watch,
    "open": _add_open,
    "compare": _add_compare,
    "precheck": _add_precheck,
    "badcase": _add_badcase,
    "scan": _add_scan,
    "allreduce": _add_allreduce,
    "weights": _add_weights,
    "serve": _add_serve,
}
"""Each command's sub-parser, in the order ``layerwatch --help`` lists them."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``command`` only that command's sub-parser (the one
    ``main`` is about to run: building the other eleven cost ~6 ms of a compare's start-up,
    argparse's per-argument formatter and gettext look-ups); parsing that command's
    arguments, its ``--help`` and its errors are the same either way."""
    parser = argparse.ArgumentParser(
        prog="layerwatch",
        description="Find where an LLM inference run goes numerically wrong: first bad token, layer and operator.",
    )
    parser.add_argument("--version", action="version", version="layerwatch 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in _COMMAND_PARSERS.items():
        if command is None or name == command:
            add(sub)
    return parser


def add_scan_bounds(parser: argparse.ArgumentParser) -> None:
    """The jump rule's numbers (engine/numerics/anomaly.py documents their calibration)."""
    parser.add_argument(
        "--jump-ratio",
        type=float,
        metavar="R",
        help="an output above R times its inputs' largest magnitude is a jump (default 1000)",
    )
    parser.add_argument(
        "--jump-floor",
        type=float,
        metavar="A",
        help="... and above A in magnitude (default 1000)",
    )


def _load(target: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = target.split(":")
    return getattr(import_module(module_name), func_name)


_QUICK_EXIT = frozenset({"compare"})
"""Headless commands whose process ends as soon as its output is out (:func:`_quick_exit`)."""


def _quick_exit(code: int) -> None:
    """End the process now that the report is written and closed and stdout is flushed: the
    interpreter's own shutdown frees every record, result and module one by one, which cost
    10–20 ms of CPU after a compare of ~900 pairs (bench dumps; 5 % of the whole run). Only
    for a process entry (``main()`` without ``argv``): in-process callers get the code back.
    Not after ``--ray``: Ray's own shutdown hooks disconnect the driver from the cluster."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # `compare --json | head`: the reader left, as main() treats it
        code = EXIT_OK
    except (OSError, ValueError):  # let the normal shutdown report it
        return
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words and words[0] in _COMMAND_PARSERS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "cmd", None) and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    save = None
    if argv is None:  # a process of its own: compiled dataclass methods from earlier runs
        from layerwatch.tui import dataclass_cache

        save = dataclass_cache.install(dataclass_cache.default_path(args.command)).save
    try:
        return _run(args, argv, save)
    finally:
        if save is not None:
            save()


def _run(
    args: argparse.Namespace, argv: Sequence[str] | None, save: Callable[[], None] | None
) -> int:
    """Run the parsed command; ``save`` keeps the compiled dataclass methods (called before
    the quick exit, which skips ``main``'s ``finally``)."""
    from layerwatch.capture.errors import LayerwatchError

    handler = _HANDLERS[args.command]
    if args.command == "dump" and (args.scan or args.exit_on_anomaly or args.scan_output):
        handler = "layerwatch.tui.frontends:dump_scan_main"
    if args.command == "precheck" and args.replay:
        handler = "layerwatch.engine.replay:replay_main"
    try:
        code = _load(handler)(args)
        if argv is None and args.command in _QUICK_EXIT and not getattr(args, "ray", None):
            if save is not None:
                save()
            _quick_exit(code)
        return code
    except LayerwatchError as exc:
        print(f"layerwatch {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # its words, where the command gave some (engine/runner.py)
        print(f"layerwatch {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `layerwatch compare --json | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
