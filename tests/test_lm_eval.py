"""Perplexity evaluation: the evaluate module, sliding windows, real text folders as datasets."""

from __future__ import annotations

import math

import evaluate
import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from hf_tensorcompress import assets
from hf_tensorcompress.data.text import split_documents, text_dataset
from hf_tensorcompress.evaluation.perplexity import PERPLEXITY_METRIC, perplexity, window_nll


def test_metric_module_combines_windows_exactly():
    metric = evaluate.load(str(PERPLEXITY_METRIC))
    result = metric.compute(nll_sum=[10.0, 2.0], token_count=[4, 2])
    assert result["tokens"] == 6 and result["ln_perplexity"] == pytest.approx(2.0)
    assert result["perplexity"] == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError, match="at least one"):
        metric.compute(nll_sum=[1.0], token_count=[0])


def test_sliding_windows_score_every_token_once_and_overlap_adds_context():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    ids = torch.randint(0, 50, (70,))
    pieces = list(window_nll(model, ids, window=32, stride=12))
    assert sum(count for _, count in pieces) == len(ids) - 1
    with torch.no_grad():
        full = F.cross_entropy(model(ids[None, :64]).logits[0, :-1], ids[1:64], reduction="sum").item()
    first_two = list(window_nll(model, ids[:64], window=64, stride=64))
    assert first_two[0][0] == pytest.approx(full, rel=1e-5)
    disjoint = perplexity(model, ids, window=16, stride=16)
    overlapping = perplexity(model, ids, window=32, stride=8)
    assert overlapping["tokens"] == len(ids) - 1
    assert disjoint["tokens"] == len(ids) - 1 - 4  # disjoint windows cannot predict each window's first token
    assert disjoint["perplexity"] != pytest.approx(overlapping["perplexity"])


def test_real_text_folders_load_in_document_order_and_split_without_overlap():
    moby = text_dataset(assets.moby_dick_dir())
    assert moby[0]["source"] == "chapter_1" and moby[0]["text"].startswith("Call me Ishmael")
    assert moby[134]["source"] == "chapter_135"
    build, held_out = split_documents(moby, 0.2)
    assert len(build) + len(held_out) == len(moby) and not set(build["source"]) & set(held_out["source"])
    sotu = text_dataset(assets.sotu_dir())
    assert sotu[0]["source"].startswith("1790") and len(sotu) > 200
    raw, mail = text_dataset(assets.mail_dir()), text_dataset(assets.mail_dir(), mail_bodies=True)
    assert len(raw) == len(mail) == 2500 and raw[0]["source"].startswith("00001.")
    assert sum("Return-Path:" in text for text in raw["text"]) > 2000  # raw messages carry routing headers
    assert sum(text.startswith(("Return-Path:", "From ", "Received:")) for text in mail["text"]) == 0
    with pytest.raises(ValueError, match="empty split"):
        split_documents(moby, 0.0)
