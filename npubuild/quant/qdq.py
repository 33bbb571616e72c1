"""QDQ export: a ``QGraph`` as an ONNX model of float ops between QuantizeLinear/Dequantize-
Linear pairs, which ONNX Runtime runs as the independent fake-quant reference.

``export_qdq(qgraph)`` has the float submodel's inputs and outputs (``graph_<i>.qdq.onnx``).
``layerwise_qdq(qgraph)`` is the same layers with every integer input a graph input, so each
layer can be fed the integer reference's own inputs and its output compared element by element
(``crosscheck``): a difference then comes from that layer's arithmetic alone, not from
differences accumulated upstream.

Each layer is its float ONNX op on dequantized inputs (weights as int8 + DequantizeLinear,
per-channel along axis 0; bias as int32 at scale ``s_x · s_w``), then QuantizeLinear. Where our
integer math and ONNX Runtime's can round differently:

- ORT's QuantizeLinear rounds half to **even**; ours rounds half **up**. In pow2 graphs the
  requantization factors are powers of two, so exact ties are common (``acc / 2^n`` with
  ``n ≥ 1``). Before such a QuantizeLinear the export adds half a unit of the accumulator's last
  bit (``s_y · 2^-(n+1)``), which turns ties upwards and moves nothing else; ORT then rounds
  exactly as we do wherever its float32 arithmetic is exact (|acc| < 2^24).
- Float-scale graphs use a fixed-point multiplier (31 bits) where ORT uses float32 products:
  results differ by one step only when the exact value lies within ~1e-6 of a rounding tie.
- Lookup tables are built the way this model computes them (float32, ties to even), so they
  differ only where ORT's float32 kernel for the function differs by an ulp from NumPy's
  (Sigmoid, Tanh) and that ulp crosses a rounding boundary.
- Bilinear resize weights are rounded to ``RESIZE_FRAC_BITS`` bits (exact for power-of-two
  scale factors). Average pools in pow2 graphs: an exact tie of a *negative* window sum over
  a count that is not a power of two rounds down (the reciprocal is rounded up), ORT rounds
  it to even: average pools mostly follow a Relu, where sums are never negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.engine.hashing import sha256_array
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.quant import schemes
from npubuild.quant.qgraph import QGraph, QLayer

ONNX_INT = {"int8": TensorProto.INT8, "int16": TensorProto.INT16}
INT64_MIN = -(2 ** 63)
AXES_AS_INPUT = 18  # opset where the Reduce* ops' axes attribute became an input
RMS_NORMALIZATION_OPSET = 23  # an rms layernorm's fragment is one RMSNormalization


@dataclass
class _Builder:
    qgraph: QGraph
    in_q: dict[str, str]          # integer tensor → name of its quantized value read by layers
    out_q: dict[str, str]         # integer tensor → name a layer writes its quantized value to
    float_name: dict[str, str]    # float tensor → name read / written
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    functions: dict = field(default_factory=dict)
    opsets: dict = field(default_factory=dict)
    opset: int = 17                                # the model's default-domain opset
    ties: bool = True                              # nudge exact ties upwards (see the module doc)
    prequant: dict = field(default_factory=dict)  # integer tensor → float value QuantizeLinear reads
    _dq_done: set = field(default_factory=set)
    _weights: dict = field(default_factory=dict)  # a weight's content -> its initializer

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs, outputs, **attrs):
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def weight(self, key: str, layer: QLayer, arrange, scale: np.ndarray, axis: int) -> str:
        """A conv layer's weights as the layer reads them (``arrange``: the layout its float op
        takes), dequantized from int8 per channel along ``axis``."""
        return _dq_weight(self, key, arrange(layer.arrays["weight"]), scale, axis)

    def bias(self, key: str, layer: QLayer, scale: np.ndarray) -> str:
        """A conv layer's int32 bias, dequantized at the accumulator's scale; a W16A16 layer's
        int64 bias (no DequantizeLinear reads int64) as the float32 constant that
        DequantizeLinear would compute, ``float32(b) · scale``."""
        count = layer.arrays["bias"].shape[0]
        if layer.arrays["bias"].dtype == np.int64:
            real = layer.arrays["bias"].astype(np.float32) * np.asarray(scale, np.float32)
            return self.const(f"{key}::bias", real.astype(np.float32))
        return self.node("DequantizeLinear", [self.const(f"{key}::b", layer.arrays["bias"]),
                                              self.const(f"{key}::bs", scale),
                                              self.const(f"{key}::bz", np.zeros(count, np.int32))],
                         [f"{key}::bias"], axis=0)

    def clamp(self, layer: QLayer) -> tuple[float, float] | None:
        """The real bounds of a layer's folded Relu/Clip (None: its dtype's own range)."""
        return _clamp(layer, self.qgraph)

    # ---- tensors ------------------------------------------------------------------------

    def qparams(self, t: str) -> tuple[str, str]:
        scale, zp = f"{t}::scale", f"{t}::zp"
        if scale not in self._dq_done:
            info = self.qgraph.tensors[t]
            self.const(scale, np.float32(info.scale))
            self.const(zp, np.array(info.zero_point, dtype=schemes.DTYPES[info.dtype]))
            self._dq_done.add(scale)
        return scale, zp

    def read(self, t: str) -> str:
        """The float value a layer reads for tensor ``t``."""
        info = self.qgraph.tensors[t]
        if info.is_float:
            return self.float_name[t]
        out = f"{t}::dq"
        if out not in self._dq_done:
            self.node("DequantizeLinear", [self.in_q[t], *self.qparams(t)], [out])
            self._dq_done.add(out)
        return out

    def write(self, t: str, value: str, nudge: np.ndarray | float | None = None,
              clamp: tuple[float, float] | None = None) -> None:
        """Quantize a layer's float result ``value`` into tensor ``t``."""
        info = self.qgraph.tensors[t]
        if info.is_float:
            self.node("Identity", [value], [self.float_name[t]])
            return
        if self.ties and nudge is not None and np.any(np.asarray(nudge) != 0):
            value = self.node("Add", [value, self.const(f"{t}::tie", np.float32(nudge))],
                              [f"{t}::nudged"])
        if clamp is not None:
            lo, hi = (self.const(f"{t}::lo", np.float32(clamp[0])),
                      self.const(f"{t}::hi", np.float32(clamp[1])))
            value = self.node("Clip", [value, lo, hi], [f"{t}::clipped"])
        self.prequant[t] = value
        self.node("QuantizeLinear", [value, *self.qparams(t)], [self.out_q[t]])


