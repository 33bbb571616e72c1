"""Lower a float ONNX (sub)model to a ``FloatGraph`` of quantizable layers.

Read top to bottom, lowering is:

1. ``prepare``: opset ≥ 13 (so QDQ per-channel axes exist), every node named, fused ops
   (domain ``npubuild.fused``) inlined unless their body is a unary element-wise function
   (those become one lookup table, e.g. the SiLU fused op);
2. probe the model once: every tensor's shape, and the value of every constant tensor
   (initializers, Constant nodes, and anything computed only from them or from static shapes);
3. walk the nodes in order; patterns first (``x · sigmoid(x)`` → one SiLU table,
   ``x · hardsigmoid(x)`` → HardSwish), then the per-op rules of ``npubuild.quant.ops``; after
   a layer, the constant affine steps that follow a conv or a table fold into it
   (``npubuild.quant.affine``) and a Relu/Clip after a conv/add into its requant clamp. A node
   no rule expresses, or one named by a float override, becomes a ``float`` layer with the
   reason.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import onnx

from npubuild import onnx_io, proofs
from npubuild.errors import BuildError
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.quant import affine, equalize as cross_layer, ops
from npubuild.quant.floatgraph import (FLOAT_OVERRIDE, FLayer, FloatGraph, Probe, Unsupported,
                                      fragment_model)

FUSED_DOMAIN = "npubuild.fused"
MIN_OPSET = 13
STATIC_SHAPE_OPS = {"Shape", "Size"}
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli"}
ELEMENTWISE = {"Sigmoid", "Mul", "Add", "Sub", "Div", "Tanh", "HardSigmoid", "HardSwish",
               "Relu", "Clip", "LeakyRelu", "Exp", "Log", "Softplus", "Erf", "Sqrt", "Neg",
               "Abs", "Constant", "Identity", "Pow", "Min", "Max", "Elu", "Gelu", "Reciprocal",
               "Softsign", "Mish", "Selu", "Celu", "Cast"}
FOLDABLE_INTO = {"conv", "add"}


class Context:
    """What rules may ask about a node's tensors."""

    def __init__(self, constants: dict[str, np.ndarray], shapes: dict[str, list[int]], opset: int):
        self.constants, self.shapes, self.opset = constants, shapes, opset
        self._fc_weights: dict[tuple, np.ndarray] = {}

    def const(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def fc_weight(self, name: str, transposed: bool, alpha: float) -> np.ndarray:
        """Constant ``name`` as a fully connected layer's float64 weight [out, in, 1, 1]
        (``transposed``: stored [out, in] already; times ``alpha``), one read-only array per
        constant: an unrolled recurrence's steps read the same weights (nakdimon: 256 layers,
        1.1 GB of copies)."""
        key = (name, transposed, alpha)
        if key not in self._fc_weights:
            value = self.constants[name]
            w = np.asarray((value if transposed else value.T) * alpha, np.float64)  # as Gemm rounds
            w = w.reshape(w.shape[0], w.shape[1], 1, 1)
            w.flags.writeable = False
            self._fc_weights[key] = w
        return self._fc_weights[key]

    def shape(self, name: str) -> list[int]:
        return self.shapes[name]

    def add_constant(self, name: str, value: np.ndarray) -> str:
        self.constants[name] = np.asarray(value, dtype=np.float32)
        self.shapes[name] = list(np.shape(value))
        return name


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), 0)


def prepare(model: onnx.ModelProto, keep: Iterable[str] = ()) -> onnx.ModelProto:
    """Opset ≥ 13, fused ops inlined (except unary element-wise ones and the nodes in ``keep``,
    which a float override keeps whole), every node named uniquely."""
    original = model
    model = onnx_io.skeleton(model)  # the inliner and the converter copy weights otherwise
    _detach_kept_functions(model, set(keep))
    inline = [(f.domain, f.name) for f in model.functions
              if f.domain == FUSED_DOMAIN and not is_unary_elementwise(f)
              and not f.name.endswith(KEPT_SUFFIX)]
    if inline:  # before the opset conversion, which does not convert function bodies
        import onnx.inliner

        model = onnx.inliner.inline_selected_functions(model, inline)
    if opset_of(model) < MIN_OPSET:
        model = onnx_io.convert_version(model, MIN_OPSET)
    model = onnx_io.with_weights(model, original)
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}" if not node.name else f"{node.name}_{i}"
        seen.add(node.name)
    return model


