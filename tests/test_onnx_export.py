"""ONNX export: the compressed tensors stay as stored, and ONNX Runtime gives PyTorch's outputs."""

import numpy as np
import onnx
import pytest
import torch
from onnx_cases import (
    FORECAST_CASES,
    LM_CASES,
    PROMPT,
    WIDE_LMS,
    contrib_ops,
    decisive,
    exported,
    saved_forecaster,
    saved_lm,
    stored_tensors_kept,
    torch_forecast,
    torch_greedy,
)

from hf_tensorcompress import CompressionConfig, apply_compression, load_model, quantize_linears
from hf_tensorcompress.cli import main
from hf_tensorcompress.deploy.onnx import OnnxExportError, export_onnx
from hf_tensorcompress.deploy.onnx.embeddings import narrow_slot
from hf_tensorcompress.deploy.onnx.runner import empty_cache, forecast, generate, load, metadata, step
from hf_tensorcompress.runtime.torchao_linears import dense_linears

FAST_FORECASTS = ("cp-int4", "cp-int4-ortops")
FAST_LMS = ("tiered-int4-int2",)
#: case → the ONNX Runtime contrib ops its storage maps onto (``ortops.py``)
MAPPED = {
    ("forecast", "cp-int4-ortops"): {"MatMulNBits", "GatherBlockQuantized"},  # out factor; the two small factors
    ("forecast", "svd-int4-ortops"): {"MatMulNBits"},
    ("forecast", "lowbit-int4-ortops"): {"MatMulNBits"},
    ("forecast", "lowbit-int4-ortops-randomized-hadamard"): {"MatMulNBits"},  # after the rotation's butterflies
    ("lm", "tiered-ortops"): {"MatMulNBits", "GatherBlockQuantized"},  # int4 tier: head, lookup; int8 tier: lookup
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``get(kind, name)``: the saved folder and exported file of a case, made once per module (an export takes
    seconds)."""
    root, made = tmp_path_factory.mktemp("onnx"), {}

    def get(kind, name):
        if (kind, name) not in made:
            if kind == "forecast":
                folder = saved_forecaster(root / f"{kind}-{name}", FORECAST_CASES[name])
            else:
                folder = saved_lm(
                    root / f"{kind}-{name}", LM_CASES[name], **({"hidden": 32} if name in WIDE_LMS else {})
                )
            made[kind, name] = folder, exported(folder)
        return made[kind, name]

    return get


def _tiers(cases, fast):
    return [pytest.param(name, marks=() if name in fast else pytest.mark.slow) for name in cases]


@pytest.mark.parametrize("name", _tiers(FORECAST_CASES, FAST_FORECASTS))
@pytest.mark.parametrize("fold_constants", [True, False])
def test_forecast_matches_pytorch(exports, name, fold_constants):
    folder, path = exports("forecast", name)
    assert stored_tensors_kept(folder, path) == []
    past = np.random.default_rng(0).standard_normal((5, 32, 3)).astype(np.float32)
    expected = torch_forecast(folder, past)
    got = forecast(load(path, threads=1, fold_constants=fold_constants), past)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("name", ["cp-int4", "cp-int4-ortops"])
def test_no_dense_weight_in_the_file(exports, name):
    """A low-bit CP layer's file holds its codes, and no float initializer the size of a replaced weight (with or
    without ONNX Runtime's quantized ops)."""
    _, path = exports("forecast", name)
    model, replaced = onnx.load(str(path)), metadata(load(path))["compressed_modules"]
    inits = {
        prefix: [i for i in model.graph.initializer if i.name.startswith(f"model.{prefix}.")] for prefix in replaced
    }
    assert replaced and all(inits.values())
    for held in inits.values():
        assert all(np.prod(i.dims) < 32 * 32 for i in held if i.data_type == onnx.TensorProto.FLOAT)
        assert any(i.data_type == onnx.TensorProto.UINT8 for i in held)


@pytest.mark.parametrize("name", _tiers(LM_CASES, FAST_LMS))
def test_greedy_tokens_match_pytorch(exports, name):
    folder, path = exports("lm", name)
    assert stored_tensors_kept(folder, path) == []
    session = load(path, threads=1)
    expected = torch_greedy(folder, PROMPT, 16)
    assert len(set(expected)) > 1  # the tokens change, so equality says something
    assert generate(session, PROMPT, 16) == expected


@pytest.mark.parametrize(
    ("kind", "name"),
    [pytest.param(*case, marks=() if case[1] in FAST_FORECASTS else pytest.mark.slow) for case in MAPPED],
)
def test_mapped_storage_runs_on_contrib_ops(exports, kind, name):
    """Storage whose width and groups ONNX Runtime's kernels take is exported onto them (the ops are in the graph,
    and no unpacking of those tensors is left)."""
    _, path = exports(kind, name)
    assert contrib_ops(path) == MAPPED[kind, name]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "name"), list(MAPPED))
