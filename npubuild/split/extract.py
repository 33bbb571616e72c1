"""Segments → standalone ONNX submodels, each checker-valid and runnable on its own.

A submodel's inputs are the tensors its nodes read (outer-scope captures of If/Loop/Scan
bodies included) that another segment or the caller produces; its outputs are the tensors it
produces that a later segment reads or the original model returns. It keeps the initializers,
Constant nodes, model-local functions and opset imports it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from npubuild.errors import BuildError
from npubuild.split.graph import OpGraph, subgraphs
from npubuild.split.partition import Segment, segment_of
from npubuild.surgery import origins


@dataclass(frozen=True)
class SegmentIO:
    inputs: list[str]
    outputs: list[str]


def segment_io(og: OpGraph, segments: list[Segment]) -> list[SegmentIO]:
    """Each segment's boundary tensors, in first-use / production order."""
    seg_of = segment_of(segments, len(og))
    readers: dict[str, set[int]] = {}
    for i, used in enumerate(og.uses):
        for t in used:
            readers.setdefault(t, set()).add(seg_of[i])
    returned = set(og.outputs)
    local = og.initializers | set(og.free_consts)
    io = []
    for seg in segments:
        inputs, outputs = {}, {}
        for i in seg.nodes:
            for t in og.uses[i]:
                source = og.producer.get(t)
                if t not in local and (source is None or seg_of[source] != seg.index):
                    inputs[t] = None
            for t in og.nodes[i].output:
                if t and (t in returned or readers.get(t, set()) - {seg.index}):
                    outputs[t] = None
        if not outputs:  # dead-end nodes: return what they compute, so the graph is valid
            read_here = {t for i in seg.nodes for t in og.uses[i]}
            outputs = dict.fromkeys(t for i in seg.nodes for t in og.nodes[i].output
                                    if t and t not in read_here)
        if seg.index == 0:  # an initializer returned as a model output
            outputs.update(dict.fromkeys(o for o in og.outputs if o in og.initializers))
        io.append(SegmentIO(list(inputs), list(outputs)))
    return io


def submodel(model: onnx.ModelProto, og: OpGraph, seg: Segment, io: SegmentIO,
             shapes: dict[str, list[int]] | None = None) -> onnx.ModelProto:
    """The standalone model of one segment; ``shapes`` fills boundary dims inference missed."""
    infos = {v.name: v for g in (model.graph.input, model.graph.value_info, model.graph.output)
             for v in g}
    nodes = [og.nodes[i] for i in seg.nodes]
    used = {t for i in seg.nodes for t in og.uses[i]} | set(io.outputs)
    consts = [og.free_consts[t] for t in og.free_consts if t in used]
    inits = [t for t in model.graph.initializer if t.name in used]
    produced = [o for n in nodes for o in n.output]  # node order, never set order: reproducible
    internal = [infos[t] for t in dict.fromkeys(produced) if t in infos and t not in io.outputs]
    graph = helper.make_graph(
        consts + nodes, f"graph_{seg.index}",
        [_boundary_info(t, infos, shapes, seg) for t in io.inputs],
        [_boundary_info(t, infos, shapes, seg) for t in io.outputs],
        initializer=inits, value_info=internal)
    sub = helper.make_model(graph, opset_imports=list(model.opset_import),
                            functions=_functions_used(model, consts + nodes),
                            producer_name="npubuild split", ir_version=model.ir_version)
    helper.set_model_props(sub, {"npubuild.graph": str(seg.index), "npubuild.device": seg.device})
    renamed = origins.read(model, origins.MODEL_KEY).get("inputs", {})
    carried = {new: old for new, old in renamed.items() if new in io.inputs}
    if carried:  # later stages find the recipe's entry for an input surgery renamed
        origins.write(sub, {"inputs": carried, "outputs": {}}, origins.MODEL_KEY)
    try:
        onnx.checker.check_model(sub)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"graph_{seg.index} is not a valid ONNX model: {exc}", stage="split") from None
    return sub


def _boundary_info(name: str, infos: dict, shapes: dict | None, seg: Segment) -> onnx.ValueInfoProto:
    info = infos.get(name)
    if info is None or not info.type.WhichOneof("value"):
        raise BuildError(f"graph_{seg.index}: the type of boundary tensor {name!r} is unknown "
                         "(shape inference could not type it)", stage="split")
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    actual = (shapes or {}).get(name)
    tt = out.type.tensor_type
    if actual is not None and out.type.HasField("tensor_type") and not _static(tt):
        tt.ClearField("shape")
        tt.shape.SetInParent()
        for d in actual:
            tt.shape.dim.add().dim_value = int(d)
    return out


def _static(tensor_type) -> bool:
    return tensor_type.HasField("shape") and all(d.HasField("dim_value")
                                                 for d in tensor_type.shape.dim)


def _functions_used(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> list[onnx.FunctionProto]:
    """The model-local functions these nodes call, directly, in subgraphs or in other functions."""
    table = {(f.domain, f.name, f.overload): f for f in model.functions}
    wanted: dict[tuple[str, str, str], None] = {}
    stack = list(nodes)
    while stack:
        node = stack.pop()
        key = (node.domain, node.op_type, node.overload)
        if key in table and key not in wanted:
            wanted[key] = None
            stack.extend(table[key].node)
        for sub in subgraphs(node):
            stack.extend(sub.node)
    return [f for key, f in table.items() if key in wanted]
