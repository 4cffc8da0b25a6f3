"""``python -m layerwatch.capture.demo``: run the demo model as an ordinary inference program.

Prints the generated token ids (one line, space-separated) on stdout. ``--dump DIR`` captures the
run in-process with ``register_hook`` (so the demo works as a layerwatch golden or target
without the launcher); without it, nothing but torch runs, which is what ``layerwatch dump --
python -m layerwatch.capture.demo`` needs to show zero-code-change capture.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import LayerwatchError
from . import DEFAULT_FAULT, FAULTS, NEW_TOKENS, PROMPT_LEN, build_model, generate, make_prompt
from .model import DTYPES, DemoConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m layerwatch.capture.demo",
        description="Tiny Llama-style model with named faults.",
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument(
        "--fault",
        default="none",
        metavar="NAME",
        help=f"one of: none, {', '.join(FAULTS)} (default target fault: {DEFAULT_FAULT})",
    )
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, metavar="N")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, metavar="P")
    parser.add_argument("--layers", type=int, default=DemoConfig().n_layers, metavar="L")
    parser.add_argument("--dump", metavar="DIR", help="capture this run into DIR (register_hook)")
    parser.add_argument(
        "--format",
        choices=("layerwatch", "msit"),
        default="layerwatch",
        help="dump format with --dump",
    )
    parser.add_argument("--list-faults", action="store_true", help="list the named faults and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_faults:
        for fault in FAULTS.values():
            mark = " (default)" if fault.name == DEFAULT_FAULT else ""
            print(
                f"{fault.name}{mark}: {fault.node} from token {fault.start_token}: {fault.description}"
            )
        return 0
    try:
        if args.new_tokens < 1:
            raise LayerwatchError(f"--new-tokens must be at least 1, got {args.new_tokens}")
        model = build_model(dtype=args.dtype, fault=args.fault, layers=args.layers)
        prompt = make_prompt(args.prompt_len, vocab_size=model.cfg.vocab_size)
        handle = None
        if args.dump:
            from .. import DumpConfig, register_hook

            handle = register_hook(model, DumpConfig(dump_path=args.dump, format=args.format))
        try:
            ids = generate(model, prompt, args.new_tokens)
        finally:
            if handle is not None:
                handle.close()
    except LayerwatchError as exc:
        print(f"layerwatch demo: {exc}", file=sys.stderr)
        return 2
    print(" ".join(str(i) for i in ids[0, prompt.shape[1] :].tolist()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
