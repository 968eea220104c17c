"""Codebook (vector-quantized) tiers of ``method="tiered"``: storage, output-aware indices, save and load."""

from __future__ import annotations

import pytest
import torch
from helpers import run_without_library, tiny_causal_lm
from transformers import AutoModelForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression, apply_tiered
from hf_tensorcompress.methods.tiered import codebook_rounding
from hf_tensorcompress.methods.tiered.codebook_rounding import codebook_codes
from hf_tensorcompress.methods.tiered.config import CODEBOOK_SIZES as TIERED_CODEBOOK_SIZES
from hf_tensorcompress.runtime.codebook import CODEBOOK_SIZES, CodebookTensor

IDS = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(2))
CALIBRATION = torch.randint(3, 120, (1, 400), generator=torch.Generator().manual_seed(3))
OPTIONS = dict(tier_tokens=[20], tier_bits=[8, "codebook"], tier_group_size=8, codebook_size=256, rounding="output")


def compressed(**options):
    return apply_tiered(tiny_causal_lm("llama"), CompressionConfig(method="tiered", **options), CALIBRATION)


@pytest.mark.parametrize("entries", CODEBOOK_SIZES)
def test_indices_codebook_and_scales_come_back_as_stored(entries):
    generator = torch.Generator().manual_seed(entries)
    indices = torch.randint(entries, (7, 10), generator=generator)
    codebook, scale = torch.randn(entries, 3, generator=generator).half(), torch.rand(7, generator=generator) + 0.5
    stored = CodebookTensor((7, 30), 3, entries).set_indices(indices, scale.half(), codebook)
    expected = codebook.float()[indices].reshape(7, 30) * scale.half().float()[:, None]
    torch.testing.assert_close(stored.dequantize(), expected)
    torch.testing.assert_close(stored.rows(torch.tensor([6, 0])), expected[[6, 0]])
    hidden = torch.randn(2, 30)
    torch.testing.assert_close(stored.matmul_t(hidden, chunk=3), hidden @ expected.T, rtol=1e-5, atol=1e-5)
    index_bits = {256: 8, 1024: 10, 2048: 11, 4096: 12, 65536: 16}[entries]
    padded = -(-10 // 8) * 8 * (index_bits - 8) + 10 * 8  # the low byte, then high bits 8 to a group of bytes
    assert stored.storage_bits() == 7 * padded + 7 * 16 + entries * 3 * 16


def test_the_config_offers_exactly_the_sizes_the_tensor_stores():
    assert TIERED_CODEBOOK_SIZES == CODEBOOK_SIZES
    for entries in CODEBOOK_SIZES:
        CodebookTensor((2, 8), 4, entries)  # each stores


def test_output_aware_indices_lower_the_logit_error_they_target():
    torch.manual_seed(0)
    weight, mixing = torch.randn(600, 32), torch.randn(32, 32) * torch.linspace(0.1, 3, 32)
    hidden = torch.randn(2000, 32) @ mixing
    covariance = hidden.T.double() @ hidden.double() / len(hidden)
    nearest = codebook_codes(weight, 4, 256).dequantize()
    aware = codebook_codes(weight, 4, 256, covariance).dequantize()
    assert ((hidden @ (aware - weight).T) ** 2).mean() < 0.9 * ((hidden @ (nearest - weight).T) ** 2).mean()
    assert (nearest - weight).norm() < 0.6 * weight.norm()  # the codebook fits the rows it stores


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_a_codebook_tier_saves_and_loads_natively_and_without_the_library(tmp_path):
    model = compressed(**OPTIONS)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding.tiers[1], CodebookTensor) and "100×codebook256/d4" in repr(embedding)
    table = embedding.weight
    torch.testing.assert_close(embedding(IDS), table[IDS])
    hidden = torch.randn(2, 5, 24)
    torch.testing.assert_close(model.lm_head(hidden), hidden @ table.T, rtol=1e-5, atol=1e-5)
    reference = model(IDS).logits
    model.save_pretrained(tmp_path / "tiered")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "tiered")
    assert loaded.get_input_embeddings().tiers[1].codes.dtype == torch.uint8
    assert torch.equal(loaded(IDS).logits, reference)
    torch.save({"ids": IDS, "logits": reference}, tmp_path / "io.pt")
    script = f"""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "tiered")!r}, trust_remote_code=True)
    io = torch.load({str(tmp_path / "io.pt")!r})
    assert "hf_tensorcompress" not in type(model).__module__, type(model)
    print(float((model(io["ids"]).logits - io["logits"]).abs().max()))
    """
    assert float(run_without_library(script, cwd=tmp_path).stdout.split()[-1]) == 0.0


