"""ONNX frontend: what the import stage does to any ONNX model after its input shapes are fixed.

- `normalise_ir`: old models (IR < 4) list every initializer as a graph input too. Later stages
  cut the graph into submodels, and a submodel that keeps the initializer without the input is
  not valid at IR 3 ("in initializer but not in graph input"). Import drops those inputs and
  raises the IR version to 4, the first that allows it; the values and the graph are unchanged.
- `resolve_shapes`: shapes are inferred from the fixed inputs. What inference cannot derive is
  mostly shape arithmetic it does not propagate (Paddle's Shape → Cast → Slice → Concat feeding
  a Reshape): those Shape/Size nodes read tensors whose shapes are now static, so they and the
  integer arithmetic after them fold to constants, round after round. Outputs still without a
  shape keep what the source model declared; a graph output with neither is named in an error.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.errors import BuildError

IR_WITHOUT_INITIALIZER_INPUTS = 4
MAX_FOLD_ROUNDS = 8
# Integer shape arithmetic: exact, so folding it keeps the import's bit-identical proof
SHAPE_OPS = {"Cast", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Add", "Sub", "Mul",
             "Div", "Floor", "Ceil", "Neg", "Abs", "Max", "Min", "ReduceProd", "Range", "Equal",
             "Where", "Reshape", "Identity", "Expand", "ConstantOfShape", "Constant", "Mod"}


def normalise_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without initializers among the graph inputs (IR raised to 4 when it was older)."""
    inits = {t.name for t in model.graph.initializer}
    if not any(i.name in inits for i in model.graph.input):
        return model
    model = onnx_io.clone(model)
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.ir_version = max(model.ir_version, IR_WITHOUT_INITIALIZER_INPUTS)
    return model


def resolve_shapes(model: onnx.ModelProto, declared: onnx.ModelProto) -> onnx.ModelProto:
    """Infer every shape from the fixed inputs, folding shape arithmetic that depends on them.

    `declared` is the model as its source wrote it: a graph output inference leaves without a
    shape keeps the shape declared there. Raises `BuildError` naming each output that has none.
    """
    model = _infer(model)
    for _ in range(MAX_FOLD_ROUNDS):
        if _first_unknown(model) is None:
            break
        folded = fold_shape_arithmetic(model)
        if folded is None:
            break
        model = _infer(folded)
    _keep_declared(model, declared)
    missing = [o.name for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if missing:
        raise BuildError(f"the shape of output(s) {', '.join(map(repr, missing))} cannot be "
                         f"derived from the input shapes, and the model does not declare it "
                         f"(first tensor without a shape: {_first_unknown(model)!r})",
                         stage="import",
                         hint="fix every input's shape in model.inputs, or cut the model before "
                              "that tensor with model.outputs")
    return model


def fold_shape_arithmetic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """Replace Shape/Size of statically shaped tensors, and the shape arithmetic that then reads
    only constants, by initializers; None when nothing folds."""
    from npubuild.surgery.folding import evaluate, fold_shape_reads
    from npubuild.surgery.graph import Editor, subgraph_inputs

    ed = Editor(model, "import")
    derived = fold_shape_reads(ed)
    if not derived:
        return None
    constant = {t.name for t in ed.graph.initializer if not ed.overridable(t.name)}
    computable = []
    for node in ed.graph.node:  # topological
        if _computable(ed, node, constant):
            computable.append(node)
            constant.update(node.output)
    batch = _reaching(ed, computable, derived)
    if not batch:
        return ed.finish(prune=False)
    ids = {id(n) for n in batch}
    read = {name for n in ed.graph.node if id(n) not in ids
            for name in [*n.input, *subgraph_inputs(n)]}
    needed = [o for n in batch for o in n.output if o in read]
    values = evaluate(ed, batch, needed)
    ed.remove(*batch)
    for name in needed:
        ed.set_initializer(name, values[name])
    return ed.finish(prune=False)


def _computable(ed, node: onnx.NodeProto, constant: set[str]) -> bool:
    """Shape arithmetic that reads constants only (a Constant node is one)."""
    return (node.op_type in SHAPE_OPS and node.domain in ("", "ai.onnx")
            and all(not name or name in constant for name in node.input)
            and not any(ed.is_graph_output(o) for o in node.output))


def _reaching(ed, computable: list[onnx.NodeProto], derived: set[str]) -> list[onnx.NodeProto]:
    """The computable nodes that read a folded shape, and the constant nodes feeding them, in
    graph order (only these fold: the rest of the graph stays as the source wrote it)."""
    tainted = set(derived)
    for node in computable:
        if any(name in tainted for name in node.input):
            tainted.update(node.output)
    keep, wanted = set(), set()
    for node in reversed(computable):
        if any(o in tainted for o in node.output) or any(o in wanted for o in node.output):
            keep.add(id(node))
            wanted.update(node.input)
    return [n for n in computable if id(n) in keep]


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx_io.reinfer_shapes(model)
    except Exception as exc:  # onnx raises InferenceError, ValidationError and friends
        raise BuildError(f"shape inference failed: {exc}", stage="import") from None


def _first_unknown(model: onnx.ModelProto) -> str | None:
    """The first node output (in graph order) that shape inference left without a shape."""
    typed = {v.name for v in [*model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape")}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in typed:
                return name
    return None


def _keep_declared(model: onnx.ModelProto, declared: onnx.ModelProto) -> None:
    """Outputs without an inferred shape take the shape the source declares (if it does)."""
    source = {o.name: o for o in declared.graph.output}
    for out in model.graph.output:
        ttype = out.type.tensor_type
        if ttype.HasField("shape") or out.name not in source:
            continue
        theirs = source[out.name].type.tensor_type
        if theirs.HasField("shape"):
            ttype.shape.CopyFrom(theirs.shape)