# ---- per-kind float ops --------------------------------------------------------------------

def _exact_bits(multipliers, shifts) -> np.ndarray:
    """``n' = n - ctz(M)``: ``acc · M / 2^n`` is a multiple of ``2^-n'`` (so ties are exact)."""
    m = np.abs(np.asarray(multipliers, dtype=np.int64))
    m, n = np.broadcast_arrays(m, np.asarray(shifts, dtype=np.int64))
    ctz = np.zeros(m.shape, dtype=np.int64)
    rest = m.copy()
    while np.any((rest > 0) & (rest % 2 == 0)):
        even = (rest > 0) & (rest % 2 == 0)
        ctz += even
        rest = np.where(even, rest // 2, rest)
    return np.where(m > 0, n - ctz, 0)


def _tie(layer: QLayer, qg: QGraph, multipliers, shifts, shape=None):
    """pow2 graphs: half a unit of the result's last fractional bit, ``s_y · 2^-(n'+1)``; per
    channel when ``shape`` is given, else the smallest over the factors."""
    if qg.scheme != "pow2_symmetric":
        return None
    s_y = qg.tensors[layer.outputs[0]].scale
    bits = _exact_bits(multipliers, shifts)
    if shape is None:
        bits = np.max(bits) if bits.size else 0
    nudge = np.where(bits > 0, s_y * 2.0 ** -(bits.astype(np.float64) + 1), 0.0)
    return float(nudge) if np.ndim(nudge) == 0 else nudge.reshape(shape)


def _clamp(layer: QLayer, qg: QGraph):
    sides = clamp_sides(layer, qg)
    if sides == (None, None):
        return None
    t = qg.tensors[layer.outputs[0]]
    qmin, qmax = schemes.qrange(t.dtype)
    lo, hi = ((qmin - t.zero_point) * t.scale if sides[0] is None else sides[0],
              (qmax - t.zero_point) * t.scale if sides[1] is None else sides[1])
    return lo, hi


def clamp_sides(layer: QLayer, qg: QGraph) -> tuple[float | None, float | None]:
    """The real bound of each side a folded Relu/Clip narrows below the output's dtype range
    (None for a side it does not): Relu's 0, Clip's ``lo``/``hi`` at the output's steps."""
    t = qg.tensors[layer.outputs[0]]
    qmin, qmax = schemes.qrange(t.dtype)
    lo, hi = layer.params.get("qmin", qmin), layer.params.get("qmax", qmax)
    return ((lo - t.zero_point) * t.scale if lo != qmin else None,
            (hi - t.zero_point) * t.scale if hi != qmax else None)


def _conv(b: _Builder, layer: QLayer, key: str):
    a, qg = layer.attrs, b.qgraph
    x = b.read(layer.inputs[0])
    w = layer.arrays["weight"]
    w_scale = np.asarray(layer.params["weight_scale"], np.float32)
    s_x = qg.tensors[layer.inputs[0]].scale
    bias_scale = (s_x * w_scale.astype(np.float64)).astype(np.float32)
    bias = b.bias(key, layer, bias_scale)
    cout = w.shape[0]
    if a.get("fc"):
        rank = len(qg.tensors[layer.inputs[0]].shape)
        if rank == 2:
            wf = b.weight(key, layer, lambda v: v.reshape(cout, -1), w_scale, 0)
            y = b.node("Gemm", [x, wf, bias], [f"{key}::y"], transB=1)
        else:
            wf = b.weight(key, layer, lambda v: np.ascontiguousarray(v.reshape(cout, -1).T),
                          w_scale, 1)
            mm = b.node("MatMul", [x, wf], [f"{key}::mm"])
            y = b.node("Add", [mm, bias], [f"{key}::y"])
        tie_shape = None
    else:
        wf = b.weight(key, layer, lambda v: v, w_scale, 0)
        top, bottom, left, right = a["pads"]
        y = b.node("Conv", [x, wf, bias], [f"{key}::y"], kernel_shape=a["kernel"],
                   strides=a["stride"], dilations=a["dilation"], group=a["group"],
                   pads=[top, left, bottom, right])
        tie_shape = (1, cout, 1, 1)
    nudge = _tie(layer, qg, layer.arrays["multiplier"], layer.arrays["shift"], tie_shape or (cout,))
    b.write(layer.outputs[0], y, nudge, b.clamp(layer))


def _dq_weight(b: _Builder, key: str, w: np.ndarray, scale: np.ndarray, axis: int) -> str:
    """int8 (or a W16A16 layer's int16) weights, dequantized per channel along ``axis``; equal
    weights are one initializer (an unrolled recurrence's steps read the same ones: nakdimon's
    QDQ model held 256 copies of four 400x1600 weights)."""
    digest = sha256_array(w)
    if digest not in b._weights:
        b._weights[digest] = b.const(f"{key}::w", w)
    return b.node("DequantizeLinear", [b._weights[digest], b.const(f"{key}::ws", scale),
                                       b.const(f"{key}::wz", np.zeros(scale.size, w.dtype))],
                  [f"{key}::weight"], axis=axis)


def _add(b: _Builder, layer: QLayer, key: str):
    p = layer.params
    op = "Sub" if p.get("sub") else "Add"
    y = b.node(op, [b.read(t) for t in layer.inputs], [f"{key}::y"])
    b.write(layer.outputs[0], y, _tie(layer, b.qgraph, p["multipliers"], p["shift"]),
            b.clamp(layer))


def _mul(b: _Builder, layer: QLayer, key: str):
    p = layer.params
    y = b.node("Mul", [b.read(t) for t in layer.inputs], [f"{key}::y"])
    b.write(layer.outputs[0], y, _tie(layer, b.qgraph, p["multiplier"], p["shift"]),
            b.clamp(layer))


def _matmul(b: _Builder, layer: QLayer, key: str):
    p = layer.params
    y = b.node("MatMul", [b.read(t) for t in layer.inputs], [f"{key}::y"])
    if layer.attrs.get("factor", 1.0) != 1.0:  # a folded scalar Mul/Div
        k = b.const(f"{key}::k", np.float32(layer.attrs["factor"]))
        y = b.node("Mul", [y, k], [f"{key}::scaled"])
    b.write(layer.outputs[0], y, _tie(layer, b.qgraph, p["multiplier"], p["shift"]),
            b.clamp(layer))


def _rescale(b: _Builder, layer: QLayer, key: str):
    """``x · factor``; with a negative side (PRelu, LeakyRelu) ``Where(x ≥ 0, x · factor,
    x · negative_factor)``, each side nudged on its own ties (pow2 graphs)."""
    p, a = layer.params, layer.attrs
    x = b.read(layer.inputs[0])
    if "input_offset" in a:  # a model input's DequantizeLinear: s · (x - z)
        x = b.node("Sub", [x, b.const(f"{key}::z", np.float32(a["input_offset"]))], [f"{key}::x"])
    if "divisor" in a:  # a model output's QuantizeLinear: y / s + z
        y = b.node("Div", [x, b.const(f"{key}::k", np.float32(a["divisor"]))], [f"{key}::d"])
        y = b.node("Add", [y, b.const(f"{key}::z", np.float32(a["output_offset"]))], [f"{key}::y"])
    else:
        y = b.node("Mul", [x, b.const(f"{key}::k", np.float32(a["factor"]))], [f"{key}::y"])
    nudge = _tie(layer, b.qgraph, p["multiplier"], p["shift"])
    if "negative_factor" in a:
        shape = None
        if "axis" in a:  # one slope per index of the axis, broadcast from the right as PRelu's
            rank = len(b.qgraph.tensors[layer.inputs[0]].shape)
            shape = (len(a["negative_factor"]),) + (1,) * (rank - 1 - a["axis"])
        slope = np.asarray(a["negative_factor"], np.float32).reshape(shape or ())
        negative = b.node("Mul", [x, b.const(f"{key}::kn", slope)], [f"{key}::yn"])
        negative_nudge = _tie(layer, b.qgraph, layer.arrays["negative_multiplier"],
                              layer.arrays["negative_shift"], shape)
        if b.ties:
            y = _nudged(b, y, nudge, f"{key}::tp")
            negative = _nudged(b, negative, negative_nudge, f"{key}::tn")
        zero = b.const(f"{key}::zero", np.float32(0.0))
        positive = b.node("GreaterOrEqual", [x, zero], [f"{key}::pos"])
        y, nudge = b.node("Where", [positive, y, negative], [f"{key}::prelu"]), None
    b.write(layer.outputs[0], y, nudge, b.clamp(layer))


def _nudged(b: _Builder, value: str, nudge, name: str) -> str:
    """``value`` plus a tie nudge (`_tie`), where there is one."""
    if nudge is None or not np.any(np.asarray(nudge) != 0):
        return value
    return b.node("Add", [value, b.const(name, np.float32(nudge))], [f"{name}::nudged"])


def _concat(b: _Builder, layer: QLayer, key: str):
    p = layer.params
    y = b.node("Concat", [b.read(t) for t in layer.inputs], [f"{key}::y"], axis=layer.attrs["axis"])
    nudge = _tie(layer, b.qgraph, p["multipliers"], p["shifts"])
    b.write(layer.outputs[0], y, nudge, b.clamp(layer))


def _maxpool(b: _Builder, layer: QLayer, key: str):
    a = layer.attrs
    x = b.read(layer.inputs[0])
    if a.get("global"):
        y = b.node("GlobalMaxPool", [x], [f"{key}::y"])
    else:
        t, bo, l, r = a["pads"]
        y = b.node("MaxPool", [x], [f"{key}::y"], kernel_shape=a["kernel"], strides=a["stride"],
                   dilations=a["dilation"], pads=[t, l, bo, r])
    b.write(layer.outputs[0], y)


def _avgpool(b: _Builder, layer: QLayer, key: str):
    a = layer.attrs
    x = b.read(layer.inputs[0])
    if a.get("global"):
        y = b.node("GlobalAveragePool", [x], [f"{key}::y"])
    else:
        t, bo, l, r = a["pads"]
        y = b.node("AveragePool", [x], [f"{key}::y"], kernel_shape=a["kernel"],
                   strides=a["stride"], pads=[t, l, bo, r],
                   count_include_pad=a.get("count_include_pad", 0))
    b.write(layer.outputs[0], y, _avgpool_tie(layer, b.qgraph), b.clamp(layer))


def _avgpool_tie(layer: QLayer, qg: QGraph):
    """pow2: ``sum · 2^e / count`` is at least ``min(1, 2^e) / (2·count)`` from a tie unless
    exactly on one; a quarter of the smallest such gap turns exact ties upwards only."""
    if qg.scheme != "pow2_symmetric":
        return None
    x, y = qg.tensors[layer.inputs[0]], qg.tensors[layer.outputs[0]]
    e = y.log2scale - x.log2scale
    return y.scale * min(1.0, 2.0 ** e) / (4 * int(layer.arrays["counts"].max()))


def _resize(b: _Builder, layer: QLayer, key: str):
    a = layer.attrs
    shape = list(b.qgraph.tensors[layer.outputs[0]].shape)
    sizes = b.const(f"{key}::sizes", np.array(shape, np.int64))
    y = b.node("Resize", [b.read(layer.inputs[0]), "", "", sizes], [f"{key}::y"], mode=a["mode"],
               coordinate_transformation_mode=a["coordinate_transformation_mode"],
               nearest_mode=a["nearest_mode"])
    if a["mode"] == "nearest":
        b.write(layer.outputs[0], y)
        return
    b.write(layer.outputs[0], y, _resize_tie(layer, b.qgraph), b.clamp(layer))


def _resize_tie(layer: QLayer, qg: QGraph):
    """pow2: the result is a multiple of ``2^(e - 2·fb)`` where ``fb`` is the number of
    fractional bits the integer taps really use (2 for a ×2 half-pixel resize)."""
    if qg.scheme != "pow2_symmetric":
        return None
    from npubuild.quant.reference import _linear_taps, _source_coords

    a, one = layer.attrs, 1 << schemes.RESIZE_FRAC_BITS
    taps = []
    for out_size, in_size in zip(a["output_size"], a["input_size"]):
        w1 = _linear_taps(_source_coords(out_size, in_size, a["coordinate_transformation_mode"]),
                          in_size)[2]
        taps += [w1, one - w1]
    weights = np.concatenate(taps)
    frac = int(_exact_bits(weights[weights > 0], schemes.RESIZE_FRAC_BITS).max(initial=0))
    x, y = qg.tensors[layer.inputs[0]], qg.tensors[layer.outputs[0]]
    bits = 2 * frac - (y.log2scale - x.log2scale)
    return y.scale * 2.0 ** -(bits + 1) if bits > 0 else None


def _data(b: _Builder, layer: QLayer, key: str):
    a, x = layer.attrs, b.read(layer.inputs[0])
    if layer.kind == "reshape":
        shape = b.const(f"{key}::shape", np.array(a["shape"], np.int64))
        y = b.node("Reshape", [x, shape], [f"{key}::y"])
    elif layer.kind == "transpose":
        y = b.node("Transpose", [x], [f"{key}::y"], perm=a["perm"])
    elif layer.kind == "depth_to_space":
        y = b.node("DepthToSpace", [x], [f"{key}::y"], blocksize=a["blocksize"], mode=a["mode"])
    elif layer.kind == "slice":
        ends = [INT64_MIN if e is None else e for e in a["ends"]]
        y = b.node("Slice", [x] + [b.const(f"{key}::{n}", np.array(v, np.int64)) for n, v in
                                   (("starts", a["starts"]), ("ends", ends), ("axes", a["axes"]),
                                    ("steps", a["steps"]))], [f"{key}::y"])
    elif layer.kind == "pad":
        t = b.qgraph.tensors[layer.inputs[0]]
        value = np.float32((a["value"] - t.zero_point) * t.scale)
        pads = b.const(f"{key}::pads", np.array(a["pads"], np.int64))
        y = b.node("Pad", [x, pads, b.const(f"{key}::value", value)], [f"{key}::y"],
                   mode=a.get("mode", "constant"))
    else:  # split
        outs = [f"{key}::y{i}" for i in range(len(layer.outputs))]
        sizes = b.const(f"{key}::split", np.array(a["sizes"], np.int64))
        b.node("Split", [x, sizes], outs, axis=a["axis"])
        for t, y in zip(layer.outputs, outs):
            b.write(t, y)
        return
    b.write(layer.outputs[0], y)


def _fragment(b: _Builder, layer: QLayer, key: str):
    """Splice the layer's float ONNX fragment (LUT functions, CPU layers) between Q/DQ."""
    frag = _at_opset(layer.arrays["model"].tobytes(), b.opset)
    names = {i.name: b.read(i.name) for i in frag.graph.input}  # inputs keep tensor names
    outs = {o.name: f"{key}::{j}" for j, o in enumerate(frag.graph.output)}
    rename = lambda n: "" if not n else names.get(n) or outs.get(n) or f"{key}::{n}"  # noqa: E731
    for init in frag.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename(init.name)
        b.inits.append(copy)
    for node in frag.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{key}::{node.name}"
        copy.input[:] = [rename(i) for i in node.input]
        copy.output[:] = [rename(o) for o in node.output]
        b.nodes.append(copy)
    for f in frag.functions:
        b.functions.setdefault((f.domain, f.name), f)
    for o in frag.opset_import:
        if o.domain not in STANDARD_DOMAINS:
            b.opsets[o.domain] = o.version
    for o, t in zip(frag.graph.output, layer.outputs):
        b.write(t, outs[o.name])


FRAGMENTS = {"conv": _conv, "add": _add, "mul": _mul, "matmul": _matmul, "layernorm": _fragment,
             "lrn": _fragment,
             "rescale": _rescale, "concat": _concat,
             "maxpool": _maxpool, "avgpool": _avgpool, "resize": _resize, "lut": _fragment,
             "softmax": _fragment, "float": _fragment, **{k: _data for k in ("reshape", "transpose", "depth_to_space", "slice", "split",
                                   "pad")}}


def _layers(b: _Builder) -> None:
    for i, layer in enumerate(b.qgraph.layers):
        FRAGMENTS[layer.kind](b, layer, f"L{i}")


def _model(b: _Builder, inputs, outputs, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, f"{b.qgraph.name}_qdq", inputs, outputs, b.inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in b.opsets.items()]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(b.functions.values()),
                              producer_name="npubuild.quant.qdq")
    model.ir_version = onnx_io.MAX_ORT_IR_VERSION
    return model


