"""``hf-tensorcompress compress``: a model folder or GGUF file to a self-contained compressed checkpoint.

Everything the flags say is checked before torch is imported (a wrong value is refused at once): the config, the
source and output paths, the packages ``--quantize-linears`` needs; then whether the method takes (or needs)
``--calibration``. Then the model loads,
compresses and is saved with its tokenizer (and the data statistics a forecaster was trained with) in one step.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path

from ..core import registry
from ..core.extras import check_installed
from .common import PROG, UsageError, quoted, tokenizer_of
from .config_flags import add_config_flags, compression_config

HELP = "Compress a model folder or GGUF file and save it as a self-contained checkpoint."
EXAMPLE = (
    "examples:\n"
    f"  {PROG} compress ./patchtst ./patchtst-cp --method cp --rank 0.5\n"
    f"  {PROG} compress SmolLM2-135M-Instruct.Q4_1.gguf ./smollm2-svd --method svd --rank 0.25 "
    "--target-modules q_proj k_proj\n"
    f"  {PROG} compress ./patchtst ./patchtst-svd --config compression.json\n\n"
    "Every CompressionConfig field is a flag; values are read as JSON where they parse (0.5, 8, '{...}'),\n"
    "otherwise as text. List-valued flags (--target-modules, --tt-shape, --tt-ranks, --attention-modules)\n"
    "take space-separated values, comma-separated values or one JSON list: --tt-shape 8 8 9, --tt-shape 8,8,9\n"
    "and --tt-shape '[8, 8, 9]' are the same. A --config file is read first and flags override its fields.\n"
    "SOURCE may also be a folder holding one .gguf file (what `fetch smollm2` prints)."
)

#: ``--quantize-linears``: what quantizes the ``nn.Linear`` weights a method leaves uncompressed (``quantize_linears``).
LINEAR_QUANTIZATION = {
    "none": "keep them in --dtype",
    "torchao-int8": "torchao int8 weight-only, one scale per row",
    "bnb-nf4": "bitsandbytes NF4: 4-bit codes packed two a byte (on CPU too), blocks of 64, 8-bit double-quantized "
    "scales",
}
#: The packages each ``--quantize-linears`` choice needs (the checkpoint it writes needs them to load, too).
LINEAR_PACKAGES = {"none": (), "torchao-int8": ("torchao",), "bnb-nf4": ("bitsandbytes", "accelerate")}

#: Files of a source folder that describe its data, not its weights, copied beside the compressed model: the
#: statistics a forecaster was trained with (``export-onnx`` puts them in the graph, so it takes the user's units).
KEPT_FILES = ("standardization.json",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", help="a folder written by save_pretrained, a .gguf file (causal LMs), or a folder holding one"
    )
    parser.add_argument("output", help="folder to save the compressed model, its code and model card into")
    parser.add_argument("--config", help="JSON file of CompressionConfig fields")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty output folder")
    parser.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="precision of what the method leaves uncompressed (default: auto, the source's: bfloat16 for a GGUF "
        "file, else its config.json dtype)",
    )
    parser.add_argument(
        "--quantize-linears",
        choices=list(LINEAR_QUANTIZATION),
        default="none",
        help="the nn.Linear weights the method leaves uncompressed: "
        + "; ".join(f"{name}: {about}" for name, about in LINEAR_QUANTIZATION.items())
        + " (default: none)",
    )
    parser.add_argument(
        "--calibration",
        metavar="PATH",
        help="calibration text for tiered (rounding output, tier orders by frequency) and tt (output basis, exact "
        "tokens): a text file, a folder of .txt files or JSON documents, a saved datasets folder, or a "
        ".json/.jsonl/.csv/.parquet file",
    )
    parser.add_argument(
        "--calibration-column", default="text", help="the text column of a data set or table (default: text)"
    )
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=65536,
        help="tokens of calibration text to use (default: 65536; the hidden-state covariance uses the first 4096)",
    )
    add_config_flags(parser)


def model_source(path: str) -> Path:
    """The model to compress: a ``.gguf`` file, a folder with ``config.json``, or a folder holding exactly one
    ``.gguf`` file (said on stderr); a missing path, an empty folder or one of several GGUF files is a UsageError
    naming what is there."""
    from ..runtime.atomic import recover  # the standard library only

    source = Path(path)
    if source.suffix == ".gguf":
        if not source.is_file():
            raise UsageError(f"GGUF file {source} does not exist")
        return source
    try:
        recover(source)  # a save killed mid-way: its previous folder back first
    except OSError:
        pass
    if not source.is_dir():
        raise UsageError(f"{source} does not exist; pass a model folder (with config.json) or a .gguf file")
    if (source / "config.json").is_file():
        return source
    found = sorted(source.glob("*.gguf"))
    if len(found) == 1:
        print(f"{source} holds one GGUF file: compressing {found[0].name}", file=sys.stderr, flush=True)
        return found[0]
    if found:
        raise UsageError(
            f"{source} holds {len(found)} GGUF files ({', '.join(f.name for f in found[:4])}); pass one of them: "
            f"{PROG} compress {quoted(found[0])} ..."
        )
    raise UsageError(f"{source} has no config.json and no .gguf file; pass a folder written by save_pretrained")


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


def linear_quantization(choice: str):
    """The ``quantize_linears`` config of ``--quantize-linears`` (None for none)."""
    if choice == "none":
        return None
    check_installed(LINEAR_PACKAGES[choice], f"--quantize-linears {choice}")
    import torch
    from transformers import BitsAndBytesConfig, TorchAoConfig

    if choice == "bnb-nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis

    return TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))


def calibrated_compression(config, calibration: str | None):
    """``apply_compression``, or with ``--calibration`` ``apply_calibrated(model, config, ids)``; checked before the
    model loads: calibration text a method cannot use, or options that need it and lack it."""
    from ..compress import apply_calibrated, apply_compression

    method = registry.method_for(config)
    if calibration:
        if method.calibrate is None:
            takes = [name for name in registry.records() if registry.get_method(name).calibrate is not None]
            raise UsageError(
                f"--calibration: method {config.method!r} takes no calibration text ({', '.join(takes)} do); drop "
                "the flag"
            )
        return apply_calibrated
    try:
        if method.prepare is not None:
            method.prepare(None, config, None)
    except ValueError as error:
        raise UsageError(
            f"{error}. From the command line: --calibration FILE (text of the kind the model serves)"
        ) from None
    return apply_compression


def calibration_token_ids(source: Path, args: argparse.Namespace):
    """``--calibration``'s text as token ids of the source's tokenizer, saying what was read."""
    from ..data.calibration import calibration_ids, read_calibration_text

    tokenizer = tokenizer_of(source)
    if tokenizer is None:
        raise UsageError(
            f"--calibration needs the source's tokenizer, and {source} has none (save it beside the model)"
        )
    texts, description = read_calibration_text(args.calibration, args.calibration_column)
    ids = calibration_ids(tokenizer, texts, args.calibration_tokens)
    print(f"calibration: {description}; {len(ids):,} tokens used", file=sys.stderr, flush=True)
    return ids


def protect_template_tokens(config, tokenizer) -> None:
    """A ``size_ratio`` build keeps the tokenizer's special tokens and its chat template's at int8 or wider, unless
    ``--protected-tokens`` names them."""
    if tokenizer is None or config.protected_tokens is not None:
        return
    from ..methods.tiered.guard import template_tokens

    config.protected_tokens = template_tokens(tokenizer)
    print(
        f"size_ratio: {len(config.protected_tokens)} tokens kept at int8 or wider (the tokenizer's special tokens and "
        "those its chat template writes; --protected-tokens to choose them)",
        file=sys.stderr,
        flush=True,
    )


def report_guards(model, tokenizer, caught: list) -> None:
    """Show the warnings the build raised; where a ``size_ratio`` guard fired, the rows it served worst on
    held-back text, as the tokenizer spells them."""
    from ..methods.tiered.guard import BudgetCheckWarning

    fired = False
    for warning in caught:
        fired |= issubclass(warning.category, BudgetCheckWarning)
        print(f"warning: {warning.message}", file=sys.stderr)
    if not fired:  # only a size_ratio build fires one, and its model has an input embedding
        return
    check = getattr(model.get_input_embeddings(), "budget_check", None)
    if check is None or not check.worst_served:
        return
    print("size_ratio: the rows served worst on held-back text (token, uses there, stored width):", file=sys.stderr)
    for token, uses, width in check.worst_served:
        shown = repr(tokenizer.convert_ids_to_tokens(token)) if tokenizer is not None else "?"
        print(f"  {token} {shown}: {uses} uses, {width}", file=sys.stderr)


def save_beside(source: Path, output: Path) -> None:
    """Copy the source's tokenizer and data statistics next to the compressed model (evaluation, pushing and the
    ONNX export take them from there)."""
    tokenizer = tokenizer_of(source)
    if tokenizer is not None:
        tokenizer.save_pretrained(output)
    for name in KEPT_FILES:
        if source.is_dir() and (source / name).is_file():
            shutil.copyfile(source / name, output / name)


def run(args: argparse.Namespace) -> int:
    source, output = model_source(args.source), Path(args.output)
    check_output(source, output, args.overwrite)
    config = compression_config(args)
    check_installed(LINEAR_PACKAGES[args.quantize_linears], f"--quantize-linears {args.quantize_linears}")
    from ..hub import CardInfo, set_card_info
    from ..loading import gguf_provenance, load_model
    from ..methods.tiered.guard import BudgetCheckWarning
    from ..runtime.atomic import atomic_folder
    from .checkpoint_size import DTYPES, size_line, source_dtype

    compress = calibrated_compression(config, args.calibration)
    linears = linear_quantization(args.quantize_linears)
    print(f"loading {source}", file=sys.stderr, flush=True)
    model = load_model(source)
    dtype = source_dtype(source) if args.dtype == "auto" else DTYPES[args.dtype]
    tokenizer = tokenizer_of(source) if getattr(config, "size_ratio", None) is not None else None
    protect_template_tokens(config, tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BudgetCheckWarning)
        if args.calibration:
            compress(model, config, calibration_token_ids(source, args))
        else:
            compress(model, config)
    report_guards(model, tokenizer, caught)
    if linears is not None:  # quantized from the float weights; the cast leaves packed codes as they are
        from ..stacking import quantize_linears

        quantize_linears(model, linears)
    model.to(dtype)  # what the method left uncompressed keeps the source's precision (packed storage is unaffected)
    info = CardInfo()
    if source.suffix == ".gguf":
        info.base_model, note = gguf_provenance(source)
        info.limitations.append(note)
    set_card_info(model, info)
    with atomic_folder(output) as staging:  # the model and what goes with it replace the folder together, or nothing
        model.save_pretrained(staging)
        save_beside(source, staging)
    print(
        f"saved compressed model ({config.method}, {len(model.config.compression_config['modules'])} modules, "
        f"{'' if linears is None else f'Linears {args.quantize_linears}, '}the rest in "
        f"{str(dtype).removeprefix('torch.')}) to {output}"
    )
    print(size_line(source, output))
    return 0
