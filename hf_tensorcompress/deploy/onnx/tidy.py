"""The exported graph tidied with onnxscript's and onnx-ir's own passes, never at the stored tensors' expense.

The dynamo exporter writes one ``Constant`` node per literal and repeats the same shape arithmetic at every layer;
on a small compressed model that graph is over a tenth of the file. Constant folding, common-subexpression elimination
and dead-node removal shrink it, and the per-value shape annotations (``value_info``, which ONNX Runtime infers again
at load) are dropped. The exporter's own optimizer stays off: it would also fold the decodes of small stored tensors
into float initializers. Here every initializer is marked as a graph input while folding, which makes it overridable
and so not a constant to the folder: only what the graph computes from literals and static shapes is folded, and
every stored tensor stays byte for byte as exported. The folded literals go back into ``Constant`` nodes, so the
initializers stay the model's tensors and nothing else.

The exporter's records for debugging an export go too: each node's Python stack trace (5 of the 7 MB of a CP
PatchTST), its generated name (``node_Add_12``: the op type and a counter) and the graph's ``ExportedProgram``
signature (20-40 KB of text naming each parameter, which the initializers' names already do). Nothing reads them at
run time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import (
    AddInitializersToInputsPass,
    CommonSubexpressionEliminationPass,
    RemoveInitializersFromInputsPass,
    RemoveUnusedNodesPass,
)
from onnxscript.optimizer import fold_constants


def tidy_graph(path: Path) -> None:
    """Rewrite the ONNX file at ``path`` with its literal arithmetic folded, repeated nodes merged, unused nodes,
    shape annotations and debug records dropped; initializers unchanged."""
    model = ir.load(str(path))
    stored = set(model.graph.initializers)
    with _quiet("onnxscript", "onnx_ir"):
        AddInitializersToInputsPass()(model)
        fold_constants(model, onnx_shape_inference=False)
        RemoveInitializersFromInputsPass()(model)
        _literals_as_constants(model.graph, stored)
        CommonSubexpressionEliminationPass()(model)
        RemoveUnusedNodesPass()(model)
    _drop_debug_records(model)
    proto = ir.serde.serialize_model(model)
    del proto.graph.value_info[:]
    onnx.save(proto, str(path))


def _literals_as_constants(graph: ir.Graph, stored: set[str]) -> None:
    """Each initializer the folder made (not in ``stored``) turned back into a ``Constant`` node at the graph's start."""
    first = next(iter(graph), None)
    for name in [name for name in graph.initializers if name not in stored]:
        value = graph.initializers.pop(name)
        node = ir.Node("", "Constant", (), [ir.AttrTensor("value", value.const_value)], outputs=[value])
        if first is None:
            graph.append(node)
        else:
            graph.insert_before(first, node)


def _drop_debug_records(model: ir.Model) -> None:
    model.graph.metadata_props.clear()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        node.name = None
        node.metadata_props.clear()


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """The passes log an INFO line for every node they skip (thousands for an LM), which a process that configured
    INFO logging would print (ONNX Runtime's quantizer configures it at import): only warnings pass meanwhile."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
