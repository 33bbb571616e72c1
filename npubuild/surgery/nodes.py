"""Node edits: ``remove_nodes``, ``replace_op``, ``set_attribute``, ``insert_op``.

Nodes are chosen by name (exact, or a glob such as ``/model.22/*``) or by op type. Attribute
values are checked against the op's schema at the model's opset, and converted to the type the
schema declares (``alpha: 1`` becomes the float 1.0). A step that changes the model's numbers on
purpose (dropping a final Softmax, swapping Sigmoid for HardSigmoid) sets ``expect_change``: the
differences are logged instead of failing the step.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import lazy_loader as lazy
from pydantic import BaseModel, ConfigDict, Field, model_validator

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery import StepArgs, SurgeryError, rewrite
from npubuild.surgery.graph import Editor, node_label, suggest

np = lazy.load("numpy")
onnx = lazy.load("onnx")

AttrValue = Union[int, float, str, list[int], list[float], list[str]]


class NodeSelection(StepArgs):
    """Which nodes a step edits."""

    nodes: list[str] = Field(default_factory=list, description="Node names; globs allowed "
                                                               "('/model.22/*').")
    op_types: list[str] = Field(default_factory=list, description="Every node of these op types.")
    expect_change: bool = Field(False, description="The step changes the outputs on purpose: "
                                                   "differences are logged, not checked.")

    @model_validator(mode="after")
    def _something_selected(self):
        if not self.nodes and not self.op_types:
            raise ValueError("give nodes or op_types")
        return self


class RemoveNodesArgs(NodeSelection):
    """Arguments of ``remove_nodes``."""

    keep_input: int | None = Field(
        None, ge=0, description="Which input the consumers read instead, for nodes with several "
                                "non-constant inputs (default: the only one).")


@rewrite("remove_nodes", RemoveNodesArgs)
def remove_nodes(model: onnx.ModelProto, args: RemoveNodesArgs) -> onnx.ModelProto:
    """Remove single-path nodes; their consumers read the node's input instead."""
    ed = Editor(model, "remove_nodes")
    for node in ed.select(args.nodes, args.op_types):
        ed.bypass(node, _passing_input(ed, node, args.keep_input))
    return ed.finish()


def _passing_input(ed: Editor, node: onnx.NodeProto, keep_input: int | None) -> int:
    label = node_label(node)
    used = [o for o in node.output if o and (ed.consumers(o) or ed.is_graph_output(o))]
    if len(used) > 1:
        raise SurgeryError(f"cannot remove node {label!r}: {len(used)} of its outputs are used "
                           f"({', '.join(used)}); which one its input replaces is ambiguous")
    if used and used[0] != node.output[0]:
        raise SurgeryError(f"cannot remove node {label!r}: its used output {used[0]!r} is not "
                           "its first")
    if keep_input is not None:
        if keep_input >= len(node.input) or not node.input[keep_input]:
            raise SurgeryError(f"node {label!r} has no input {keep_input}")
        return keep_input
    data = [i for i, name in enumerate(node.input) if name and not ed.is_constant(name)]
    if len(data) != 1:
        raise SurgeryError(f"cannot remove node {label!r}: it has {len(data)} non-constant inputs, "
                           "so what its consumers should read is ambiguous",
                           hint="set keep_input to the index of the input that passes through")
    return data[0]


class ReplaceOpArgs(NodeSelection):
    """Arguments of ``replace_op``."""

    op_type: str = Field(description="The new op type.")
    domain: str = Field("", description="The new op's domain (default: ONNX).")
    inputs: list[int] | None = Field(None, description="Which of the old node's inputs the new op "
                                                       "takes, in order (default: all).")
    keep_attributes: bool = Field(False, description="Copy the old node's attributes the new op "
                                                     "also has.")
    attributes: dict[str, AttrValue] = Field(default_factory=dict,
                                             description="Attributes of the new op.")


