"""A full-integer TFLite flatbuffer written from npubuild's own quantized graph (`QGraph`).

This is what Vela takes, and it replaces the TensorFlow-plus-onnx2tf detour for ONNX sources.
The TFLite is npubuild's int8 model itself, not a re-quantization of the float one: every
tensor of the qgraph becomes the TFLite tensor of the same name with npubuild's scale and zero
point (int8; an int16 tensor is `Unwritable`, see `INT16`), every conv its
int8 weights, per-channel scales and integer bias (bias correction included), every folded
Relu/Clip its clamp as the fused activation. Layers map to the builtins Ethos-U runs
(`npubuild.backends.tflite_ops`). Where a TFLite kernel fixes a quantization npubuild chose
otherwise (LOGISTIC and SOFTMAX write 1/256, TANH 1/128; AVERAGE_POOL_2D and CONCATENATION keep
their input's), the op writes a tensor of its own at the fixed parameters and a QUANTIZE
requantizes it to npubuild's: npubuild's decisions hold on every tensor it made, and
`Written.coverage` counts what else the TFLite holds and why.

4-D tensors are NHWC inside the flatbuffer (the runner transposes at the boundary); every other
tensor keeps its ONNX shape. ``write_tflite(qgraph)`` is deterministic: same qgraph, same bytes.
A layer with no TFLite form raises `Unwritable` naming the layer and why; the chip files of the
Ethos-U targets list only ops written here, so the split keeps such nodes on the CPU first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.quant.qgraph import QGraph, QTensor

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
AXIS_NHWC = {0: 0, 1: 3, 2: 1, 3: 2}
#: Output quantization TFLite's kernels fix, per op and type: (scale, zero point).
FIXED_OUTPUT = {("LOGISTIC", "int8"): (1 / 256, -128), ("SOFTMAX", "int8"): (1 / 256, -128),
                ("TANH", "int8"): (1 / 128, 0)}
INT_RANGE = {"int8": (-128, 127)}
#: Why npubuild's int16 tensors have no TFLite form (so the Ethos-U chip files say ``int16:
#: false`` and the precision search never chooses int16 there). TFLite's 16x8 kernels, the only
#: int16 ones Vela takes, need int16 activations symmetric (zero point 0) and a layer's input
#: and output both int16 (a CONV_2D reading int16 and writing int8 fails to prepare: "output->type
#: != input_type (INT8 != INT16)", measured in TensorFlow Lite's reference kernels); npubuild
#: chooses int16 per tensor, with the recipe's scheme's zero point (asymmetric: 3920 on a tiny
#: conv's input).
INT16 = ("int16 activations have no TFLite form here: TFLite's 16x8 kernels need them symmetric "
         "(zero point 0) and int16 in and out of each layer, npubuild chooses int16 per tensor")


class Unwritable(Exception):
    """The layer has no TFLite integer form here; the message says which layer and why."""


def schema():
    from tensorflow.lite.python import schema_py_generated

    return schema_py_generated


@dataclass(frozen=True)
class Quant:
    """One TFLite tensor's quantization: per-tensor (activations) or per-axis (weights)."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    @classmethod
    def of(cls, scale, zero_point=0, axis: int = 0) -> "Quant":
        scales = tuple(float(np.float32(s)) for s in np.ravel(scale))
        zps = np.broadcast_to(np.ravel(zero_point), (len(scales),))
        return cls(scales, tuple(int(z) for z in zps), axis)


@dataclass
class Tensor:
    index: int
    shape: list[int]   # TFLite order (NHWC for a 4-D activation)
    nhwc: bool
    quant: Quant
    dtype: str         # int8


