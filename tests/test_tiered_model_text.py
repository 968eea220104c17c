"""``size_ratio`` weighs rows by the model's own text beside the calibration text (``model_text_tokens``): tokens
the calibration text never uses but the model does keep wider rows; sampling leaves the model and the caller's
random state alone; configs without start tokens start from the calibration text; 0 turns it off."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T
from test_tiered_budget import CALIBRATION, HIDDEN, VOCAB, tiny
from tqdm.auto import tqdm

from hf_tensorcompress import CompressionConfig, apply_tiered
from hf_tensorcompress.methods.tiered import model_text
from hf_tensorcompress.methods.tiered.layer import tier_storage
from hf_tensorcompress.methods.tiered.model_text import RowOrderSampler, sample_model_text

#: Calibration text that never uses the upper 700 tokens.
SEEN = 300
NARROW_CALIBRATION = CALIBRATION[CALIBRATION < SEEN]


def peaked() -> torch.nn.Module:
    """The tiny model with its tied rows scaled up, so its next-token distribution (and its own text) favours some
    tokens strongly, as a trained model's does; a random model's is nearly uniform."""
    model = tiny()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(6)
    return model


def budget(tokens: int) -> CompressionConfig:
    return CompressionConfig(
        method="tiered", size_ratio=4, rounding="output", codebook_size=256, model_text_tokens=tokens
    )


def row_bytes(model: torch.nn.Module) -> torch.Tensor:
    """Bytes of each token's stored row (by token id)."""
    layer = model.get_input_embeddings()
    per_row = []
    for spec in layer.tier_specs:
        one, two = (tier_storage({**spec, "rows": rows}, HIDDEN).storage_bits() for rows in (1, 2))
        per_row += [(two - one) / 8] * spec["rows"]
    return torch.tensor(per_row)[layer.slot.long()]


def test_tokens_the_model_uses_beyond_the_calibration_text_keep_wider_rows(capsys):
    counts = torch.bincount(NARROW_CALIBRATION, minlength=VOCAB)
    frequencies = sample_model_text(peaked(), 8192, counts).frequencies
    unseen = torch.arange(SEEN, VOCAB)
    likely = unseen[frequencies[SEEN:].argsort(descending=True)[:100]]
    with_text = row_bytes(apply_tiered(peaked(), budget(8192), NARROW_CALIBRATION, 256))
    assert "and 8,192 tokens of the model's own text (from token 1)" in capsys.readouterr().out
    without = row_bytes(apply_tiered(peaked(), budget(0), NARROW_CALIBRATION, 256))
    assert "tokens of the model's own text" not in capsys.readouterr().out
    assert with_text[likely].mean() > 1.15 * without[likely].mean()


def test_sampling_leaves_the_model_and_the_callers_random_state_alone():
    model = peaked().train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    state = torch.random.get_rng_state()
    text = sample_model_text(model, 1000, torch.bincount(CALIBRATION, minlength=VOCAB))
    assert torch.equal(torch.random.get_rng_state(), state) and model.training
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert text.tokens >= 1000 and float(text.frequencies.sum()) == pytest.approx(1.0)
    assert text.covariance.shape == (HIDDEN, HIDDEN)


