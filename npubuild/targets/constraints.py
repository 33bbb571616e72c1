"""Op support: whether a node runs on the chip's NPU, and if not, exactly why (Arm Vela style).

Each constraint is a function ``check(node, spec) -> detail | None``. Its docstring's first line
is the reason the user sees when it fails ("Input is not 4D tensor"), formatted with the chip's
own values; the detail says which tensor or attribute broke it. The same docstrings generate
``docs/SUPPORTED_OPS.md`` (`npubuild.targets.docs`), so the docs cannot drift from the checks.

A constraint is switched on by one `OpSupport` field (``field=None``: it applies to every op in
the table) and concerns a set of op types (``ops=None``: any). `node_reasons` runs them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Iterable

import lazy_loader as lazy

from npubuild import backends
from npubuild.fusions import FUSED_DOMAIN
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.targets.model import Chip, OpSupport
from npubuild.targets.view import NodeView, is_static, show_shape

np = lazy.load("numpy")
onnx = lazy.load("onnx")


CONV_OPS = frozenset({"Conv", "ConvTranspose"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
KERNEL_OPS = CONV_OPS | POOL_OPS
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu",
                        "Equal", "Greater", "Less", "And", "Or"})
AXIS_OPS = frozenset({"Concat", "Split", "Softmax", "LogSoftmax", "Gather", "Slice", "Flatten"})
# Inputs an NPU compiler needs as compile-time constants (shapes, sizes, pads, scales).
PARAM_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Resize": (1, 2, 3), "Split": (1,), "Pad": (1, 2, 3),
    "Expand": (1,), "Tile": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Clip": (1, 2),
    "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "TopK": (1,),
}

Check = Callable[[NodeView, OpSupport], "str | None"]


@dataclass(frozen=True)
class Constraint:
    check: Check
    field: str | None
    ops: frozenset[str] | None

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def template(self) -> str:
        return inspect.getdoc(self.check).splitlines()[0]

    def active(self, spec: OpSupport) -> bool:
        return self.field is None or getattr(spec, self.field) not in (None, False, "any")

    def concerns(self, op: str) -> bool:
        return self.ops is None or op in self.ops

    def reason(self, spec: OpSupport) -> str:
        return self.template.format(**_format_values(spec))


CONSTRAINTS: list[Constraint] = []


def constraint(field: str | None = None, ops: Iterable[str] | None = None):
    """Register a check; its docstring's first line is its reason."""

    def decorate(fn: Check) -> Check:
        CONSTRAINTS.append(Constraint(fn, field, frozenset(ops) if ops is not None else None))
        return fn

    return decorate


def either(values: Iterable[object], suffix: str = "") -> str:
    items = [f"{v}{suffix}" for v in values]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


_GROUPS = {"one": "1", "depthwise": "depthwise (groups = channels)",
           "one_or_depthwise": "1 or depthwise (groups = channels)", "any": "any"}
_BROADCAST = {"same_shape": "the same shape", "any": "any broadcast",
              "channel": "the same shape or per-channel [1, C, 1, 1]",
              "scalar_or_channel": "the same shape, a scalar or per-channel [1, C, 1, 1]"}


def _format_values(spec: OpSupport) -> dict[str, object]:
    values = spec.model_dump()
    for key in ("ranks",):
        values[key] = either(spec.ranks or [], "D")
    for key in ("dtypes", "kernel_sizes", "axes", "resize_modes", "resize_coordinate_modes",
                "pad_modes"):
        values[key] = either(getattr(spec, key) or [])
    values["groups"] = _GROUPS[spec.groups]
    values["broadcast"] = _BROADCAST[spec.broadcast]
    return values


def _first(items: Iterable[str]) -> str | None:
    """The first two offending details (and how many more), or None when there is none."""
    items = list(items)
    if not items:
        return None
    more = f" (and {len(items) - 2} more)" if len(items) > 2 else ""
    return "; ".join(items[:2]) + more


# ---- checks on every op in the table -------------------------------------------------------

