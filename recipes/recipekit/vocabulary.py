"""Renumbering a causal LM's vocabulary (``--permute-vocabulary``): the same function under other token ids, to
check that a compression setting does not depend on how a tokenizer numbers its tokens."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def permute_vocabulary(model: nn.Module, seed: int) -> torch.Tensor:
    """Move token ``p[i]``'s embedding row (and an untied output row and bias) to id ``i`` for a seeded random
    permutation ``p``, and the special tokens the configs name with them; returns the map old id → new id, through
    which every text's token ids must go."""
    embedding = model.get_input_embeddings()
    permutation = torch.randperm(embedding.num_embeddings, generator=torch.Generator().manual_seed(seed))
    embedding.weight.copy_(embedding.weight[permutation.to(embedding.weight.device)])
    head = model.get_output_embeddings()
    if head is not None and head.weight is not embedding.weight:
        head.weight.copy_(head.weight[permutation.to(head.weight.device)])
        if getattr(head, "bias", None) is not None:
            head.bias.copy_(head.bias[permutation.to(head.bias.device)])
    renumber = torch.argsort(permutation)
    renumber_special_tokens(model, renumber)
    return renumber


def renumber_special_tokens(model: nn.Module, renumber: torch.Tensor) -> None:
    """The BOS / EOS / pad ids of the model's config and generation config, through ``renumber`` (old id → new)."""
    for config in (model.config, getattr(model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                setattr(config, name, int(renumber[value]))
            elif isinstance(value, (list, tuple)):
                setattr(config, name, [int(renumber[item]) for item in value])