def test_sequences_run_in_rounds_whose_cache_fits_the_budget_and_give_the_same_counts(monkeypatch):
    model = peaked()  # 1 layer, 4 key/value heads, 127 positions after the start token
    cache_per_sequence = model_text.cache_bytes_per_position(model) * 128
    assert cache_per_sequence == 1 * 2 * 4 * (HIDDEN // 4) * 4 * 128  # layers × k, v × heads × head dim × fp32
    per_sequence = cache_per_sequence + model_text.LOGIT_COPIES * 4 * VOCAB  # and each step's logits
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    fit = max(8, model_bytes // model_text.CACHE_SHARE // per_sequence)
    assert model_text.sequences_at_once(model, 127, 1000) == fit
    model.config.sliding_window = 4096  # the static cache holds a sliding-window layer at the sequences' length
    assert model_text.sequences_at_once(model, 127, 1000) == fit
    model.config.sliding_window = None
    monkeypatch.setattr(model_text, "CACHE_SHARE", 1e-9)  # room for any number of sequences: the cap decides
    assert model_text.sequences_at_once(model, 127, 1000) == model_text.MOST_AT_ONCE == 64
    assert model_text.sequences_at_once(model, 127, 50) == 50
    monkeypatch.undo()
    counts = torch.bincount(CALIBRATION, minlength=VOCAB)
    whole = sample_model_text(model, 2000, counts, held_tokens=90)
    monkeypatch.setattr(model_text, "CACHE_SHARE", 10**9)  # 8 sequences a round: the counted and held ones mix
    rounds = sample_model_text(model, 2000, counts, held_tokens=90)
    length = model_text.LENGTH
    assert rounds.held_out.shape == whole.held_out.shape == (-(-90 // length), length + 1)
    assert rounds.tokens == whole.tokens == -(-2000 // length) * length  # only the counted sequences' positions
    assert float(rounds.frequencies.sum()) == pytest.approx(1.0)


def test_a_config_naming_no_start_token_starts_from_the_most_frequent_calibration_token():
    config = T.Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None,
    )  # fmt: skip
    model = T.Qwen2ForCausalLM(config).eval()
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = None
    counts = torch.bincount(CALIBRATION, minlength=VOCAB)
    assert sample_model_text(model, 200, counts).start == int(counts.argmax())


def test_tied_logits_are_broken_by_the_rows_values_not_by_id():
    """Float32 logits tie often; a draw that lands on a tie must pick the same token after renumbering."""
    rows = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    scores = torch.zeros(8, 6)  # every token tied
    permutation = torch.tensor([3, 5, 0, 1, 4, 2])  # new id i is old permutation[i]
    picks = []
    for table, permuted in ((rows, False), (rows[permutation], True)):
        sampler = RowOrderSampler(table, seed=0, bar=tqdm(disable=True))
        chosen = sampler(None, scores.clone()).argmax(1)
        picks.append(permutation[chosen] if permuted else chosen)
    assert torch.equal(picks[0], picks[1]) and len(set(picks[0].tolist())) > 1


def built_row_bytes(**setting) -> torch.Tensor:
    """Each row's bytes in the peaked model built at 4× from 256 tokens of its own text, with ``setting`` changed."""
    config = CompressionConfig(**{**budget(256).to_dict(), **setting})
    return row_bytes(apply_tiered(peaked(), config, NARROW_CALIBRATION, 256))


def test_model_text_tokens_must_be_a_count():
    with pytest.raises(ValueError, match=r"model_text_tokens must be an int >= 0"):
        CompressionConfig(method="tiered", size_ratio=4, model_text_tokens=-1)


def test_model_text_seed_draws_another_sample_and_the_same_one_again():
    counts = torch.bincount(NARROW_CALIBRATION, minlength=VOCAB)
    first, again, other = (sample_model_text(peaked(), 256, counts, seed=seed).frequencies for seed in (0, 0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(*(built_row_bytes(model_text_seed=seed) for seed in (0, 1))), (
        "model_text_seed never reached the sampler"
    )
    with pytest.raises(ValueError, match=r"model_text_seed must be an int >= 0"):
        CompressionConfig(method="tiered", size_ratio=4, model_text_seed=-1)


def test_text_drawn_hotter_counts_the_models_own_probabilities():
    """The counted sequences' draws follow ``softmax(scores / T)``, the held-out ones' (the build's check) stay at
    ``softmax(scores)``, and the expected counts stay ``softmax(scores)`` whatever ``T``."""
    torch.manual_seed(0)
    scores = torch.randn(1, 50).repeat(2, 1) * 3
    steps = 4000
    for temperature in (1.0, 2.5):
        sampler = RowOrderSampler(
            torch.randn(50, 8), bar=tqdm(disable=True), seed=0, counted=1, temperature=temperature
        )
        drawn = torch.stack([sampler(None, scores.clone()).argmax(-1) for _ in range(steps)])
        assert torch.allclose(sampler.expected, steps * scores[0].double().softmax(-1))  # the counted sequence only
        for sequence, drawn_at in ((0, temperature), (1, 1.0)):
            share = torch.bincount(drawn[:, sequence], minlength=50).double() / steps
            expected_share = (scores[0].double() / drawn_at).softmax(-1)
            assert (share - expected_share).abs().max() < 0.03, f"sequence {sequence} not drawn at {drawn_at}"
    assert (scores[0] / 2.5).softmax(-1).max() < scores[0].softmax(-1).max() - 0.1, "2.5 should flatten the draws"


def test_model_text_temperature_reaches_the_sampler_and_must_be_positive():
    counts = torch.bincount(NARROW_CALIBRATION, minlength=VOCAB)
    cold, hot = (sample_model_text(peaked(), 256, counts, temperature=t) for t in (1.0, 3.0))
    assert not torch.equal(cold.frequencies, hot.frequencies), "the draws at 3 reached the same contexts as at 1"
    assert not torch.equal(*(built_row_bytes(model_text_temperature=t) for t in (1.0, 3.0))), (
        "model_text_temperature never reached the sampler"
    )
    for wrong in (0, -1.0, True, math.inf, "hot"):
        with pytest.raises(ValueError, match=r"model_text_temperature must be a number > 0"):
            CompressionConfig(method="tiered", size_ratio=4, model_text_temperature=wrong)
