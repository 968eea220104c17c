"""The model's own text: what ``size_ratio`` weighs rows by beside the calibration text (build time only; not
shipped).

Calibration counts say which tokens one text uses. A row that text never needs gets the narrowest width, and text of
another domain pays for it (SmolLM2 at 8× calibrated on Moby Dick: Δ ln PPL 0.08 on Moby Dick, 0.43 on mails). The
model itself knows which tokens its training text used: text it samples from its start token follows its training
distribution, and the expected counts along it, ``Σ_t p(· | prefix_t)``, estimate how often each token is used there.
The hidden states entering its output layer along that text estimate the covariance its tied head sees. The
sequences are drawn hotter than the model (``model_text_temperature``) and counted at temperature 1: drawn at 1,
each settles into one kind of text, and one sample of them moved SmolLM2's 8× mail figure by 0.06; drawn hotter
they reach more kinds, and each position's counts are still what the model predicts there.

Cost: short sequences sampled side by side with the key/value cache, so the model runs about as many token
positions as the sample holds, each step one GEMM-sized product over every sequence of a round, and the hidden states
are taken from those steps rather than from a second pass. As many sequences run at once as keep their cache and
each step's logits under half of the model's own bytes (64 at most): each round reads every weight once a step, and a
decoding step of a few sequences is bound by those reads, so fewer, wider rounds take less time. Short sequences make
the rounds wide (a sequence's cache grows with its length) and few (a round takes as many steps as a sequence has
tokens): on SmolLM2 (2 cores), 8,192 tokens as 64 sequences of 128 took 85 s, 128 of 64 took 74 s, 256 of 32 took
51 s, and the rows weighed at 32 served unseen text no worse. The cache is ``generate``'s static one, allocated
once at the sequences' length: the default cache grows by a position each step, every layer's keys and values copied
into a slightly larger tensor, and the freed ones fragment the heap (on a 262,144 × 640 Gemma 3 shape, 4,096 tokens
added 1,265 MB at the peak that way, 335 MB with the static cache, in no more time there). Drawing is linear in the
vocabulary: an inverse CDF over the probabilities in an order set by the rows' values (a seeded projection of each
token's row), not by id, so a model whose vocabulary is renumbered samples the same text, renumbered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ...core.progress import progress

#: The sampled sequences' length after the start token (shorter where the model's positions end sooner): more and
#: shorter sequences sample faster (wider rounds, fewer steps) and cover more of what the model's documents start
#: with; at 32 the rows they weigh served SmolLM2's unseen domains no worse than at 128, in 60 % of the time.
LENGTH = 32

#: Sequences whose next-token probabilities are drawn from at a time (float64: 2 MB each at 262,144 tokens), and the
#: fewest sampled side by side however large their cache.
SEQUENCES_AT_ONCE = 8

#: Rows projected at a time (a float64 copy of a whole 262,144 × 640 table would take 1.3 GB).
ROWS_AT_ONCE = 4096

#: What the sequences sampled side by side hold (their cache and each step's logits) stays under the model's bytes
#: divided by this. Half: on SmolLM2, 30 sequences a round instead of a quarter's 15 took the step from 182 s to 136 s
#: (2 cores), and the build's peak did not rise (the widths measured next reuse the freed space).
CACHE_SHARE = 2

#: The most sequences sampled side by side, however many fit: at 64 the step adds less at its peak than the build's
#: largest other step (on SmolLM2, a 262k-vocabulary 270M shape and a 1B shape). Under half its bytes alone, the 1B
#: shape (128,256 × 2,048, 16 layers) sampled its 288 sequences in two rounds of 144 and the step added 1.7 GB (0.36×
#: its fp32 bytes), taking the build's peak to 1.52× the model; in five rounds of 58 it added 259 MB (peak 1.27×), at
#: the price of 383 s against 257 s for the step (2 cores, on days a dense forward took 193 s and 176 s).
MOST_AT_ONCE = 64

#: Float32 copies of a sequence's logits a generation step holds at its peak (the model's output, ``generate``'s
#: float copy, a soft cap's temporaries, the draw's scores, and the heap they leave): measured on the 262,144 × 640
#: Gemma 3 shape at 8,192 tokens, the step's peak grew by 12 MB a sequence (413 MB added at 16 side by side, 857 MB at
#: 53, where the cache alone was counted).
LOGIT_COPIES = 12


@dataclass
class ModelText:
    """What the model's sampled text says: expected token frequencies (float64, summing to 1) and the covariance of
    the hidden states entering the output layer over its ``tokens`` positions (none where ``tokens`` is 0), and
    sequences sampled beside it that neither counts (``held_out``, ``(sequences, length)``: text to check a build
    on)."""

    frequencies: torch.Tensor
    covariance: torch.Tensor
    tokens: int
    start: int
    held_out: torch.Tensor


class RowOrderSampler(LogitsProcessor):
    """Draws each next token from the full softmax by inverse CDF over the probabilities taken in the order of the
    tokens' rows (their projection on a seeded direction), the first ``counted`` sequences at ``temperature`` and the
    rest at 1, and sums the counted sequences' probabilities at temperature 1 (expected counts: what the model
    predicts in the contexts the draws reach); returns scores that make greedy search pick the draw.

    Any fixed order samples the same distribution; one set by the rows' values, not by id, makes the draw the same
    token after the vocabulary is renumbered (tokens with equal rows are interchangeable)."""

    def __init__(
        self, rows: torch.Tensor, seed: int, bar: tqdm, counted: int | None = None, temperature: float = 1.0
    ) -> None:
        self.vocab, self.counted, self.temperature = len(rows), counted, temperature
        self.generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(rows.shape[1], generator=self.generator, dtype=torch.float64)
        self.by_row = row_projection(rows, direction).argsort(descending=True, stable=True)
        self.expected = torch.zeros(self.vocab, dtype=torch.float64)
        self.bar = bar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        draws = torch.rand(len(scores), 1, generator=self.generator, dtype=torch.float64)
        chosen = torch.cat(
            [self._draw(part, draws[first : first + len(part)], first) for first, part in self._parts(scores)]
        )
        self.bar.update(len(scores))
        picked = torch.full_like(scores, -math.inf)
        return picked.scatter_(1, chosen.to(scores.device), 0.0)

    def _parts(self, scores: torch.Tensor):
        """``(first row, rows)`` of ``scores`` a few sequences at a time: float64 probabilities of a 262,144-token
        vocabulary take 2 MB a sequence, and a step's whole batch in float64 would take hundreds of MB."""
        return (
            (first, scores[first : first + SEQUENCES_AT_ONCE]) for first in range(0, len(scores), SEQUENCES_AT_ONCE)
        )

    def _draw(self, scores: torch.Tensor, draws: torch.Tensor, first: int) -> torch.Tensor:
        probabilities = scores[:, : self.vocab].double().softmax(-1).cpu()
        counted = max(0, min(len(probabilities), (self.counted if self.counted is not None else 1 << 62) - first))
        self.expected += probabilities[:counted].sum(0)
        if self.temperature != 1 and counted:  # the held-out sequences (the build's check) stay at 1
            hot = scores[:counted, : self.vocab].double() / self.temperature
            probabilities[:counted] = hot.softmax(-1).cpu()
        cumulative = probabilities[:, self.by_row].cumsum(1)
        pick = torch.searchsorted(cumulative, draws * cumulative[:, -1:], right=True).clamp(max=self.vocab - 1)
        return self.by_row[pick]


