"""A full-int8 TFLite flatbuffer written from a float ONNX NPU submodel and per-tensor ranges.

This is what Vela takes, and it replaces the TensorFlow-plus-onnx2tf detour for ONNX sources:
each ONNX node becomes the TFLite builtin that Ethos-U runs, in TFLite's int8 conventions —
activations per-tensor asymmetric int8 from the given ranges, weights per-channel symmetric
int8, biases int32 at ``input scale × weight scale``, LOGISTIC/SOFTMAX outputs at 1/256 and
TANH at 1/128 as TFLite's kernels require. 4-D tensors are NHWC inside the flatbuffer (the
runner transposes at the boundary); every other tensor keeps its ONNX shape.

`write_tflite(model, ranges)` returns the flatbuffer bytes (deterministic: same model and
ranges, same bytes). A node it cannot express raises `Unwritable` naming the node and why; the
chip files of the Ethos-U targets list only ops this writer emits, so the split keeps such
nodes on the CPU first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
AXIS_NHWC = {0: 0, 1: 3, 2: 1, 3: 2}
# TFLite's int8 kernels fix the output quantization of these ops.
FIXED_OUTPUT = {"Sigmoid": (1 / 256, -128), "Softmax": (1 / 256, -128), "Tanh": (1 / 128, 0)}


class Unwritable(Exception):
    """The node has no TFLite int8 form here; the message says which node and why."""


def schema():
    from tensorflow.lite.python import schema_py_generated

    return schema_py_generated


@dataclass
class Quant:
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0


def activation_quant(lo: float, hi: float) -> Quant:
    """TFLite's int8 activation parameters for a real range (which must hold 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0 / 255.0
    zero = int(np.clip(np.round(-128 - lo / scale), -128, 127))
    return Quant(np.array([scale], np.float32), np.array([zero], np.int64))


def weight_quant(w: np.ndarray, axis: int) -> tuple[np.ndarray, Quant]:
    """Per-channel symmetric int8 along ``axis`` (TFLite: zero points 0)."""
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = np.maximum(np.abs(moved).max(axis=1), 1e-12) / 127.0
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, Quant(scale.astype(np.float32), np.zeros(len(scale), np.int64), axis)


@dataclass
class Tensor:
    index: int
    shape: list[int]
    nhwc: bool
    quant: Quant | None = None


@dataclass
class Writer:
    model: onnx.ModelProto
    ranges: dict[str, tuple[float, float]]
    tensors: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    operators: list = field(default_factory=list)
    opcodes: dict[int, int] = field(default_factory=dict)
    names: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self):
        self.s = schema()
        self.buffers.append(self.s.BufferT())  # buffer 0: the empty buffer
        inferred = onnx.shape_inference.infer_shapes(self.model)
        self.shapes = {}
        for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            dims = v.type.tensor_type.shape.dim
            self.shapes[v.name] = [d.dim_value for d in dims]
        self.consts = {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}
        for node in self.model.graph.node:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)

    # -- tensors -----------------------------------------------------------------------------
    def _add_tensor(self, name: str, shape: list[int], dtype: int, quant: Quant | None,
                    data: np.ndarray | None = None) -> int:
        t = self.s.TensorT()
        t.name = name.encode()
        t.shape = list(int(d) for d in shape)
        t.type = dtype
        t.buffer = 0
        if data is not None:
            b = self.s.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8).tolist()
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        if quant is not None:
            q = self.s.QuantizationParametersT()
            q.scale = [float(v) for v in quant.scale]
            q.zeroPoint = [int(v) for v in quant.zero_point]
            q.quantizedDimension = quant.axis
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def activation(self, name: str, op: str | None = None) -> Tensor:
        """The int8 tensor of ONNX activation ``name`` (made on first use)."""
        if name in self.names:
            return self.names[name]
        shape = self.shapes.get(name)
        if not shape or any(d <= 0 for d in shape):
            raise Unwritable(f"tensor {name!r} has no static shape")
        if op in FIXED_OUTPUT:
            scale, zero = FIXED_OUTPUT[op]
            quant = Quant(np.array([scale], np.float32), np.array([zero], np.int64))
        else:
            if name not in self.ranges:
                raise Unwritable(f"tensor {name!r} has no calibrated range")
            quant = activation_quant(*self.ranges[name])
        nhwc = len(shape) == 4
        tshape = [shape[i] for i in NCHW_TO_NHWC] if nhwc else shape
        t = Tensor(self._add_tensor(name, tshape, self.s.TensorType.INT8, quant), tshape, nhwc, quant)
        self.names[name] = t
        return t

    def const_int8(self, name: str, value: np.ndarray, like_nhwc: bool) -> Tensor:
        """A constant operand of an elementwise op, per-tensor int8 (NHWC when 4-D)."""
        value = np.asarray(value, np.float32)
        if like_nhwc:
            value = value.reshape([1] * (4 - value.ndim) + list(value.shape)).transpose(NCHW_TO_NHWC)
        quant = activation_quant(float(value.min()), float(value.max()))
        q = np.clip(np.round(value / quant.scale[0]) + quant.zero_point[0], -128, 127).astype(np.int8)
        index = self._add_tensor(name, list(value.shape), self.s.TensorType.INT8, quant, q)
        return Tensor(index, list(value.shape), like_nhwc, quant)

    def int32(self, name: str, value: np.ndarray, quant: Quant | None = None) -> int:
        value = np.asarray(value, np.int32)
        return self._add_tensor(name, list(value.shape), self.s.TensorType.INT32, quant, value)

    # -- operators ---------------------------------------------------------------------------
    def op(self, code: int, inputs: list[int], outputs: list[int], options_type=None, options=None):
        if code not in self.opcodes:
            self.opcodes[code] = len(self.opcodes)
        o = self.s.OperatorT()
        o.opcodeIndex = self.opcodes[code]
        o.inputs, o.outputs = list(inputs), list(outputs)
        if options_type is not None:
            o.builtinOptionsType = options_type
            o.builtinOptions = options
        self.operators.append(o)

    def serialize(self, inputs: list[str], outputs: list[str]) -> bytes:
        import flatbuffers

        sub = self.s.SubGraphT()
        sub.tensors = self.tensors
        sub.inputs = [self.names[n].index for n in inputs]
        sub.outputs = [self.names[n].index for n in outputs]
        sub.operators = self.operators
        sub.name = b"main"
        model = self.s.ModelT()
        model.version = 3
        model.description = b"npubuild int8"
        model.buffers = self.buffers
        model.subgraphs = [sub]
        codes = sorted(self.opcodes.items(), key=lambda kv: kv[1])
        model.operatorCodes = []
        for code, _ in codes:
            oc = self.s.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = 1
            model.operatorCodes.append(oc)
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


