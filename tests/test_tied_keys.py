"""transformers' tied-weights contract on TT models: every key pattern a model declares (``_tied_weights_keys`` of
it and its submodules) must match parameters that really share storage, as transformers' own model tests check.
A TT embedding's head reads the cores, so nothing is tied: no pattern may be declared."""

from __future__ import annotations

import collections
import re

import pytest
from transformers.modeling_utils import _get_tied_weight_keys
from transformers.pytorch_utils import id_tensor_storage

from hf_tensorcompress import apply_compression
from helpers import tiny_causal_lm


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
