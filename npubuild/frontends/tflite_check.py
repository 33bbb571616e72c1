"""A structural check of a ``.tflite`` flatbuffer before TensorFlow Lite sees it.

The TFLite interpreter trusts the file's offsets: a truncated or garbled model crashes the
process (SIGSEGV, no message). This walk reads every table the import uses through the Python
flatbuffers accessors, which raise instead of reading out of bounds, and checks that every
index (buffer, tensor, op code) and every external buffer range lies inside the file.
"""

from __future__ import annotations

import struct
from pathlib import Path

from npubuild.errors import Location, UserError

IDENTIFIER = b"TFL3"


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


def _bad(path: Path, problem: str) -> UserError:
    return UserError(f"cannot read {path.name} as a TFLite model (truncated or corrupt: "
                     f"{problem[:200]})",
                     location=Location(str(path)), hint="export the model again")


def _in_range(values, limit: int, allow_none: bool = True) -> bool:
    low = -1 if allow_none else 0
    return all(low <= int(v) < limit for v in values)


def _walk(buf: bytearray) -> str | None:
    from tf2onnx.tflite.Model import Model

    if struct.unpack_from("<I", buf, 0)[0] >= len(buf):
        return "the root table lies past the end of the file"
    model = Model.GetRootAsModel(buf, 0)
    buffers = model.BuffersLength()
    for i in range(buffers):
        b = model.Buffers(i)
        if b.DataLength():
            b.DataAsNumpy()
        if b.Offset() > 1 and b.Offset() + b.Size() > len(buf):
            return f"buffer {i} lies past the end of the file"
    codes = model.OperatorCodesLength()
    for i in range(codes):
        model.OperatorCodes(i).BuiltinCode()
    if not model.SubgraphsLength():
        return "no subgraph"
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        tensors = graph.TensorsLength()
        for t in range(tensors):
            tensor = graph.Tensors(t)
            tensor.Name()
            if tensor.ShapeLength():
                tensor.ShapeAsNumpy()
            if not 0 <= tensor.Buffer() < max(buffers, 1):
                return f"tensor {t} names buffer {tensor.Buffer()} of {buffers}"
        ends = [graph.InputsAsNumpy() if graph.InputsLength() else [],
                graph.OutputsAsNumpy() if graph.OutputsLength() else []]
        if not all(_in_range(e, tensors, allow_none=False) for e in ends):
            return f"subgraph {s} names a tensor it does not have"
        for o in range(graph.OperatorsLength()):
            op = graph.Operators(o)
            if not 0 <= op.OpcodeIndex() < codes:
                return f"operator {o} names op code {op.OpcodeIndex()} of {codes}"
            for ports in (op.InputsAsNumpy() if op.InputsLength() else [],
                          op.OutputsAsNumpy() if op.OutputsLength() else []):
                if not _in_range(ports, tensors):
                    return f"operator {o} names a tensor subgraph {s} does not have"
    return None
