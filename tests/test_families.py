"""Every (method, family) pair of the family table: apply with the default targets, forward, save, load with the
library and without it (``trust_remote_code``), generate where the model generates; unsupported pairs refuse."""

from __future__ import annotations

import pytest
import torch
from family_models import ENCODERS, FAMILIES, LANGUAGE_MODELS, first_output, tiny, tiny_inputs
from helpers import run_without_library
from transformers.pytorch_utils import Conv1D

from hf_tensorcompress import CompressionConfig, UnsupportedModelError, apply_compression, apply_tiered
from hf_tensorcompress.core.targets import FAMILIES as FAMILY_TABLE
from hf_tensorcompress.core.targets import attention_projections
from hf_tensorcompress.loading import load_model

#: Options per method; tt's are exact on the tiny models (hidden 32 = 4 × 8, ranks 4), so outputs match dense.
EXACT = {
    "svd": {"rank": 1.0},
    "cp": {"rank": 0.5, "cp_iterations": 5},
    "biprop": {"keep_ratio": 0.5},
    "tt": {"tt_shape": [4, 8], "tt_ranks": 4},
    "tiered": {"tier_bits": [16]},
}
#: The fast tier runs one pair per structure (q/k/v Linear, fused Conv1D, fused Linear, BERT, scaled and untied
#: embeddings); every other pair runs in the slow tier (``make test-slow``).
FAST = {
    ("cp", "llama"),
    ("svd", "gpt2"),
    ("biprop", "bert"),
    ("svd", "phi3"),
    ("tt", "gemma"),
    ("tt", "gpt_neox"),
    ("tt", "gemma3_text"),
    ("tiered", "gemma3_text"),
    ("tiered", "llama"),
    ("biprop", "whisper"),
}
#: The causal LMs (every language model but BERT's masked LM), each with its embedding class: plain, scaled (Gemma,
#: Gemma 3), with a ``padding_idx`` (Phi-3, Gemma 3), tied or untied (Llama 3, Qwen2/3, Phi-3, GPT-NeoX).
CAUSAL_LMS = sorted(set(LANGUAGE_MODELS) - {"bert"})
PAIRS = [
    pytest.param(m, f, marks=() if (m, f) in FAST else pytest.mark.slow)
    for m, f in [(m, f) for f in FAMILIES for m in ("cp", "svd", "biprop")]
    + [("tt", f) for f in LANGUAGE_MODELS]
    + [("tiered", f) for f in CAUSAL_LMS]
]


def _forward(model, family):
    with torch.no_grad():
        return first_output(model(**tiny_inputs(family)))


def test_the_family_table_covers_every_tested_family():
    assert set(FAMILIES) <= set(FAMILY_TABLE)
    assert {f for f, family in FAMILY_TABLE.items() if family.token_embedding} == set(LANGUAGE_MODELS)


@pytest.mark.parametrize("method, family", PAIRS)
def test_default_targets_compress_save_and_load(method, family, tmp_path):
    """Apply with the default targets, forward, save, load through the library and natively through the model's
    own class, and compress on load (``from_pretrained(dense, quantization_config=...)``) to the same model."""
    dense = tiny(family)
    expected = _forward(dense, family)
    config = CompressionConfig(method=method, **EXACT[method])
    model = apply_compression(tiny(family), config)
    names = list(model.config.compression_config["modules"])
    assert names, "no module compressed"
    output = _forward(model, family)
    if method == "tt":  # exact trains: the compressed model computes what the dense one does
        torch.testing.assert_close(output, expected, atol=1e-4, rtol=1e-4)
    if method == "tiered":  # bf16 rows: the dense function up to bf16 rounding of the embedding
        torch.testing.assert_close(output, expected, atol=2e-2, rtol=2e-2)
    assert torch.isfinite(output).all() and output.shape == expected.shape
    model.save_pretrained(tmp_path / "compressed")
    torch.testing.assert_close(_forward(load_model(tmp_path / "compressed").eval(), family), output)
    base_class = FAMILIES[family][0]
    torch.testing.assert_close(_forward(base_class.from_pretrained(tmp_path / "compressed").eval(), family), output)
    dense.save_pretrained(tmp_path / "dense")
    on_load = base_class.from_pretrained(tmp_path / "dense", quantization_config=config).eval()
    torch.testing.assert_close(_forward(on_load, family), output)


