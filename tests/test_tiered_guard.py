"""``size_ratio`` is never silently worse than the safe choice: the model's special tokens and ``protected_tokens``
keep int8 rows or wider however rarely the calibration text uses them; a calibration text short for the vocabulary
is named in a warning; after the build, held-back text is scored through the allocation and through the same bytes
with every row weighed alike, and where the weighed one loses the layer keeps the other, with a warning naming the
fix and the rows served worst."""

from __future__ import annotations

import pytest
import torch
from test_tiered_budget import CALIBRATION, VOCAB, budget, tiny
from test_tiered_model_text import peaked

from hf_tensorcompress import apply_tiered
from hf_tensorcompress.methods.tiered.guard import BudgetCheckWarning, held_back, ln_perplexity
from hf_tensorcompress.methods.tiered.model_text import sample_model_text


def widths_of(model: torch.nn.Module, tokens: list[int]) -> list[object]:
    """The stored width of each token's row."""
    layer = model.get_input_embeddings()
    per_row = [spec["bits"] for spec in layer.tier_specs for _ in range(spec["rows"])]
    return [per_row[int(layer.slot[token])] for token in tokens]


def test_special_and_protected_tokens_keep_int8_rows_the_text_never_uses(capsys):
    unused = [token for token in range(900, VOCAB) if token not in CALIBRATION.tolist()][:5]
    config = budget(6, model_text_tokens=0, protected_tokens=unused[:3])
    model = tiny()
    model.config.pad_token_id = unused[3]
    with pytest.warns(BudgetCheckWarning, match="short"):
        compressed = apply_tiered(model, config, CALIBRATION, 256)
    special = [compressed.config.bos_token_id, compressed.config.eos_token_id]
    assert all(width in (8, 16) for width in widths_of(compressed, unused[:4] + special))
    assert widths_of(compressed, unused[4:5]) != [8]  # an unprotected unused token: narrow
    assert "size_ratio check on held-back text" in capsys.readouterr().out


def test_protected_tokens_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match=r"protected_tokens \[1000\] are not token ids of this 1000-token"):
        apply_tiered(tiny(), budget(4, model_text_tokens=0, protected_tokens=[1000]), CALIBRATION, 256)


def test_protected_tokens_are_a_floor_of_the_budget_only():
    from hf_tensorcompress import CompressionConfig

    with pytest.raises(ValueError, match="protected_tokens is a floor of the size_ratio budget"):
        CompressionConfig(method="tiered", tier_bits=[4], protected_tokens=[1])
    with pytest.raises(ValueError, match="protected_tokens must be a list of token ids"):
        CompressionConfig(method="tiered", size_ratio=4, protected_tokens=[-1])


def test_an_allocation_that_loses_on_held_back_text_gives_way_with_a_warning(capsys):
    """Calibration text made of the 300 tokens the model's own text uses least, and no model text: the weighed
    allocation starves the rows that text needs; the check sees it on the held-back sample and keeps the rows
    weighed alike."""
    frequencies = sample_model_text(peaked(), 4096, torch.bincount(CALIBRATION, minlength=VOCAB)).frequencies
    rare = frequencies.argsort()[:300]
    narrow = rare[CALIBRATION % len(rare)]
    with pytest.warns(BudgetCheckWarning) as caught:
        model = apply_tiered(peaked(), budget(6, model_text_tokens=0), narrow, 256)
    lost = [str(w.message) for w in caught if "lost on held-back text" in str(w.message)]
    assert lost and "keep model_text_tokens > 0" in lost[0] and "Rows it served worst: token " in lost[0]
    check = model.get_input_embeddings().budget_check
    assert check.kept == "weighed alike" and check.worst_served
    assert check.alike["model's own text"] < check.weighed["model's own text"]
    assert "kept weighed alike" in capsys.readouterr().out


def test_the_calibration_text_is_held_back_at_its_end():
    ids = torch.arange(16000)
    kept, held = held_back(ids)
    assert torch.equal(torch.cat([kept, held]), ids) and len(held) == 1024
    assert len(held_back(torch.arange(80))[1]) == 10  # at most an eighth


