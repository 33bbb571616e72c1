"""Small TFLite flatbuffers written from scratch (TensorFlow's schema classes), with the custom
ops MediaPipe models use, and builtin twins the interpreter can run."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FLOAT32 = 0


@dataclass
class Graph:
    """Tensors by name (shape, constant value or None) and operators in order."""

    tensors: dict[str, tuple[list[int], np.ndarray | None]] = field(default_factory=dict)
    ops: list[tuple] = field(default_factory=list)  # (builtin name or custom code, ins, outs, options)

    def tensor(self, name: str, shape, value=None) -> str:
        self.tensors[name] = (list(shape), None if value is None else np.asarray(value))
        return name

    def op(self, kind: str, inputs: list[str], outputs: list[str], options=None) -> None:
        self.ops.append((kind, inputs, outputs, options))


def write(graph: Graph, inputs: list[str], outputs: list[str], path: Path) -> Path:
    """The graph as a .tflite file: builtin ops by schema name with (options type, options
    object), custom ops by code with raw option bytes."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = schema.ModelT()
    model.version, model.description = 3, "npubuild test model"
    model.buffers = [schema.BufferT()]
    names = list(graph.tensors)
    sub = schema.SubGraphT()
    sub.tensors = []
    for name in names:
        shape, value = graph.tensors[name]
        tensor = schema.TensorT()
        tensor.name, tensor.shape = name.encode(), np.array(shape, np.int32)
        tensor.type = {np.dtype(np.int32): 2}.get(None if value is None else value.dtype, FLOAT32)
        tensor.buffer = 0
        if value is not None:
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(value.tobytes(), np.uint8)
            model.buffers.append(buffer)
            tensor.buffer = len(model.buffers) - 1
        sub.tensors.append(tensor)
    codes: list[str] = []
    sub.operators = []
    for kind, ins, outs, options in graph.ops:
        if kind not in codes:
            codes.append(kind)
        op = schema.OperatorT()
        op.opcodeIndex = codes.index(kind)
        op.inputs = np.array([names.index(n) for n in ins], np.int32)
        op.outputs = np.array([names.index(n) for n in outs], np.int32)
        if isinstance(options, bytes):
            op.customOptions = np.frombuffer(options, np.uint8)
        elif options is not None:
            op.builtinOptionsType, op.builtinOptions = options
        sub.operators.append(op)
    sub.inputs = np.array([names.index(n) for n in inputs], np.int32)
    sub.outputs = np.array([names.index(n) for n in outputs], np.int32)
    sub.name = b"main"
    model.subgraphs = [sub]
    model.operatorCodes = [_code(schema, kind) for kind in codes]
    path.write_bytes(bytes(flatbuffer_utils.convert_object_to_bytearray(model)))
    return path


def _code(schema, kind: str):
    code = schema.OperatorCodeT()
    builtin = getattr(schema.BuiltinOperator, kind, None)
    if builtin is None:
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
        code.customCode = kind.encode()
    else:
        code.builtinCode = builtin
        code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 3 if kind == "TRANSPOSE_CONV" else 1  # version 3: the bias input
    return code


def c_struct(*fields: int) -> bytes:
    """Custom options as MediaPipe writes them: the builtin op's C params struct."""
    return struct.pack(f"<{len(fields)}i", *fields)


SAME, VALID = 1, 2  # TfLitePadding in the C structs (the schema's Padding enum is 0/1)


def transpose_conv(tmp: Path, size: tuple[int, int], kernel: int, stride: int, padding: int,
                   custom: bool, seed: int = 0) -> Path:
    """RELU → transposed conv with bias (MediaPipe's Convolution2DTransposeBias, or TFLite's
    builtin TRANSPOSE_CONV with its bias input) → LOGISTIC, on a 1×H×W×4 input."""
    from tensorflow.lite.python import schema_py_generated as schema

    rng = np.random.default_rng(seed)
    height, width = size
    c_in, c_out = 4, 3
    total = [max(0, kernel - (n - 1) % stride - 1) if padding == SAME else 0 for n in size]
    out_h, out_w = (stride * (n - 1) + kernel - t for n, t in zip(size, total))
    g = Graph()
    g.tensor("x", [1, height, width, c_in])
    g.tensor("relu", [1, height, width, c_in])
    g.tensor("weights", [c_out, kernel, kernel, c_in],
             rng.normal(0, 0.5, (c_out, kernel, kernel, c_in)).astype(np.float32))
    g.tensor("bias", [c_out], rng.normal(0, 1, c_out).astype(np.float32))
    g.tensor("up", [1, out_h, out_w, c_out])
    g.tensor("y", [1, out_h, out_w, c_out])
    g.op("RELU", ["x"], ["relu"])
    if custom:
        g.op("Convolution2DTransposeBias", ["relu", "weights", "bias"], ["up"],
             c_struct(padding, stride, stride))
    else:
        g.tensor("out_shape", [4], np.array([1, out_h, out_w, c_out], np.int32))
        options = schema.TransposeConvOptionsT()
        options.padding = 0 if padding == SAME else 1
        options.strideW = options.strideH = stride
        g.op("TRANSPOSE_CONV", ["out_shape", "weights", "relu", "bias"], ["up"],
             (schema.BuiltinOptions.TransposeConvOptions, options))
    g.op("LOGISTIC", ["up"], ["y"])
    return write(g, ["x"], ["y"], tmp / f"transpose_conv_{'custom' if custom else 'builtin'}.tflite")


