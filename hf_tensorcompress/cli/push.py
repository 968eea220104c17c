"""``hf-tensorcompress push``: a compressed model folder to the Hub, with its code and a model card."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import PROG, UsageError, existing_folder, positive_int, tokenizer_of

HELP = "Upload a compressed model folder to the Hub with its code and a model card."
EXAMPLE = (
    "example:\n"
    f"  {PROG} push ./patchtst-cp me/patchtst-cp --results runs/results.json --run smartformer\n\n"
    "The token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub.\n"
    "A results.json inside FOLDER is used when --results is not given."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a compressed model folder")
    parser.add_argument("repo_id", help="<user or org>/<name> on the Hub")
    parser.add_argument("--results", help="a recipe's results.json to show in the card (default: FOLDER/results.json)")
    parser.add_argument("--run", help="the results.json run this model is")
    parser.add_argument("--base-model", help="Hub id of the model it was compressed from")
    parser.add_argument("--dataset", nargs="+", help="evaluation data set name(s) or Hub id(s)")
    parser.add_argument("--dataset-note", help="one line about the evaluation data (e.g. what it substitutes)")
    parser.add_argument("--license", help="a Hub license id, e.g. apache-2.0")
    parser.add_argument("--tokens", type=positive_int, help="rows/tokens per forward for the card's FLOPs (default: 1)")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")


def _results(folder: Path, given: str | None) -> dict | None:
    """The results to show in the card: ``--results``, else the folder's ``results.json`` (None where neither)."""
    results_file = Path(given) if given else folder / "results.json"
    if given and not results_file.is_file():
        raise UsageError(f"--results {results_file} does not exist")
    if not results_file.is_file():
        return None
    try:
        return json.loads(results_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UsageError(f"{results_file} is not valid JSON: {error}") from None


def run(args: argparse.Namespace) -> int:
    folder = existing_folder(args.folder, "a compressed model folder")
    results = _results(folder, args.results)
    from ..hub import CARD_INFO_FILE, CardInfo, push_to_hub, set_card_info
    from ..loading import load_model

    sidecar = folder / CARD_INFO_FILE
    info = CardInfo.from_json_file(sidecar) if sidecar.is_file() else CardInfo()
    if results is not None:
        info.results = results
    for name in ("run", "base_model", "dataset_note", "license"):
        if getattr(args, name) is not None:
            setattr(info, name, getattr(args, name))
    if args.dataset:
        info.datasets = args.dataset
    if args.tokens is not None:
        info.tokens = args.tokens
    model = load_model(folder)
    if not getattr(model.config, "compression_config", None):
        raise UsageError(f"{folder} holds a dense model; compress it first (`{PROG} compress`)")
    set_card_info(model, info)
    tokenizer = tokenizer_of(folder)
    print(push_to_hub(model, args.repo_id, token=args.token, private=args.private or None, tokenizer=tokenizer))
    return 0