#: Ops whose TFLite int8 kernels need the same scale and zero point on inputs and output
#: (they move or select values, never requantize): their tensors share one range.
SAME_QUANT = {"Concat": None, "MaxPool": 1, "AveragePool": 1, "GlobalAveragePool": 1,
              "Reshape": 1, "Flatten": 1, "Squeeze": 1, "Unsqueeze": 1, "Transpose": 1, "Pad": 1,
              "Resize": 1, "Identity": 1, "Split": 1}
#: The real ranges of the fixed output quantizations (scale, zero point) in FIXED_OUTPUT.
FIXED_RANGE = {op: ((-128 - z) * s, (127 - z) * s) for op, (s, z) in FIXED_OUTPUT.items()}


def shared_ranges(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]]
                  ) -> dict[str, tuple[float, float]]:
    """``ranges`` with every group of tensors that TFLite needs at one quantization widened
    to their union (a fixed output quantization, such as LOGISTIC's, wins its group)."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    fixed = {n.output[0]: FIXED_RANGE[n.op_type] for n in model.graph.node if n.op_type in FIXED_RANGE}
    consts = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type not in SAME_QUANT:
            continue
        count = SAME_QUANT[node.op_type]
        members = ([t for t in list(node.input)[:count] if t and t not in consts]
                   + [o for o in node.output if o])
        for t in members[1:]:
            parent[find(t)] = find(members[0])
    groups: dict[str, list[str]] = {}
    for t in set(parent) | set(ranges):
        groups.setdefault(find(t), []).append(t)
    out = dict(ranges)
    for members in groups.values():
        pinned = [fixed[t] for t in members if t in fixed]
        known = [ranges[t] for t in members if t in ranges]
        if pinned:
            union = pinned[0]
        elif known:
            union = (min(r[0] for r in known), max(r[1] for r in known))
        else:
            continue
        out.update({t: union for t in members})
    return out


def write_tflite(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]]) -> bytes:
    """The int8 TFLite of a float ONNX model (standard ops only; see the module docstring)."""
    from npubuild.backends import tflite_ops

    w = Writer(model, shared_ranges(model, ranges))
    graph_inputs = [i.name for i in model.graph.input if i.name not in w.consts]
    for name in graph_inputs:
        w.activation(name)
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        emit = tflite_ops.EMITTERS.get(node.op_type)
        if emit is None:
            raise Unwritable(f"node {node.name or node.output[0]!r}: {node.op_type} has no "
                             "TFLite int8 form in npubuild's writer")
        try:
            emit(w, node)
        except Unwritable as exc:
            raise Unwritable(f"node {node.name or node.output[0]!r} ({node.op_type}): {exc}") from None
    return w.serialize(graph_inputs, [o.name for o in model.graph.output])
