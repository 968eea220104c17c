"""Causal-LM perplexity with sliding windows and a stride; the per-window NLL sums go through the project's
``evaluate`` module ``perplexity`` (shipped in ``evaluation/metrics``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .metrics import load_metric, metric_path

PERPLEXITY_METRIC = metric_path("perplexity")


@torch.no_grad()
def window_nll(model: nn.Module, ids: torch.Tensor, window: int, stride: int, progress: bool = False):
    """Yield ``(nll_sum, predicted_tokens)`` per sliding window: each window scores only the tokens not scored
    by the previous one, with up to ``window - stride`` tokens of context before them."""
    if not 0 < stride <= window:
        raise ValueError(f"need 0 < stride <= window, got stride={stride}, window={window}")
    device = next(model.parameters()).device
    scored_until = 1  # the first token has no prediction
    starts = range(0, max(len(ids) - 1, 1), stride)
    for begin in tqdm(starts, desc="perplexity", disable=not progress):
        end = min(begin + window, len(ids))
        if end <= scored_until:
            break
        chunk = ids[begin:end].to(device)[None]
        logits = model(input_ids=chunk).logits[0, :-1].float()
        targets = chunk[0, 1:].clone()
        first_new = scored_until - begin - 1  # index (in targets) of the first token not scored yet
        targets[: max(first_new, 0)] = -100
        yield F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum").item(), int((targets >= 0).sum())
        scored_until = end


def perplexity(
    model: nn.Module, ids: torch.Tensor, window: int = 512, stride: int = 256, progress: bool = False
) -> dict:
    """``{"perplexity", "ln_perplexity", "tokens"}`` of ``model`` on the token stream ``ids``."""
    metric = load_metric("perplexity")
    was_training = model.training
    model.eval()
    for nll, count in window_nll(model, ids, window, stride, progress):
        metric.add(nll_sum=nll, token_count=count)
    model.train(was_training)
    return metric.compute()
