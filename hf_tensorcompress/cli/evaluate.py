"""``hf-tensorcompress evaluate``: a forecaster's MSE/MAE on a data set's test windows, as JSON for the model card.

The data is read with the recipes' flags (``data/arguments.py``): a CSV needs the same ``--one-hot``,
``--drop-columns``, ``--target`` … it needed for training, and the errors that name those flags can be followed here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..data.arguments import add_forecasting_arguments, load_forecasting_from_args
from .common import PROG, UsageError, existing_folder, positive_int

HELP = "Forecast a data set's test windows with a saved model and write MSE/MAE as JSON."
EXAMPLE = (
    "example (dense, then compressed, into one results file for the model card):\n"
    f"  {PROG} evaluate ./patchtst --output results.json\n"
    f"  {PROG} evaluate ./patchtst-cp --output results.json\n"
    f"  {PROG} evaluate ./patchtst-cp --dataset my.csv --drop-columns 'Unnamed: 0' --one-hot kind --covariates kind\n\n"
    "Data is split 7:1:2 in time and standardised with training statistics; MSE/MAE are on that scale. What was read\n"
    "is printed to stderr first (the JSON goes to stdout)."
)
#: The splits of a forecasting data set (``data.SPLITS``; that module imports pandas).
SPLITS = ("train", "validation", "test")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a model folder (dense or compressed) of PatchTST, Autoformer or Informer")
    parser.add_argument("--split", choices=SPLITS, default="test", help="split to evaluate (default: test)")
    parser.add_argument(
        "--output",
        help="results JSON to write; an existing one gets this run added beside "
        "the others (e.g. dense, then compressed), ready for `push --results`",
    )
    parser.add_argument("--name", help="run name in the results (default: dense or compressed)")
    parser.add_argument("--stride", type=positive_int, default=1, help="step between windows (default: 1)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="windows per forward (default: 64)")
    add_forecasting_arguments(parser)


def _previous_results(output: Path | None, dataset_name: str) -> dict | None:
    """The results file this run is added to (None where there is none yet); it must be of the same data set."""
    if output is None or not output.is_file():
        return None
    try:
        results = json.loads(output.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UsageError(f"--output {output} is not valid JSON ({error}); choose another --output") from None
    if not isinstance(results, dict) or results.get("dataset") != dataset_name:
        found = results.get("dataset") if isinstance(results, dict) else None
        raise UsageError(f"{output} holds results on {found!r}, not {dataset_name!r}; choose another --output")
    return results


def run(args: argparse.Namespace) -> int:
    folder = existing_folder(args.folder)
    output = Path(args.output) if args.output else None
    dataset_name = args.dataset or "appliances_energy"
    results = _previous_results(output, dataset_name)
    from ..data import describe_forecasting, describe_source, forecasting_windows
    from ..evaluation.forecasting import evaluate_forecaster
    from ..loading import load_model

    model = load_model(folder)
    data = load_forecasting_from_args(args)
    print(describe_forecasting(data, describe_source(args.dataset), model.config.model_type), file=sys.stderr)
    windows = forecasting_windows(data[args.split], model, stride=args.stride)
    metrics = evaluate_forecaster(model, windows, batch_size=args.batch_size, description=f"evaluate {args.split}")
    compressed = bool(getattr(model.config, "compression_config", None))
    run = {
        "name": args.name or ("compressed" if compressed else "dense"),
        "metrics": metrics,
        "windows": len(windows),
        "model": str(args.folder),
    }
    results = results or {"dataset": dataset_name, "split": args.split, "runs": []}
    results["runs"] = [r for r in results["runs"] if r.get("name") != run["name"]] + [run]
    text = json.dumps(results, indent=2)
    if output:
        output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0
