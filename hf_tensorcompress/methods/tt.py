"""``method="tt"``: the token embedding becomes per-token tensor trains (TensorSLM, DESIGN.md §3.4).

Targets ``model.get_input_embeddings()`` by default. A tied output layer (GPT-2, OPT, SmolLM2) is taken over by
``TTTiedHead`` (logits read from the cores; the tied matrix is stored once, compressed) unless
``tt_untie_output=True`` keeps a dense copy.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import CompressionConfig
from ..layers.tt_embedding import TTEmbedding, balanced_shape
from . import Method, register_method

DEFAULT_ORDER = 3


def input_embedding_name(model: nn.Module) -> list[str]:
    """The full name of ``model.get_input_embeddings()``."""
    getter = getattr(model, "get_input_embeddings", None)
    embedding = getter() if getter is not None else None
    names = [name for name, module in model.named_modules() if module is embedding and name]
    if not names:
        raise ValueError(
            f"{type(model).__name__} has no input embedding reachable by get_input_embeddings(); "
            "pass target_modules naming an nn.Embedding"
        )
    return names[:1]


def tied_output_name(model: nn.Module, embedding: nn.Module) -> str | None:
    """The name of the output layer sharing ``embedding``'s weight, if the model ties them."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if getter is not None else None
    if head is None or getattr(head, "weight", None) is not embedding.weight:
        return None
    return next(name for name, module in model.named_modules() if module is head)


def tt_settings(config: CompressionConfig, hidden: int) -> tuple[list[int], list[int] | None]:
    """(shape, max ranks) from the config, checked against the hidden size."""
    shape = config.tt_shape or balanced_shape(hidden, config.tt_order or DEFAULT_ORDER)
    product = 1
    for factor in shape:
        product *= factor
    if product != hidden:
        raise ValueError(
            f"tt_shape={shape} multiplies to {product}, but the embedding size is {hidden}; "
            f"e.g. tt_shape={balanced_shape(hidden, len(shape))}"
        )
    ranks = config.tt_ranks
    if isinstance(ranks, int):
        ranks = [ranks] * (len(shape) - 1)
    elif ranks is not None and len(ranks) != len(shape) - 1:
        raise ValueError(f"tt_ranks={ranks} needs {len(shape) - 1} entries for tt_shape={shape}")
    return list(shape), ranks


@torch.no_grad()
def build(model: nn.Module, name: str, embedding: nn.Embedding, config: CompressionConfig) -> TTEmbedding:
    if type(embedding) is not nn.Embedding:
        raise ValueError(
            f"method 'tt' replaces plain nn.Embedding modules; {name} is {type(embedding).__name__}, whose forward "
            "may do more than a lookup (e.g. scaling), so replacing it would change the model"
        )
    shape, ranks = tt_settings(config, embedding.embedding_dim)
    layer = TTEmbedding.from_weight(embedding.weight.detach(), shape, ranks, config.tt_eps)
    if not config.tt_untie_output:
        layer.tied_output = tied_output_name(model, embedding)
    return layer


register_method(Method("tt", input_embedding_name, build, accepts=(nn.Embedding,)))
