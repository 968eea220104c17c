"""Float weights stored the way the graph reads them: the exporter writes ``nn.Linear`` as ``MatMul(x, Transpose(W))``
with ``W`` an initializer, which ONNX Runtime's constant folding turns into a transposed initializer at load. A
session that keeps the packed tensors packed (folding off) would transpose every dense weight on every call, so the
file stores those weights already transposed (the same bytes in the other order): only float initializers that
nothing else reads, outside the compressed modules (whose tensors stay byte for byte as the checkpoint stores them).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def fold_weight_transposes(path: Path, keep: tuple[str, ...] = ()) -> int:
    """Rewrite the ONNX file at ``path`` with each ``Transpose`` of a float initializer (read only by it, its name
    starting with none of ``keep``) replaced by the transposed initializer; the number replaced."""
    model = onnx.load(str(path))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    nodes, folded = [], {}
    for node in graph.node:
        source = initializers.get(node.input[0]) if node.op_type == "Transpose" else None
        if (
            source is None
            or source.data_type != onnx.TensorProto.FLOAT
            or readers[source.name] != 1
            or source.name.startswith(keep)
        ):
            nodes.append(node)
            continue
        array = numpy_helper.to_array(source)
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(array.ndim))[::-1])
        folded[source.name] = numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)), node.output[0])
    if folded:
        kept = [init for init in graph.initializer if init.name not in folded]
        del graph.initializer[:]
        graph.initializer.extend([*kept, *folded.values()])
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, str(path))
    return len(folded)
