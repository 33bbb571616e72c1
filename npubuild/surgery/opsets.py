"""Operator arguments that moved between attributes and inputs across opsets.

Slice (inputs from opset 10), Squeeze/Unsqueeze (axes input from 13), Split (sizes input from
13), Pad (pads input from 11), Reduce* (axes input from 13 for ReduceSum, 18 for the rest),
Reshape (shape input from 5).
Readers return plain Python values (None when a value is not constant); makers build the node
the model's opset expects.
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.surgery import SurgeryError
from npubuild.surgery.graph import Editor

np = lazy.load("numpy")
onnx = lazy.load("onnx")


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _const_ints(ed: Editor, node: onnx.NodeProto, index: int) -> list[int] | None:
    if len(node.input) <= index or not node.input[index]:
        return None
    value = ed.constant(node.input[index])
    return None if value is None else [int(v) for v in np.asarray(value).ravel()]


def slice_spec(ed: Editor, node: onnx.NodeProto, rank: int) -> list[tuple[int, int, int, int]] | None:
    """(axis, start, end, step) per sliced axis, axes normalised; None if not constant."""
    if ed.opset < 10:
        starts, ends = attr(node, "starts"), attr(node, "ends")
        axes, steps = attr(node, "axes"), None
    else:
        starts, ends = _const_ints(ed, node, 1), _const_ints(ed, node, 2)
        axes, steps = _const_ints(ed, node, 3), _const_ints(ed, node, 4)
        if starts is None or ends is None:
            return None
        if (len(node.input) > 3 and node.input[3] and axes is None) or \
                (len(node.input) > 4 and node.input[4] and steps is None):
            return None
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return list(zip(axes, starts, ends, steps))


def make_slice(ed: Editor, data: str, output: str, spec: list[tuple[int, int, int, int]],
               name_hint: str) -> onnx.NodeProto:
    axes, starts, ends, steps = (list(v) for v in zip(*spec))
    if ed.opset < 10:
        if any(s != 1 for s in steps):
            raise SurgeryError(f"Slice with steps needs opset >= 10 (the model has {ed.opset})")
        return ed.make_node("Slice", [data], [output], name_hint, starts=starts, ends=ends, axes=axes)
    named = (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))
    inputs = [data] + [ed.add_initializer(np.array(v, np.int64), f"{name_hint}_{k}") for k, v in named]
    return ed.make_node("Slice", inputs, [output], name_hint)


def axes_of(ed: Editor, node: onnx.NodeProto) -> list[int] | None:
    """The axes of Squeeze/Unsqueeze/Reduce*, from the attribute or the second input."""
    value = attr(node, "axes")
    if value is not None:
        return list(value)
    return _const_ints(ed, node, 1)


def axes_as_input(ed: Editor, op_type: str) -> bool:
    if op_type in ("Squeeze", "Unsqueeze", "ReduceSum"):
        return ed.opset >= 13
    if op_type.startswith("Reduce"):
        return ed.opset >= 18
    return False


def make_axes_node(ed: Editor, op_type: str, inputs: list[str], outputs: list[str], axes: list[int],
                   name_hint: str, **attrs) -> onnx.NodeProto:
    """Squeeze/Unsqueeze/Reduce* with ``axes`` where the model's opset wants them."""
    if axes_as_input(ed, op_type):
        axes_name = ed.add_initializer(np.array(axes, np.int64), f"{name_hint}_axes")
        return ed.make_node(op_type, [inputs[0], axes_name], outputs, name_hint, **attrs)
    return ed.make_node(op_type, inputs[:1], outputs, name_hint, axes=axes, **attrs)


def make_split(ed: Editor, data: str, outputs: list[str], sizes: list[int], axis: int,
               name_hint: str) -> onnx.NodeProto:
    """Split of ``data`` on ``axis`` into ``sizes``, given where the model's opset wants them."""
    if ed.opset < 13:
        return ed.make_node("Split", [data], outputs, name_hint, axis=axis, split=list(sizes))
    sizes_name = ed.add_initializer(np.array(sizes, np.int64), f"{name_hint}_sizes")
    return ed.make_node("Split", [data, sizes_name], outputs, name_hint, axis=axis)


def split_sizes(ed: Editor, node: onnx.NodeProto, dim: int) -> list[int] | None:
    """The sizes a Split cuts its axis into (equal parts when not given)."""
    sizes = attr(node, "split")
    if sizes is None:
        sizes = _const_ints(ed, node, 1)
    if sizes is None:
        if len(node.input) > 1 and node.input[1]:
            return None
        parts = attr(node, "num_outputs", len(node.output))
        chunk = -(-dim // parts)
        sizes = [min(chunk, dim - i * chunk) for i in range(parts)]
    return list(sizes)


def make_reshape(ed: Editor, data: str, output: str, shape: list[int],
                 name_hint: str) -> onnx.NodeProto:
    if ed.opset < 5:
        return ed.make_node("Reshape", [data], [output], name_hint, shape=list(shape))
    shape_name = ed.add_initializer(np.array(shape, np.int64), f"{name_hint}_shape")
    return ed.make_node("Reshape", [data, shape_name], [output], name_hint)


def make_pad(ed: Editor, data: str, output: str, pads: list[int], name_hint: str) -> onnx.NodeProto:
    """A constant (zero) Pad by ``pads`` (ONNX order: every axis's begin, then every end)."""
    if ed.opset < 11:
        return ed.make_node("Pad", [data], [output], name_hint, pads=list(pads), mode="constant")
    pads_name = ed.add_initializer(np.array(pads, np.int64), f"{name_hint}_pads")
    return ed.make_node("Pad", [data, pads_name], [output], name_hint, mode="constant")