def _at_opset(data: bytes, opset: int) -> onnx.ModelProto:
    """A fragment at the export's opset: int16 Q/DQ needs opset 21, where older fragments'
    ops changed form (ReduceMean's axes became an input), so the converter rewrites them."""
    frag = onnx.ModelProto()
    frag.ParseFromString(data)
    own = next((o.version for o in frag.opset_import if o.domain in STANDARD_DOMAINS), opset)
    if own >= AXES_AS_INPUT or opset < AXES_AS_INPUT:
        return frag  # same operator forms: splices as it is
    return onnx_io.convert_version(frag, opset)  # fused functions' bodies too


def fragments_opset(qg: QGraph) -> int:
    """The default-domain opset the layers' float fragments need at least: 23 where a
    ``layernorm`` is an RMSNormalization (the op arrived at 23), else 13."""
    return RMS_NORMALIZATION_OPSET if any(layer.attrs.get("rms") for layer in qg.layers) else 13


def _opset(qg: QGraph, base: int) -> int:
    uses_int16 = any(t.dtype == "int16" for t in qg.tensors.values()) or any(
        layer.kind == "conv" and layer.arrays["weight"].dtype == np.int16 for layer in qg.layers)
    return max(base, 21 if uses_int16 else 13, fragments_opset(qg))