@constraint()
def static_shapes(node: NodeView, spec: OpSupport) -> str | None:
    """Tensor shape is unknown or not static"""
    return _first(f"{t!r} has shape {show_shape(node.shape(t))}"
                  for t in [*node.activations, *node.outputs] if not is_static(node.shape(t)))


@constraint(field="dtypes")
def dtype_allowed(node: NodeView, spec: OpSupport) -> str | None:
    """Tensor type is not {dtypes}"""
    allowed = set(spec.dtypes or [])
    for t in [*node.activations, *node.outputs]:
        code = node.facts.elem_type(t)
        name = onnx.helper.tensor_dtype_to_np_dtype(code).name if code else "unknown"
        if name not in allowed:
            return f"{t!r} is {name}"
    return None


@constraint()
def params_constant(node: NodeView, spec: OpSupport) -> str | None:
    """Parameter input is not constant"""
    names = [node.input(i) for i in PARAM_INPUTS.get(node.op, ())]
    return _first(f"{n!r} is computed at run time" for n in names
                  if n and not node.facts.is_const(n))


@constraint()
def constants_not_empty(node: NodeView, spec: OpSupport) -> str | None:
    """Constant input has no elements"""
    params = {node.input(i) for i in PARAM_INPUTS.get(node.op, ())}
    return _first(f"{t!r} has shape {show_shape(node.shape(t))}" for t in node.node.input
                  if t and t not in params and node.facts.is_const(t)
                  and 0 in (node.shape(t) or ()))  # legal ONNX; no place in NPU memory


@constraint()
def reads_an_activation(node: NodeView, spec: OpSupport) -> str | None:
    """Node computes on constants only (surgery `fold_constants` folds it)"""
    # a layer without an input tensor has nothing to tile or quantize: split crashed in the
    # LMEM check, quantize on a missing value (Silero VAD's OpenVINO export, unfolded)
    return None if node.activations else "every input is a constant"


# ---- checks switched on by the op's table entry --------------------------------------------

@constraint(field="ranks")
def input_rank(node: NodeView, spec: OpSupport) -> str | None:
    """Input is not {ranks} tensor"""
    return _first(f"{t!r} has shape {show_shape(node.shape(t))}" for t in node.activations
                  if node.shape(t) is not None and len(node.shape(t)) not in spec.ranks)


@constraint(field="ranks")
def output_rank(node: NodeView, spec: OpSupport) -> str | None:
    """Output is not {ranks} tensor"""
    return _first(f"{t!r} has shape {show_shape(node.shape(t))}" for t in node.outputs
                  if node.shape(t) is not None and len(node.shape(t)) not in spec.ranks)


@constraint(field="max_channels", ops={"Conv"})
def conv_input_channels(node: NodeView, spec: OpSupport) -> str | None:
    """Each output channel reads more than {max_channels} input channels (the compiler splits output channels, not input channels)"""
    weight = node.shape(node.input(1))
    if weight and len(weight) >= 2 and isinstance(weight[1], int) and weight[1] > spec.max_channels:
        return f"weight {node.input(1)!r} has shape {show_shape(weight)}"
    return None


@constraint(field="max_channels", ops=CONV_OPS - {"Conv"})
def channels(node: NodeView, spec: OpSupport) -> str | None:
    """Channels are more than {max_channels}"""
    for t in [*node.activations, *node.outputs]:
        shape = node.shape(t)
        if shape and len(shape) >= 3 and isinstance(shape[1], int) and shape[1] > spec.max_channels:
            return f"{t!r} has {shape[1]} channels"
    return None


def kernel(node: NodeView) -> list[int] | None:
    if "kernel_shape" in node.attrs:
        return list(node.attrs["kernel_shape"])
    weight = node.shape(node.input(1)) if node.op in CONV_OPS else None
    return [int(d) for d in weight[2:]] if weight and all(isinstance(d, int) for d in weight) else None


