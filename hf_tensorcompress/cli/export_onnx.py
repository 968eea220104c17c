"""``hf-tensorcompress export-onnx``: one ONNX file that keeps the compressed tensors as stored."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import PROG, UsageError, existing_folder

HELP = (
    "Export a PatchTST, Autoformer, Informer or causal LM folder to one ONNX file that keeps the compressed tensors "
    "as stored."
)
EXAMPLE = f"example:\n  {PROG} export-onnx ./patchtst-cp patchtst-cp.onnx"
#: ``MatMulNBits``' accuracy levels (the keys of ``deploy/onnx/ortops.ACCURACY_LEVELS``; that module imports onnx).
ACCURACY_LEVELS = range(5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a model folder (compressed or dense)")
    parser.add_argument("output", help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=21, help="ONNX opset (default: 21)")
    parser.add_argument(
        "--standardization",
        metavar="PATH",
        help="a forecaster's training statistics (standardization.json, as the recipes save it): the file then takes "
        "and returns values in your units (default: FOLDER/standardization.json where it exists)",
    )
    parser.add_argument(
        "--standard-ops",
        action="store_true",
        help="standard ONNX ops only (default: the packed codes run on ONNX Runtime's MatMulNBits / "
        "GatherBlockQuantized where they map)",
    )
    parser.add_argument(
        "--accuracy-level",
        type=int,
        choices=ACCURACY_LEVELS,
        default=0,
        help="MatMulNBits' accuracy_level: 0 computes the 4-bit products in fp32 as PyTorch does (default); 4 "
        "quantizes their activations to int8, faster on CPUs, outputs not identical to PyTorch's",
    )


def run(args: argparse.Namespace) -> int:
    if args.accuracy_level and args.standard_ops:
        raise UsageError(
            f"--accuracy-level {args.accuracy_level} sets how MatMulNBits computes, and --standard-ops has no "
            "MatMulNBits: drop one of the two"
        )
    folder = existing_folder(args.folder)
    if args.standardization and not Path(args.standardization).is_file():
        raise UsageError(f"--standardization {args.standardization} does not exist; pass a standardization.json")
    from ..core.extras import require_all

    require_all(("onnx", "onnxscript"), "exporting to ONNX")
    from ..deploy.onnx.export import describe, export_onnx
    from ..deploy.onnx.metadata import read_metadata

    path = export_onnx(
        folder,
        args.output,
        opset=args.opset,
        ort_ops=not args.standard_ops,
        accuracy_level=args.accuracy_level,
        standardization=args.standardization,
    )
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    units = read_metadata(path).get("units")
    if units:
        print(f"values in and out: {units}", file=sys.stderr)
    print(describe(path))
    return 0
