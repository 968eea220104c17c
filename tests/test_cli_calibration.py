"""``hf-tensorcompress compress`` with calibration text (``--calibration``), the precision of what a method leaves
uncompressed (``--dtype``) and the bytes line it ends with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import save_word_level_lm
from safetensors import safe_open
from transformers import AutoTokenizer, LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_tiered
from hf_tensorcompress.cli import main
from hf_tensorcompress.data.calibration import calibration_ids, read_calibration_text

VOCAB, HIDDEN = 64, 32
TIERED = ["--method", "tiered", "--tier-tokens", "16", "--tier-bits", "8", "4", "--tier-group-size", "16"]


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> Path:
    return save_word_level_lm(tmp_path_factory.mktemp("lm"), VOCAB, HIDDEN)


def text_of(words: int, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(f"w{int(i)}" for i in torch.randint(1, VOCAB, (words,), generator=generator))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``hf-tensorcompress ARGS`` in this process (the console script runs the same ``main``; tests/test_cli.py runs
    the script itself): exit code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def test_output_rounding_from_the_command_line_equals_apply_tiered(lm_folder, tmp_path, capsys):
    (tmp_path / "calibration.txt").write_text(text_of(600), encoding="utf-8")
    output = tmp_path / "out"
    code, _, err = cli(
        capsys, "compress", str(lm_folder), str(output), *TIERED, "--rounding", "output", "--tier-order",
        "calibration", "--calibration", str(tmp_path / "calibration.txt"), "--calibration-tokens", "500",
    )  # fmt: skip
    assert code == 0 and "calibration: " in err and "a text file, 1 document(s)" in err
    assert "500 tokens used" in err
    tokenizer = AutoTokenizer.from_pretrained(lm_folder)
    ids = calibration_ids(tokenizer, [text_of(600)], 500)
    config = CompressionConfig(
        method="tiered", tier_tokens=[16], tier_bits=[8, 4], tier_group_size=16, rounding="output",
        tier_order="calibration",
    )  # fmt: skip
    expected = apply_tiered(LlamaForCausalLM.from_pretrained(lm_folder), config, ids)
    stored = tensors(output)
    for key, value in expected.state_dict().items():
        if key.startswith("model.embed_tokens."):
            assert torch.equal(stored[key], value), key


def test_options_that_need_calibration_are_refused_before_loading(lm_folder, tmp_path, capsys):
    code, _, err = cli(capsys, "compress", str(lm_folder), str(tmp_path / "o"), *TIERED, "--rounding", "output")
    assert code == 2 and "error: " in err and "needs calibration text" in err and "--calibration FILE" in err
    assert "loading" not in err  # refused before the model load
    code, _, err = cli(capsys, "compress", str(lm_folder), str(tmp_path / "o"), "--method", "svd", "--calibration", "x")
    assert code == 2 and "method 'svd' takes no calibration text" in err


@pytest.mark.parametrize("kind", ["folder", "jsonl", "csv", "dataset"])
def test_calibration_text_is_read_from_folders_tables_and_saved_datasets(kind, tmp_path):
    import datasets

    texts = [text_of(20, seed) for seed in range(3)]
    if kind == "folder":
        (tmp_path / "docs").mkdir()
        for number, text in enumerate(texts):
            (tmp_path / "docs" / f"{number}.txt").write_text(text, encoding="utf-8")
        path = tmp_path / "docs"
    elif kind == "jsonl":
        path = tmp_path / "docs.jsonl"
        path.write_text("".join(json.dumps({"body": text}) + "\n" for text in texts), encoding="utf-8")
    elif kind == "csv":
        path = tmp_path / "docs.csv"
        datasets.Dataset.from_dict({"body": texts}).to_csv(str(path), index=False)
    else:
        path = tmp_path / "saved"
        datasets.Dataset.from_dict({"body": texts}).save_to_disk(str(path))
    column = "text" if kind == "folder" else "body"
    read, description = read_calibration_text(path, column)
    assert read == texts and "3 document(s)" in description
    if kind != "folder":
        with pytest.raises(ValueError, match=r"no column 'text'.*\['body'\].*--calibration-column"):
            read_calibration_text(path)


def test_the_rest_keeps_the_source_precision_and_the_size_line_says_what_dominates(lm_folder, tmp_path, capsys):
    model = LlamaForCausalLM.from_pretrained(lm_folder).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bf16" / name).write_bytes((lm_folder / name).read_bytes())
    code, out, _ = cli(capsys, "compress", str(tmp_path / "bf16"), str(tmp_path / "out"), *TIERED)
    assert code == 0 and "the rest in bfloat16" in out
    stored = tensors(tmp_path / "out")
    floats = {key: value.dtype for key, value in stored.items() if value.is_floating_point()}
    assert all(dtype == torch.bfloat16 for key, dtype in floats.items() if "embed_tokens" not in key), floats
    line = out.strip().splitlines()[-1]
    assert line.startswith("size on disk: bf16 ") and "uncompressed BF16 hold" in line
    _, forced, _ = cli(
        capsys, "compress", str(tmp_path / "bf16"), str(tmp_path / "out32"), *TIERED, "--dtype", "float32"
    )
    assert "the rest in float32" in forced
    assert tensors(tmp_path / "out32")["model.norm.weight"].dtype == torch.float32


@pytest.mark.slow
def test_a_model_loaded_from_a_gguf_file_compresses_and_saves(tmp_path):
    """transformers dequantises SmolLM2's GGUF weights where no GGUF kernel is installed; such a model compresses
    (its GGUF quantizer dropped) and saves like any other."""
    from transformers import AutoModelForCausalLM

    from hf_tensorcompress import apply_compression
    from hf_tensorcompress.assets import smollm2_gguf

    gguf = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ids = torch.tensor([[1, 2, 3, 4]])
    apply_compression(model, CompressionConfig(method="tiered", tier_bits=[8]))
    expected = model(ids).logits
    model.save_pretrained(tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert loaded.config.compression_config["method"] == "tiered"
    assert torch.equal(loaded(ids).logits, expected)


def test_a_byte_budget_from_the_command_line(lm_folder, tmp_path, capsys):
    budget = ["--method", "tiered", "--size-ratio", "3", "--codebook-size", "256"]
    code, _, err = cli(capsys, "compress", str(lm_folder), str(tmp_path / "o"), *budget)
    assert code == 2 and "--size-ratio" in err and "--calibration FILE" in err
    (tmp_path / "calibration.txt").write_text(text_of(600), encoding="utf-8")
    code, out, err = cli(
        capsys, "compress", str(lm_folder), str(tmp_path / "out"), *budget, "--calibration",
        str(tmp_path / "calibration.txt"),
    )  # fmt: skip
    assert code == 0 and "size_ratio allocation" in out + err
    config = json.loads((tmp_path / "out" / "config.json").read_text())["compression_config"]
    assert config["size_ratio"] == 3
    tiers = config["modules"]["model.embed_tokens"]["tiers"]
    assert sum(tier["rows"] for tier in tiers) == VOCAB and len(tiers) > 1


def test_a_byte_budget_keeps_the_chat_templates_tokens_wide_and_names_the_rows_served_worst(tmp_path, capsys):
    """``--size-ratio``: the tokenizer's special tokens and those its chat template writes keep int8 rows (the
    calibration text never uses them); the short-calibration guard fires, so the rows served worst are printed."""
    folder = save_word_level_lm(tmp_path / "chat", VOCAB, HIDDEN)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = "{% for m in messages %}w62 {{ m['content'] }} w63 {% endfor %}"
    tokenizer.save_pretrained(folder)
    (tmp_path / "calibration.txt").write_text(" ".join(f"w{1 + i % 40}" for i in range(600)), encoding="utf-8")
    output = tmp_path / "out"
    code, _, err = cli(
        capsys, "compress", str(folder), str(output), "--method", "tiered", "--size-ratio", "2.5",
        "--rounding", "output", "--tier-group-size", "16", "--model-text-tokens", "0", "--calibration",
        str(tmp_path / "calibration.txt"),
    )  # fmt: skip
    assert code == 0 and "tokens kept at int8 or wider" in err
    assert "warning: size_ratio: 525 calibration tokens is short for a 64-token vocabulary" in err
    assert "the rows served worst on held-back text" in err and "'w" in err
    spec = json.loads((output / "config.json").read_text())["compression_config"]["modules"]["model.embed_tokens"]
    layer = LlamaForCausalLM.from_pretrained(output).get_input_embeddings()
    widths = [tier["bits"] for tier in spec["tiers"] for _ in range(tier["rows"])]
    assert all(widths[int(layer.slot[token])] in (8, 16) for token in (0, 62, 63))
