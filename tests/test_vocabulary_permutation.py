"""The recipes' ``--permute-vocabulary``: the same model under other token ids — rows, tied head and the special
tokens its configs name renumbered together (a model's own text starts from its BOS, so a BOS left behind would
start another text)."""

from __future__ import annotations

import torch
from test_tiered_budget import EVALUATION, tiny

from recipekit.vocabulary import permute_vocabulary


def test_a_renumbered_model_is_the_same_function_with_its_special_tokens_renumbered():
    original, permuted = tiny(), tiny()
    renumber = permute_vocabulary(permuted, seed=0)
    with torch.no_grad():
        logits, moved = original(EVALUATION).logits, permuted(renumber[EVALUATION]).logits
    torch.testing.assert_close(moved[..., renumber], logits)
    for config in (permuted.config, permuted.generation_config):
        assert (config.bos_token_id, config.eos_token_id) == (int(renumber[1]), int(renumber[2]))
