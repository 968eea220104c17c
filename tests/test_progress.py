"""Progress bars of the long compression steps: drawn when forced (``HF_TENSORCOMPRESS_PROGRESS=1``, as a terminal
would show them once a step runs a while), absent when forced off."""

from __future__ import annotations

import pytest
import torch
from helpers import save_word_level_lm
from transformers import LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.progress import PROGRESS_ENV
from hf_tensorcompress.methods.tiered.codebook_rounding import codebook_codes
from hf_tensorcompress.methods.tiered.rounding import output_aware_codes


def covariance(size: int) -> torch.Tensor:
    hidden = torch.randn(256, size, generator=torch.Generator().manual_seed(0))
    return hidden.T @ hidden / len(hidden)


def test_kmeans_and_gptvq_blocks_show_progress_when_forced(monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    rows = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    codebook_codes(rows, 4, 256, covariance(16))
    output_aware_codes(rows, covariance(16), 4, 8)
    err = capsys.readouterr().err
    assert "k-means (256 entries):   0%| | 0/15" in err.replace(" " * 10, " ")
    assert "GPTVQ blocks:   0%| | 0/1" in err.replace(" " * 10, " ")  # 16 columns: one batch of up to 128
    assert "GPTQ int4 blocks:   0%| | 0/2" in err.replace(" " * 10, " ")  # groups of 8: blocks of 8


def test_no_bar_when_forced_off(monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    codebook_codes(torch.randn(64, 16), 4, 256)
    assert "k-means" not in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["1", "0"])
def test_apply_compression_shows_one_bar_over_the_modules(setting, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, setting)
    model = LlamaForCausalLM.from_pretrained(save_word_level_lm(tmp_path, 64, 32))
    capsys.readouterr()
    apply_compression(model, CompressionConfig(method="svd", rank=4, target_modules=["q_proj", "k_proj"]))
    err = capsys.readouterr().err
    assert ("compress (svd)" in err and "0/2" in err) == (setting == "1"), err