def test_standard_op_export_gives_the_same_outputs(exports, tmp_path, kind, name):
    """``ort_ops=False`` writes standard ops only, and they compute what the contrib-op export computes."""
    folder, path = exports(kind, name)
    standard = export_onnx(folder, tmp_path / "standard.onnx", ort_ops=False)
    assert contrib_ops(standard) == set()
    if kind == "forecast":
        past = np.random.default_rng(2).standard_normal((4, 32, 3)).astype(np.float32)
        mapped, plain = (forecast(load(p, threads=1, fold_constants=False), past) for p in (path, standard))
        assert np.abs(mapped - plain).max() <= 1e-5 * np.abs(plain).max()
    else:
        assert generate(load(standard, threads=1), PROMPT, 16) == generate(load(path, threads=1), PROMPT, 16)


def test_cache_steps_match_one_pass(exports):
    """Prefill then one step through the cache gives the logits of one pass over the whole sequence."""
    _, path = exports("lm", "tiered-int4-int2")
    session = load(path, threads=1)
    info = metadata(session)
    ids = np.asarray([PROMPT], dtype=np.int64)
    whole, _ = step(session, info, ids, empty_cache(info, 1))
    _, cache = step(session, info, ids[:, :-1], empty_cache(info, 1))
    last, cache = step(session, info, ids[:, -1:], cache)
    assert np.allclose(whole, last, atol=1e-5)
    assert next(iter(cache.values())).shape[2] == len(PROMPT)


def test_unsupported_family_is_refused(tmp_path):
    from family_models import LANGUAGE_MODELS

    model_class, config = LANGUAGE_MODELS["bert"]
    with pytest.raises(OnnxExportError, match="PatchTST"):
        export_onnx(model_class(config()), tmp_path / "x.onnx")


def test_layer_without_export_form_is_refused(tmp_path):
    """A compressed layer type with no export form is refused by its layer type, not traced into a wrong graph."""
    from helpers import tiny_causal_lm

    from hf_tensorcompress import CompressionConfig, apply_compression
    from hf_tensorcompress.methods.svd.layer import LowRankLinear

    class Unexported(LowRankLinear):
        layer_type = "svd_without_export_form"

    model = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="svd", rank=0.5))
    next(module for module in model.modules() if isinstance(module, LowRankLinear)).__class__ = Unexported
    with pytest.raises(OnnxExportError, match="svd_without_export_form"):
        export_onnx(model, tmp_path / "x.onnx")


