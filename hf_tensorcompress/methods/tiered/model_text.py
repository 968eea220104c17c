"""The model's own text: what ``size_ratio`` weighs rows by beside the calibration text (build time only; not
shipped).

Calibration counts say which tokens one text uses. A row that text never needs gets the narrowest width, and text of
another domain pays for it (SmolLM2 at 8× calibrated on Moby Dick: Δ ln PPL 0.08 on Moby Dick, 0.43 on mails). The
model itself knows which tokens its training text used: text it samples from its start token follows its training
distribution, and the expected counts along it, ``Σ_t p(· | prefix_t)``, estimate how often each token is used there.
Its hidden states estimate the covariance its tied head sees over that text.

Sampling is numbering-free: each token is drawn by inverse CDF over the probabilities sorted by value, not by id, so a
model whose vocabulary is renumbered samples the same text, renumbered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ...progress import progress
from ..tt.calibration import hidden_covariance

#: Most sequences sampled at once, and their longest length with the start token (shorter where the model's
#: positions end sooner): one window of the covariance pass.
SEQUENCES, LENGTH = 64, 512


@dataclass
class ModelText:
    """What the model's sampled text says: expected token frequencies (float64, summing to 1) and the covariance of
    the hidden states entering the output layer over it."""

    frequencies: torch.Tensor
    covariance: torch.Tensor
    tokens: int
    start: int


class ValueOrderSampler(LogitsProcessor):
    """Draws each next token from the full softmax (temperature 1) by inverse CDF over the probabilities sorted by
    value, and sums the probabilities (expected counts); returns scores that make greedy search pick the draw.

    Float32 logits tie often (dozens of pairs among 49,152 at each step), so ties are broken by a value of each
    token's row, its projection on a seeded direction, not by id: tokens with equal rows are interchangeable."""

    def __init__(self, rows: torch.Tensor, seed: int, bar: tqdm) -> None:
        self.vocab = len(rows)
        self.generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(rows.shape[1], generator=self.generator, dtype=torch.float64)
        self.by_row = (rows.detach().double().cpu() @ direction).argsort(descending=True, stable=True)
        self.expected = torch.zeros(self.vocab, dtype=torch.float64)
        self.bar = bar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probabilities = scores[:, : self.vocab].double().softmax(-1).cpu()
        self.expected += probabilities.sum(0)
        ordered, position = probabilities[:, self.by_row].sort(dim=1, descending=True, stable=True)
        order = self.by_row[position]
        draw = torch.rand(len(ordered), 1, generator=self.generator, dtype=torch.float64)
        pick = (ordered.cumsum(1) < draw).sum(1).clamp(max=self.vocab - 1)
        chosen = order.gather(1, pick[:, None]).to(scores.device)
        self.bar.update(len(ordered))
        picked = torch.full_like(scores, -math.inf)
        return picked.scatter_(1, chosen, 0.0)


def start_token(model: nn.Module, counts: torch.Tensor) -> int:
    """The token the model's documents start with: its BOS, else its EOS (the separator between documents), else
    the calibration text's most frequent token (a config that names neither)."""
    for config in (getattr(model, "generation_config", None), model.config):
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(config, name, None)
            value = value[0] if isinstance(value, (list, tuple)) and value else value
            if isinstance(value, int):
                return value
    return int(counts.argmax())


@torch.no_grad()
def sample_model_text(model: nn.Module, tokens: int, counts: torch.Tensor, seed: int = 0) -> ModelText:
    """About ``tokens`` tokens the model samples from its start token (``SEQUENCES`` at a time, up to ``LENGTH``
    long; ``counts``, the calibration text's, pick the start where the config names none), their expected counts
    and hidden-state covariance; the model is left as it was (eval/train mode too)."""
    rows = model.get_input_embeddings().weight
    positions = getattr(model.config, "max_position_embeddings", None) or LENGTH + 1
    length = max(1, min(LENGTH, positions) - 1)
    rounds = math.ceil(tokens / (SEQUENCES * length))
    batch = math.ceil(tokens / (rounds * length))
    device = next(model.parameters()).device
    first = start_token(model, counts)
    start = torch.full((batch, 1), first, dtype=torch.long, device=device)
    settings = GenerationConfig(
        do_sample=False, max_new_tokens=length, min_new_tokens=length, eos_token_id=None, pad_token_id=0
    )
    was_training = model.training
    model.eval()
    with progress(desc="model's own text", total=rounds * batch * length, unit="token") as bar:
        sampler = ValueOrderSampler(rows, seed, bar)
        texts = [
            model.generate(
                start,
                attention_mask=torch.ones_like(start),
                generation_config=settings,
                logits_processor=LogitsProcessorList([sampler]),
            ).cpu()
            for _ in range(rounds)
        ]
    model.train(was_training)
    sequences = torch.cat(texts)
    covariance = sum(hidden_covariance(model, row, window=LENGTH) for row in sequences) / len(sequences)
    return ModelText(sampler.expected / sampler.expected.sum(), covariance, int(sampler.expected.sum()), first)