@constraint(field="kernel_sizes", ops=KERNEL_OPS)
def kernel_in_set(node: NodeView, spec: OpSupport) -> str | None:
    """Kernel size is not {kernel_sizes}"""
    k = kernel(node)
    return f"kernel {k}" if k and any(d not in spec.kernel_sizes for d in k) else None


@constraint(field="max_kernel", ops=KERNEL_OPS)
def kernel_bound(node: NodeView, spec: OpSupport) -> str | None:
    """Kernel is larger than {max_kernel}"""
    k = kernel(node)
    return f"kernel {k}" if k and max(k) > spec.max_kernel else None


def strides(node: NodeView) -> list[int]:
    if node.op == "Slice":
        steps = node.const(4)
        return [abs(int(s)) for s in steps] if steps is not None else []
    return list(node.attr("strides", []))


@constraint(field="max_stride", ops=KERNEL_OPS | {"Slice"})
def stride_bound(node: NodeView, spec: OpSupport) -> str | None:
    """Stride is larger than {max_stride}"""
    s = strides(node)
    return f"strides {s}" if s and max(s) > spec.max_stride else None


@constraint(field="max_dilation", ops=CONV_OPS | {"MaxPool"})
def dilation_bound(node: NodeView, spec: OpSupport) -> str | None:
    """Dilation is larger than {max_dilation}"""
    d = list(node.attr("dilations", []))
    return f"dilations {d}" if d and max(d) > spec.max_dilation else None


def pads(node: NodeView) -> list[int]:
    """Spatial padding (a kernel's window border). A Pad's batch and channel pads are left
    out: appending zero channels (TFLite's channel padding) is a fill, not a window border."""
    if node.op == "Pad":
        value = node.const(1)
        raw = [int(p) for p in value] if value is not None else list(node.attr("pads", []))
        rank = len(raw) // 2
        return raw[2:rank] + raw[rank + 2:] if rank > 2 else raw
    if node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(node)
    return list(node.attr("pads", []))


