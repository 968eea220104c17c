"""``export_onnx``: a compressed (or dense) model to one ONNX file that ONNX Runtime runs without torch.

The exporter is torch's own dynamo-based ``torch.onnx.export(..., dynamo=True)`` (``torch.export`` then onnxscript):
with torch 2.13 and transformers 5 the TorchScript exporter (``dynamo=False``) writes a PatchTST graph ONNX Runtime
refuses (a positional-encoding ``Add`` traced at the example's shape); optimum is not used (not installed here, and
the dynamo exporter covers these models with transformers' own code). Before tracing, each compressed layer is swapped for its export form (``linears.py``,
``embeddings.py``), which keeps the stored tensors as initializers and decodes them with graph ops; the fused C kernel
is never on this path (``ortops.py``: where a stored matrix fits ONNX Runtime's own quantized kernels, the graph runs
it on them). A model holding a layer without an export form is refused before tracing; after it, the dense weights
are stored as the graph reads them (``transposes.py``) and the graph's own arithmetic is tidied (``tidy.py``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from ...loading import load_model
from ...runtime.contract import CompressedLayer
from ...runtime.torchao_linears import dense_linears, linears_config
from .embeddings import swap_embeddings
from .errors import OnnxExportError
from .graphs import GRAPHS, graph_for
from .linears import GRAPH_FORMS, link_shared
from .metadata import write_metadata
from .ortops import ACCURACY_LEVELS
from .ortops import TRANSLATIONS as CONTRIB_TRANSLATIONS
from .tidy import tidy_graph
from .transposes import fold_weight_transposes
from .units import in_user_units, read_statistics
from .unpack import TRANSLATIONS as UNPACK_TRANSLATIONS
from .unpack import GraphLowBit


def swap_layers(model: nn.Module, ort_ops: bool = False, accuracy_level: int = 0) -> list[str]:
    """Replace every compressed layer that has an export form, in place; the names of the replaced modules.
    ``ort_ops``: the stored matrices whose width and groups ONNX Runtime's quantized kernels take run on them,
    ``MatMulNBits`` at ``accuracy_level``."""
    replaced = swap_embeddings(model)
    for name, module in list(model.named_modules()):
        form = GRAPH_FORMS.get(type(module))
        if form is not None:
            model.set_submodule(name, form(module))
            replaced.append(name)
    link_shared(model)
    for module in model.modules():
        if isinstance(module, GraphLowBit):
            module.ort_ops, module.accuracy_level = ort_ops, accuracy_level
    return replaced


def _model(model_or_folder: nn.Module | str | Path) -> tuple[nn.Module, str | None]:
    """The model to trace (a copy, or loaded), in fp32, with its torchao / bitsandbytes Linears as the float weights
    they stand for: ONNX has no operator for NF4 codes nor torchao's tensors, and transformers refuses ``.float()``
    while they are there. The compressed layers keep their stored form; the note (None without quantized Linears)
    says what the Linears became."""
    model = copy.deepcopy(model_or_folder) if isinstance(model_or_folder, nn.Module) else load_model(model_or_folder)
    linears = linears_config(getattr(model.config, "quantization_config", None))
    if linears is None:
        return model.float().eval(), None
    dense_linears(model)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    kind = "bitsandbytes 4-bit" if linears.get("quant_method") == "bitsandbytes" else "torchao"
    note = f"the {kind} Linears are stored as the float weights they stand for (ONNX has no operator for their codes)"
    return model.float().eval(), note


def export_onnx(
    model_or_folder: nn.Module | str | Path,
    path: str | Path,
    opset: int = 21,
    ort_ops: bool = True,
    accuracy_level: int = 0,
    standardization: object = None,
) -> Path:
    """Export a PatchTST forecaster/classifier/regressor, an Autoformer or Informer forecaster or a causal LM (dense,
    or compressed by this library) to the single ONNX file ``path``; the compressed layers keep their stored
    tensors. Returns ``path``.

    ``ort_ops`` (default): stored matrices that ONNX Runtime's own quantized kernels take run on them
    (``MatMulNBits`` for 4-bit products, ``GatherBlockQuantized`` for 2/4/8-bit lookups; ``ortops.py``), the rest
    decodes with standard ops. ``False``: standard ops only, for runtimes without ONNX Runtime's contrib ops.

    ``accuracy_level`` (``MatMulNBits``' own attribute): 0 (default) computes the 4-bit products in fp32, as PyTorch
    does; 4 quantizes their activations to int8 per block, which ONNX Runtime's CPU kernel runs 2-4× faster, at
    outputs that differ from PyTorch's by that rounding (greedy tokens may differ).

    ``standardization`` (a forecaster's training statistics: a ``Standardization``, its dict, or the path of its
    JSON; default: ``standardization.json`` beside a model folder): the graph takes and returns values in the user's
    units, standardising them inside (``units.py``); without statistics, in the units the model was trained on.

    The file carries what the runner needs in its metadata (``hf_tensorcompress.kind``: ``forecast`` or
    ``causal_lm``, the model's input/output names, and for forecasters the ``units``), so ``runner.forecast`` /
    ``runner.generate`` take only it.
    """
    _check_accuracy_level(accuracy_level, ort_ops)
    statistics = read_statistics(model_or_folder, standardization)
    model, linears = _model(model_or_folder)
    graph = graph_for(model)
    if graph is None:
        supported = ", ".join(GRAPHS)
        raise OnnxExportError(
            f"{type(model).__name__} does not export to ONNX here; the exported families are: {supported}"
        )
    replaced = swap_layers(model, ort_ops, accuracy_level)
    left = {type(module).layer_type for module in model.modules() if isinstance(module, CompressedLayer)}
    if left:
        raise OnnxExportError(
            f"layer types {sorted(left)} have no ONNX export form (cp, svd, biprop, lowbit, shared, tiered_embedding and tt_embedding have one)"
        )
    wrapper, inputs, dynamic, metadata = graph(model)
    wrapper, dynamic, metadata = in_user_units(wrapper, model, metadata, dynamic, statistics)
    wrapper.eval()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            inputs,
            input_names=list(metadata["inputs"]),
            output_names=list(metadata["outputs"]),
            dynamic_shapes=dynamic,
            opset_version=opset,
            dynamo=True,
            external_data=False,
            optimize=False,
            verbose=False,
            custom_translation_table={**CONTRIB_TRANSLATIONS, **UNPACK_TRANSLATIONS},
        )
    program.save(str(path), external_data=False)
    where = next(name for name, module in wrapper.named_modules() if module is model)  # the model inside the graph
    fold_weight_transposes(path, keep=tuple(f"{where}.{name}." for name in replaced))
    tidy_graph(path)
    extra = {} if linears is None else {"linears": linears}
    write_metadata(
        path,
        {**metadata, "compressed_modules": replaced, "ort_ops": ort_ops, "accuracy_level": accuracy_level, **extra},
    )
    return path


def _check_accuracy_level(accuracy_level: int, ort_ops: bool) -> None:
    if accuracy_level not in ACCURACY_LEVELS:
        levels = ", ".join(f"{level} ({meaning})" for level, meaning in ACCURACY_LEVELS.items())
        raise OnnxExportError(f"accuracy_level={accuracy_level!r} is not one of MatMulNBits' levels: {levels}")
    if accuracy_level and not ort_ops:
        raise OnnxExportError(
            f"accuracy_level={accuracy_level} sets how MatMulNBits computes, and a standard-ops export has no "
            "MatMulNBits: leave it at 0, or export with ort_ops=True"
        )


def describe(path: str | Path) -> str:
    """The metadata an exported file carries, as indented JSON (for the command line)."""
    from .metadata import read_metadata

    return json.dumps(read_metadata(path), indent=2)
