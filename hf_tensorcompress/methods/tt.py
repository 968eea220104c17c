"""``method="tt"``: the token embedding becomes per-token tensor trains (TensorSLM, DESIGN.md §3.4).

Targets ``model.get_input_embeddings()`` by default. A tied output layer (GPT-2, OPT, SmolLM2) is taken over by
``TTTiedHead`` (logits read from the cores; the tied matrix is stored once, compressed) unless
``tt_untie_output=True`` keeps a dense copy.
"""

from __future__ import annotations

import contextvars

import torch
from torch import nn

from ..config import CompressionConfig
from ..layers.tt_embedding import TTEmbedding, balanced_shape
from . import Method, register_method

DEFAULT_ORDER = 3

#: calibration statistics handed from ``apply_tt`` to ``build``: {"covariance": (d, d), "counts": (V,)}
_CALIBRATION: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tt_calibration", default=None)


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
def hidden_covariance(model: nn.Module, token_ids: torch.Tensor, window: int = 512) -> torch.Tensor:
    """``E[h hᵀ]`` (float64, ``d×d``) of the hidden states entering the output layer, over calibration tokens."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    window = min(window, getattr(model.config, "max_position_embeddings", None) or window)
    total, count = None, 0
    for start in range(0, len(token_ids), window):
        chunk = token_ids[start : start + window].to(device)[None]
        hidden = model(input_ids=chunk, output_hidden_states=True).hidden_states[-1][0].double()
        total = hidden.T @ hidden if total is None else total + hidden.T @ hidden
        count += hidden.shape[0]
    model.train(was_training)
    return (total / count).cpu()


def output_basis(weight: torch.Tensor, covariance: torch.Tensor | None = None) -> torch.Tensor:
    """``P`` with ``P⁻¹ = C^{1/2} Q``: whiten by the hidden-state covariance ``C`` (identity if None, giving the
    principal axes of ``W``), then rotate onto the principal axes ``Q`` of ``W C^{1/2}`` so that each row's energy
    sits in its leading coordinates, which is what per-token TT truncation keeps. Minimising ``‖(w − ŵ) C^{1/2}‖``
    is minimising the expected logit error ``E (h·(w − ŵ))²`` of a tied output layer."""
    weight = weight.detach().double().cpu()
    size = weight.shape[1]
    if covariance is None:
        root, inverse_root = torch.eye(size, dtype=torch.float64), torch.eye(size, dtype=torch.float64)
    else:
        values, vectors = torch.linalg.eigh(covariance.double())
        values = values.clamp(min=float(values.max()) * 1e-8)
        root = (vectors * values.sqrt()) @ vectors.T
        inverse_root = (vectors / values.sqrt()) @ vectors.T
    _, _, vh = torch.linalg.svd(weight @ root, full_matrices=False)
    return vh @ inverse_root


def apply_tt(
    model: nn.Module,
    config: CompressionConfig,
    calibration_ids: torch.Tensor | None = None,
    covariance_tokens: int = 4096,
) -> nn.Module:
    """``apply_compression`` for ``method="tt"``, with calibration tokens for ``tt_basis="output"`` and
    ``tt_exact_tokens`` (text that must not overlap the evaluation text). The basis and the exact rows end up in
    the checkpoint; loading needs no calibration. Token frequencies use all ``calibration_ids``; the hidden-state
    covariance the first ``covariance_tokens`` (forward passes are the expensive part)."""
    from ..compress import apply_compression

    needs = config.tt_basis == "output" or config.tt_exact_tokens > 0
    if needs and calibration_ids is None:
        raise ValueError(
            "tt_basis='output' and tt_exact_tokens need calibration_ids: token ids of text the model should serve"
        )
    calibration = None
    if needs:
        vocab = model.get_input_embeddings().num_embeddings
        calibration = {
            "covariance": hidden_covariance(model, calibration_ids[:covariance_tokens]) if config.tt_basis == "output" else None,
            "counts": torch.bincount(calibration_ids.reshape(-1).cpu(), minlength=vocab)[:vocab],
        }
    token = _CALIBRATION.set(calibration)
    try:
        return apply_compression(model, config)
    finally:
        _CALIBRATION.reset(token)


def exact_token_ids(counts: torch.Tensor, number: int) -> torch.Tensor:
    """The ``number`` tokens kept exact: most frequent in the calibration text first, then the tokens it never
    used in id order. BPE vocabularies (GPT-2, OPT, SmolLM2) number tokens by merge order, i.e. roughly by
    frequency in the tokenizer's training corpus, so low ids are the common tokens any text is likely to need."""
    return counts.argsort(descending=True, stable=True)[: min(number, len(counts))]


@torch.no_grad()
def build(model: nn.Module, name: str, embedding: nn.Embedding, config: CompressionConfig) -> TTEmbedding:
    if type(embedding) is not nn.Embedding:
        raise ValueError(
            f"method 'tt' replaces plain nn.Embedding modules; {name} is {type(embedding).__name__}, whose forward "
            "may do more than a lookup (e.g. scaling), so replacing it would change the model"
        )
    shape, ranks = tt_settings(config, embedding.embedding_dim)
    basis, calibration = None, _CALIBRATION.get()
    if (config.tt_basis == "output" or config.tt_exact_tokens) and calibration is None:
        raise ValueError(
            "tt_basis='output' and tt_exact_tokens need calibration text: use methods.tt.apply_tt(model, config, ids)"
        )
    if config.tt_basis == "output":
        basis = output_basis(embedding.weight, calibration["covariance"])
    elif config.tt_basis == "pca":
        basis = output_basis(embedding.weight)
    weight = embedding.weight.detach()
    layer = TTEmbedding.from_weight(
        weight, shape, ranks, config.tt_eps, None if basis is None else basis.to(weight), config.tt_solver
    )
    if config.tt_exact_tokens:
        frequent = exact_token_ids(calibration["counts"], config.tt_exact_tokens)
        layer.keep_exact(frequent, weight[frequent.to(weight.device)])
    if not config.tt_untie_output:
        layer.tied_output = tied_output_name(model, embedding)
    return layer


register_method(Method("tt", input_embedding_name, build, accepts=(nn.Embedding,)))
