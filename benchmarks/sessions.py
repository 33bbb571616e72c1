"""ONNX Runtime sessions as a build holds them: many at once, each with its own thread pool.

The integer reference runs every CPU layer of an NPU graph in a one-node session, the runner
one session per segment, calibration a probe: dozens to hundreds of sessions live at once.
With ORT's default spinning, each pool's threads spin after every run and the pools fight for
the cores. ``npubuild.onnx_io.session`` turns spinning off; this benchmark measures both
settings in the same run, on YOLOv8n-320's own nodes (one session per node, fed the real
intermediate tensors of one photo) and on the whole model:

    python3 benchmarks/sessions.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npubuild import onnx_io  # noqa: E402
from npubuild.recipe.paths import package_dir  # noqa: E402

SHAPE = [1, 3, 320, 320]


def yolov8n() -> onnx.ModelProto:
    import onnxscript.optimizer

    model = onnx.load(str(package_dir("nudenet") / "320n.onnx"))
    model = onnx_io.fix_input_shapes(model, {model.graph.input[0].name: SHAPE})
    return onnxscript.optimizer.optimize(model)  # shape arithmetic folded: Conv, Mul, Concat…


def one_node_models(model: onnx.ModelProto, values: dict[str, np.ndarray]):
    """Each node as its own model, with its feeds: the tensors the whole model computed."""
    weights = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        fed = [i for i in node.input if i and i not in weights]
        graph = helper.make_graph(
            [node], node.name or node.op_type, [_value_info(i, values[i]) for i in fed],
            [_value_info(o, values[o]) for o in node.output if o],
            [weights[i] for i in node.input if i in weights])
        one = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
        yield one, {i: values[i] for i in fed}


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                         value.shape)


def session(model, spinning: bool):
    """``onnx_io.session``'s options, spinning as asked (ORT's default is on)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def per_pass(runs: list, repeats: int) -> float:
    for sess, feeds in runs:  # warm
        sess.run(None, feeds)
    start = time.perf_counter()
    for _ in range(repeats):
        for sess, feeds in runs:
            sess.run(None, feeds)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from PIL import Image

    model = yolov8n()
    image = Image.open(package_dir("skimage") / "data" / "astronaut.png").convert("RGB")
    x = np.asarray(image.resize((320, 320)), np.float32).transpose(2, 0, 1)[None] / 255
    feeds = {model.graph.input[0].name: x}
    names = [o for n in model.graph.node for o in n.output if o]
    values = {**feeds, **onnx_io.run(onnx_io.with_outputs(model, names), feeds)}
    nodes = list(one_node_models(model, values))
    rows = []
    for spinning in (True, False):
        layer = per_pass([(session(m, spinning), f) for m, f in nodes], args.repeats)
        whole = per_pass([(session(model, spinning), feeds)], args.repeats)
        rows.append((spinning, layer, whole))
    base_layer, base_whole = rows[0][1], rows[0][2]
    print(f"YOLOv8n-320: {len(nodes)} one-node sessions, and the whole model; "
          f"ms per pass, {args.repeats} repeats\n")
    print("| spinning | one-node sessions, ms | vs spinning | whole model, ms | vs spinning |")
    print("|---|---|---|---|---|")
    for spinning, layer, whole in rows:
        print(f"| {'on (ORT default)' if spinning else 'off (npubuild)'} | {1e3 * layer:.1f} | "
              f"{base_layer / layer:.2f}x | {1e3 * whole:.1f} | {base_whole / whole:.2f}x |")


if __name__ == "__main__":
    main()