KEPT_SUFFIX = "__kept"


def _detach_kept_functions(model: onnx.ModelProto, keep: set[str]) -> None:
    """Point each kept fused node at its own copy of its function, which is not inlined."""
    functions = {(f.domain, f.name): f for f in model.functions}
    for node in model.graph.node:
        if node.name in keep and node.domain == FUSED_DOMAIN and (node.domain, node.op_type) in functions:
            copy = onnx.FunctionProto()
            copy.CopyFrom(functions[(node.domain, node.op_type)])
            copy.name = f"{node.op_type}_{len(model.functions)}{KEPT_SUFFIX}"
            model.functions.append(copy)
            node.op_type = copy.name


def is_unary_elementwise(function: onnx.FunctionProto) -> bool:
    return (len(function.input) == 1 and len(function.output) == 1
            and all(n.op_type in ELEMENTWISE and n.domain in STANDARD_DOMAINS for n in function.node))


class EqualizationNotExact(BuildError):
    """The equalised model's outputs differ from the original's by more than float rounding."""


def lower(model: onnx.ModelProto, *, float_nodes: Iterable[str] = (),
          equalize: bool = False) -> tuple[FloatGraph, Probe]:
    """The layer graph of ``model`` and a probe that runs it (for calibration); with
    ``equalize``, conv pairs are cross-layer equalised first (``quant.equalize``: the float
    function is unchanged: proved on the probe's inputs, else `EqualizationNotExact`; the
    graph's ``equalization`` says which pairs)."""
    float_nodes = set(float_nodes)
    model = prepare(model, keep=float_nodes)
    equalization = None
    feeds = proofs.make_feeds(model)
    if equalize:
        plain = model
        model, equalization = cross_layer.equalize(model)
        changed = equalization.pairs or equalization.folded  # a folded BatchNorm changes it too
        failures = cross_layer.proof_failures(plain, model, feeds) if changed else []
        if failures:
            raise EqualizationNotExact(
                "cross-layer equalisation changed the float function: " + "; ".join(failures[:3]),
                stage="quantize")
    probe = Probe(model)
    values = probe.run(feeds)
    constants = _constants(model, values)
    shapes = {name: list(np.shape(v)) for name, v in {**values, **constants}.items()}
    for value in onnx_io.graph_inputs(model):
        shapes[value.name] = [int(d) for d in onnx_io.value_shape(value)]
    ctx = Context(constants, shapes, opset_of(model))
    walker = _Walker(model, ctx, float_nodes)
    graph = FloatGraph(model, [v.name for v in onnx_io.graph_inputs(model)],
                       [o.name for o in model.graph.output], walker.layers(), shapes, ctx.constants,
                       equalization)
    return graph, probe


