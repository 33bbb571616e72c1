"""Tiny float models written inline, quantized and checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npubuild import metrics, onnx_io
from npubuild.quant import calibrate, check, quantizer
from npubuild.quant.lower import lower
from npubuild.quant.reference import quantize_inputs, run_reference


def model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    """``inputs``/``outputs``: {name: shape}; ``inits``: {name: array}."""
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(_array(v), n) for n, v in dict(inits).items()])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(f.domain, 1) for f in functions][:1]
    m = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m


def _array(value) -> np.ndarray:
    value = np.asarray(value)
    return value if value.dtype.kind in "iu" else value.astype(np.float32)


def feeds_for(m, n: int = 3, seed: int = 0):
    """Random samples for every (non-initializer) input of ``m``."""
    return samples({v.name: onnx_io.value_shape(v) for v in onnx_io.graph_inputs(m)}, n, seed)


def samples(shapes: dict, n: int = 3, seed: int = 0, low=-2.0, high=3.0):
    rng = np.random.default_rng(seed)
    return [{k: rng.uniform(low, high, s).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]


def quantize(m, feeds, scheme="symmetric", granularity="per_channel", method="minmax", **kw):
    fg, probe = lower(m)
    stats = calibrate.observe(fg, probe, feeds, method,
                              weight_grams=kw.get("weight_rounding") == "gptq")
    config = quantizer.QuantConfig(scheme=scheme, granularity=granularity, method=method, **kw)
    qg, records = quantizer.quantize_graph(fg, stats, config, "g")
    return qg, fg, probe


def check_against_ort(m, feeds, **kw):
    """Quantize, then: reference vs ORT on the QDQ model layer by layer, and vs float."""
    qg, fg, probe = quantize(m, feeds, **kw)
    envs = [run_reference(qg, quantize_inputs(qg, f)) for f in feeds]
    cc = check.crosscheck(qg, envs)
    sess = onnx_io.session(m)
    cos = []
    for f, env in zip(feeds, envs):
        ref = onnx_io.run(sess, f)
        for name in qg.outputs:
            t = qg.tensors[name]
            got = env[name] if t.is_float else (env[name].astype(np.float64) - t.zero_point) * t.scale
            cos.append(metrics.similarity(ref[name], got).cosine)
    return qg, cc, float(np.mean(cos))


def biased_conv_mul_conv():
    """conv1 → Mul by a constant → conv2 on [1, 4, 6, 6], biases large against their
    accumulators: int16 on conv2's input quantizes its bias at a 256 times finer scale (and
    widens its weight scale where the bias would not fit), which a tensor's parameters alone
    leave as int8 built them. (nodes, initializers)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 3.0, (4,)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, (1, 4, 1, 1)).astype(np.float32), "k"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 3.0, (4,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "k"], ["m"], name="mul"),
             helper.make_node("Conv", ["m", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    return nodes, inits


def adopted_fake_quant_values(workflow, samples, kept):
    """The fake-quant export of ``workflow``'s own (first) graph run at its own parameters
    and placement: what a choice or a change adopted computes."""
    from npubuild.quant import fakequant
    from npubuild.quant.schemes import QParams

    state = workflow.states[0]
    qg = state.qgraph
    pipeline = fakequant.FakeQuantPipeline(workflow.pipeline.split_dir,
                                           fakequant.export_graphs({0: (qg, state.fg)}))
    params = {t: None if info.is_float else QParams(info.scale, info.zero_point, info.log2scale,
                                                     info.dtype) for t, info in qg.tensors.items()}
    cpu = {layer.name for layer in qg.layers if layer.device == "cpu"}
    feeds = {0: fakequant.params_feed(pipeline.tensors(0), params, pipeline.layers(0), cpu)}
    return pipeline.run(samples, feeds, kept)
