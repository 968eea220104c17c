"""method="tiered": tiers of low-bit rows (+ a low-rank part) for the token embedding and its tied output layer."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from helpers import run_without_library, tiny_causal_lm
from transformers import AutoModelForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression, apply_tiered
from hf_tensorcompress.methods.tiered.layer import GEMM_POSITIONS, GEMM_TOKENS, TieredEmbedding, TieredTiedHead
from hf_tensorcompress.methods.tiered.rounding import output_aware_codes
from hf_tensorcompress.methods.tiered.scaled import ScaledTieredEmbedding
from hf_tensorcompress.runtime.lowbit import LowBitTensor

IDS = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(2))
CALIBRATION = torch.randint(3, 120, (1, 400), generator=torch.Generator().manual_seed(3))
OPTIONS = dict(
    tier_tokens=[20], tier_bits=[8, 3], tier_group_size=8, tier_order="calibration", rounding="output", low_rank=2
)


def compressed(**options):
    return apply_tiered(tiny_causal_lm("llama"), CompressionConfig(method="tiered", **options), CALIBRATION)


def test_lookups_and_the_tied_head_read_the_same_stored_rows():
    model = compressed(**OPTIONS)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, TieredEmbedding) and isinstance(model.lm_head, TieredTiedHead)
    table = embedding.weight
    hidden = torch.randn(2, 5, 24)
    torch.testing.assert_close(embedding(IDS), table[IDS])
    torch.testing.assert_close(model.lm_head(hidden), hidden @ table.T, rtol=1e-5, atol=1e-5)


def test_ids_of_any_integer_dtype_and_layout_look_up_the_same_rows():
    """The C lookup takes contiguous int64 ids as they are and converts the rest (int32, a transposed view, one id):
    each must give the rows ``nn.Embedding`` semantics give, not rows read from a misread buffer."""
    embedding = compressed(**OPTIONS).get_input_embeddings()
    table = embedding.weight
    ids = torch.randint(0, table.shape[0], (6, 5), generator=torch.Generator().manual_seed(4))
    for form in (ids, ids.int(), ids.T, ids.T.int(), ids[:, ::2], ids[0, 0]):
        rows = embedding(form)  # the low-rank part's product may round apart by an ulp with another count of rows
        assert rows.shape == (*form.shape, table.shape[1])
        torch.testing.assert_close(rows, table[form.long()], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "options",
    [
        OPTIONS,
        dict(tier_tokens=[30], tier_bits=[16, 0], low_rank=3, tier_order="calibration"),
        dict(tier_tokens=[20], tier_bits=[4, "codebook"], tier_group_size=8, tier_order="calibration"),
    ],
    ids=["int8-int3-lowrank", "bf16-lowrank-only", "int4-codebook"],
)
def test_the_accelerator_lookup_without_nonzero_gives_the_cpu_lookups_rows(options):
    embedding = compressed(**options).get_input_embeddings()
    ids = torch.cat([IDS.reshape(-1), torch.arange(120)])  # every tier, and tokens repeated
    slot = embedding.slot[ids].long()
    every_tier = embedding._lookup_every_tier(slot, torch.float32)  # what lookup runs off the CPU
    torch.testing.assert_close(every_tier, embedding(ids), rtol=0, atol=0)


def test_frequent_tokens_get_the_wide_tier_and_the_table_stays_close():
    dense = tiny_causal_lm("llama").get_input_embeddings().weight.detach()
    model = compressed(**OPTIONS)
    embedding = model.get_input_embeddings()
    frequent = torch.bincount(CALIBRATION.reshape(-1), minlength=120).argsort(descending=True, stable=True)[:20]
    assert (embedding.slot[frequent] < 20).all()  # stored in the 8-bit tier
    live = dense.norm(dim=1) > 0  # not the zero padding row
    errors = (embedding.weight - dense).norm(dim=1)[live] / dense.norm(dim=1)[live]
    assert errors[(embedding.slot[live] < 20)].max() < 0.02 < errors.mean() < 0.3
    # 8-bit tier 20×(24 codes + 3 groups × fp16 scale, min); 3-bit tier 100×(24×3 + 3×32); factors (8 codes a byte
    # row, padded) with one scale and min per row; the int32 slot of every token
    tiers = 20 * (24 * 8 + 3 * 32) + 100 * (24 * 3 + 3 * 32)
    factors = 100 * (8 * 8 + 32) + 2 * (24 * 8 + 32)  # the low-rank part serves the last tier (100 tokens)
    assert embedding.storage_bits() == tiers + factors + 120 * 32


def test_output_aware_rounding_lowers_the_logit_error_it_targets():
    torch.manual_seed(0)
    weight, mixing = torch.randn(300, 32), torch.randn(32, 32) * torch.linspace(0.1, 3, 32)
    hidden = torch.randn(2000, 32) @ mixing
    covariance = hidden.T.double() @ hidden.double() / len(hidden)
    nearest = LowBitTensor.quantize(weight, 3, 16).dequantize()
    aware = output_aware_codes(weight, covariance, 3, 16).dequantize()
    assert ((hidden @ (aware - weight).T) ** 2).mean() < 0.8 * ((hidden @ (nearest - weight).T) ** 2).mean()


def test_dense_rows_plus_a_low_rank_tail_is_the_bits_zero_tier():
    model = compressed(tier_tokens=[30], tier_bits=[16, 0], low_rank=3, tier_order="calibration")
    embedding = model.get_input_embeddings()
    assert embedding.low_rank_start == 30 and len(embedding.tiers) == 1 and embedding.left.shape == (90, 3)
    dense = tiny_causal_lm("llama").get_input_embeddings().weight.detach()
    kept = embedding.slot < 30
    torch.testing.assert_close(embedding.weight[kept], dense[kept].bfloat16().float())


def test_save_then_load_natively_and_as_a_compressed_class_gives_equal_outputs(tmp_path):
    model = compressed(**OPTIONS)
    reference = model(IDS).logits
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["compression_config"]["method"] == "tiered"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    embedding = loaded.get_input_embeddings()
    assert embedding.tiers[1].codes.dtype == torch.uint8 and embedding.tiers[1].scale.dtype == torch.float16
    assert torch.equal(loaded(IDS).logits, reference)
    greedy = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(loaded.generate(IDS[:1], **greedy), model.generate(IDS[:1], **greedy))


@pytest.mark.slow  # a fresh Python importing transformers: 15-45 s on a shared machine
def test_loads_without_the_library_to_the_same_logits(tmp_path):
    model = compressed(**OPTIONS)
    model.save_pretrained(tmp_path / "tiered")
    torch.save({"ids": IDS, "logits": model(IDS).logits}, tmp_path / "io.pt")
    script = f"""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "tiered")!r}, trust_remote_code=True)
    io = torch.load({str(tmp_path / "io.pt")!r})
    assert type(model).__name__.startswith("Compressed"), type(model)
    print(float((model(io["ids"]).logits - io["logits"]).abs().max()))
    """
    assert float(run_without_library(script, cwd=tmp_path).stdout.split()[-1]) == 0.0


def test_compress_on_load_without_calibration(tmp_path):
    tiny_causal_lm("llama").save_pretrained(tmp_path)
    config = CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=config)
    direct = apply_compression(tiny_causal_lm("llama"), config)
    assert torch.equal(loaded(IDS).logits, direct(IDS).logits)


def test_dequantize_gives_back_a_tied_dense_model_with_the_same_logits():
    model = compressed(**OPTIONS)
    expected = model(IDS).logits
    dense = model.dequantize()  # hf_tensorcompress.decompress(model) is the same
    assert dense.get_output_embeddings().weight is dense.get_input_embeddings().weight
    torch.testing.assert_close(dense(IDS).logits, expected, atol=1e-5, rtol=1e-5)


def test_resizing_the_vocabulary_says_to_resize_before_compressing():
    model = compressed(**OPTIONS)
    reference = model(IDS).logits
    model.resize_token_embeddings(120)  # the same size: nothing changes
    assert torch.equal(model(IDS).logits, reference)
    with pytest.raises(ValueError, match="resize the dense model's token embeddings first"):
        model.resize_token_embeddings(121)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(tier_tokens=[10], tier_bits=[4]), "one width per tier"),
        (dict(tier_bits=[5]), "choose one of"),
        (dict(tier_tokens=[10], tier_bits=[0, 4]), "for the last tier and needs low_rank"),
        (dict(tier_group_size=[8, 8]), "one of those per tier"),
        (dict(rounding="gptq"), "choose one of"),
    ],
)
def test_bad_options_name_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="tiered", **options)


def test_calibrated_options_without_calibration_say_how_to_calibrate():
    with pytest.raises(ValueError, match="apply_tiered"):
        apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tiered", rounding="output"))
    with pytest.raises(ValueError, match="dividing the 24 columns"):
        apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tiered", tier_group_size=7))


@pytest.mark.parametrize("rank", [0, 8])
def test_the_head_over_many_positions_decodes_in_token_order_to_the_same_logits(rank):
    """From ``GEMM_POSITIONS`` hidden states the head decodes chunks of tokens' rows for a GEMM: the logits of each
    position are the ones the per-tier products give it alone, and ``hidden @ weight.T``."""
    vocab = 4 * GEMM_TOKENS + 300  # a partial last chunk
    tiers = [
        {"rows": 300, "bits": 8, "group_size": 32},
        {"rows": 2 * GEMM_TOKENS, "bits": "codebook", "codebook_dim": 4, "codebook_size": 1024},
        {"rows": 2 * GEMM_TOKENS, "bits": 3 if rank == 0 else 0, "group_size": 32},
    ]
    torch.manual_seed(rank)
    layer = TieredEmbedding(vocab, 64, tiers, rank)
    layer.reset_parameters()
    layer.slot.copy_(torch.randperm(vocab).int())
    hidden = torch.randn(2, GEMM_POSITIONS, 64)
    together = layer.logits(hidden)
    alone = torch.cat([layer.logits(hidden[:, i : i + 1]) for i in range(GEMM_POSITIONS)], 1)
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together, hidden @ layer.weight.T, rtol=1e-5, atol=1e-5)


def test_lookup_and_head_read_what_is_stored_now():
    """On the CPU the lookup and the head decode every tier in one C call, through a decode of the tiers' buffers
    built once: a slot or codes changed in place, every buffer replaced (a load with ``assign``), a copy, a pickled
    layer and a move with ``to()`` each give the rows stored now."""
    vocab = 3 * GEMM_TOKENS
    tiers = [
        {"rows": GEMM_TOKENS, "bits": 8, "group_size": 32},
        {"rows": GEMM_TOKENS, "bits": "codebook", "codebook_dim": 4, "codebook_size": 1024},
        {"rows": vocab - 2 * GEMM_TOKENS, "bits": 2, "group_size": 32},
    ]
    layer, other = TieredEmbedding(vocab, 32, tiers), TieredEmbedding(vocab, 32, tiers)
    layer.reset_parameters(), other.reset_parameters()
    hidden, ids = torch.randn(GEMM_POSITIONS, 32), torch.randint(vocab, (2, 300))

    def reads_what_is_stored() -> None:
        stored = torch.cat([tier.dequantize(torch.float32) for tier in layer.tiers])[layer.slot.long()]
        torch.testing.assert_close(layer(ids).float(), stored[ids].to(layer.dtype_probe.dtype).float())
        torch.testing.assert_close(layer.logits(hidden), hidden @ stored.T, rtol=1e-5, atol=1e-5)

    reads_what_is_stored()
    layer.load_state_dict({**layer.state_dict(), "slot": torch.randperm(vocab).int()})  # copied in place
    reads_what_is_stored()
    layer.tiers[0].codes.copy_(torch.randint(256, layer.tiers[0].codes.shape, dtype=torch.uint8))
    reads_what_is_stored()
    layer.load_state_dict(other.state_dict(), assign=True)  # every buffer another tensor
    reads_what_is_stored()
    copied = copy.deepcopy(layer)  # the same tensors as far as the copy knows, at other addresses
    for tier in layer.tiers:
        tier.scale.zero_()  # the original's rows, not the copy's
    layer = copied
    reads_what_is_stored()
    layer = pickle.loads(pickle.dumps(layer))  # a saved whole module: the decode is built again where it loads
    reads_what_is_stored()
    layer.to(torch.bfloat16)
    reads_what_is_stored()
    with pytest.raises(ValueError, match="block of 512 rows"):
        layer.decode_tokens(0, 512, torch.empty(100, 32))  # the C decode would write past the block
    with pytest.raises(IndexError, match="outside the vocabulary"):
        layer(torch.tensor([0, vocab]))


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["kernel", "torch"])
@pytest.mark.parametrize("rank", [0, 4])
def test_a_scaled_lookup_is_the_lookup_times_the_scale_in_the_models_dtype(kernels, rank, monkeypatch):
    """Gemma's √d scale: an fp32 lookup on CPU takes the product as each row is decoded, other dtypes and a
    low-rank part afterwards; either way the very values of ``lookup(ids) * scale`` in the model's dtype, as the
    replaced module computes them."""
    monkeypatch.setenv("HF_TENSORCOMPRESS_KERNELS", kernels)
    tiers = [
        {"rows": 40, "bits": 4, "group_size": 16},
        {"rows": 50, "bits": "codebook", "codebook_dim": 4, "codebook_size": 256},
        {"rows": 38, "bits": 2, "group_size": 16},
    ]
    torch.manual_seed(rank)
    layer = ScaledTieredEmbedding(128, 48, tiers, rank=rank, embed_scale=48**0.5)
    layer.reset_parameters()
    ids = torch.randint(128, (3, 70))
    for dtype in (torch.float32, torch.bfloat16):
        layer = layer.to(dtype)
        expected = layer.lookup(ids) * torch.tensor(48**0.5, dtype=torch.float32).to(dtype)
        got = layer(ids)
        assert got.dtype == dtype and torch.equal(got, expected)