def pool_unpool(tmp: Path, size: tuple[int, int], kernel: int, stride: int, padding: int,
                activation: int = 0) -> Path:
    """RELU → MaxPoolingWithArgmax2D → (values, indices) → MaxUnpooling2D, as MediaPipe's hair
    segmentation pairs them; the pooled values, indices and unpooled map are all outputs."""
    from npubuild.frontends.tflite_custom import pool_output_size

    height, width = size
    pooled = [1, pool_output_size(height, kernel, stride, padding),
              pool_output_size(width, kernel, stride, padding), 3]
    options = c_struct(padding, stride, stride, kernel, kernel, activation)
    g = Graph()
    g.tensor("x", [1, height, width, 3])
    g.tensor("shifted", [1, height, width, 3])
    g.tensor("values", pooled)
    g.tensor("indices", pooled)
    g.tensor("unpooled", [1, pooled[1] * kernel, pooled[2] * kernel, 3])
    g.op("RELU6", ["x"], ["shifted"])
    g.op("MaxPoolingWithArgmax2D", ["shifted"], ["values", "indices"], options)
    g.op("MaxUnpooling2D", ["values", "indices"], ["unpooled"], options)
    return write(g, ["x"], ["values", "indices", "unpooled"], tmp / "pool_unpool.tflite")


def with_unknown_custom_op(tmp: Path) -> Path:
    """RELU → a custom op nothing lowers (``TransformTensorNearest``, a name no lowering has)
    → LOGISTIC; a second output ``side`` does not depend on it."""
    g = Graph()
    for name in ("x", "relu", "warped", "y", "side"):
        g.tensor(name, [1, 4, 4, 2])
    g.op("RELU", ["x"], ["relu"])
    g.op("TransformTensorNearest", ["relu"], ["warped"], c_struct(0))
    g.op("LOGISTIC", ["warped"], ["y"])
    g.op("TANH", ["x"], ["side"])
    return write(g, ["x"], ["y", "side"], tmp / "unknown_custom.tflite")


def attention_crop(tmp: Path, points: int, subset: list[int], rotation: tuple[int, int],
                   crop: tuple[int, int], size: tuple[int, int], target: float | None = 0.0,
                   scale: tuple[float, float] = (1.5, 1.5)) -> Path:
    """The region crop of MediaPipe's face mesh with attention, its three custom ops with
    their flexbuffer options: landmarks ``pts`` [1, points, 3] → Landmarks2TransformMatrix →
    TransformTensorBilinear of the feature map ``x`` [1, *size, 4] (a ``crop`` of it) and
    TransformLandmarks of ``local`` [1, 5, 2] (points found inside the crop) back to ``x``'s
    frame; ``target=None`` leaves ``target_rotation_radians`` out of the options."""
    from flatbuffers import flexbuffers

    options = {"left_rotation_idx": rotation[0], "right_rotation_idx": rotation[1],
               "output_height": crop[0], "output_width": crop[1], "scale_x": scale[0],
               "scale_y": scale[1], "subset_idxs": subset}
    if target is not None:
        options["target_rotation_radians"] = target
    g = Graph()
    g.tensor("x", [1, *size, 4])
    g.tensor("pts", [1, points, 3])
    g.tensor("local", [1, 5, 2])
    g.tensor("matrix", [1, 4, 4])
    g.tensor("crop", [1, *crop, 4])
    g.tensor("moved", [1, 5, 2])
    g.op("Landmarks2TransformMatrix", ["pts"], ["matrix"], bytes(flexbuffers.Dumps(options)))
    g.op("TransformTensorBilinear", ["x", "matrix"], ["crop"],
         bytes(flexbuffers.Dumps({"output_height": crop[0], "output_width": crop[1]})))
    g.op("TransformLandmarks", ["local", "matrix"], ["moved"], b"")
    return write(g, ["x", "pts", "local"], ["matrix", "crop", "moved"], tmp / "attention_crop.tflite")
