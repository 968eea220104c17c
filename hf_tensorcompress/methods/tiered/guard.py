"""What keeps a ``size_ratio`` build from being silently worse than the safe choice (build time only; not shipped).

The budget weighs rows by how often text uses their tokens, so a calibration text of one kind can starve the rows
another kind needs: SmolLM2-Instruct at 6× weighed by 8k tokens of prose alone answered a chat prompt with
``'<<<<<"<<<'``. Three guards: the tokens a model reads in every conversation (its special tokens, a chat template's)
are never narrower than int8 (``budget.WIDE_ENOUGH``); a calibration text short for the vocabulary is named with a
warning; and after the build, text the allocation never saw (the end of the calibration text and a few sequences the
model sampled) is scored through the budget's allocation and through the same bytes with every row weighed alike.
Where the weighed allocation loses, the build keeps the other one and warns, naming the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

#: Calibration tokens below which ``size_ratio`` warns (fewer for a vocabulary under 4,096 tokens: 16 a token): its
#: rows are weighed by how often the text uses each token, and a short text leaves most of a large vocabulary
#: unweighed (the command line's default calibration length).
ENOUGH_CALIBRATION = 65_536

#: Tokens held back at the end of the calibration text for the check (at most an eighth of the text).
HELD_BACK_TOKENS = 1024

#: Tokens the model samples for the check, besides the ones its text is weighed by.
CHECK_TOKENS = 1024

#: The most positions scored per forward pass of the check.
CHECK_WINDOW = 128

#: Float32 logits a forward pass of the check may hold: fewer positions a pass for a large vocabulary (32 over
#: 262,144 tokens). The loss holds them twice more (a float32 copy and its log-softmax): at 128 positions over
#: 262,144 tokens the check added 331 MB at its peak, the most of any step of a bf16 build of that shape.
CHECK_LOGIT_BYTES = 32 * 2**20

#: ln-perplexity margin by which the rows weighed alike must win on held-back text before the build keeps them.
MARGIN = 0.01

#: Tokens the check names where the weighed allocation serves them worst.
WORST_SHOWN = 10


class BudgetCheckWarning(UserWarning):
    """A ``size_ratio`` build's guard fired: short calibration text, or an allocation that lost on held-back text."""


@dataclass
class BudgetCheck:
    """What the held-back check measured: Δ ln PPL against the dense embedding per text for the weighed allocation
    and the one weighed alike, which of the two the layer holds, and the tokens the weighed one served worst (id,
    uses in the held-back text, its width)."""

    weighed: dict[str, float]
    alike: dict[str, float]
    kept: str
    worst_served: list[tuple[int, int, str]] = field(default_factory=list)

    def line(self) -> str:
        texts = "; ".join(
            f"{name}: weighed {self.weighed[name]:+.3f}, weighed alike {self.alike[name]:+.3f}" for name in self.weighed
        )
        return f"size_ratio check on held-back text (Δ ln PPL against the dense embedding) — {texts}; kept {self.kept}"