def _constants(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in NONDETERMINISTIC:
            continue
        static = node.op_type in STATIC_SHAPE_OPS or all(
            i in constants for i in node.input if i)
        if static:
            for out in node.output:
                if out in values:
                    constants[out] = values[out]
    return constants


class _Walker:
    """One pass over the nodes: patterns, then rules, then activation folding."""

    def __init__(self, model: onnx.ModelProto, ctx: Context, float_nodes: set[str]):
        self.model, self.ctx, self.float_nodes = model, ctx, float_nodes
        self.nodes = [n for n in model.graph.node if not all(
            o in ctx.constants for o in n.output if o)]
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        self.graph_outputs = {o.name for o in model.graph.output}
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.claimed: set[str] = set()

    def layers(self) -> list[FLayer]:
        out = []
        for node in self.nodes:
            if node.name in self.claimed:
                continue
            layer = self._pattern(node) or self._rule(node)
            self._fold_affine(layer)
            self._fold_activation(layer)
            out.append(layer)
        return out

    def _only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        return users[0]

    def _free(self, *nodes: onnx.NodeProto) -> bool:
        return all(n.name not in self.float_nodes and n.name not in self.claimed for n in nodes)

    def _pattern(self, node: onnx.NodeProto) -> FLayer | None:
        if node.op_type in ("Sigmoid", "HardSigmoid"):
            user = self._only_consumer(node.output[0])
            if (user is not None and user.op_type == "Mul" and self._free(node, user)
                    and set(user.input) == {node.input[0], node.output[0]}):
                self.claimed.add(user.name)
                if node.op_type == "Sigmoid":
                    fn, name = ops.silu, "SiLU"
                else:
                    hs = ops.LUT_FUNCTIONS["HardSigmoid"](node, self.ctx)
                    fn, name = (lambda x, hs=hs: x * hs(x)), "HardSwish"
                return FLayer(user.name, "lut", [node.input[0]], [user.output[0]],
                              attrs={"function": name}, source_nodes=[node.name, user.name], fn=fn)
        if node.domain == FUSED_DOMAIN and node.name not in self.float_nodes:
            function = self.functions.get((node.domain, node.op_type))
            if function is not None and is_unary_elementwise(function):
                frag = fragment_model(self.model, [node.name], [node.input[0]], [node.output[0]], {})
                return FLayer(node.name, "lut", [node.input[0]], [node.output[0]],
                              attrs={"function": node.op_type}, source_nodes=[node.name],
                              fn=FragmentFunction(frag))
        return None

    def _rule(self, node: onnx.NodeProto) -> FLayer:
        if node.name in self.float_nodes:
            return self._float(node, FLOAT_OVERRIDE)
        rule = ops.RULES.get(node.op_type) if node.domain in STANDARD_DOMAINS else None
        if rule is None:
            return self._float(node, f"no integer kernel for {node.domain + '.' if node.domain else ''}"
                                     f"{node.op_type}")
        try:
            return rule(node, self.ctx)
        except Unsupported as exc:
            return self._float(node, str(exc))

    def _float(self, node: onnx.NodeProto, reason: str) -> FLayer:
        inputs = [i for i in node.input if i and i not in self.ctx.constants]
        return FLayer(node.name, "float", inputs, [o for o in node.output if o],
                      source_nodes=[node.name], reason=reason)

    def _fold_affine(self, layer: FLayer) -> None:
        """Constant Mul/Div/Add/Sub (and BatchNormalization) steps after a conv or a table
        become part of it (`npubuild.quant.affine`): one rounding instead of one per step."""
        while layer.kind in affine.FOLDS_AFFINE and len(layer.outputs) == 1:
            out = layer.outputs[0]
            user = self._only_consumer(out)
            if user is None or user.op_type not in affine.AFFINE_OPS or not self._free(user):
                return
            shape = self.ctx.shape(out)
            step = affine.affine_of(user, out, self.ctx.const, shape,
                                    affine.fold_axis(layer, len(shape)))
            if step is None or self.ctx.shape(user.output[0]) != shape:
                return
            if layer.kind == "conv":
                affine.fold_into_conv(layer, *step)
            elif layer.kind == "matmul":
                if not affine.fold_into_matmul(layer, float(step[0][0]), float(step[1][0])):
                    return
            else:
                affine.fold_into_table(layer, float(step[0][0]), float(step[1][0]))
            layer.outputs = [user.output[0]]
            layer.source_nodes.append(user.name)
            self.claimed.add(user.name)

    def _fold_activation(self, layer: FLayer) -> None:
        if layer.kind not in FOLDABLE_INTO or len(layer.outputs) != 1:
            return
        user = self._only_consumer(layer.outputs[0])
        if user is None or user.op_type not in ("Relu", "Clip") or not self._free(user):
            return
        try:
            lo, hi = (0.0, None) if user.op_type == "Relu" else ops.clip_bounds(user, self.ctx)
        except Unsupported:
            return
        layer.activation = ("relu" if user.op_type == "Relu" else "clip", lo, hi)
        layer.outputs = [user.output[0]]
        layer.source_nodes.append(user.name)
        self.claimed.add(user.name)


class FragmentFunction:
    """An element-wise float function evaluated by ONNX Runtime on a one-node model."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self._session = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._session is None:
            self._session = onnx_io.session(self.model)
        name = self._session.get_inputs()[0].name
        flat = np.asarray(x, np.float32).reshape(-1)
        return self._session.run(None, {name: flat})[0].astype(np.float64).reshape(np.shape(x))
