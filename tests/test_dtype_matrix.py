"""Every dtype a model is kept in (fp32, bf16, fp16) × every method and storage option: save, then in a new process
load and run a forward, natively (the library installed) and with ``trust_remote_code`` where the library cannot be
imported, and on folders the ``compress`` command wrote. Each forward must run, give the model's dtype, be finite,
match what the model computed before saving, and be the same on both load paths.

Cheap by construction: tiny models, every folder built in this process, then ONE process loads them all natively
and ONE loads them all without the library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import WIDE_LLAMA, run_without_library, tiny_causal_lm, tiny_inputs, tiny_time_series

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.cli import main as cli_main

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: name -> (family, config options, --quantize-linears choice): every method, every storage form of its tensors
#: (fp32 factors, bf16 values, packed codes, ternary codes, codebooks, low-rank tails, SBT attention, full-rank
#: low-bit weights, a form per Linear), biased Linears
#: (PatchTST) and bias-free ones (Llama), and the quantized Linears a compressed model can carry. The stored forms
#: do not depend on how factors were initialised: ``init="random"`` skips the CP decomposition where it is not the
#: point.
CASES = {
    "cp": ("llama", dict(method="cp", rank=0.5, cp_iterations=2), "none"),
    "cp-16": ("llama", dict(method="cp", rank=0.5, init="random", factor_bits=16), "none"),
    "cp-4": ("llama", dict(method="cp", rank=0.5, init="random", factor_bits=4), "none"),
    "cp-2-biased": ("patchtst", dict(method="cp", rank=0.5, init="random", factor_bits=2), "none"),
    "cp-ternary": ("llama", dict(method="cp", rank=0.5, init="random", factor_bits="ternary"), "none"),
    "svd": ("llama", dict(method="svd", rank=0.5), "none"),
    "svd-16": ("llama", dict(method="svd", rank=0.5, factor_bits=16), "none"),
    "svd-3": ("llama", dict(method="svd", rank=0.5, factor_bits=3, factor_group_size=8), "none"),
    "biprop": ("patchtst", dict(method="biprop", keep_ratio=0.5), "none"),
    "biprop-sbt": ("patchtst", dict(method="biprop", keep_ratio=0.5, attention="qkv_mask"), "none"),
    "lowbit-4": ("llama", dict(method="lowbit", weight_bits=4, weight_group_size=8), "none"),
    "lowbit-ternary-biased": ("patchtst", dict(method="lowbit", weight_bits="ternary", weight_group_size=8), "none"),
    "lowbit-ternary-fp16-bias": (
        "patchtst",
        dict(method="lowbit", weight_bits="ternary", weight_group_size=8, bias_dtype="float16"),
        "none",
    ),
    "mixed": (
        "patchtst",
        dict(
            method="mixed",
            forms={
                "q_proj": {"method": "svd", "rank": 2, "factor_bits": 4},
                "v_proj": {"method": "lowbit", "weight_bits": 2, "weight_group_size": 8},
                "ff.0": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
            },
        ),
        "none",
    ),
    "tt": ("llama", dict(method="tt", tt_order=3, tt_ranks=2), "none"),
    "tt-4": ("llama", dict(method="tt", tt_order=3, tt_ranks=2, tt_storage_bits=4), "none"),
    "tiered": ("llama", dict(method="tiered", tier_tokens=[40], tier_bits=[8, 3], tier_group_size=8), "none"),
    "tiered-low-rank": (
        "llama",
        dict(method="tiered", tier_tokens=[40], tier_bits=[16, 0], low_rank=2, tier_group_size=8),
        "none",
    ),
    "tiered-codebook": (
        "llama",
        dict(method="tiered", tier_tokens=[40], tier_bits=[2, "codebook"], codebook_size=256, tier_group_size=8),
        "none",
    ),
    "tiered-int8-linears": (
        "llama",
        dict(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8),
        "torchao-int8",
    ),
    "tiered-nf4-linears": (  # bitsandbytes' packed CPU kernel (eval, no grad) needs widths in multiples of 64
        "llama-64",
        dict(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8),
        "bnb-nf4",
    ),
}
#: (case, dtype) written by ``hf-tensorcompress compress`` from a dense folder saved in that dtype; the same
#: computation as the Python cell, so it is held to that cell's reference.
COMMAND_LINE = (("cp-4", "bfloat16"), ("cp-4", "float16"), ("svd-3", "bfloat16"), ("tiered-nf4-linears", "bfloat16"))

#: Largest relative L2 distance between a loaded model's output and the output before saving: the stored forms
#: decode the same values, but may sum them in another order (a fused kernel accumulates in fp32).
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}

LOAD = """
import json, pathlib, sys, torch, transformers
from transformers.utils import logging
logging.set_verbosity_error()
{imports}
report = {{}}
for folder, family in json.loads(sys.argv[1]).items():
    io = torch.load(pathlib.Path(folder) / "io.pt")
    try:
        model = {load}.from_pretrained(folder, {options}).eval()
        torch.manual_seed(123)
        with torch.no_grad():
            out = model(**io["inputs"])
        value = out.logits if family.startswith("llama") else out.prediction_outputs
        torch.save(value, pathlib.Path(folder) / "{name}.pt")
        reference = io["reference"].float()
        distance = float((value.float() - reference).norm() / reference.norm())
        report[folder] = {{"dtype": str(value.dtype), "finite": bool(value.isfinite().all()), "distance": distance}}
    except Exception as error:
        report[folder] = {{"error": type(error).__name__ + ": " + str(error)[:300]}}
