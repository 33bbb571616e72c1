"""The graph's interface: ``extract``, ``update_io_shape``, ``rename_tensors``.

``extract`` is ``onnx.utils.extract_model`` as a step: new inputs and outputs at named tensors,
and everything no output needs is dropped. The proof compares an output placed at an existing
tensor with that tensor's value in the step's input, and feeds a new input the value the step's
input computed there, so even a cut model is checked. ``rename_tensors`` records its renames, so
renamed outputs are compared with their old selves.
"""

from __future__ import annotations

import lazy_loader as lazy
from pydantic import Field

from npubuild.surgery import StepArgs, SurgeryError, rewrite
from npubuild.surgery import origins as org
from npubuild.surgery.graph import Editor, subgraph_inputs, suggest, skeleton

onnx = lazy.load("onnx")


class ExtractArgs(StepArgs):
    """Arguments of ``extract``."""

    inputs: list[str] | None = Field(
        None, description="Tensors that become the graph inputs; what computed them is dropped "
                          "(default: keep the inputs; those no output needs are dropped).")
    outputs: list[str] | None = Field(
        None, description="Tensors that become the graph outputs, in order "
                          "(default: keep the outputs).")


@rewrite("extract", ExtractArgs, data_movement=True)
def extract(model: onnx.ModelProto, args: ExtractArgs) -> onnx.ModelProto:
    """Cut the graph: new inputs and outputs at named tensors; drop what no output needs."""
    ed = Editor(model, "extract")
    known = ed.tensor_names()
    for name in (args.inputs or []) + (args.outputs or []):
        if name not in known:
            raise SurgeryError(f"tensor {name!r} not found" + suggest(name, sorted(known)))
        if ed.initializer(name) is not None:
            raise SurgeryError(f"{name!r} is a constant; it cannot become a graph input or output")
    inputs = args.inputs if args.inputs is not None else ed.input_names
    outputs = args.outputs if args.outputs is not None else ed.output_names
    input_values = [_value(ed, n, "input") for n in inputs]
    output_values = {o.name: o for o in ed.graph.output}
    output_values = [output_values.get(n) or _value(ed, n, "output") for n in outputs]
    keep = _needed_nodes(ed, inputs, outputs)
    ed.remove(*[n for n in ed.graph.node if id(n) not in keep])
    read = {name for node in ed.graph.node for name in node.input} | set(outputs)
    for name in outputs:
        if ed.producer(name) is None and name not in inputs + ed.input_names:
            raise SurgeryError(f"output {name!r} is no longer computed")
    extra = [i for i in ed.graph.input if i.name not in inputs and i.name in read]
    ed.graph.ClearField("input")
    ed.graph.input.extend(input_values + extra)
    ed.graph.ClearField("output")
    ed.graph.output.extend(output_values)
    ed.touch()
    return ed.finish()


def _needed_nodes(ed: Editor, inputs: list[str], outputs: list[str]) -> dict[int, onnx.NodeProto]:
    """The nodes the outputs need (by id), walking back and stopping at the new inputs."""
    stop, seen, keep = set(inputs), set(), {}
    stack = list(outputs)
    while stack:
        tensor = stack.pop()
        if tensor in seen or tensor in stop:
            continue
        seen.add(tensor)
        node = ed.producer(tensor)
        if node is None or id(node) in keep:
            continue
        keep[id(node)] = node
        stack.extend(node.input)
        stack.extend(subgraph_inputs(node))
    for node in keep.values():
        if stop.intersection(node.output):
            cut = sorted(stop.intersection(node.output))[0]
            raise SurgeryError(f"tensor {cut!r} cannot become an input: its producer "
                               f"{node.name!r} also computes {sorted(set(node.output) - stop)}, "
                               "which the outputs need")
    return keep


def _value(ed: Editor, name: str, what: str) -> onnx.ValueInfoProto:
    elem, shape = ed.elem_type(name), ed.shape(name)
    if shape is None or not elem:
        raise SurgeryError(f"the type or shape of {name!r} is not known, so it cannot become a "
                           f"graph {what}", hint="fix the input shapes and run fold_constants first")
    return onnx.helper.make_tensor_value_info(name, elem, shape)