def test_runner_refuses_the_wrong_kind(exports):
    _, path = exports("forecast", "cp-int4")
    with pytest.raises(ValueError, match="forecast model"):
        generate(load(path), PROMPT, 2)
    with pytest.raises(ValueError, match=r"\(batch, 32, 3\)"):
        forecast(load(path), np.zeros((1, 16, 3), dtype=np.float32))


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "contrib"), [([], {"MatMulNBits"}), (["--standard-ops"], set())])
def test_cli_export(tmp_path, capsys, flags, contrib):
    folder = saved_forecaster(tmp_path / "svd", FORECAST_CASES["svd-int4-ortops"])
    assert main(["export-onnx", str(folder), str(tmp_path / "out.onnx"), *flags]) == 0
    assert '"kind": "forecast"' in capsys.readouterr().out
    assert contrib_ops(tmp_path / "out.onnx") == contrib
    past = np.ones((2, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(forecast(load(tmp_path / "out.onnx"), past), torch_forecast(folder, past), rtol=1e-4)


def test_accuracy_level_reaches_every_4bit_product(exports, tmp_path, capsys):
    """``--accuracy-level 4`` sets ``MatMulNBits``' attribute on every 4-bit product (int8 activations): the forecast
    moves by the activations' rounding only, and the file's metadata says which level it was exported at."""
    folder, default = exports("forecast", "cp-int4-ortops")
    out = tmp_path / "int8-activations.onnx"
    assert main(["export-onnx", str(folder), str(out), "--accuracy-level", "4"]) == 0
    assert '"accuracy_level": 4' in capsys.readouterr().out
    levels = {
        path: [
            next((a.i for a in node.attribute if a.name == "accuracy_level"), None)
            for node in onnx.load(str(path)).graph.node
            if node.op_type == "MatMulNBits"
        ]
        for path in (default, out)
    }
    assert levels[out] and set(levels[out]) == {4} and set(levels[default]) == {0}
    past = np.random.default_rng(3).standard_normal((4, 32, 3)).astype(np.float32)
    exact, fast = (forecast(load(path, threads=1), past) for path in (default, out))
    assert np.abs(fast - exact).max() <= 0.05 * np.abs(exact).max()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"accuracy_level": 5}, r"not one of MatMulNBits' levels: 0 \(fp32 \(unset\)\).*4 \(int8 activations\)"),
        ({"accuracy_level": 4, "ort_ops": False}, "a standard-ops export has no MatMulNBits"),
    ],
)
def test_accuracy_level_refusals_write_nothing(exports, tmp_path, options, message):
    folder, _ = exports("forecast", "cp-int4-ortops")
    with pytest.raises(OnnxExportError, match=message):
        export_onnx(folder, tmp_path / "x.onnx", **options)
    assert not (tmp_path / "x.onnx").exists()


def test_token_map_is_narrowed_where_the_rows_fit(exports):
    """The tiered token→row map goes into the file in 16 bits (half the checkpoint's int32) for a vocabulary of at
    most 65,536 rows, restored exactly at both ends of the range; a larger one stays int32."""
    _, path = exports("lm", "tiered-int4-int2")
    (slot,) = [init for init in onnx.load(str(path)).graph.initializer if init.name.endswith(".slot")]
    assert slot.data_type == onnx.TensorProto.INT16
    rows = torch.randperm(65_536, generator=torch.Generator().manual_seed(0)).int()
    narrowed, offset = narrow_slot(rows)
    assert narrowed.dtype == torch.int16 and torch.equal(narrowed.long() + offset, rows.long())
    wide = torch.arange(65_537, dtype=torch.int32)
    kept, offset = narrow_slot(wide)
    assert kept is wide and offset == 0


def saved_stacked_lm(folder, linears: str):
    """A tiny tiered Llama whose other Linears are quantized (``--quantize-linears``): 64 wide, as bitsandbytes'
    CPU kernel needs, with weights large enough for greedy decoding to change tokens."""
    from helpers import WIDE_LLAMA, tiny_causal_lm

    from hf_tensorcompress.cli import linear_quantization

    model = decisive(tiny_causal_lm("llama", **WIDE_LLAMA))
    apply_compression(model, CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8))
    quantize_linears(model, linear_quantization(linears))
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("linears", ["bnb-nf4", pytest.param("torchao-int8", marks=pytest.mark.slow)])
def test_a_compressed_model_with_quantized_linears_exports(tmp_path, capsys, linears):
    """The smallest model (tiered embedding + NF4 Linears) failed with transformers' "`.float()` is not supported for
    quantized model": its Linears are exported as the float weights they stand for, the embedding as stored."""
    folder = saved_stacked_lm(tmp_path / "lm", linears)
    assert main(["export-onnx", str(folder), str(tmp_path / "lm.onnx")]) == 0
    assert "Linears are stored as the float weights they stand for" in capsys.readouterr().out
    assert stored_tensors_kept(folder, tmp_path / "lm.onnx") == []
    # PyTorch on the same weights: bitsandbytes' packed CPU kernel (eval, no grad) rounds otherwise (bf16) than the
    # dequantized product its own training path and the export compute
    model = load_model(folder)
    dense_linears(model)
    with torch.no_grad():
        out = model.eval().generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    expected = out[0, len(PROMPT) :].tolist()
    assert len(set(expected)) > 1 and generate(load(tmp_path / "lm.onnx", threads=1), PROMPT, 12) == expected