print(json.dumps(report))
"""


def dense(family: str, dtype: torch.dtype):
    if family == "llama-64":
        return tiny_causal_lm("llama", **WIDE_LLAMA).to(dtype)
    model = tiny_causal_lm("llama") if family == "llama" else tiny_time_series("patchtst")
    return model.to(dtype)


def inputs_of(family: str, model) -> dict:
    if family.startswith("llama"):
        return {
            "input_ids": torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
        }
    return {key: value.to(model.dtype) for key, value in tiny_inputs("PatchTST", model).items()}


def output_of(family: str, model, inputs: dict) -> torch.Tensor:
    torch.manual_seed(123)
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if family.startswith("llama") else out.prediction_outputs


def build(case: str, dtype_name: str, folder: Path) -> None:
    """The Python cell: the model kept in ``dtype``, compressed (its other Linears quantized where the case says),
    saved with its inputs and the output before saving."""
    from hf_tensorcompress.cli import linear_quantization
    from hf_tensorcompress.stacking import quantize_linears

    family, options, linears = CASES[case]
    model = apply_compression(dense(family, DTYPES[dtype_name]), CompressionConfig(**options))
    if linears != "none":
        quantize_linears(model, linear_quantization(linears))
    inputs = inputs_of(family, model)
    model.save_pretrained(folder)
    torch.save({"inputs": inputs, "reference": output_of(family, model, inputs)}, folder / "io.pt")


def flags(options: dict) -> list[str]:
    return [part for key, value in options.items() for part in (f"--{key.replace('_', '-')}", json.dumps(value))]


def build_with_the_command_line(case: str, dtype_name: str, root: Path) -> Path:
    """``hf-tensorcompress compress`` of a dense folder saved in ``dtype``, held to the Python cell's reference."""
    family, options, linears = CASES[case]
    source = root / f"dense-{family}-{dtype_name}"
    if not source.exists():
        dense(family, DTYPES[dtype_name]).save_pretrained(source)
    folder = root / f"cli-{case}-{dtype_name}"
    argv = ["compress", str(source), str(folder), *flags(options), "--quantize-linears", linears]
    assert cli_main(argv) == 0
    (folder / "io.pt").write_bytes((root / f"{case}-{dtype_name}" / "io.pt").read_bytes())
    return folder


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict[str, dict]:
    """``{folder: entry}`` for every cell: where it came from, and what each load path gave."""
    root = tmp_path_factory.mktemp("dtypes")
    cells = {}
    for case, (family, _, _) in CASES.items():
        for dtype_name in DTYPES:
            folder = root / f"{case}-{dtype_name}"
            build(case, dtype_name, folder)
            cells[str(folder)] = {"case": case, "dtype": dtype_name, "family": family, "via": "python"}
    for case, dtype_name in COMMAND_LINE:
        folder = build_with_the_command_line(case, dtype_name, root)
        cells[str(folder)] = {"case": case, "dtype": dtype_name, "family": CASES[case][0], "via": "command line"}
    families = json.dumps({folder: cell["family"] for folder, cell in cells.items()})
    # natively: the class config.json names (the library's quantizer rebuilds the layers); without the library: the
    # Auto class, which follows auto_map into the shipped code
    base = 'getattr(transformers, json.load(open(pathlib.Path(folder) / "config.json"))["architectures"][0].removeprefix("Compressed"))'
    native = LOAD.format(imports="import hf_tensorcompress", load=base, options="", name="native")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", native, families], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for folder, entry in json.loads(run.stdout.strip().splitlines()[-1]).items():
        cells[folder]["native"] = entry
    auto = '(transformers.AutoModelForCausalLM if family.startswith("llama") else transformers.AutoModel)'
    remote = LOAD.format(imports="", load=auto, options="trust_remote_code=True", name="remote")
    run = run_without_library(f"import sys; sys.argv[1:] = [{families!r}]\n" + remote, cwd=root, timeout=600)
    for folder, entry in json.loads(run.stdout.strip().splitlines()[-1]).items():
        cells[folder]["remote"] = entry
    return cells


def test_every_dtype_method_and_storage_option_loads_and_runs_on_both_paths(matrix):
    wrong = []
    for folder, cell in matrix.items():
        label = f"{cell['case']} {cell['dtype']} ({cell['via']})"
        for path in ("native", "remote"):
            entry = cell[path]
            if "error" in entry:
                wrong.append(f"{label}, {path}: {entry['error']}")
            elif entry["dtype"] != f"torch.{cell['dtype']}" or not entry["finite"]:
                wrong.append(f"{label}, {path}: {entry['dtype']} output, finite={entry['finite']}")
            elif entry["distance"] > TOLERANCE[cell["dtype"]]:
                wrong.append(f"{label}, {path}: {entry['distance']:.2e} from the output before saving")
        if not wrong or not wrong[-1].startswith(label):
            native, remote = (torch.load(Path(folder) / f"{path}.pt") for path in ("native", "remote"))
            if not torch.equal(native, remote):
                wrong.append(f"{label}: the native and the trust_remote_code forwards differ")
    assert not wrong, "\n".join(wrong)


def test_the_matrix_covers_every_method_dtype_and_the_command_line(matrix):
    from hf_tensorcompress.core.registry import records

    assert {options["method"] for _, options, _ in CASES.values()} == set(records())
    assert {(cell["case"], cell["dtype"]) for cell in matrix.values()} == {(c, d) for c in CASES for d in DTYPES}
    assert sum(cell["via"] == "command line" for cell in matrix.values()) == len(COMMAND_LINE)
