"""State encoder: the network's attention layers as token strings -> one state vector for the selected layer.

Follows the paper (after Cai et al. 2018): each layer is described as "<type>-<position>-<heads>-<head_dim>-<rank>",
tokens are embedded, a 1-layer bidirectional LSTM (64 units) runs over the layers, and the output at the selected
layer's position is the state. The vocabulary holds only the tokens that can occur (a few dozen), so the encoder
has tens of thousands of parameters, not the 459M of the public code's embedding. In the byte search a sixth
field holds the layer's factor width ("bits:4", "bits:ternary", "bits:None" for fp32); the search over forms
describes each Linear by its form, position, sizes, rank, width and keep ratio (``forms.LinearSlot.describe``).
"""

from __future__ import annotations

import torch
from torch import nn

from .space import FIELDS


def build_vocabulary(groups: list, chosen: dict) -> list[str]:
    """Every token that can occur: all layers' descriptions (``group.describe``) at every candidate action and at
    the one each holds now (``chosen``)."""
    tokens = {"<unk>"}
    for group in groups:
        for action in (*group.actions, chosen[group.name]):
            tokens.update(group.describe(action))
    return sorted(tokens)


class StateEncoder(nn.Module):
    def __init__(
        self, vocabulary: list[str], embedding_dim: int = 16, lstm_units: int = 64, fields: int = len(FIELDS)
    ) -> None:
        super().__init__()
        self.vocabulary = list(vocabulary)
        self.index = {token: i for i, token in enumerate(self.vocabulary)}
        self.embedding = nn.Embedding(len(self.vocabulary), embedding_dim)
        self.lstm = nn.LSTM(embedding_dim * fields, lstm_units, num_layers=1, batch_first=True, bidirectional=True)

    @property
    def state_dim(self) -> int:
        return 2 * self.lstm.hidden_size

    def encode_tokens(self, descriptions: list[list[str]]) -> list[list[int]]:
        unknown = self.index["<unk>"]
        return [[self.index.get(token, unknown) for token in description] for description in descriptions]

    def forward(self, token_ids: list[list[int]], position: int) -> torch.Tensor:
        """``token_ids``: one row of field tokens per layer; returns the (2·lstm_units,) state of ``position``."""
        ids = torch.tensor(token_ids, dtype=torch.long)
        layers = self.embedding(ids).flatten(1).unsqueeze(0)  # (1, layers, fields · embedding_dim)
        output, _ = self.lstm(layers)
        return output[0, position]
