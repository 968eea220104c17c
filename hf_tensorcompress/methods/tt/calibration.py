"""Calibration of ``method="tt"``: statistics of text the model should serve, computed once before the layers are
built from calibration text by ``apply_calibrated`` (``apply_tt``) and passed to them explicitly."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ...core.progress import progress
from .config import EXACT_PRIORS, TTConfig


@dataclass
class TTCalibration:
    """What the calibration text tells the TT method: token counts (``tt_exact_tokens``) and the covariance of the
    hidden states entering the output layer (``tt_basis="output"``); ``held_out``: token ids of the same text kept
    out of both, for a check of what was built (tiered's ``size_ratio``)."""

    counts: torch.Tensor
    covariance: torch.Tensor | None = None
    held_out: torch.Tensor | None = None

    @classmethod
    def from_ids(
        cls, model: nn.Module, calibration_ids: torch.Tensor, covariance_tokens: int, covariance: bool, caller: str
    ) -> TTCalibration:
        """Token frequencies over all ``calibration_ids``; with ``covariance``, the hidden-state covariance over the
        first ``covariance_tokens`` (forward passes are the expensive part). ``caller`` names the entry point in
        errors."""
        vocab = model.get_input_embeddings().num_embeddings
        check_calibration_ids(calibration_ids, vocab, covariance_tokens, caller)
        counts = torch.bincount(calibration_ids.reshape(-1).cpu(), minlength=vocab)[:vocab]
        hidden = hidden_covariance(model, calibration_ids.reshape(-1)[:covariance_tokens]) if covariance else None
        return cls(counts=counts, covariance=hidden)


def check_calibration_ids(ids: object, vocab: int, covariance_tokens: object, caller: str) -> None:
    """A ValueError naming the argument, before any forward pass or change to the model: ids that are no token ids
    of this vocabulary would fail deep inside ``bincount`` or the embedding, or count wrong tokens."""
    if isinstance(covariance_tokens, bool) or not isinstance(covariance_tokens, int) or covariance_tokens < 1:
        raise ValueError(
            f"{caller}: covariance_tokens must be an int >= 1 (how many calibration tokens the hidden-state covariance "
            f"is measured on, e.g. 4096), got {covariance_tokens!r}"
        )
    if not isinstance(ids, torch.Tensor):
        raise ValueError(
            f"{caller}: calibration_ids must be a torch.Tensor of token ids (e.g. tokenizer(text, "
            f"return_tensors='pt').input_ids), got {type(ids).__name__}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{caller}: calibration_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel() == 0:
        raise ValueError(f"{caller}: calibration_ids is empty; pass the token ids of some calibration text")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{caller}: calibration_ids must be token ids in [0, {vocab}) for this model's {vocab}-token vocabulary, "
            f"got values from {low} to {high} (ids from another tokenizer?)"
        )


def needs_calibration(config: TTConfig) -> bool:
    return config.tt_basis == "output" or (config.tt_exact_tokens > 0 and config.tt_exact_prior != "token_id")


def check_calibration(model: nn.Module, config: TTConfig, calibration: object) -> TTCalibration | None:
    """``Method.prepare`` of tt: the calibration the config needs, of the right kind, else a clear error."""
    if not needs_calibration(config):
        return None
    if not isinstance(calibration, TTCalibration) or (config.tt_basis == "output" and calibration.covariance is None):
        raise ValueError(
            "tt_basis='output' and tt_exact_tokens (unless tt_exact_prior='token_id') need calibration text: call "
            "apply_tt(model, config, calibration_ids) with token ids of text the model should serve"
        )
    return calibration


#: Tokens read with and without the head to check that the decoder's output is what the head sees (the full logits
#: of a 262,144-token vocabulary over 64 positions: 67 MB).
PROBE_TOKENS = 64


def head_inputs(model: nn.Module, ids: torch.Tensor, skip_head: bool) -> torch.Tensor | None:
    """The hidden states entering the output layer at every position of ``ids`` (``(1, T)``), as ``(T, d)``. With
    ``skip_head``, they are read at the decoder's output and the head runs on one position (``logits_to_keep``): over
    a large vocabulary the head costs more than the layers below it; None where the model does not allow that."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    states: list[torch.Tensor] = []
    if skip_head:
        if decoder is None or decoder is model or "logits_to_keep" not in inspect.signature(model.forward).parameters:
            return None
        hook = decoder.register_forward_hook(lambda module, inputs, output: states.append(output[0]))
    else:
        hook = model.get_output_embeddings().register_forward_pre_hook(lambda module, inputs: states.append(inputs[0]))
    try:
        model(input_ids=ids, **({"logits_to_keep": 1} if skip_head else {}))
    finally:
        hook.remove()
    hidden = states[-1].reshape(-1, states[-1].shape[-1]) if states else None
    return hidden if hidden is not None and len(hidden) == ids.shape[1] else None


@torch.no_grad()
def hidden_covariance(model: nn.Module, token_ids: torch.Tensor, window: int = 512) -> torch.Tensor:
    """``E[h hᵀ]`` (float64, ``d×d``) of the hidden states entering the output layer, over calibration tokens. The
    first ``PROBE_TOKENS`` are read both ways (``head_inputs``); the head is skipped only where they agree."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    window = min(window, getattr(model.config, "max_position_embeddings", None) or window)
    probe = token_ids[:PROBE_TOKENS].to(device)[None]
    fast = head_inputs(model, probe, True)
    skip_head = fast is not None and torch.equal(fast, head_inputs(model, probe, False))
    total, count = None, 0
    for start in progress(range(0, len(token_ids), window), desc="calibration hidden states", unit="window"):
        hidden = head_inputs(model, token_ids[start : start + window].to(device)[None], skip_head).double()
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


def exact_token_ids(counts: torch.Tensor | None, number: int, prior: str = "calibration") -> torch.Tensor:
    """The ``number`` tokens kept exact, under ``prior``:

    - ``"calibration"``: most frequent in the calibration text first, then the tokens it never used in id order;
    - ``"token_id"``: the lowest ids (no text needed). BPE vocabularies (GPT-2, OPT, SmolLM2) number tokens in merge
      order, i.e. roughly by frequency in the tokenizer's own (broad) training corpus: a domain-free prior;
    - ``"mixed"``: the most frequent half from the calibration text (tokens it used), the rest by lowest id.
    """
    if prior not in EXACT_PRIORS:
        raise ValueError(f"prior={prior!r}; choose one of {list(EXACT_PRIORS)}")
    if prior == "token_id":
        return torch.arange(min(number, len(counts)))
    order = counts.argsort(descending=True, stable=True)
    if prior == "calibration":
        return order[: min(number, len(counts))]
    seen = order[: min(number // 2, int((counts > 0).sum()))]
    chosen = torch.zeros(len(counts), dtype=torch.bool)
    chosen[seen] = True
    rest = (~chosen).nonzero().squeeze(1)[: max(number - len(seen), 0)]
    return torch.cat([seen, rest])
