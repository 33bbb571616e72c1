"""A ``.tflite`` flatbuffer read without TensorFlow: its structure checked, its signature read.

The TFLite interpreter trusts the file's offsets: a truncated or garbled model crashes the
process (SIGSEGV, no message). `check_tflite` walks every table the import uses through the
``flatbuffers`` runtime's accessors (a dependency of ONNX Runtime), which raise instead of
reading out of bounds, and checks that every index (buffer, tensor, op code) and every external
buffer range lies inside the file. `signature` reads the input, output and tensor names the
recipe is checked against, so ``npubuild validate`` needs neither TensorFlow nor tf2onnx.

Field numbers are those of TensorFlow Lite's ``schema.fbs``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.errors import Location, UserError

IDENTIFIER = b"TFL3"
# schema.fbs field numbers of the tables read here
MODEL_CODES, MODEL_SUBGRAPHS, MODEL_BUFFERS = 1, 2, 4
CODE_DEPRECATED_BUILTIN, CODE_BUILTIN = 0, 3
GRAPH_TENSORS, GRAPH_INPUTS, GRAPH_OUTPUTS, GRAPH_OPERATORS = 0, 1, 2, 3
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER, TENSOR_NAME, TENSOR_SHAPE_SIGNATURE = 0, 1, 2, 3, 7
OP_CODE, OP_INPUTS, OP_OUTPUTS = 0, 1, 2
BUFFER_DATA, BUFFER_OFFSET, BUFFER_SIZE = 0, 1, 2
# TensorType → numpy dtype name (the types a model input can have)
DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "object",
          6: "bool", 7: "int16", 9: "int8", 10: "float64", 12: "uint64", 15: "uint32",
          16: "uint16"}


class _Table:
    """One flatbuffer table: fields by schema number (absent fields read as their default)."""

    def __init__(self, buf: bytearray, pos: int):
        from flatbuffers.table import Table

        self._t = Table(buf, pos)

    def _field(self, number: int) -> int:
        return self._t.Offset(4 + 2 * number)

    def scalar(self, number: int, flags, default: int = 0) -> int:
        offset = self._field(number)
        return self._t.Get(flags, offset + self._t.Pos) if offset else default

    def string(self, number: int) -> str:
        offset = self._field(number)
        return self._t.String(offset + self._t.Pos).decode() if offset else ""

    def ints(self, number: int, flags=None) -> np.ndarray:
        from flatbuffers import number_types

        offset = self._field(number)
        if not offset:
            return np.zeros(0, np.int32)
        return self._t.GetVectorAsNumpy(flags or number_types.Int32Flags, offset)

    def tables(self, number: int) -> list["_Table"]:
        offset = self._field(number)
        if not offset:
            return []
        start = self._t.Vector(offset)
        return [_Table(self._t.Bytes, self._t.Indirect(start + 4 * i))
                for i in range(self._t.VectorLen(offset))]


def _root(buf: bytearray) -> _Table:
    return _Table(buf, struct.unpack_from("<I", buf, 0)[0])


def check_tflite(path: Path) -> None:
    """Raise a UserError naming the problem when ``path`` is not a whole TFLite model."""
    buf = bytearray(path.read_bytes())
    if len(buf) < 8 or bytes(buf[4:8]) != IDENTIFIER:
        raise _bad(path, "no TFLite identifier 'TFL3' at byte 4")
    try:
        problem = _walk(buf)
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        raise _bad(path, problem)


@dataclass(frozen=True)
class Signature:
    """What the recipe's names are checked against: every tensor of the main subgraph as (name,
    dims with None for a dynamic dim, dtype name), by index; the indices of its inputs and
    outputs (a cut may name any tensor)."""

    tensors: list[tuple[str, list[int | None], str]]
    inputs: list[int]
    outputs: list[int]


# Builtin codes of the ops a streaming model keeps its state with (VAR_HANDLE, READ_VARIABLE,
# ASSIGN_VARIABLE, CALL_ONCE)
VARIABLE_OPS = (142, 143, 144, 129)


def uses_variables(path: Path) -> bool:
    """Whether the model has resource-variable ops (call `check_tflite` first)."""
    from flatbuffers import number_types

    for code in _root(bytearray(path.read_bytes())).tables(MODEL_CODES):
        builtin = max(code.scalar(CODE_BUILTIN, number_types.Int32Flags),
                      code.scalar(CODE_DEPRECATED_BUILTIN, number_types.Int8Flags))
        if builtin in VARIABLE_OPS:
            return True
    return False


def signature(path: Path | bytes) -> Signature:
    """The main subgraph's tensors, inputs and outputs (call `check_tflite` first); of the
    file at `path`, or of a flatbuffer's bytes."""
    content = path if isinstance(path, bytes) else path.read_bytes()
    graph = _root(bytearray(content)).tables(MODEL_SUBGRAPHS)[0]
    tensors = []
    for tensor in graph.tables(GRAPH_TENSORS):
        dims = tensor.ints(TENSOR_SHAPE_SIGNATURE)
        dims = dims if len(dims) else tensor.ints(TENSOR_SHAPE)
        tensors.append((tensor.string(TENSOR_NAME), [None if d < 0 else int(d) for d in dims],
                        DTYPES.get(tensor.scalar(TENSOR_TYPE, _flags("Int8Flags")), "unknown")))
    return Signature(tensors, [int(i) for i in graph.ints(GRAPH_INPUTS)],
                     [int(i) for i in graph.ints(GRAPH_OUTPUTS)])