def export_qdq(qg: QGraph, *, opset: int = 17, ties: bool = True) -> onnx.ModelProto:
    """The QDQ model with the float submodel's interface: float in, float out.

    ``ties=False`` leaves out the Adds that turn exact ties upwards (pow2 graphs): the model
    handed to a vendor, which rounds in its own kernels, and for which a float op between a
    layer and its QuantizeLinear makes the layer a float one (rknn-toolkit2 2.5.0 then stops:
    "Invalid w_par['dtype'] = float16")."""
    ints = [t for t, info in qg.tensors.items() if not info.is_float]
    b = _Builder(qg, {t: f"{t}::q" for t in ints}, {t: f"{t}::q" for t in ints},
                 {t: t for t, info in qg.tensors.items() if info.is_float}, opset=_opset(qg, opset),
                 ties=ties)
    for t in ints:
        if t in qg.constants:
            b.const(f"{t}::q", qg.constants[t])
    for t in qg.inputs:
        if not qg.tensors[t].is_float:
            b.node("QuantizeLinear", [t, *b.qparams(t)], [f"{t}::q"])
    _layers(b)
    for t in qg.outputs:
        if not qg.tensors[t].is_float:
            b.node("Identity", [b.read(t)], [t])
    value = lambda t: helper.make_tensor_value_info(t, TensorProto.FLOAT, qg.tensors[t].shape)  # noqa: E731
    inputs, outputs = [value(t) for t in qg.inputs], [value(t) for t in qg.outputs]
    return _model(b, inputs, outputs, b.opset)