def _same_pads(node: NodeView) -> list[int]:
    """Total padding per spatial dim that SAME auto-padding adds (from the inferred shapes)."""
    x, y, k = node.shape(node.input(0)), node.shape(node.node.output[0]), kernel(node)
    if not (is_static(x) and is_static(y) and k):
        return []
    s = node.attr("strides", [1] * len(k))
    d = node.attr("dilations", [1] * len(k))
    totals = [max((o - 1) * st + (kk - 1) * dd + 1 - i, 0)
              for i, o, kk, st, dd in zip(x[2:], y[2:], k, s, d)]
    return [(t + 1) // 2 for t in totals]


@constraint(field="max_pad", ops=KERNEL_OPS | {"Pad"})
def pad_bound(node: NodeView, spec: OpSupport) -> str | None:
    """Padding is larger than {max_pad}"""
    p = pads(node)
    return f"pads {p}" if p and max(p) > spec.max_pad else None


@constraint(field="same_padding_only", ops={"AveragePool"})
def average_pool_same_padding(node: NodeView, spec: OpSupport) -> str | None:
    """Padding left out of the average is not TFLite's SAME (its AVERAGE_POOL_2D divides by the valid positions only with SAME)"""
    p = list(node.attr("pads", []))
    if not any(p) or node.attr("count_include_pad", 0):
        return None
    x, y, k = node.shape(node.input(0)), node.shape(node.node.output[0]), kernel(node)
    if not (is_static(x) and is_static(y) and k):
        return f"pads {p} on unknown shapes"
    s, n = strides(node), len(k)
    for i in range(n):
        out = -(-x[2 + i] // s[i])
        total = max((out - 1) * s[i] + k[i] - x[2 + i], 0)
        if y[2 + i] != out or (p[i], p[i + n]) != (total // 2, total - total // 2):
            return f"pads {p} (SAME would be {total // 2} before and {total - total // 2} after on axis {2 + i})"
    return None


@constraint(field="pad_modes", ops={"Pad"})
def pad_mode(node: NodeView, spec: OpSupport) -> str | None:
    """Pad mode is not {pad_modes}"""
    mode = node.attr("mode", "constant")
    return f"mode {mode!r}" if mode not in spec.pad_modes else None


@constraint(field="groups", ops=CONV_OPS)
def conv_groups(node: NodeView, spec: OpSupport) -> str | None:
    """Convolution groups are not {groups}"""
    group = int(node.attr("group", 1))
    x = node.shape(node.input(0))
    cin = x[1] if x and len(x) > 1 and isinstance(x[1], int) else None
    depthwise = cin is not None and group == cin and group > 1
    ok = {"one": group == 1, "depthwise": depthwise,
          "one_or_depthwise": group == 1 or depthwise}[spec.groups]
    return None if ok else f"group={group}, {cin if cin is not None else '?'} input channels"


def axes(node: NodeView) -> list[int] | None:
    """The axes an op works on, normalised to non-negative (None when unknown)."""
    rank = node.rank()
    if rank is None:
        return None
    if node.op == "Slice":
        value = node.const(3)
        starts = node.const(1)
        raw = list(value) if value is not None else (
            list(range(len(starts))) if starts is not None else None)
    elif node.op in ("Softmax", "LogSoftmax"):
        opset = _opset(node)
        raw = [node.attr("axis", -1 if opset >= 13 else 1)]
    else:
        raw = [node.attr("axis", 0 if node.op != "Flatten" else 1)]
    return None if raw is None else sorted({int(a) % rank for a in raw})


def _opset(node: NodeView) -> int:
    return next((o.version for o in node.facts.opset_imports if o.domain in STANDARD_DOMAINS), 21)


@constraint(field="axes", ops=AXIS_OPS)
def axis_allowed(node: NodeView, spec: OpSupport) -> str | None:
    """Axis is not {axes}"""
    a = axes(node)
    bad = [x for x in (a or []) if x not in spec.axes]
    return f"axis {bad[0]} of a {node.rank()}-D tensor" if bad else None


def resize_factors(node: NodeView) -> list[float] | None:
    """Output / input size per dim, from the inferred shapes."""
    x, y = node.shape(node.input(0)), node.shape(node.node.output[0])
    if not (is_static(x) and is_static(y)) or len(x) != len(y):
        return None
    return [o / i for i, o in zip(x, y)]


@constraint(field="resize_modes", ops={"Resize", "Upsample"})
def resize_mode(node: NodeView, spec: OpSupport) -> str | None:
    """Resize mode is not {resize_modes}"""
    mode = node.attr("mode", "nearest")
    return f"mode {mode!r}" if mode not in spec.resize_modes else None


@constraint(field="resize_modes", ops={"Resize", "Upsample"})
def resize_spatial(node: NodeView, spec: OpSupport) -> str | None:
    """Resize changes the batch or channel dimension"""
    f = resize_factors(node)
    return f"scales {f}" if f and len(f) >= 2 and (f[0] != 1 or f[1] != 1) else None


@constraint(field="resize_integer_scales", ops={"Resize", "Upsample"})
def resize_integer(node: NodeView, spec: OpSupport) -> str | None:
    """Resize scale is not an integer"""
    f = resize_factors(node)
    return f"scales {f}" if f and any(s != int(s) or s < 1 for s in f) else None


@constraint(field="resize_coordinate_modes", ops={"Resize"})
def resize_coordinates(node: NodeView, spec: OpSupport) -> str | None:
    """Resize coordinate mode is not {resize_coordinate_modes}"""
    mode = node.attr("coordinate_transformation_mode", "half_pixel")
    return f"mode {mode!r}" if mode not in spec.resize_coordinate_modes else None


def _broadcast_form(a: list, b: list) -> str:
    """How operand shape ``b`` broadcasts onto output shape ``a`` (ONNX broadcasting aligns
    shapes from the right: a ``[C, 1, 1]`` constant is per-channel on a 4-D tensor)."""
    if len(b) < len(a):
        b = [1] * (len(a) - len(b)) + b
    if a == b:
        return "same_shape"
    if int(np.prod(b)) == 1:
        return "scalar"
    if len(b) == len(a) >= 2 and b[1] == a[1] and all(d == 1 for i, d in enumerate(b) if i != 1):
        return "channel"
    return "other"


_BROADCAST_OK = {"same_shape": {"same_shape"}, "channel": {"same_shape", "channel"},
                 "scalar_or_channel": {"same_shape", "scalar", "channel"}}


@constraint(field="broadcast", ops=BINARY_OPS)
def broadcast_form(node: NodeView, spec: OpSupport) -> str | None:
    """Operands are not {broadcast}"""
    out = node.shape(node.node.output[0])
    if not is_static(out):
        return None
    for name in [i for i in node.node.input if i]:
        shape = node.shape(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            continue
        form = _broadcast_form(list(out), list(shape))
        if form not in _BROADCAST_OK[spec.broadcast]:
            return f"{name!r} has shape {show_shape(shape)}, the output {show_shape(out)}"
    return None


# ---- what npubuild's quantizer can express -------------------------------------------------

@constraint()
def integer_kernel(node: NodeView, spec: OpSupport) -> str | None:
    """The quantizer has no integer kernel for it"""
    from npubuild.targets.integer import lowering_failure

    if spec.vendor_kernel is not None and node.activations == list(filter(None, node.node.input)):
        return None  # a node of activations only: the vendor's own kernel takes what ours cannot
    return lowering_failure(node)


# ---- layout no-ops ---------------------------------------------------------------------------

#: Ops that only rename the dimensions of a contiguous tensor (or, Identity, not even that):
#: on the NPU they move no data.
LAYOUT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
LAYOUT_NOOP_NOTE = ("Reshape, Flatten, Squeeze, Unsqueeze, Identity and a Cast to the type it "
                    "reads between two NPU ops run on the NPU as layout no-ops (they move no "
                    "data) on every chip, listed in its table or not, when their shapes are "
                    "static and their shape inputs constant")


def moves_no_data(view: NodeView) -> bool:
    """A layout op, or a Cast to the type it reads (exporters leave float-to-float Casts;
    quantize lowers one as it lowers an Identity)."""
    if view.op == "Cast":
        return bool(view.node.input) and view.attr("to") == view.facts.elem_type(view.input(0))
    return view.op in LAYOUT_OPS


def layout_noop_reasons(view: NodeView, chip: Chip) -> list[str] | None:
    """Why a layout op cannot be an NPU layout no-op (None: ``view`` is no layout op).

    Its table entry (or its absence) and ranks do not matter: between two NPU ops the NPU
    keeps the tensor where it is. Static shapes, constant shape inputs and the chip's dtypes do.
    """
    if not moves_no_data(view) or view.node.domain not in STANDARD_DOMAINS:
        return None
    return unlisted_reasons(view, chip)


def unlisted_reasons(view: NodeView, chip: Chip) -> list[str]:
    """The chip-wide checks alone (static shapes, constant parameters, the chip's dtypes, an
    integer kernel), for data movement the NPU runs whether its table lists the op or not:
    layout no-ops (`layout_noop_reasons`), channel permutations (`npubuild.split.shuffles`)."""
    spec = OpSupport(dtypes=list(chip.dtypes))
    return [_with_detail(c.reason(spec), detail) for c in CONSTRAINTS
            if c.field in (None, "dtypes") and (detail := c.check(view, spec)) is not None]


# ---- the node-level answer -----------------------------------------------------------------

HAS_SUBGRAPH_REASON = "Op has a subgraph (control flow runs on the CPU)"


def op_label(node: onnx.NodeProto) -> str:
    if node.domain == FUSED_DOMAIN:
        return f"fused op {node.op_type}"
    return node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}.{node.op_type}"


def effective_spec(chip: Chip, op: str, fused: bool = False) -> OpSupport | None:
    """The op's table entry with the chip's defaults filled in; None when the NPU lacks it."""
    spec = chip.ops.get(op)
    if spec is None and not (fused and chip.accept_fused_bodies):
        return None
    spec = spec or OpSupport()
    return spec if spec.dtypes else spec.model_copy(update={"dtypes": list(chip.dtypes)})


def node_reasons(view: NodeView, chip: Chip) -> list[str]:
    """Why the node cannot run on ``chip``'s NPU; an empty list means it can."""
    node = view.node
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return [HAS_SUBGRAPH_REASON + _why_not_unrolled(view)]
    fused = node.domain == FUSED_DOMAIN
    spec = effective_spec(chip, node.op_type, fused) if fused or node.domain in STANDARD_DOMAINS else None
    if spec is None:
        label = op_label(node)
        return [f"{label if fused else 'op ' + label} is not supported by chip {chip.name}"
                + _why_not_unrolled(view)]
    reasons = [_with_detail(c.reason(spec), detail) for c in CONSTRAINTS
               if c.active(spec) and c.concerns(node.op_type)
               and (detail := c.check(view, spec)) is not None]
    if fused and not reasons:
        reasons += _body_reasons(view, chip)
    elif not reasons and backends.of(chip).plans_lmem:
        from npubuild.targets.fit import lmem_reasons

        reasons += lmem_reasons(view, chip)
    return reasons


def _why_not_unrolled(view: NodeView) -> str:
    """For a recurrent layer, a Loop or a Scan, why import left it whole
    (`npubuild.frontends.recurrent`, `npubuild.frontends.loops`)."""
    from npubuild.frontends import loops, recurrent

    if view.op in loops.LOOP_OPS and view.node.domain in STANDARD_DOMAINS:
        opset = next((o.version for o in view.facts.opset_imports if o.domain in STANDARD_DOMAINS),
                     loops.SCAN_INPUTS_OPSET)
        why = loops.why_kept(view.node, view.facts.value, view.shape, opset)
        return f" (import unrolls a loop of a static trip count, not this one: {why})" if why else ""
    if view.op not in recurrent.RECURRENT_OPS or view.node.domain not in STANDARD_DOMAINS:
        return ""
    why = recurrent.why_kept(view.op, recurrent.attributes(view.node),
                             view.shape(view.input(0)), view.const,
                             lambda i: bool(view.input(i)))
    return f" (import unrolls a recurrent layer, not this one: {why})" if why else ""


def _with_detail(reason: str, detail: str) -> str:
    return f"{reason}: {detail}" if detail else reason


def _body_reasons(view: NodeView, chip: Chip) -> list[str]:
    """A fused op runs on the NPU only when every node of its body does, at its real shapes."""
    from npubuild.targets.fused import body_views

    views = body_views(view)
    if views is None:
        return [f"fused op {view.op}: its function body is missing from the model"]
    # quantize turns a unary element-wise body into one lookup table, whatever its nodes are;
    # npubuild's compiler runs that table, so there the body's ops need no entry of their own
    # (a vendor compiler is handed the body inlined, op by op)
    table = integer_kernel.__doc__ if _is_lookup_table(view) else None
    if table is not None and backends.of(chip).plans_lmem:
        return []
    return [f"in its body, {op_label(inner.node)}: {reason}"
            for inner in views if inner.op != "Constant" for reason in node_reasons(inner, chip)
            if table is None or not reason.startswith(table)]


def _is_lookup_table(view: NodeView) -> bool:
    from npubuild.quant.lower import is_unary_elementwise

    function = view.facts.functions.get((view.node.domain, view.op, view.node.overload))
    return function is not None and is_unary_elementwise(function)


def inapplicable_fields(op: str, spec: OpSupport) -> list[str]:
    """Fields set on ``op``'s entry that no constraint for ``op`` reads (a chip-file mistake)."""
    bad = []
    for name in spec.model_fields_set - {"note"}:
        users = [c for c in CONSTRAINTS if c.field == name]
        if users and not any(c.concerns(op) for c in users):
            bad.append(name)
    return sorted(bad)