def test_fused_projections_are_compressed_as_one():
    """GPT-2's ``c_attn`` (a ``Conv1D``, weight stored ``(in, out)``), Phi-3's ``qkv_proj``, GPT-NeoX's
    ``query_key_value``: one compressed layer with the fused output width, same function at full rank."""
    for family, name, out in (
        ("gpt2", "transformer.h.0.attn.c_attn", 96),
        ("phi3", "model.layers.0.self_attn.qkv_proj", 96),
        ("gpt_neox", "gpt_neox.layers.0.attention.query_key_value", 96),
    ):
        dense = tiny(family)
        assert name in attention_projections(dense)
        if family == "gpt2":
            assert isinstance(dense.get_submodule(name), Conv1D)
        model = apply_compression(tiny(family), CompressionConfig(method="svd", target_modules=[name], rank=32))
        layer = model.get_submodule(name)
        assert (layer.in_features, layer.out_features) == (32, out)
        x = torch.randn(3, 32)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), dense.get_submodule(name)(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "family, method",
    [("gemma", "tt"), ("gemma2", "tt"), ("gemma3_text", "tt"), ("gemma3_text", "tiered"), ("gemma", "tiered")],
)
def test_a_scaled_embedding_keeps_its_scale_exactly(family, method, tmp_path):
    dense = tiny(family)
    model = apply_compression(tiny(family), CompressionConfig(method=method, **EXACT[method]))
    layer = model.get_input_embeddings()
    assert layer.embed_scale == float(dense.get_input_embeddings().embed_scale) == float(torch.tensor(32**0.5))
    ids = torch.arange(96)[None]
    tolerance = 1e-5 if method == "tt" else 2e-2  # tiered: bf16 rows
    with torch.no_grad():
        torch.testing.assert_close(layer(ids), dense.get_input_embeddings()(ids), atol=tolerance, rtol=tolerance)
        # the tied output layer reads the unscaled matrix, as Gemma's lm_head does
        hidden = torch.randn(1, 3, 32)
        torch.testing.assert_close(
            model.get_output_embeddings()(hidden),
            dense.get_output_embeddings()(hidden),
            atol=max(tolerance, 1e-4),
            rtol=max(tolerance, 1e-4),
        )
    model.save_pretrained(tmp_path)
    assert load_model(tmp_path).get_input_embeddings().embed_scale == layer.embed_scale


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=() if f in ("gpt2", "gemma") else pytest.mark.slow)
        for f in sorted(set(LANGUAGE_MODELS) - {"bert"})
    ],
)
def test_generate_gives_the_dense_tokens_at_full_rank(family):
    prompt = tiny_inputs(family)["input_ids"][:1]
    dense = tiny(family)
    model = apply_compression(tiny(family), CompressionConfig(method="tt", **EXACT["tt"]))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kwargs), dense.generate(prompt, **kwargs))


@pytest.mark.slow
def test_every_family_loads_without_the_library(tmp_path):
    """One subprocess where hf_tensorcompress cannot be imported loads a tt checkpoint of every language model
    family and an svd checkpoint of every other family, through the Auto classes and ``trust_remote_code``."""
    cases = [("tt", f, "AutoModelForMaskedLM" if f == "bert" else "AutoModelForCausalLM") for f in LANGUAGE_MODELS]
    cases += [("svd", f, "AutoModel") for f in ENCODERS]
    for method, family, _ in cases:
        model = apply_compression(tiny(family), CompressionConfig(method=method, **EXACT[method]))
        model.save_pretrained(tmp_path / family)
        torch.save({"inputs": tiny_inputs(family), "output": _forward(model, family)}, tmp_path / family / "io.pt")
    run_without_library(
        f"""
        import torch, transformers
        for method, family, auto in {cases!r}:
            model = getattr(transformers, auto).from_pretrained({str(tmp_path)!r} + "/" + family, trust_remote_code=True).eval()
            io = torch.load({str(tmp_path)!r} + "/" + family + "/io.pt")
            with torch.no_grad():
                out = model(**io["inputs"])
            out = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
            torch.testing.assert_close(out, io["output"], atol=1e-5, rtol=1e-5)
        print("ok")
        """,
        tmp_path,
        timeout=600,
    )