def row_projection(rows: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """Each row's float64 projection on ``direction``, ``ROWS_AT_ONCE`` rows at a time through one reused float64
    block: a new block per chunk would be a new large allocation each time, and after the calibration pass glibc
    places each on top of the last one's freed space (a 262,144 × 640 table grew the process by 1.2 GB that way)."""
    projection = torch.empty(len(rows), dtype=torch.float64)
    block = torch.empty(min(ROWS_AT_ONCE, len(rows)), rows.shape[1], dtype=torch.float64)
    for first in range(0, len(rows), ROWS_AT_ONCE):
        part = block[: min(ROWS_AT_ONCE, len(rows) - first)]
        part.copy_(rows[first : first + len(part)].detach())
        torch.mv(part, direction, out=projection[first : first + len(part)])
    return projection


class HeadInputs:
    """``E[h hᵀ]`` (float64) of the last position's hidden state entering the output layer at every call, over the
    first ``counted`` sequences: with the key/value cache, each generation step's new positions."""

    def __init__(self, width: int, counted: int | None = None) -> None:
        self.total = torch.zeros(width, width, dtype=torch.float64)
        self.count, self.counted = 0, counted

    def __call__(self, module: nn.Module, inputs: tuple) -> None:
        hidden = inputs[0].reshape(len(inputs[0]), -1, inputs[0].shape[-1])[: self.counted, -1].double().cpu()
        self.total += hidden.T @ hidden
        self.count += len(hidden)

    def covariance(self) -> torch.Tensor:
        return self.total / max(self.count, 1)


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


def cache_bytes_per_position(model: nn.Module) -> int:
    """Bytes the key/value cache holds per sequence position, from the model's config (layers × keys and values ×
    key/value heads × head width × the weights' element size)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    hidden = getattr(config, "hidden_size", None) or model.get_input_embeddings().weight.shape[1]
    heads = getattr(config, "num_attention_heads", None) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layers = getattr(config, "num_hidden_layers", None) or 1
    return layers * 2 * kv_heads * head_dim * next(model.parameters()).element_size()


def sequences_at_once(model: nn.Module, length: int, total: int) -> int:
    """How many sequences to sample side by side: as many as keep their cache and their steps' logits under
    ``1 / CACHE_SHARE`` of the model's bytes, at least ``SEQUENCES_AT_ONCE``, at most ``MOST_AT_ONCE`` and
    ``total``."""
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    vocab = model.get_output_embeddings().weight.shape[0]
    # the static cache holds the start token and ``length`` positions a sequence (a sliding-window layer no more)
    per_sequence = cache_bytes_per_position(model) * (length + 1) + LOGIT_COPIES * 4 * vocab
    fit = model_bytes // CACHE_SHARE // max(1, per_sequence)
    return max(1, min(total, MOST_AT_ONCE, max(SEQUENCES_AT_ONCE, fit)))


@torch.no_grad()
def sample_model_text(
    model: nn.Module,
    tokens: int,
    counts: torch.Tensor,
    seed: int = 0,
    held_tokens: int = 0,
    temperature: float = 1.0,
) -> ModelText:
    """About ``tokens`` tokens the model samples from its start token (``LENGTH``-long sequences, shorter where the
    model's positions end sooner, ``sequences_at_once`` side by side; ``counts``, the calibration text's, pick the
    start where the config names none), their expected counts and the hidden-state covariance of the output layer's
    inputs along them, and sequences of about ``held_tokens`` more tokens sampled beside them that neither counts;
    the counted sequences are drawn at ``temperature`` (their counts are the model's probabilities at temperature 1),
    the held-out ones at 1, text as the model writes it; the model is left as it was (eval/train mode too)."""
    rows = model.get_input_embeddings().weight
    positions = getattr(model.config, "max_position_embeddings", None) or LENGTH + 1
    length = max(1, min(LENGTH, positions - 1))
    counted = math.ceil(tokens / length) if tokens else 0
    total = counted + math.ceil(held_tokens / length)
    at_once = sequences_at_once(model, length, total)
    at_once = math.ceil(total / math.ceil(total / at_once)) if total else at_once  # rounds of equal width
    device = next(model.parameters()).device
    first = start_token(model, counts)
    settings = GenerationConfig(
        do_sample=False, max_new_tokens=length, min_new_tokens=length, eos_token_id=None, pad_token_id=0,
        cache_implementation="static", disable_compile=True,
    )  # fmt: skip
    head_inputs = HeadInputs(rows.shape[1])
    hook = model.get_output_embeddings().register_forward_pre_hook(head_inputs)
    was_training = model.training
    model.eval()
    try:
        with progress(desc="model's own text", total=total * length, unit="token") as bar:
            sampler = RowOrderSampler(rows, seed, bar, temperature=temperature)
            texts = []
            for done in range(0, total, at_once):
                size = min(at_once, total - done)
                # the counted sequences come first in each round: the rest are the held-out ones
                sampler.counted = head_inputs.counted = max(0, min(size, counted - done))
                start = torch.full((size, 1), first, dtype=torch.long, device=device)
                texts.append(
                    model.generate(
                        start,
                        attention_mask=torch.ones_like(start),
                        generation_config=settings,
                        logits_processor=LogitsProcessorList([sampler]),
                    ).cpu()
                )
    finally:
        hook.remove()
        model.train(was_training)
    expected = sampler.expected
    frequencies = expected / expected.sum() if tokens else expected
    sample = torch.cat(texts) if texts else torch.zeros(0, length + 1, dtype=torch.long)
    held_out = sample[counted:]
    return ModelText(frequencies, head_inputs.covariance(), round(float(expected.sum())), first, held_out)