@rewrite("replace_op", ReplaceOpArgs)
def replace_op(model: onnx.ModelProto, args: ReplaceOpArgs) -> onnx.ModelProto:
    """Replace nodes by another op on the same tensors (e.g. Sum -> Add, Dropout -> Identity)."""
    ed = Editor(model, "replace_op")
    schema = _schema(ed, args.op_type, args.domain)
    for node in ed.select(args.nodes, args.op_types):
        inputs = list(node.input)
        if args.inputs is not None:
            if any(i >= len(inputs) for i in args.inputs):
                raise SurgeryError(f"node {node_label(node)!r} has {len(inputs)} inputs; "
                                   f"inputs {args.inputs} do not fit")
            inputs = [inputs[i] for i in args.inputs]
        kept = [a for a in node.attribute if args.keep_attributes and schema
                and a.name in schema.attributes and a.name not in args.attributes]
        new = onnx.helper.make_node(args.op_type, inputs, list(node.output), name=node.name,
                                    domain=args.domain or None)
        new.attribute.extend(kept)
        new.attribute.extend(_attributes(ed, schema, args.attributes, args.op_type))
        new.doc_string = "npubuild surgery: replace_op"
        _check_arity(schema, new)
        node.CopyFrom(new)
    ed.touch()
    return ed.finish()


class SetAttributeArgs(NodeSelection):
    """Arguments of ``set_attribute``."""

    attributes: dict[str, AttrValue] = Field(default_factory=dict, description="Attributes to set.")
    remove: list[str] = Field(default_factory=list, description="Attributes to delete.")


@rewrite("set_attribute", SetAttributeArgs)
def set_attribute(model: onnx.ModelProto, args: SetAttributeArgs) -> onnx.ModelProto:
    """Set or delete attributes of nodes (values checked against the op's schema)."""
    ed = Editor(model, "set_attribute")
    for node in ed.select(args.nodes, args.op_types):
        schema = _schema(ed, node.op_type, node.domain)
        for name in args.remove:
            if not any(a.name == name for a in node.attribute):
                raise SurgeryError(f"node {node_label(node)!r} has no attribute {name!r} to remove")
        dropped = set(args.remove) | set(args.attributes)
        kept = [a for a in node.attribute if a.name not in dropped]
        new_attrs = _attributes(ed, schema, args.attributes, node.op_type)
        node.ClearField("attribute")
        node.attribute.extend(kept + new_attrs)
    ed.touch()
    return ed.finish()


class ConstantInput(BaseModel):
    """A constant input written in the recipe."""

    model_config = ConfigDict(extra="forbid")  # docstrings: `npubuild.schemas.docstrings`

    value: float | int | list[Any] = Field(description="A number or a nested list.")
    dtype: Literal["float32", "float16", "int64", "int32", "int8", "uint8", "bool"] = "float32"
    """Element type of the constant."""


class InsertOpArgs(StepArgs):
    """Arguments of ``insert_op``."""

    tensor: str = Field(description="The tensor the op is inserted on: it becomes the op's first "
                                    "input, and the op's output replaces it for its consumers.")
    op_type: str = Field(description="The op to insert.")
    domain: str = ""
    """The op's domain (empty: standard ONNX)."""
    inputs: list[Union[str, ConstantInput]] = Field(
        default_factory=list, description="Further inputs: tensor names or constants "
                                          "({value: [1, -1, 1, 1], dtype: int64}).")
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    """The new node's attributes by name."""
    consumers: list[str] | None = Field(
        None, description="Only these consumer nodes read the new output (default: all, and "
                          "the graph output when the tensor is one).")
    name: str | None = Field(None, description="The new node's name (default: <op_type>_<tensor>).")
    expect_change: bool = Field(False, description="The op changes the outputs on purpose: "
                                                   "differences are logged, not checked.")