@dataclass
class Written:
    """The flatbuffer and where each of its activation tensors' quantization came from."""

    data: bytes
    #: per TFLite activation tensor: "npubuild" (a qgraph tensor, at its own parameters;
    #: "npubuild (layout)" / "(padding)": a copy at them), or the TFLite constraint that made a
    #: tensor of its own ("fixed by LOGISTIC", "AVERAGE_POOL_2D keeps its input's
    #: quantization", ...) before a QUANTIZE to npubuild's.
    sources: dict[str, str] = field(default_factory=dict)
    #: QUANTIZE ops the TFLite constraints added.
    requantizations: int = 0

    def coverage(self) -> dict:
        """What the report says: npubuild's parameters on how many of the TFLite's tensors,
        and every other tensor with its reason."""
        mine = [t for t, s in self.sources.items() if s.startswith("npubuild")]
        other = {t: s for t, s in sorted(self.sources.items()) if not s.startswith("npubuild")}
        return {"tensors": len(self.sources), "npubuild": len(mine),
                "tflite_constraints": other, "requantizations": self.requantizations}


class Writer:
    """The flatbuffer under construction: tensors, buffers, operators."""

    def __init__(self, qgraph: QGraph):
        self.s = schema()
        self.q = qgraph
        self.tensors: list = []
        self.buffers: list = [self.s.BufferT()]  # buffer 0: the empty buffer
        self.operators: list = []
        self.opcodes: dict[int, int] = {}
        self.names: dict[str, Tensor] = {}
        self.sources: dict[str, str] = {}
        self.requantizations = 0
        self.producers = qgraph.producers()

    # -- tensors -----------------------------------------------------------------------------
    def add_tensor(self, name: str, shape: list[int], dtype: str, quant: Quant | None,
                   data: np.ndarray | None = None) -> int:
        t = self.s.TensorT()
        t.name = name.encode()
        t.shape = [int(d) for d in shape]
        t.type = getattr(self.s.TensorType, dtype.upper())
        t.buffer = 0
        if data is not None:
            b = self.s.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8).tolist()
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        if quant is not None:
            q = self.s.QuantizationParametersT()
            q.scale = list(quant.scale)
            q.zeroPoint = list(quant.zero_point)
            q.quantizedDimension = quant.axis
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def qtensor(self, name: str) -> QTensor:
        t = self.q.tensors.get(name)
        if t is None:
            raise Unwritable(f"tensor {name!r} is not in npubuild's quantized graph")
        if t.dtype == "int16":
            raise Unwritable(f"tensor {name!r} is int16: {INT16}")
        if t.dtype not in INT_RANGE:
            raise Unwritable(f"tensor {name!r} is {t.dtype} (runs on the CPU in npubuild's graph)")
        return t

    def tensor(self, name: str) -> Tensor:
        """The TFLite tensor of qgraph tensor ``name``, at npubuild's parameters (made on first
        use; a constant operand gets its buffer)."""
        if name in self.names:
            return self.names[name]
        t = self.qtensor(name)
        if not t.shape or any(d <= 0 for d in t.shape):
            raise Unwritable(f"tensor {name!r} has no static shape")
        nhwc = len(t.shape) == 4
        shape = [t.shape[i] for i in NCHW_TO_NHWC] if nhwc else list(t.shape)
        quant = Quant.of(t.scale, t.zero_point)
        data = None
        if name in self.q.constants:
            value = np.asarray(self.q.constants[name]).astype(t.dtype)
            data = value.transpose(NCHW_TO_NHWC) if nhwc else value
        index = self.add_tensor(name, shape, t.dtype, quant, data)
        if data is None:
            self.sources[name] = "npubuild"
        self.names[name] = Tensor(index, shape, nhwc, quant, t.dtype)
        return self.names[name]

    def operand(self, name: str, like: Tensor) -> Tensor:
        """An elementwise operand: a constant broadcast to ``like``'s rank and layout."""
        if name not in self.q.constants or name in self.names:
            return self.tensor(name)
        t = self.qtensor(name)
        value = np.asarray(self.q.constants[name]).astype(t.dtype)
        rank = len(like.shape)
        if value.ndim < rank:
            value = value.reshape([1] * (rank - value.ndim) + list(value.shape))
        if like.nhwc and value.ndim == 4:
            value = value.transpose(NCHW_TO_NHWC)
        quant = Quant.of(t.scale, t.zero_point)
        index = self.add_tensor(name, list(value.shape), t.dtype, quant, value)
        self.names[name] = Tensor(index, list(value.shape), like.nhwc, quant, t.dtype)
        return self.names[name]

    def helper(self, name: str, like: Tensor, quant: Quant, why: str, shape=None,
               nhwc: bool | None = None) -> Tensor:
        """A tensor of the TFLite's own (``why`` says which constraint made it)."""
        shape = list(like.shape if shape is None else shape)
        index = self.add_tensor(name, shape, like.dtype, quant)
        self.sources[name] = why
        return Tensor(index, shape, like.nhwc if nhwc is None else nhwc, quant, like.dtype)

    def constant(self, name: str, value: np.ndarray, dtype: str, quant: Quant | None = None) -> int:
        value = np.asarray(value).astype(dtype)
        return self.add_tensor(name, list(value.shape), dtype, quant, value)

    # -- requantization where a TFLite kernel fixes a quantization -----------------------------
    def requantize(self, x: Tensor, to: Tensor) -> None:
        """QUANTIZE ``x`` into ``to`` (an int8 → int8 rescale)."""
        self.op(self.s.BuiltinOperator.QUANTIZE, [x.index], [to.index],
                self.s.BuiltinOptions.QuantizeOptions, self.s.QuantizeOptionsT())
        self.requantizations += 1

    def at(self, x: Tensor, quant: Quant, name: str, why: str) -> Tensor:
        """``x`` at ``quant``: itself, or a QUANTIZE of it into a tensor of its own."""
        if x.quant == quant:
            return x
        y = self.helper(name, x, quant, why)
        self.requantize(x, y)
        return y

    def output_at(self, name: str, quant: Quant | None, why: str, emit) -> None:
        """Emit ``emit(out)`` for qgraph tensor ``name`` whose kernel writes ``quant`` (None:
        any): straight into npubuild's tensor when they agree, else into a tensor of its own
        and a QUANTIZE to npubuild's."""
        y = self.tensor(name)
        if quant is None or quant == y.quant:
            emit(y)
            return
        tmp = self.helper(f"{name}/tflite", y, quant, why)
        emit(tmp)
        self.requantize(tmp, y)

    def fixed(self, op: str, dtype: str) -> Quant:
        try:
            return Quant.of(*FIXED_OUTPUT[(op, dtype)])
        except KeyError:
            raise Unwritable(f"TFLite's {op} has no {dtype} kernel") from None

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

    def serialize(self) -> bytes:
        import flatbuffers

        sub = self.s.SubGraphT()
        sub.tensors = self.tensors
        sub.inputs = [self.names[n].index for n in self.q.inputs]
        sub.outputs = [self.names[n].index for n in self.q.outputs]
        sub.operators = self.operators
        sub.name = b"main"
        model = self.s.ModelT()
        model.version = 3
        model.description = b"npubuild integer model"
        model.buffers = self.buffers
        model.subgraphs = [sub]
        model.operatorCodes = []
        for code, _ in sorted(self.opcodes.items(), key=lambda kv: kv[1]):
            oc = self.s.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = 1
            model.operatorCodes.append(oc)
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def write_tflite(qgraph: QGraph) -> Written:
    """The integer TFLite of npubuild's quantized graph (see the module docstring)."""
    from npubuild.backends import tflite_ops

    w = Writer(qgraph)
    for name in qgraph.inputs:
        w.tensor(name)
    for layer in qgraph.layers:
        emit = tflite_ops.EMITTERS.get(layer.kind)
        try:
            if layer.device != "npu" or emit is None:
                raise Unwritable(layer.attrs.get("reason") or f"no TFLite form for a {layer.kind} layer")
            emit(w, layer)
        except Unwritable as exc:
            raise Unwritable(f"layer {layer.name!r} ({layer.kind}): {exc}") from None
    for name in qgraph.outputs:
        if name not in w.names:
            raise Unwritable(f"output {name!r} is not made by any layer")
    return Written(w.serialize(), w.sources, w.requantizations)