def test_compress_on_load_rounds_to_the_nearest_entry(tmp_path):
    tiny_causal_lm("llama").save_pretrained(tmp_path)
    config = CompressionConfig(
        method="tiered", tier_tokens=[40], tier_bits=[4, "codebook"], codebook_size=256, tier_group_size=8
    )
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=config)
    assert torch.equal(loaded(IDS).logits, apply_compression(tiny_causal_lm("llama"), config)(IDS).logits)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(tier_bits=["vq"]), 'ints or "codebook"'),
        (dict(tier_bits=["codebook"], codebook_size=512), "choose one of"),
        (dict(tier_bits=["codebook"], codebook_dim=0), "codebook_dim"),
    ],
)
def test_bad_codebook_options_name_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="tiered", **options)


def test_a_codebook_dim_that_does_not_divide_the_width_is_refused_before_anything_changes():
    model = tiny_causal_lm("llama")
    before = model.get_input_embeddings()
    with pytest.raises(ValueError, match="dividing the 24 columns"):
        apply_compression(model, CompressionConfig(method="tiered", tier_bits=["codebook"], codebook_dim=5))
    assert model.get_input_embeddings() is before


def test_the_nearest_entry_search_is_chunked_and_gives_the_unchunked_result(monkeypatch):
    """65,536 entries against every vector at once took tens of GB; each block now holds at most ``block`` floats."""
    generator = torch.Generator().manual_seed(0)
    vectors, codebook = torch.randn(3000, 4, generator=generator), torch.randn(4096, 4, generator=generator)
    exact = torch.cdist(vectors.double(), codebook.double()).argmin(1)
    blocks = []
    addmm = torch.addmm

    def recording(*args, **kwargs):
        result = addmm(*args, **kwargs)
        blocks.append(result.numel())
        return result

    monkeypatch.setattr(codebook_rounding.torch, "addmm", recording)
    chunked = codebook_rounding.nearest(vectors, codebook, block=100_000)
    monkeypatch.undo()
    assert len(blocks) == 125 and max(blocks) <= 100_000  # 24 vectors a block
    assert torch.equal(chunked, codebook_rounding.nearest(vectors, codebook, block=len(vectors) * len(codebook)))
    assert torch.equal(chunked, exact)
    assert codebook_rounding.BLOCK * 4 <= 64 * 2**20  # 64 MB of distances at most


@pytest.mark.parametrize("entries", [64, 96, 256, 4096])
def test_the_first_minimum_is_argmins_index_ties_included(entries):
    """The grouped search must give ``argmin``'s index exactly, the first of equal least values included (a
    codebook with repeated entries has such ties), or rows would be stored at another entry than before."""
    generator = torch.Generator().manual_seed(1)
    distances = torch.randint(0, 40, (500, entries), generator=generator).float()  # many ties
    distances[7, :] = 3.0  # every entry equal: index 0
    distances[8, -1] = -1.0  # the least in the last group
    distances[9, [5, entries - 2]] = -2.0  # a tie across two groups: the first
    assert torch.equal(codebook_rounding.first_minimum(distances), distances.argmin(1))
    assert torch.equal(codebook_rounding.first_minimum(distances, group=16), distances.argmin(1))
