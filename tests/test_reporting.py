"""Cost tables and results tables behind the model card and ``hf-tensorcompress report``."""

import pytest
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