@rewrite("insert_op", InsertOpArgs)
def insert_op(model: onnx.ModelProto, args: InsertOpArgs) -> onnx.ModelProto:
    """Insert an op on a tensor, between its producer and (some of) its consumers."""
    ed = Editor(model, "insert_op")
    known = sorted(ed.tensor_names())
    if args.tensor not in known:
        raise SurgeryError(f"tensor {args.tensor!r} not found" + suggest(args.tensor, known))
    schema = _schema(ed, args.op_type, args.domain)
    readers = ed.consumers(args.tensor)
    if args.consumers is not None:
        chosen = [ed.node(name) for name in args.consumers]
        stray = [node_label(n) for n in chosen if args.tensor not in n.input]
        if stray:
            raise SurgeryError(f"node {stray[0]!r} does not read {args.tensor!r}")
        readers = chosen
    extra = [_input(ed, spec, args) for spec in args.inputs]
    to_output = args.consumers is None and ed.is_graph_output(args.tensor)
    source, output = args.tensor, ed.unique_tensor(f"{args.tensor}_{args.op_type}")
    if to_output:  # the graph output keeps its name and now carries the op's result
        source = ed.unique_tensor(f"{args.tensor}_before_{args.op_type}")
        ed.rename(args.tensor, source, graph_output=False)
        readers = ed.consumers(source)
        output = args.tensor
    name = args.name or f"{args.op_type}_{args.tensor}"
    if args.name and any(n.name == args.name for n in ed.graph.node):
        raise SurgeryError(f"a node named {args.name!r} already exists")
    node = ed.make_node(args.op_type, [source] + extra, [output], name, domain=args.domain)
    node.attribute.extend(_attributes(ed, schema, args.attributes, args.op_type))
    _check_arity(schema, node)
    ed.replace_uses(source, output, only=[r for r in readers if r is not node])
    if to_output:
        ed.set_output_shape(output, None)
    return ed.finish()


def _input(ed: Editor, spec: Union[str, ConstantInput], args: InsertOpArgs) -> str:
    if isinstance(spec, str):
        known = ed.tensor_names()
        if spec and spec not in known:
            raise SurgeryError(f"input tensor {spec!r} not found" + suggest(spec, sorted(known)))
        return spec
    value = np.array(spec.value, dtype=spec.dtype)
    return ed.add_initializer(value, f"{args.name or args.op_type}_const")


def _schema(ed: Editor, op_type: str, domain: str):
    """The op's schema at the model's opset; None for custom domains (not checked)."""
    if domain not in STANDARD_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, ed.opset, "")
    except onnx.defs.SchemaError:
        known = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})
        raise SurgeryError(f"{op_type!r} is not an ONNX op at opset {ed.opset}"
                           + suggest(op_type, known)) from None


def _attributes(ed: Editor, schema, values: dict[str, Any], op_type: str) -> list[onnx.AttributeProto]:
    out = []
    for name, value in values.items():
        if schema is not None and name not in schema.attributes:
            allowed = ", ".join(sorted(schema.attributes)) or "none"
            raise SurgeryError(f"{op_type} (opset {ed.opset}) has no attribute {name!r} "
                               f"(allowed: {allowed})",
                               hint="some attributes became inputs in newer opsets (Slice, "
                                    "Squeeze/Unsqueeze axes, Split sizes, Clip min/max)")
        kind = schema.attributes[name].type if schema is not None else None
        out.append(onnx.helper.make_attribute(name, _coerce(value, kind, op_type, name)))
    return out


def _coerce(value: Any, kind, op_type: str, name: str) -> Any:
    AT = onnx.defs.OpSchema.AttrType
    table = {AT.FLOAT: float, AT.INT: int, AT.STRING: str}
    lists = {AT.FLOATS: float, AT.INTS: int, AT.STRINGS: str}
    try:
        if kind in table:
            if isinstance(value, list):
                raise TypeError("expected one value, got a list")
            if kind == AT.INT and isinstance(value, float) and not value.is_integer():
                raise TypeError("expected an integer")
            return table[kind](value)
        if kind in lists:
            items = value if isinstance(value, list) else [value]
            return [lists[kind](v) for v in items]
    except (TypeError, ValueError) as exc:
        raise SurgeryError(f"attribute {name!r} of {op_type}: {exc} ({value!r})") from None
    return value


def _check_arity(schema, node: onnx.NodeProto) -> None:
    if schema is None:
        return
    count = len(node.input)
    if count < schema.min_input or count > schema.max_input:
        raise SurgeryError(f"{node.op_type} takes {schema.min_input}..{schema.max_input} inputs; "
                           f"node {node_label(node)!r} would get {count}")
