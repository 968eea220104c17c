"""The exported graph's tidying: literal arithmetic folded and repeats merged, the stored tensors never decoded into
float initializers, the outputs unchanged."""

import logging

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from hf_tensorcompress.deploy.onnx.tidy import tidy_graph


def _graph_with_a_stored_matrix(path):
    """``x @ decode(codes) * (2 + 3)`` with ``decode`` (``Cast`` × scale) written twice, as an exporter repeats it,
    and the literals as ``Constant`` nodes; shape annotations on every value, and the dynamo exporter's debug records
    (generated node names, stack traces, the program's signature)."""
    codes = numpy_helper.from_array(np.arange(32, dtype=np.uint8).reshape(8, 4) % 16, "layer.codes")
    scale = numpy_helper.from_array(np.full((1, 4), 0.5, dtype=np.float32), "layer.scale")
    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
        helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.array(3.0, np.float32))),
        helper.make_node("Add", ["two", "three"], ["five"]),
        helper.make_node("Cast", ["layer.codes"], ["levels_a"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["levels_a", "layer.scale"], ["weight_a"]),
        helper.make_node("Cast", ["layer.codes"], ["levels_b"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["levels_b", "layer.scale"], ["weight_b"]),
        helper.make_node("MatMul", ["x", "weight_a"], ["product_a"]),
        helper.make_node("MatMul", ["x", "weight_b"], ["product_b"]),
        helper.make_node("Add", ["product_a", "product_b"], ["sum"]),
        helper.make_node("Mul", ["sum", "five"], ["y"]),
    ]
    annotated = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("five", "weight_a", "sum")]
    graph = helper.make_graph(
        nodes,
        "stored",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [codes, scale],
        value_info=annotated,
    )
    for number, node in enumerate(graph.node):
        node.name = f"node_{node.op_type}_{number}"
        node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value='File "model.py", line 7, in forward')
    graph.metadata_props.add(key="pkg.torch.export.ExportedProgram.graph_signature", value="# inputs\nx: USER_INPUT")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.metadata_props.add(key="kept", value="the model's own metadata")
    onnx.save(model, str(path))
    return {init.name: init.raw_data for init in (codes, scale)}


def _run(path, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_tidying_folds_literals_and_merges_repeats_but_keeps_stored_tensors(tmp_path):
    path = tmp_path / "model.onnx"
    stored = _graph_with_a_stored_matrix(path)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    before = _run(path, x)

    tidy_graph(path)

    model = onnx.load(str(path))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Constant") == 1 and ops.count("Add") == 1  # 2 + 3 folded into one literal
    assert ops.count("Cast") == 1 and ops.count("MatMul") == 1  # the repeated decode and product merged
    assert not model.graph.value_info
    assert not model.graph.metadata_props and {(n.name, len(n.metadata_props)) for n in model.graph.node} == {("", 0)}
    assert [(entry.key, entry.value) for entry in model.metadata_props] == [("kept", "the model's own metadata")]
    held = {init.name: init.raw_data for init in model.graph.initializer}
    assert held == stored  # byte for byte, and no folded value among them (the 8×4 decode stays in the graph)
    assert [i.name for i in model.graph.input] == ["x"]
    np.testing.assert_allclose(_run(path, x), before, rtol=1e-6)


def test_tidying_logs_nothing_below_a_warning_where_info_logging_is_on(tmp_path, caplog):
    """ONNX Runtime's quantizer turns INFO logging on at import; the passes' per-node lines must not flood it."""
    path = tmp_path / "model.onnx"
    _graph_with_a_stored_matrix(path)
    caplog.set_level(logging.INFO)
    tidy_graph(path)
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("onnxscript", "onnx_ir"))] == []
    assert logging.getLogger("onnxscript").level == logging.NOTSET  # the levels are restored
