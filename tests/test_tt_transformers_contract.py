"""transformers' model contract on TT models, as its own model tests check it: the input embedding is an
``nn.Embedding`` and the output embedding an ``nn.Linear`` (or None), and both can be replaced; every tied-weight key
pattern a model declares matches parameters that really share storage (a TT head reads the cores: nothing is tied)."""

from __future__ import annotations

import collections
import re

import pytest
import torch
from helpers import tiny_causal_lm
from torch import nn
from transformers.modeling_utils import _get_tied_weight_keys
from transformers.pytorch_utils import id_tensor_storage

from hf_tensorcompress import apply_compression


def unmatched_patterns(model) -> list[str]:
    groups = collections.defaultdict(list)
    for name, tensor in model.state_dict().items():
        groups[id_tensor_storage(tensor)].append(name)
    shared = [names for names in groups.values() if len(names) > 1]
    return [key for key in _get_tied_weight_keys(model) if not any(re.search(key, n) for g in shared for n in g)]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "opt"])
def test_tt_models_declare_only_tied_keys_that_are_tied(kind):
    dense = tiny_causal_lm(kind, tie=True)
    assert unmatched_patterns(dense) == []  # the dense model honours the contract
    model = apply_compression(dense, {"method": "tt", "tt_order": 3, "tt_ranks": 2})
    assert unmatched_patterns(model) == []
    rebuilt = type(model)(model.config)  # the class built from a config, as transformers' tests build models
    assert unmatched_patterns(rebuilt) == []


@pytest.mark.parametrize("kind, tie", [("llama", True), ("gpt2", True), ("opt", True), ("llama", False)])
def test_tt_embeddings_get_and_set_like_dense_ones(kind, tie):
    model = apply_compression(tiny_causal_lm(kind, tie=tie), {"method": "tt", "tt_order": 3, "tt_ranks": 2})
    assert isinstance(model.get_input_embeddings(), nn.Embedding)
    output = model.get_output_embeddings()
    assert output is None or isinstance(output, nn.Linear)
    assert output.weight.shape == (model.config.vocab_size, model.get_input_embeddings().embedding_dim)
    replacement = nn.Embedding(10, 10)
    model.set_input_embeddings(replacement)
    assert model.get_input_embeddings() is replacement


@pytest.mark.parametrize("exact", [0, 3])
def test_resized_tt_embedding_starts_new_tokens_at_the_mean(exact):
    """transformers' resize test: the new rows' mean equals the old rows' mean within 1e-3."""
    model = apply_compression(
        tiny_causal_lm("llama"),
        {"method": "tt", "tt_order": 3, "tt_ranks": 2, "tt_exact_tokens": exact, "tt_exact_prior": "token_id"},
    )
    vocab = model.config.vocab_size
    before = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(vocab + 10)
    weight = model.get_input_embeddings().weight.detach()
    assert weight.shape[0] == vocab + 10 and model.config.vocab_size == vocab + 10
    torch.testing.assert_close(weight[:vocab], before)  # the old tokens are untouched
    torch.testing.assert_close(weight[-10:].mean(0), weight[:-10].mean(0), rtol=1e-3, atol=1e-3)
    assert model(torch.tensor([[vocab + 3, 4]])).logits.shape == (1, 2, vocab + 10)