def layerwise_qdq(qg: QGraph, *, opset: int = 17) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Every layer fed from graph inputs (its integer inputs), every layer output a graph
    output. Returns the model and {tensor: graph output name}; ``"<tensor>::pre"`` names the
    float value ORT quantized into ``tensor`` (so the cross-check can tell a rounding tie)."""
    ints = [t for t, info in qg.tensors.items() if not info.is_float]
    b = _Builder(qg, {t: f"{t}::q" for t in ints}, {t: f"{t}::qo" for t in ints},
                 {t: t for t, info in qg.tensors.items() if info.is_float}, opset=_opset(qg, opset))
    produced = {t for layer in qg.layers for t in layer.outputs}
    b.float_name.update({t: f"{t}::fo" for t in produced if qg.tensors[t].is_float})
    _layers(b)
    read = {i for n in b.nodes for i in n.input}
    inputs = []
    for t, info in qg.tensors.items():
        name = (f"{t}::q" if not info.is_float else t)
        if name in read and t not in qg.constants:
            elem = TensorProto.FLOAT if info.is_float else ONNX_INT[info.dtype]
            inputs.append(helper.make_tensor_value_info(name, elem, info.shape))
    for t in qg.constants:
        if f"{t}::q" in read:
            b.const(f"{t}::q", qg.constants[t])
    out_names = {t: (f"{t}::fo" if qg.tensors[t].is_float else f"{t}::qo") for t in produced}
    out_names.update({f"{t}::pre": v for t, v in b.prequant.items() if t in produced})
    outputs = [onnx.ValueInfoProto(name=n) for n in out_names.values()]
    return _model(b, inputs, outputs, b.opset), out_names
