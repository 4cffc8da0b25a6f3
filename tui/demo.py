"""``layerwatch demo``: the demo model run twice through live capture, compared as it runs.

Golden = fp32 without fault, target = ``--dtype`` with ``--fault``; both are launched as
``python -m layerwatch.capture.demo`` through the same launcher as ``layerwatch dump`` (zero
code change, output to log files so nothing garbles the screen), into a temporary directory
that is removed afterwards unless ``--out`` names one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from layerwatch.capture.errors import LayerwatchError


def list_faults() -> str:
    from layerwatch.capture.demo.faults import DEFAULT_FAULT, FAULTS

    lines = []
    for name, fault in FAULTS.items():
        default = " (default)" if name == DEFAULT_FAULT else ""
        lines.append(f"{name}{default}: {fault.description}")
        lines.append(f"    breaks {fault.node} from token {fault.start_token}")
    return "\n".join(lines)


def demo_commands(fault: str, dtype: str, new_tokens: int | None) -> tuple[list[str], list[str]]:
    """The golden and target argument vectors (plain ``python -m``: the launcher adds capture)."""
    base = [sys.executable, "-m", "layerwatch.capture.demo"]
    if new_tokens is not None:
        base += ["--new-tokens", str(new_tokens)]
    return [*base, "--dtype", "fp32", "--fault", "none"], [
        *base,
        "--dtype",
        dtype,
        "--fault",
        fault,
    ]


def build_pipeline(args: argparse.Namespace, out: Path):  # -> LivePipeline
    from layerwatch.capture.demo.faults import DEFAULT_FAULT, FAULTS
    from layerwatch.capture.launch import CaptureOptions, LaunchSpec
    from layerwatch.engine.live.pipeline import LivePipeline, SideSpec
    from layerwatch.engine.session.core import CompareSession

    fault = args.fault or DEFAULT_FAULT
    if fault not in FAULTS and fault != "none":
        raise LayerwatchError(
            f"unknown fault {fault!r}: choose one of {', '.join(FAULTS)} (or none)"
        )
    if args.new_tokens is not None and args.new_tokens < 1:
        raise LayerwatchError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    golden_cmd, target_cmd = demo_commands(fault, args.dtype, args.new_tokens)
    sides = {}
    for name, cmd in (("golden", golden_cmd), ("target", target_cmd)):
        where = out / name
        if where.exists() and any(where.iterdir()):
            raise LayerwatchError(f"{where} is not empty (an earlier demo?): pick another --out")
        sides[name] = SideSpec(
            where, LaunchSpec(cmd, where, CaptureOptions(), log=out / f"{name}.log")
        )
    return LivePipeline(
        sides["golden"], sides["target"], session=CompareSession(compact=True)
    ), fault


def demo_main(args: argparse.Namespace) -> int:
    if args.list_faults:
        print(list_faults())
        return 0
    from layerwatch.tui.frontends import present

    out = (
        Path(args.out).absolute() if args.out else Path(tempfile.mkdtemp(prefix="layerwatch-demo-"))
    )
    try:
        pipeline, fault = build_pipeline(args, out)
        title = f"layerwatch demo · {fault} · target {args.dtype}"
        code = present(pipeline, args, title)  # --headless too: one place sets up the process
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    return demo_exit(code, fault)


def demo_exit(code: int, fault: str) -> int:
    """The comparison's own exit code (engine/outcome.py: 1 = the planted fault was found, as
    compare would say it), with one stderr line when the demo did not show what it plants."""
    from layerwatch.engine.outcome import EXIT_FINDING, EXIT_OK

    if code not in (EXIT_OK, EXIT_FINDING):
        return code
    expected = EXIT_OK if fault == "none" else EXIT_FINDING
    if code != expected and fault == "none":
        print("layerwatch demo: the clean run reported a failure", file=sys.stderr)
    elif code != expected:
        print(f"layerwatch demo: the planted fault {fault} was not found", file=sys.stderr)
    return code
