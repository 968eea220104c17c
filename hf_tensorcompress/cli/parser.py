"""The ``hf-tensorcompress`` argument parser: one subcommand per module of this package.

Building it imports only the method registry, the method configs (plain dataclasses) and the flag definitions of
the data: ``--help`` and argument errors never import torch, transformers, pandas or datasets.
"""

from __future__ import annotations

import argparse

from . import compress, evaluate, export_onnx, fetch, push, report
from .common import PROG

#: ``{subcommand: its module}``: each has ``HELP``, ``EXAMPLE``, ``add_arguments(parser)`` and ``run(args)``.
COMMANDS = {
    "fetch": fetch,
    "compress": compress,
    "evaluate": evaluate,
    "report": report,
    "export-onnx": export_onnx,
    "push": push,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compress Hugging Face transformers models with tensor methods (CP, SVD, ...), report their "
        "size and cost, and push them to the Hub with a model card. Run `%(prog)s COMMAND --help` for details.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=module.EXAMPLE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; a flag the subcommand does not take is reported with the subcommand's usage (not
    the program's, which would not show the flags there are)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args