def test_the_check_scores_through_the_built_layer_alone_and_leaves_the_model_as_it_was(monkeypatch):
    """``ln_perplexity`` with a layer equals the model with that layer in place, never runs the dense embedding or
    head (their logits would double the check's memory), and restores both modules' own ``forward``."""
    import copy

    model = tiny()
    embedding = model.get_input_embeddings()
    built = apply_tiered(copy.deepcopy(model), budget(6, model_text_tokens=0), CALIBRATION, 256)
    layer = built.get_input_embeddings()
    ids = CALIBRATION[:200].reshape(2, 100)
    called = []
    for module in (embedding, model.lm_head):
        module.register_forward_pre_hook(lambda m, args: called.append(m))
    dense_forward = torch.nn.Linear.forward

    def counted_forward(self, x):
        if self is model.lm_head:
            called.append("dense head")
        return dense_forward(self, x)

    monkeypatch.setattr(torch.nn.Linear, "forward", counted_forward)
    through_layer = ln_perplexity(model, embedding, layer, ids)
    assert "dense head" not in called and len(called) == 2 * 2  # the hooks ran: each window's calls went through
    assert "forward" not in vars(embedding) and "forward" not in vars(model.lm_head)
    offloaded = model.lm_head.forward  # a forward set on the instance, as accelerate's offloading sets one
    model.lm_head.forward = offloaded
    assert ln_perplexity(model, embedding, layer, ids) == through_layer
    assert vars(model.lm_head)["forward"] is offloaded and "forward" not in vars(embedding)
    reference = ln_perplexity(built, layer, None, ids)
    assert through_layer == pytest.approx(reference, rel=1e-5)
    assert abs(ln_perplexity(model, embedding, None, ids) - reference) > 1e-3  # the layer's rows are not dense


def test_the_check_scores_short_sequences_side_by_side_and_long_ones_in_windows(monkeypatch):
    """About ``CHECK_WINDOW`` predictions a forward pass however long the sequences: short ones side by side, a long
    one in windows; the mean ln-loss is every prediction's, as one sequence at a time gives it."""
    from hf_tensorcompress.methods.tiered import guard

    model = tiny().eval()
    shapes = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    monkeypatch.setattr(guard, "CHECK_WINDOW", 40)
    short = CALIBRATION[:210].reshape(10, 21)
    side_by_side = ln_perplexity(model, model.get_input_embeddings(), None, short)
    assert shapes == [(2, 21)] * 5  # 20 predictions each: two a pass
    one_at_a_time = sum(float(model(input_ids=row[None], labels=row[None]).loss) for row in short) / len(short)
    assert side_by_side == pytest.approx(one_at_a_time, rel=1e-5)
    shapes.clear()
    long = CALIBRATION[:101][None]
    ln_perplexity(model, model.get_input_embeddings(), None, long)
    assert shapes == [(1, 41), (1, 41), (1, 21)]  # 100 predictions in windows of 40


def test_the_check_scores_fewer_positions_a_pass_over_a_large_vocabulary(monkeypatch):
    """Over a large vocabulary the check's window shrinks so its logits stay under ``CHECK_LOGIT_BYTES`` (32 positions
    over 262,144 tokens, 128 over SmolLM2's 49,152); the mean ln-loss is every window's prediction's."""
    from hf_tensorcompress.methods.tiered import guard

    assert guard.check_window(262_144) == 32 and guard.check_window(128_256) == 65 and guard.check_window(49_152) == 128
    model = tiny().eval()
    shapes = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    long = CALIBRATION[:101][None]
    vocab = model.get_input_embeddings().weight.shape[0]
    monkeypatch.setattr(guard, "CHECK_LOGIT_BYTES", 4 * vocab * 25)  # room for 25 positions' logits
    narrow = ln_perplexity(model, model.get_input_embeddings(), None, long)
    assert shapes == [(1, 26)] * 4  # 100 predictions, 25 a pass
    windows = [long[:, start : start + 26] for start in range(0, 100, 25)]
    assert narrow == pytest.approx(sum(float(model(input_ids=w, labels=w).loss) for w in windows) / 4, rel=1e-5)
