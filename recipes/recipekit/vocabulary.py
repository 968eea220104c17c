"""Renumbering a causal LM's vocabulary (``--permute-vocabulary``): the same function under other token ids, to
check that a compression setting does not depend on how a tokenizer numbers its tokens."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def permute_vocabulary(model: nn.Module, seed: int) -> torch.Tensor:
    """Move token ``p[i]``'s embedding row (and an untied output row and bias) to id ``i`` for a seeded random
    permutation ``p``; returns the map old id → new id, through which every text's token ids must go."""
    embedding = model.get_input_embeddings()
    permutation = torch.randperm(embedding.num_embeddings, generator=torch.Generator().manual_seed(seed))
    embedding.weight.copy_(embedding.weight[permutation.to(embedding.weight.device)])
    head = model.get_output_embeddings()
    if head is not None and head.weight is not embedding.weight:
        head.weight.copy_(head.weight[permutation.to(head.weight.device)])
        if getattr(head, "bias", None) is not None:
            head.bias.copy_(head.bias[permutation.to(head.bias.device)])
    return torch.argsort(permutation)
