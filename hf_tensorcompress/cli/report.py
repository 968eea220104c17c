"""``hf-tensorcompress report``: parameters, storage, FLOPs and estimated energy of a compressed model."""

from __future__ import annotations

import argparse
import json

from .common import PROG, UsageError, existing_folder, positive_int

HELP = "Print parameters, storage bits, FLOPs and estimated energy per module and in total."
EXAMPLE = f"example:\n  {PROG} report ./patchtst-cp --tokens 512"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a compressed model folder")
    parser.add_argument("--tokens", type=positive_int, default=1, help="rows/tokens per forward for FLOPs (default: 1)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    folder = existing_folder(args.folder, "a compressed model folder")
    from ..core.metrics import compression_report
    from ..loading import load_model
    from ..reporting import COST_HEADERS, bytes_table, cost_table_rows, summary_headers, summary_rows, text_table

    model = load_model(folder)
    if not getattr(model.config, "compression_config", None):
        raise UsageError(f"{folder} holds a dense model; compress it first (`{PROG} compress`)")
    report = compression_report(model, tokens=args.tokens)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    # the inference path of each module beside its type ("reconstruct": dense matmul with the rebuilt weight cached)
    paths = [entry.get("path", "") for entry in report["modules"]] + [""]
    headers = [*COST_HEADERS[:2], "path", *COST_HEADERS[2:]]
    rows = [[*row[:2], path, *row[2:]] for row, path in zip(cost_table_rows(report), paths)]
    print(text_table(headers, rows))
    print()
    print(text_table(["total", *summary_headers(report)[1:]], [list(r) for r in summary_rows(report)]))
    print()
    print(text_table(*bytes_table(report)))
    return 0
