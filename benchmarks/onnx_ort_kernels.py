"""What ONNX Runtime's CPU kernels for block-quantized weights accept, and how fast they run: ``MatMulNBits`` at each
width and zero-point form, and ``GatherBlockQuantized``, on the library's packed layout (``lowbit.pack``).

    nice -n 5 python benchmarks/onnx_ort_kernels.py [--rows 49152] [--columns 576] [--block 64] [--repeats 20]

Each case is a one-node model with random codes, fp16 group scales and minima cast to fp32 in the graph (as the
export writes them). ``MatMulNBits`` forms: no zero point (the kernel subtracts ``2^(bits−1)``; the export adds the
offset back with a small ``MatMul``), uint8 zero points (packed at the width), float zero points ``−minimum / scale``
(the library's decode directly). Batch 1 (one decoding step) at 1 thread, against a float ``MatMul`` of the same
matrix; default shape: SmolLM2's tied head. A case that fails prints ONNX Runtime's reason. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ZERO_POINTS = ("none", "uint8", "float")


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """``lowbit.pack`` for 2, 4, 8 bits (codes low bits first); 3 bits (8 codes in 3 bytes) via the same word."""
    rows, columns = codes.shape
    words = (codes.reshape(rows, -1, 8).astype(np.uint64) << (np.arange(8, dtype=np.uint64) * bits)).sum(-1)
    return ((words[..., None] >> (np.arange(bits, dtype=np.uint64) * 8)) & 255).astype(np.uint8).reshape(rows, -1)


def stored(rows: int, columns: int, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Codes, fp16 scale and minimum, and the library's decode ``code · scale + minimum`` in fp32."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2**bits, (rows, columns)).astype(np.uint8)
    scale = (rng.random((rows, columns // block)) * 0.01 + 1e-3).astype(np.float16)
    minimum = (rng.standard_normal((rows, columns // block)) * 0.05).astype(np.float16)
    grouped = (
        codes.reshape(rows, -1, block) * scale.astype(np.float32)[..., None] + minimum.astype(np.float32)[..., None]
    )
    return codes, scale, minimum, grouped.reshape(rows, columns)


def session(nodes: list, inputs: list, output: list, initializers: list) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "case", inputs, output, initializers)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def milliseconds(run, repeats: int) -> float:
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats * 1e3


def matmul_nbits(rows: int, columns: int, bits: int, block: int, zero_point: str, repeats: int) -> dict:
    codes, scale, minimum, dense = stored(rows, columns, bits, block)
    blob = block * bits // 8
    initializers = [
        numpy_helper.from_array(pack(codes, bits).reshape(rows, columns // block, blob), "B"),
        numpy_helper.from_array(scale, "scale16"),
        numpy_helper.from_array(minimum, "minimum16"),
    ]
    nodes = [
        helper.make_node("Cast", ["scale16"], ["scale"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["minimum16"], ["minimum"], to=TensorProto.FLOAT),
    ]
    inputs = ["A", "B", "scale"]
    if zero_point == "float":
        nodes += [helper.make_node("Div", ["minimum", "scale"], ["ratio"]), helper.make_node("Neg", ["ratio"], ["zp"])]
        inputs.append("zp")
    elif zero_point == "uint8":
        per_byte = 8 // bits if 8 % bits == 0 else 1
        zeros = np.zeros((rows, -(-(columns // block) // per_byte)), np.uint8)
        initializers.append(numpy_helper.from_array(zeros, "zp"))
        inputs.append("zp")
    attributes = dict(K=columns, N=rows, bits=bits, block_size=block)
    nodes.append(helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", **attributes))
    a = np.random.default_rng(1).standard_normal((1, columns)).astype(np.float32)
    try:
        case = session(
            nodes,
            [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, columns])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, rows])],
            initializers,
        )
        y = case.run(None, {"A": a})[0]
    except Exception as error:  # noqa: BLE001 - the reason is the result
        return {"runs": False, "reason": str(error).splitlines()[0][-200:]}
    result = {"runs": True, "ms": milliseconds(lambda: case.run(None, {"A": a}), repeats)}
    if zero_point == "float":  # the one form that is the library's decode as it is
        expected = a @ dense.T
        result["relative_error"] = float(np.abs(y - expected).max() / np.abs(expected).max())
    return result


def gather_block_quantized(rows: int, columns: int, bits: int, block: int) -> dict:
    codes, scale, _, _ = stored(rows, columns, bits, block)
    nodes = [
        helper.make_node("Cast", ["scale16"], ["scale"], to=TensorProto.FLOAT),
        helper.make_node(
            "GatherBlockQuantized",
            ["data", "ids", "scale"],
            ["Y"],
            domain="com.microsoft",
            bits=bits,
            block_size=block,
            gather_axis=0,
            quantize_axis=1,
        ),
    ]
    initializers = [numpy_helper.from_array(pack(codes, bits), "data"), numpy_helper.from_array(scale, "scale16")]
    ids = np.asarray([3, rows - 1, 0], dtype=np.int64)
    try:
        case = session(
            nodes,
            [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, columns])],
            initializers,
        )
        y = case.run(None, {"ids": ids})[0]
    except Exception as error:  # noqa: BLE001 - the reason is the result
        return {"runs": False, "reason": str(error).splitlines()[0][-200:]}
    grouped = codes[ids].reshape(len(ids), -1, block).astype(np.float32) - 2 ** (bits - 1)
    expected = (grouped * scale.astype(np.float32)[ids][..., None]).reshape(len(ids), columns)
    return {"runs": True, "max_abs_error": float(np.abs(y - expected).max())}


def dense_matmul(rows: int, columns: int, repeats: int) -> float:
    weight = np.random.default_rng(0).standard_normal((columns, rows)).astype(np.float32)
    case = session(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])],
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, columns])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, rows])],
        [numpy_helper.from_array(weight, "W")],
    )
    a = np.ones((1, columns), dtype=np.float32)
    return milliseconds(lambda: case.run(None, {"A": a}), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=49152)
    parser.add_argument("--columns", type=int, default=576)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    shape = (args.rows, args.columns)
    results = {"onnxruntime": ort.__version__, "shape": shape, "block": args.block}
    results["dense_matmul_ms"] = dense_matmul(*shape, args.repeats)
    print("float MatMul", results["dense_matmul_ms"], flush=True)
    for bits in (2, 3, 4, 8):
        for zero_point in ZERO_POINTS:
            key = f"matmul_nbits_{bits}bit_zp_{zero_point}"
            results[key] = matmul_nbits(*shape, bits, args.block, zero_point, args.repeats)
            print(key, results[key], flush=True)
        results[f"gather_block_quantized_{bits}bit"] = gather_block_quantized(*shape, bits, args.block)
        print(f"gather_block_quantized_{bits}bit", results[f"gather_block_quantized_{bits}bit"], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
