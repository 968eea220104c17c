"""Cost tables and results tables behind the model card and ``hf-tensorcompress report``."""

import pytest
import torch
from test_hub_push import small_patchtst

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report
from hf_tensorcompress.reporting import cost_rows, estimated_energy, results_table, summary_rows


def test_cost_rows_total_the_modules_and_estimate_energy():
    model = apply_compression(small_patchtst(), CompressionConfig(method="svd", rank=4))
    report = compression_report(model, tokens=4)
    rows = cost_rows(report)
    modules, total = rows[:-1], rows[-1]
    assert len(modules) == 6 and total.name == "total"
    assert total.params == sum(row.params for row in modules) == report["targets"]["params"]
    assert total.energy == pytest.approx(5 * total.bits / 32 + total.flops)
    assert modules[0].dense_energy == estimated_energy(modules[0].dense_bits, modules[0].dense_flops)
    params_row = dict((row[0], row[3]) for row in summary_rows(report))["parameters, compressed modules"]
    assert params_row == f"{total.params / total.dense_params:.3f}" == "0.529"  # (4·(16+16) + 16) / (16·16 + 16)


def test_results_table_averages_seeds_and_reads_both_recipe_layouts():
    results = {
        "runs": [
            {"name": "tt-8x8x9", "perplexity": 40.0, "compression_ratio": 2.0},  # TensorSLM layout: top-level numbers
            {"name": "dense", "seed": 0, "metrics": {"perplexity": 28.0}},
            {"name": "dense", "seed": 1, "metrics": {"perplexity": 30.0}},
        ]
    }
    headers, rows = results_table(results, highlight="tt-8x8x9")
    assert headers == ["run", "runs averaged", "compression_ratio", "perplexity"]
    assert rows == [["dense", "2", "", "29"], ["**tt-8x8x9** (this model)", "1", "2", "40"]]


def stacked_bf16_llama():
    """A bf16 Llama with a tiered embedding and NF4 Linears: the smallest model, as the command line writes it."""
    from helpers import WIDE_LLAMA, tiny_causal_lm

    from hf_tensorcompress.cli import linear_quantization
    from hf_tensorcompress.stacking import quantize_linears

    model = tiny_causal_lm("llama", **WIDE_LLAMA).to(torch.bfloat16)
    config = CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8)
    return quantize_linears(apply_compression(model, config), linear_quantization("bnb-nf4"))


def test_every_line_compares_against_the_dense_model_in_one_precision(tmp_path):
    """A bf16 model's report said "whole model 0.412" against fp32 on one line and compared the compressed modules
    against bf16 on the next: every dense figure is now the dense model in the precision the model keeps."""
    from hf_tensorcompress.hub import model_card
    from hf_tensorcompress.reporting import bytes_table, summary_headers

    model = stacked_bf16_llama()
    report = compression_report(model)
    dense_params = report["model"]["dense_params"]
    assert report["dense_dtype"] == "bfloat16" and summary_headers(report)[1] == "dense (bfloat16)"
    assert report["targets"]["dense_bits"] == 16 * report["targets"]["dense_params"]
    assert report["bytes"]["targets"]["dense"] * 8 == report["targets"]["dense_bits"]
    assert report["bytes"]["model"]["dense"] == 2 * dense_params
    rows = {row[0]: row for row in summary_rows(report)}
    disk = report["bytes"]["model"]["disk"]
    assert rows["bytes on disk, whole model"][3] == f"{disk / (2 * dense_params):.3f}"
    assert bytes_table(report)[0][1] == "dense (bfloat16)"
    card = str(model_card(model))
    assert "| dense (bfloat16) | compressed | compressed / dense |" in card
    fp32 = compression_report(apply_compression(small_patchtst(), CompressionConfig(method="svd", rank=4)))
    assert fp32["dense_dtype"] == "float32" and fp32["bytes"]["model"]["dense"] == 4 * fp32["model"]["dense_params"]


def test_the_size_line_names_packed_linears_as_such(tmp_path):
    """NF4 codes were listed as "uncompressed U8"."""
    from hf_tensorcompress.cli.checkpoint_size import bytes_by_part

    stacked_bf16_llama().save_pretrained(tmp_path)
    parts = bytes_by_part(tmp_path)
    packed = parts["quantized Linears (bitsandbytes NF4: packed codes and scales)"]
    assert packed > parts["uncompressed BF16"] and parts.get("uncompressed U8", 0) <= 1  # the one-byte signpost