def _budget(family: str) -> torch.nn.Module:
    """``tiered`` at a byte budget of 3× on a tiny model, calibrated on random text of its vocabulary."""
    calibration = torch.randint(3, 96, (400,), generator=torch.Generator().manual_seed(4))
    config = CompressionConfig(method="tiered", size_ratio=3, rounding="output", codebook_size=256)
    return apply_tiered(tiny(family), config, calibration, covariance_tokens=128)


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=() if f in ("gemma3_text", "llama") else pytest.mark.slow) for f in CAUSAL_LMS]
)
def test_a_byte_budget_compresses_every_embedding_class(family, tmp_path):
    """Plain, scaled, padded, tied and untied embeddings; a hidden size (32) the default group (64) does not divide."""
    model = _budget(family)
    layer = model.get_input_embeddings()
    assert abs(96 * 32 * 2 / (layer.storage_bits() / 8) - 3) < 0.03
    assert (layer.tied_output is not None) == bool(tiny(family).config.tie_word_embeddings)
    output = _forward(model, family)
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(_forward(load_model(tmp_path).eval(), family), output, atol=0, rtol=0)
    native = FAMILIES[family][0].from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_forward(native, family), output, atol=0, rtol=0)


@pytest.mark.slow
def test_every_byte_budget_loads_without_the_library(tmp_path):
    """A fresh process without hf_tensorcompress loads the 3× ``tiered`` checkpoint of every causal LM family."""
    for family in CAUSAL_LMS:
        model = _budget(family)
        model.save_pretrained(tmp_path / family)
        torch.save({"inputs": tiny_inputs(family), "output": _forward(model, family)}, tmp_path / family / "io.pt")
    run_without_library(
        f"""
        import torch, transformers
        for family in {CAUSAL_LMS!r}:
            path = {str(tmp_path)!r} + "/" + family
            model = transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
            assert type(model).__name__.startswith("Compressed"), type(model)
            io = torch.load(path + "/io.pt")
            with torch.no_grad():
                torch.testing.assert_close(model(**io["inputs"]).logits, io["output"], atol=0, rtol=0)
        print("ok")
        """,
        tmp_path,
        timeout=600,
    )


def test_an_embedding_class_that_does_more_than_a_lookup_is_refused_by_name():
    class OffsetEmbedding(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids + 2)

    for method in ("tt", "tiered"):
        model = tiny("llama")
        model.model.embed_tokens = OffsetEmbedding(96, 32)
        with pytest.raises(
            ValueError, match=f"method '{method}' replaces nn.Embedding modules .plain, or scaled.*OffsetEmbedding"
        ):
            apply_compression(model, CompressionConfig(method=method, **EXACT[method]))


def test_an_unsupported_pair_names_what_is_supported():
    with pytest.raises(ValueError, match="no token embedding.*ViTPatchEmbeddings"):
        apply_compression(tiny("vit"), CompressionConfig(method="tt", tt_ranks=2))
    from transformers import DistilBertConfig, DistilBertModel

    model = DistilBertModel(DistilBertConfig(dim=32, n_layers=1, n_heads=4, hidden_dim=32, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*pass target_modules"):
        apply_compression(model, CompressionConfig(method="svd"))


def test_the_docs_show_the_family_table_made_from_the_code():
    from pathlib import Path

    from hf_tensorcompress.core.targets import families_table
    from mkdocs_hooks import render

    options = (Path(__file__).parent.parent / "docs" / "guide" / "options.md").read_text(encoding="utf-8")
    assert families_table() in render(options)
