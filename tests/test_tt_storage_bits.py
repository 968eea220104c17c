"""method="tt" with tt_storage_bits: trains, exact rows and basis held as low-bit codes in memory and on disk."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import LM_HIDDEN, LM_VOCAB, run_without_library, tiny_causal_lm
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression, apply_tt, compression_report, decompress
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.healing import heal_tt_embedding
from hf_tensorcompress.methods.tt.layer import TTEmbedding
from hf_tensorcompress.runtime.lowbit import LowBitTensor

IDS = torch.randint(3, LM_VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
CALIBRATION = torch.randint(3, LM_VOCAB, (1, 300), generator=torch.Generator().manual_seed(3))
OPTIONS = dict(tt_order=3, tt_ranks=3, tt_basis="output", tt_exact_tokens=10)


def compressed(**options) -> torch.nn.Module:
    config = CompressionConfig(method="tt", **(OPTIONS | options))
    return apply_tt(tiny_causal_lm("llama"), config, CALIBRATION)


@pytest.mark.parametrize("bits,group,tolerance", [(8, None, 0.02), (4, 8, 0.25)])
def test_low_bit_outputs_stay_close_to_the_float_layer_on_every_logit_path(bits, group, tolerance):
    float_model = compressed()
    model = compressed(tt_storage_bits=bits, tt_storage_group_size=group)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(embedding, TTEmbedding) and isinstance(head, TTTiedHead)
    with torch.no_grad():
        table, reference = embedding.weight, float_model.get_input_embeddings().weight
        assert float((table - reference).norm() / reference.norm()) < tolerance
        torch.testing.assert_close(embedding(IDS), table[IDS])
        hidden = torch.randn(3, LM_HIDDEN)
        for path in ("factored", "rebuild"):
            torch.testing.assert_close(embedding.logits(hidden, path=path), hidden @ table.T, rtol=1e-5, atol=1e-5)
        logits = model(IDS).logits
        head.mode = "cached"
        torch.testing.assert_close(model(IDS).logits, logits, rtol=1e-5, atol=1e-5)
        dense = float_model(IDS).logits
    assert float((logits - dense).abs().max()) < 10 * tolerance * float(dense.abs().max())


def test_memory_holds_codes_and_bytes_count_codes_and_scales_exactly():
    model = compressed(tt_storage_bits=4, tt_storage_group_size=8)
    embedding = model.get_input_embeddings()
    assert embedding.cores is None and not list(embedding.parameters())
    floats = [t for t in embedding.buffers() if t.is_floating_point()]
    assert all(t.dtype == torch.float16 and t.shape[-1] <= LM_HIDDEN // 8 for t in floats if t.numel())  # scales
    assert all(isinstance(m, LowBitTensor) for m in (embedding.trains, embedding.exact_rows, embedding.basis))
    # trains: 2×3×4 at ranks 2,3 → cores of 1·2·2, 2·3·3, 3·4·1 → 34 values a token (8 does not divide it: one
    # group per token), 8 codes in 4 bytes; exact rows and basis: 24 values in 3 groups of 8; every group an fp16
    # scale and minimum
    width = 1 * 2 * 2 + 2 * 3 * 3 + 3 * 4 * 1
    assert embedding.trains.shape == (LM_VOCAB, width) and embedding.trains.group_size == width
    codes = LM_VOCAB * (-(-width // 8) * 4 + 4) + (10 + LM_HIDDEN) * (LM_HIDDEN // 2 + 3 * 4)
    integers = LM_VOCAB * 2 * 4 + LM_VOCAB * 4  # token_ranks (V×2 int32), exact_slot (V int32)
    assert embedding.storage_bits() == 8 * (codes + integers)
    report = compression_report(model)
    assert report["modules"][0]["bits"] == embedding.storage_bits()


def test_save_then_load_natively_gives_equal_outputs_and_stays_packed(tmp_path):
    model = compressed(tt_storage_bits=8)
    reference = model(IDS).logits
    greedy = dict(max_new_tokens=5, do_sample=False)
    generated = model.generate(IDS[:1], **greedy)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["compression_config"]["modules"]["model.embed_tokens"]["code_bits"] == 8
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        keys = [key for key in handle.keys() if "embed_tokens" in key]
    assert "model.embed_tokens.trains.codes" in keys and not any(".cores." in key for key in keys)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    embedding = loaded.get_input_embeddings()
    assert embedding.code_bits == 8 and embedding.trains.codes.dtype == torch.uint8 and embedding.cores is None
    assert torch.equal(loaded(IDS).logits, reference)
    assert torch.equal(loaded.generate(IDS[:1], **greedy), generated)
    assert embedding.storage_bits() == model.get_input_embeddings().storage_bits()


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_loads_without_the_library_to_the_same_logits(tmp_path):
    model = compressed(tt_storage_bits=4, tt_storage_group_size=8)
    model.save_pretrained(tmp_path / "tt")
    torch.save({"ids": IDS, "logits": model(IDS).logits}, tmp_path / "io.pt")
    script = f"""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "tt")!r}, trust_remote_code=True)
    io = torch.load({str(tmp_path / "io.pt")!r})
    embedding = model.get_input_embeddings()
    assert "hf_tensorcompress" not in type(embedding).__module__, type(embedding).__module__
    assert embedding.trains.codes.dtype == torch.uint8 and not list(embedding.parameters())
    print(float((model(io["ids"]).logits - io["logits"]).abs().max()))
    """
    assert float(run_without_library(script, cwd=tmp_path).stdout.split()[-1]) == 0.0


def test_compress_on_load_equals_compressing_in_memory(tmp_path):
    tiny_causal_lm("llama").save_pretrained(tmp_path)
    config = CompressionConfig(method="tt", tt_order=3, tt_ranks=2, tt_basis="pca", tt_storage_bits=8)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=config)
    assert loaded.get_input_embeddings().code_bits == 8
    direct = apply_compression(tiny_causal_lm("llama"), config)
    assert torch.equal(loaded(IDS).logits, direct(IDS).logits)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(tt_storage_bits=5), r"choose one of \[2, 3, 4, 8\]"),
        (dict(tt_storage_bits=True), "choose one of"),
        (dict(tt_storage_group_size=8), "give tt_storage_bits too"),
        (dict(tt_storage_bits=8, tt_storage_group_size=0), "int >= 1"),
    ],
)
def test_bad_settings_are_refused_by_the_config(options, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="tt", tt_ranks=2, **options)


def test_a_group_size_not_dividing_the_hidden_size_leaves_the_model_unchanged():
    model = tiny_causal_lm("llama")
    before = {key: value.clone() for key, value in model.state_dict().items()}
    config = CompressionConfig(method="tt", tt_ranks=2, tt_storage_bits=4, tt_storage_group_size=7)
    with pytest.raises(ValueError, match="dividing the hidden size 24"):
        apply_compression(model, config)
    assert type(model.get_input_embeddings()) is torch.nn.Embedding
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    layer = compressed().get_input_embeddings()
    with pytest.raises(ValueError, match="dividing the hidden size 24"):
        layer.store_codes(8, 5)
    assert layer.code_bits is None and isinstance(layer.cores[0], torch.nn.Parameter)


def test_vocabulary_edits_re_encode_only_the_edited_tokens():
    model = compressed(tt_storage_bits=8)
    embedding = model.get_input_embeddings()
    codes = embedding.trains.codes.clone()
    vectors = torch.randn(2, LM_HIDDEN)
    new_ids, mapping = embedding.add_tokens(vectors)
    assert mapping == {} and embedding.num_embeddings == LM_VOCAB + 2 and embedding.trains.shape[0] == LM_VOCAB + 2
    assert torch.equal(embedding.trains.codes[:LM_VOCAB], codes)
    error = (embedding(new_ids) - vectors).norm(dim=1) / vectors.norm(dim=1)
    assert float(error.max()) < 0.9  # a rank-3 train of a random vector, then 8-bit codes
    embedding.set_vectors(new_ids[:1], vectors[1:])
    torch.testing.assert_close(embedding(new_ids[:1]), embedding(new_ids[1:]), atol=1e-6, rtol=1e-6)
    exact_token = int((embedding.exact_slot >= 0).nonzero()[0])
    embedding.set_vectors([exact_token], vectors[:1])
    torch.testing.assert_close(embedding(torch.tensor([exact_token]))[0], vectors[0], atol=0.05, rtol=0.02)
    codes, reference = embedding.trains.codes[:LM_VOCAB].clone(), model(IDS).logits[..., :LM_VOCAB]
    embedding.remove_tokens(new_ids)
    assert torch.equal(embedding.trains.codes, codes)
    model.resize_token_embeddings(LM_VOCAB + 3)  # new tokens as exact rows, re-encoded with the kept ones
    assert embedding.exact_rows.shape == (13, LM_HIDDEN) and embedding.trains.shape[0] == LM_VOCAB + 3
    model.resize_token_embeddings(LM_VOCAB)
    torch.testing.assert_close(model(IDS).logits, reference, atol=1e-5, rtol=1e-5)


def test_store_codes_after_healing_decompress_and_healing_refuses_codes():
    teacher = tiny_causal_lm("llama")
    model = compressed()
    heal_tt_embedding(model, teacher, CALIBRATION, steps=2, tokens_per_step=16, progress=False)
    embedding = model.get_input_embeddings().store_codes(8)
    with pytest.raises(ValueError, match=r"store_codes\(bits, group_size\)"):
        heal_tt_embedding(model, teacher, CALIBRATION, steps=1, progress=False)
    with pytest.raises(ValueError, match="already stores 8-bit codes"):
        embedding.store_codes(4)
    with torch.no_grad():
        expected = model(IDS).logits
        dense = decompress(model)
        assert type(dense.get_input_embeddings()) is torch.nn.Embedding
        assert dense.get_output_embeddings().weight is dense.get_input_embeddings().weight
        torch.testing.assert_close(dense(IDS).logits, expected, atol=1e-5, rtol=1e-5)