class UpdateIoShapeArgs(StepArgs):
    """Arguments of ``update_io_shape``."""

    shapes: dict[str, list[int]] = Field(
        min_length=1, description="Graph input or output name -> its new shape. An output's shape "
                                  "must be what the graph computes; a new input shape propagates "
                                  "to the outputs not listed here.")


@rewrite("update_io_shape", UpdateIoShapeArgs, data_movement=True)
def update_io_shape(model: onnx.ModelProto, args: UpdateIoShapeArgs) -> onnx.ModelProto:
    """Declare new shapes for graph inputs or outputs."""
    ed = Editor(model, "update_io_shape")
    values = {v.name: v for v in list(ed.graph.input) + list(ed.graph.output)}
    for name, shape in args.shapes.items():
        if name not in values or ed.initializer(name) is not None:
            raise SurgeryError(f"{name!r} is not a graph input or output"
                               + suggest(name, ed.input_names + ed.output_names))
        if any(d < 0 for d in shape):
            raise SurgeryError(f"shape {shape} for {name!r} has a negative dimension")
        if name in ed.input_names:
            _set_dims(values[name], shape)
    ed.graph.ClearField("value_info")
    for out in ed.output_names:
        ed.set_output_shape(out, None)
    ed.touch()
    _check_inference(ed)
    if any(name in ed.input_names for name in args.shapes):
        _check_runs(ed)
    for out in ed.output_names:
        computed = ed.shape(out)
        wanted = args.shapes.get(out, computed)
        if computed is not None and wanted != computed:
            producer = ed.producer(out)
            raise SurgeryError(f"output {out!r}: the graph computes shape {computed}, not {wanted}",
                               hint=f"declare {computed}, or rewrite the node "
                                    f"{producer.name if producer else out!r} first")
        ed.set_output_shape(out, wanted)
    return ed.finish(prune=False)


def _set_dims(value: onnx.ValueInfoProto, shape: list[int]) -> None:
    ttype = value.type.tensor_type
    ttype.ClearField("shape")
    ttype.shape.SetInParent()
    for dim in shape:
        ttype.shape.dim.add().dim_value = dim


def _check_runs(ed: Editor) -> None:
    """Shape inference lets some misfits through (a Reshape's element count): run the model."""
    from npubuild import onnx_io, proofs

    try:
        onnx_io.run(ed.model, proofs.make_feeds(ed.model))
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise SurgeryError("the new shapes do not fit the graph: ONNX Runtime says "
                           f"{lines[-1] if lines else exc}") from None


def _check_inference(ed: Editor) -> None:
    try:
        onnx.shape_inference.infer_shapes(skeleton(ed.model), strict_mode=True, data_prop=True)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        reason = lines[-1] if lines else exc
        raise SurgeryError(f"the new shapes do not fit the graph: {reason}") from None


class RenameTensorsArgs(StepArgs):
    """Arguments of ``rename_tensors``."""

    names: dict[str, str] = Field(min_length=1, description="Old tensor name -> new name "
                                                            "(graph inputs and outputs included).")


@rewrite("rename_tensors", RenameTensorsArgs, data_movement=True)
def rename_tensors(model: onnx.ModelProto, args: RenameTensorsArgs) -> onnx.ModelProto:
    """Rename tensors everywhere; renamed graph outputs and inputs are recorded for the proof."""
    ed = Editor(model, "rename_tensors")
    known = ed.tensor_names()
    targets = list(args.names.values())
    for old, new in args.names.items():
        if old not in known:
            raise SurgeryError(f"tensor {old!r} not found" + suggest(old, sorted(known)))
        if (new in known and new not in args.names) or targets.count(new) > 1:
            raise SurgeryError(f"cannot rename {old!r} to {new!r}: that name is already used")
    outputs, inputs = set(ed.output_names), set(ed.input_names)
    temp = {old: ed.unique_tensor(f"{old}.renaming") for old in args.names}
    for old, tmp in temp.items():  # two passes, so swaps (a->b, b->a) work
        ed.rename(old, tmp)
    for old, tmp in temp.items():
        ed.rename(tmp, args.names[old])
    result = ed.finish(prune=False)
    org.write(result, {"outputs": {o: n for o, n in args.names.items() if o in outputs},
                       "inputs": {n: o for o, n in args.names.items() if o in inputs}})
    return result