def _flags(name: str):
    from flatbuffers import number_types

    return getattr(number_types, name)


def _bad(path: Path, problem: str) -> UserError:
    return UserError(f"cannot read {path.name} as a TFLite model (truncated or corrupt: "
                     f"{problem[:200]})",
                     location=Location(str(path)), hint="export the model again")


def _in_range(values, limit: int, allow_none: bool = True) -> bool:
    low = -1 if allow_none else 0
    return all(low <= int(v) < limit for v in values)


def _walk(buf: bytearray) -> str | None:
    if struct.unpack_from("<I", buf, 0)[0] >= len(buf):
        return "the root table lies past the end of the file"
    model = _root(buf)
    buffers = model.tables(MODEL_BUFFERS)
    for i, b in enumerate(buffers):
        b.ints(BUFFER_DATA, _flags("Uint8Flags"))
        offset = b.scalar(BUFFER_OFFSET, _flags("Uint64Flags"))
        if offset > 1 and offset + b.scalar(BUFFER_SIZE, _flags("Uint64Flags")) > len(buf):
            return f"buffer {i} lies past the end of the file"
    codes = model.tables(MODEL_CODES)
    for code in codes:
        code.scalar(CODE_DEPRECATED_BUILTIN, _flags("Int8Flags"))
        code.scalar(CODE_BUILTIN, _flags("Int32Flags"))
    graphs = model.tables(MODEL_SUBGRAPHS)
    if not graphs:
        return "no subgraph"
    for s, graph in enumerate(graphs):
        problem = _walk_graph(graph, s, len(buffers), len(codes))
        if problem:
            return problem
    return None


def _walk_graph(graph: _Table, s: int, buffers: int, codes: int) -> str | None:
    tensors = graph.tables(GRAPH_TENSORS)
    for t, tensor in enumerate(tensors):
        tensor.string(TENSOR_NAME)
        tensor.ints(TENSOR_SHAPE)
        buffer = tensor.scalar(TENSOR_BUFFER, _flags("Uint32Flags"))
        if not 0 <= buffer < max(buffers, 1):
            return f"tensor {t} names buffer {buffer} of {buffers}"
    ends = [graph.ints(GRAPH_INPUTS), graph.ints(GRAPH_OUTPUTS)]
    if not all(_in_range(e, len(tensors), allow_none=False) for e in ends):
        return f"subgraph {s} names a tensor it does not have"
    for o, op in enumerate(graph.tables(GRAPH_OPERATORS)):
        code = op.scalar(OP_CODE, _flags("Uint32Flags"))
        if not 0 <= code < codes:
            return f"operator {o} names op code {code} of {codes}"
        for ports in (op.ints(OP_INPUTS), op.ints(OP_OUTPUTS)):
            if not _in_range(ports, len(tensors)):
                return f"operator {o} names a tensor subgraph {s} does not have"
    return None
