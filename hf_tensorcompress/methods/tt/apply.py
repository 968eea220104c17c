"""``method="tt"``: the token embedding becomes per-token tensor trains (TensorSLM); registers the method.

Targets ``model.get_input_embeddings()`` by default. A tied output layer (GPT-2, OPT, SmolLM2) is taken over by
``TTTiedHead`` (logits read from the cores; the tied matrix is stored once, compressed) unless
``tt_untie_output=True`` keeps a dense copy.
"""

from __future__ import annotations

import torch
from torch import nn

from ...core.registry import Method
from ...core.targets import FAMILIES
from .calibration import TTCalibration, check_calibration, exact_token_ids, output_basis
from .config import TTConfig
from .layer import TTEmbedding
from .scaled import ScaledTTEmbedding
from .solver import balanced_shape
from .storage import check_code_storage

DEFAULT_ORDER = 3


def input_embedding_name(model: nn.Module, method: str = "tt") -> list[str]:
    """The full name of ``model.get_input_embeddings()`` when it is a token embedding (an ``nn.Embedding``); the
    error names ``method``, the one that asked."""
    getter = getattr(model, "get_input_embeddings", None)
    try:
        embedding = getter() if getter is not None else None
    except (NotImplementedError, AttributeError):  # transformers' default getter for a model without token embedding
        embedding = None
    names = [name for name, module in model.named_modules() if module is embedding and name]
    if not names or not isinstance(embedding, nn.Embedding):
        found = f" (get_input_embeddings() is {type(embedding).__name__})" if embedding is not None else ""
        families = ", ".join(f.model_type for f in FAMILIES.values() if f.token_embedding)
        raise ValueError(
            f"{type(model).__name__} has no token embedding{found}: method {method!r} compresses the token embedding "
            f"of language models ({families}, or any model whose get_input_embeddings() is an nn.Embedding); "
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


def tt_settings(config: TTConfig, hidden: int) -> tuple[list[int], list[int] | None]:
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


def embedding_scale(name: str, embedding: nn.Module, method: str) -> float | None:
    """None for a plain ``nn.Embedding``; the constant ``embed_scale`` of a scaled one (Gemma's
    ``*ScaledWordEmbedding``, Gemma 3's ``Gemma3TextScaledWordEmbedding``). Any other class is refused, naming it
    and what is supported: its forward may do more than a lookup, so replacing it would change the model.
    ``padding_idx`` changes nothing in a lookup (only training), so padded embeddings are plain ones here."""
    if type(embedding) is nn.Embedding:
        return None
    scale = getattr(embedding, "embed_scale", None)
    if (
        isinstance(embedding, nn.Embedding)
        and type(embedding).__name__.endswith("ScaledWordEmbedding")
        and scale is not None
    ):
        return float(scale)
    raise ValueError(
        f"method {method!r} replaces nn.Embedding modules (plain, or scaled by a constant embed_scale as in Gemma's "
        f"*ScaledWordEmbedding classes); {name} is {type(embedding).__name__}, whose forward may do more than a "
        "lookup, so replacing it would change the model"
    )


def layer_for(name: str, embedding: nn.Module) -> tuple[type[TTEmbedding], dict]:
    """The TT layer class that reproduces ``embedding``'s forward, with its options: a plain lookup, or a lookup
    times a constant ``embed_scale`` (``embedding_scale``)."""
    scale = embedding_scale(name, embedding, "tt")
    return (TTEmbedding, {}) if scale is None else (ScaledTTEmbedding, {"embed_scale": scale})


@torch.no_grad()
def build(
    model: nn.Module, name: str, embedding: nn.Embedding, config: TTConfig, calibration: TTCalibration | None
) -> TTEmbedding:
    layer_class, options = layer_for(name, embedding)
    shape, ranks = tt_settings(config, embedding.embedding_dim)
    if config.tt_storage_bits is not None:  # before the decomposition: a bad group size fails at once
        check_code_storage(config.tt_storage_bits, config.tt_storage_group_size, embedding.embedding_dim)
    basis = None
    if config.tt_basis == "output":
        basis = output_basis(embedding.weight, calibration.covariance)
    elif config.tt_basis == "pca":
        basis = output_basis(embedding.weight)
    weight = embedding.weight.detach()
    layer = layer_class.from_weight(
        weight, shape, ranks, config.tt_eps, None if basis is None else basis.to(weight), config.tt_solver
    )
    for key, value in options.items():
        setattr(layer, key, value)
    if config.tt_exact_tokens:
        # tt_exact_prior="token_id" needs no calibration text
        counts = (
            calibration.counts if calibration is not None else torch.zeros(embedding.num_embeddings, dtype=torch.long)
        )
        frequent = exact_token_ids(counts, config.tt_exact_tokens, config.tt_exact_prior)
        layer.keep_exact(frequent, weight[frequent.to(weight.device)])
    if config.tt_storage_bits is not None:
        layer.store_codes(config.tt_storage_bits, config.tt_storage_group_size)
    if not config.tt_untie_output:
        layer.tied_output = tied_output_name(model, embedding)
    return layer


def calibrate(model: nn.Module, config: TTConfig, ids: torch.Tensor, covariance_tokens: int) -> TTCalibration:
    """Calibration text for ``tt_basis=\"output\"`` and ``tt_exact_tokens`` (``apply_tt``)."""
    return TTCalibration.from_ids(model, ids, covariance_tokens, config.tt_basis == "output", "apply_tt")


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "tt",
    TTConfig,
    input_embedding_name,
    build,
    accepts=(nn.Embedding,),
    prepare=check_calibration,
    calibrate=calibrate,
    layers=(TTEmbedding, ScaledTTEmbedding),
)