def special_token_ids(model: nn.Module) -> set[int]:
    """The start, end, padding and decoder-start tokens the model's config and generation config name."""
    found: set[int] = set()
    for config in (model.config, getattr(model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
            value = getattr(config, name, None)
            found.update(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int))
    return found


def template_tokens(tokenizer) -> list[int]:
    """The tokenizer's special tokens and every token its chat template writes around three short messages (the
    role names, separators and turn markers a chat model reads in every conversation): ``protected_tokens`` for a
    ``size_ratio`` build of a chat model."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "system", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ]
        for prompt in (False, True):
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=prompt, return_dict=True)
            ids.update(rendered["input_ids"])
    return sorted(int(token) for token in ids)


def protected_rows(model: nn.Module, vocab: int, extra: Iterable[int] | None) -> torch.Tensor:
    """A bool per row: the model's special tokens and ``extra`` (``protected_tokens``); an id outside the
    vocabulary is an error naming it."""
    ids = special_token_ids(model) | set(extra or [])
    outside = sorted(token for token in ids if not 0 <= token < vocab)
    if outside and set(outside) & set(extra or []):
        raise ValueError(
            f"protected_tokens {outside} are not token ids of this {vocab}-token vocabulary (ids from another tokenizer?)"
        )
    rows = torch.zeros(vocab, dtype=torch.bool)
    rows[[token for token in ids if 0 <= token < vocab]] = True
    return rows


def enough_calibration(vocab: int) -> int:
    """Calibration tokens a ``size_ratio`` build wants: ``ENOUGH_CALIBRATION``, or 16 a token of a small vocabulary."""
    return min(ENOUGH_CALIBRATION, 16 * vocab)


def warn_if_short(tokens: int, vocab: int) -> None:
    """A ``BudgetCheckWarning`` where the calibration text has fewer tokens than ``enough_calibration``."""
    enough = enough_calibration(vocab)
    if tokens < enough:
        warnings.warn(
            f"size_ratio: {tokens:,} calibration tokens is short for a {vocab:,}-token vocabulary: rows are weighed by "
            f"how often the text uses each token, so give at least {enough:,} tokens of text of the kind the model "
            "will serve (--calibration-tokens on the command line) and keep model_text_tokens > 0",
            BudgetCheckWarning,
            stacklevel=2,
        )


def held_back(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration ids, held-back ids): the last ``HELD_BACK_TOKENS`` (at most an eighth) are kept for the check."""
    ids = ids.reshape(-1)
    keep = min(HELD_BACK_TOKENS, len(ids) // 8)
    return (ids[: len(ids) - keep], ids[len(ids) - keep :]) if keep else (ids, ids[:0])


@contextmanager
def serving(model: nn.Module, embedding: nn.Module, layer: nn.Module | None) -> Iterator[None]:
    """``layer`` answers in place of ``embedding`` (and of the tied output layer it serves) while inside: each
    module's ``forward`` is replaced on the instance and restored after, so the dense ones are not run (a forward
    hook would compute the dense logits too, 134 MB a window over a 262,144-token vocabulary) and the model's own
    modules are left as they were (a ``forward`` already set on the instance, as accelerate's offloading hooks set
    one, is put back)."""
    replaced = []
    if layer is not None:
        replaced.append((embedding, lambda input_ids, *args, **kwargs: layer(input_ids).to(embedding.weight.dtype)))
        if layer.tied_output is not None:
            head = model.get_submodule(layer.tied_output)
            replaced.append((head, lambda hidden, _dtype=head.weight.dtype: layer.logits(hidden).to(_dtype)))
    own = [(module, vars(module).get("forward")) for module, _ in replaced]
    for module, forward in replaced:
        module.forward = forward
    try:
        yield
    finally:
        for module, previous in own:
            if previous is None:
                del module.forward
            else:
                module.forward = previous


@torch.no_grad()
def check_window(vocab: int) -> int:
    """Positions the check scores per forward pass over a ``vocab``-token vocabulary: ``CHECK_WINDOW``, fewer where
    their logits would pass ``CHECK_LOGIT_BYTES``."""
    return max(1, min(CHECK_WINDOW, CHECK_LOGIT_BYTES // (4 * vocab)))


def ln_perplexity(model: nn.Module, embedding: nn.Module, layer: nn.Module | None, ids: torch.Tensor) -> float:
    """Mean next-token ln-loss of ``ids`` (``(sequences, length)``) through ``model`` with ``layer`` in place of
    ``embedding`` (``serving``). About ``check_window`` predictions run per forward pass, so the logits held at once
    stay small: a long sequence in windows, short ones several side by side (one at a time, 32-token sequences
    made each product 32 rows deep, and the check took half as long again)."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        window = check_window(embedding.weight.shape[0])
        predictions = max(1, ids.shape[1] - 1)
        side_by_side = max(1, window // predictions)
        total, count = 0.0, 0
        with serving(model, embedding, layer):
            for first in range(0, len(ids), side_by_side):
                rows = ids[first : first + side_by_side]
                for start in range(0, predictions, window):
                    part = rows[:, start : start + window + 1].to(device)
                    scored = part.numel() - len(part)
                    total += float(model(input_ids=part, labels=part).loss) * scored
                    count += scored
        return total / max(count, 1)
    finally:
        model.train(was_training)


def compare(
    model: nn.Module,
    embedding: nn.Module,
    weighed: nn.Module,
    alike: nn.Module,
    texts: dict[str, torch.Tensor],
) -> BudgetCheck:
    """Δ ln PPL of both allocations on each held-back text; keeps ``"weighed"`` unless the rows weighed alike win
    on the text where the weighed allocation is worst by more than ``MARGIN``."""
    dense = {name: ln_perplexity(model, embedding, None, ids) for name, ids in texts.items()}
    scores = {
        kind: {name: ln_perplexity(model, embedding, layer, ids) - dense[name] for name, ids in texts.items()}
        for kind, layer in (("weighed", weighed), ("alike", alike))
    }
    worst = max(texts, key=lambda name: scores["weighed"][name])
    kept = "weighed alike" if scores["alike"][worst] < scores["weighed"][worst] - MARGIN else "weighed"
    return BudgetCheck(scores["weighed"], scores["alike"], kept)


def worst_served(errors: torch.Tensor, ids: Iterable[torch.Tensor], names: list[str]) -> list[tuple[int, int, str]]:
    """The tokens of the held-back texts whose rows lose most there (uses × the row's error at its width):
    (token id, uses, width name), ``WORST_SHOWN`` at most. ``errors`` and ``names`` are per token."""
    uses = torch.zeros(len(errors), dtype=torch.float64)
    for part in ids:
        uses += torch.bincount(part.reshape(-1).cpu(), minlength=len(errors))[: len(errors)].double()
    order = (uses * errors.double()).argsort(descending=True)[:WORST_SHOWN]
    return [(int(token), int(uses[token]), names[token]) for token in order if uses[token] > 0]
