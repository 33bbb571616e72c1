"""Recurrent layers (ONNX LSTM, GRU, RNN) unrolled over their time steps at import.

No chip's op table has a recurrent layer, and a recurrent layer whose sequence length the
recipe fixes is a fixed chain of ops the NPU already runs with integer kernels: per layer and
direction one MatMul of the whole sequence by the input weights (every step's input product
at once, biases added), split into steps; per step one MatMul of the state by the recurrent
weights, the gates split apart, their activations (Sigmoid and Tanh lookup tables, Relu...),
and the element-wise Mul/Add/Sub of the cell. The states stay ``[1, batch, hidden]`` so a
step's hidden state is a slice of ``Y`` as it is and the last one is ``Y_h`` as it is; ``Y``
is their Concat. Every attribute the ONNX spec gives is honoured (direction forward, reverse
and bidirectional; initial_h and initial_c; layout; activations with their alpha and beta;
clip; GRU's linear_before_reset; LSTM peepholes); an initial state that is a constant of
zeros is no state at all (the first step's recurrent product is left out). The same products
summed in another order: the import proof holds the result to the folding tolerance.

A ``sequence_lens`` (a Keras mask as tf2onnx maps it, a batch of sentences of several lengths;
constant or computed) is honoured per step as ONNX Runtime does: a batch entry's state is
frozen past its length (``h·(1-m) + h'·m`` with the step's mask ``m`` of 0 or 1, exact) and
its output there is 0; the masks are computed once (``Less`` of the step numbers and the
lengths, a Cast, on the CPU) and Split into steps; a constant full length needs none.

A layer stays whole (on the CPU; `why_kept` is the reason split gives) when its sequence
length is not static, a constant ``sequence_lens`` is not one length per batch entry within
the steps, ``input_forget`` couples the LSTM gates, an activation is not one the spec lists, or
steps x gates x directions exceeds `MAX_UNROLLED_GATE_STEPS` (the graph would grow past a size
a compiler handles in reasonable time: about five nodes per gate and step).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild import onnx_io
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.opsets import make_axes_node, make_slice, make_split

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "RNN": ["Tanh"]}
CLIP_INPUTS_OPSET = 11  # Clip takes min and max as inputs from here (before: attributes)
MAX_UNROLLED_GATE_STEPS = 2048  # steps x gates x directions of one layer
# the spec's activation functions: (alpha default, beta default); None where it takes none
ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None),
    "softsign": (None, None), "softplus": (None, None), "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None), "elu": (1.0, None), "hardsigmoid": (0.2, 0.5),
    "affine": (1.0, 0.0), "scaledtanh": (1.0, 1.0)}
_OP_NAMES = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign",
             "softplus": "Softplus", "leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu",
             "elu": "Elu", "hardsigmoid": "HardSigmoid"}

Getter = Callable[[int], "np.ndarray | None"]


def why_kept(op: str, attrs: dict, input_shape: list | None, const: Getter,
             has_input: Callable[[int], bool]) -> str | None:
    """Why import leaves this recurrent layer whole (None: it unrolls it). ``attrs`` are the
    node's attributes (strings decoded), ``input_shape`` the shape of X, ``const(i)`` the value
    of input i when it is a constant, ``has_input(i)`` whether input i is given."""
    layout = attrs.get("layout", 0)
    if not input_shape or len(input_shape) != 3 or not all(isinstance(d, int) and d > 0
                                                           for d in input_shape):
        return "its sequence length is not static (fix the input shape in the recipe)"
    steps, batch = (input_shape[1], input_shape[0]) if layout else (input_shape[0], input_shape[1])
    if any(has_input(i) and const(i) is None for i in (1, 2, 3, 7)):
        return "its weights are not constants"
    if has_input(4):
        lens = const(4)
        if lens is not None and (lens.shape != (batch,) or np.any(lens < 1)
                                 or np.any(lens > steps)):
            return (f"its sequence_lens {lens.tolist()} is not one length per batch entry "
                    f"within 1..{steps}")
    if attrs.get("input_forget", 0):
        return "input_forget couples its input and forget gates"
    names = attrs.get("activations") or DEFAULT_ACTIVATIONS[op]
    unknown = sorted({a for a in names if a.lower() not in ACTIVATIONS})
    if unknown:
        return f"activation {unknown[0]} is not one of the ONNX spec's"
    directions = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    size = steps * GATES[op] * directions
    if size > MAX_UNROLLED_GATE_STEPS:
        return (f"{steps} steps x {GATES[op]} gates x {directions} directions = {size} is more "
                f"than import unrolls ({MAX_UNROLLED_GATE_STEPS})")
    return None


def unroll(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Each recurrent layer `why_kept` accepts written out step by step (the module's text);
    the model unchanged when there is none. Also, by node name, why the others stayed whole."""
    if not any(n.op_type in RECURRENT_OPS and n.domain in STANDARD_DOMAINS
               for n in model.graph.node):
        return model, {}
    from npubuild.fusions.graph import prune

    source, model = model, onnx_io.clone(model)
    graph, opset = model.graph, onnx_io.opset_of(model)
    inits = {t.name: t for t in graph.initializer}
    shapes = {v.name: onnx_io.value_shape(v)
              for v in [*graph.input, *graph.value_info, *graph.output]}
    nodes, kept, replaced = [], {}, set()
    for index, node in enumerate(graph.node):
        if node.op_type not in RECURRENT_OPS or node.domain not in STANDARD_DOMAINS:
            nodes.append(node)
            continue
        layer = _Layer(node, index, inits, opset)
        reason = why_kept(node.op_type, layer.attrs, shapes.get(node.input[0]), layer.const,
                          layer.has_input)
        if reason:
            kept[node.name or node.output[0]] = reason
            nodes.append(node)
            continue
        nodes.extend(layer.unrolled(shapes[node.input[0]]))
        graph.initializer.extend(layer.params)
        # its weights, and any output nothing reads (the nodes that would compute it)
        replaced.update(t for t in [*node.input[1:], *node.output] if t)
    if not replaced:  # every layer stayed whole
        return source, kept
    del graph.node[:]
    graph.node.extend(nodes)
    prune(model, replaced)
    return onnx_io.reinfer_shapes(model), kept


class _Layer:
    """One recurrent node and the nodes and constants that write it out."""

    def __init__(self, node: onnx.NodeProto, index: int, inits: dict, opset: int):
        self.node, self.op, self.inits, self.opset = node, node.op_type, inits, opset
        self.attrs = attributes(node)
        self.base = node.name or f"{node.op_type}_{index}"
        self.hidden = self.attrs["hidden_size"]
        self.params: list[onnx.TensorProto] = []
        self.values: dict[str, np.ndarray] = {}  # the params by name
        self.arguments: dict[tuple, str] = {}  # an op argument's dtype, shape, bytes -> param
        self.nodes: list[onnx.NodeProto] = []

    def has_input(self, i: int) -> bool:
        return len(self.node.input) > i and bool(self.node.input[i])

    def const(self, i: int) -> np.ndarray | None:
        name = self.node.input[i] if self.has_input(i) else ""
        return numpy_helper.to_array(self.inits[name]) if name in self.inits else None

    # ---- building blocks ---------------------------------------------------------------

    def param(self, name: str, value: np.ndarray) -> str:
        name = f"{self.base}/unroll/{name}"
        self.params.append(numpy_helper.from_array(np.array(value), name))  # C order, 0-d kept
        self.values[name] = value
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """A param every step reads (one copy of the recurrent weights per direction)."""
        full = f"{self.base}/unroll/{name}"
        return full if full in self.values else self.param(name, value)

    def product(self, x: str, r: np.ndarray, name: str, weight: str) -> str:
        """``x · r`` (``r`` the shared param ``weight``): a constant when ``x`` is one (a
        constant initial state), so no node computes on constants only."""
        if x in self.values:
            return self.param(name, (self.values[x] @ r).astype(np.float32))
        return self.add("MatMul", [x, self.shared(weight, r)], name)

    def product_by(self, x: str, m: str, name: str) -> str:
        """``x · m`` element-wise: a constant when both are (a constant initial state)."""
        if x in self.values and m in self.values:
            return self.param(name, (self.values[x] * self.values[m]).astype(np.float32))
        return self.add("Mul", [x, m], name)

    # what `npubuild.surgery.opsets`' makers ask of an Editor (their names are full names)
    def add_initializer(self, value: np.ndarray, hint: str) -> str:
        """A constant argument (Split sizes, Slice starts...): one per distinct value."""
        value = np.asarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self.arguments:
            self.params.append(numpy_helper.from_array(value, hint))
            self.values[hint] = value
            self.arguments[key] = hint
        return self.arguments[key]

    def make_node(self, op_type: str, inputs: list[str], outputs: list[str], name_hint: str,
                  **attrs) -> onnx.NodeProto:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name_hint, **attrs))
        return self.nodes[-1]

    def add(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        """One node named ``name`` (under the layer's), its one output named as it is."""
        name = f"{self.base}/unroll/{name}"
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def split(self, x: str, sizes: list[int], axis: int, name: str) -> list[str]:
        if len(sizes) == 1:
            return [x]
        outs = [f"{self.base}/unroll/{name}_{i}" for i in range(len(sizes))]
        make_split(self, x, outs, sizes, axis, f"{self.base}/unroll/{name}")
        return outs

    def transpose(self, x: str, perm: list[int], out: str) -> str:
        self.nodes.append(helper.make_node("Transpose", [x], [out], name=f"{out}/layout",
                                           perm=perm))
        return out

    def activation(self, kind: str, alpha: float | None, beta: float | None, x: str,
                   name: str) -> str:
        """``kind`` (the spec's name, lower case) of ``x`` as ONNX ops."""
        if kind in _OP_NAMES:
            attrs = {"alpha": alpha} if alpha is not None else {}
            if beta is not None:
                attrs["beta"] = beta
            return self.add(_OP_NAMES[kind], [x], name, **attrs)
        if kind == "scaledtanh":  # alpha · tanh(beta · x)
            scaled = self.add("Mul", [x, self.param(f"{name}_beta", np.float32(beta))],
                              f"{name}_in")
            inner = self.add("Tanh", [scaled], f"{name}_tanh")
            return self.add("Mul", [inner, self.param(f"{name}_alpha", np.float32(alpha))], name)
        scaled = self.add("Mul", [x, self.param(f"{name}_alpha", np.float32(alpha))], f"{name}_mul")
        return self.add("Add", [scaled, self.param(f"{name}_beta", np.float32(beta))], name)

    # ---- the layer -----------------------------------------------------------------------

    def functions(self, directions: int) -> list[list[tuple[str, float | None, float | None]]]:
        """Per direction, the activations with their alpha and beta (the spec consumes
        ``activation_alpha`` and ``activation_beta`` in order, by the functions that take one)."""
        names = [a.lower() for a in self.attrs.get("activations") or
                 DEFAULT_ACTIVATIONS[self.op] * directions]
        alphas = list(self.attrs.get("activation_alpha", []))
        betas = list(self.attrs.get("activation_beta", []))
        out = []
        for kind in names:
            alpha, beta = ACTIVATIONS[kind]
            alpha = (alphas.pop(0) if alphas else alpha) if alpha is not None else None
            beta = (betas.pop(0) if betas else beta) if beta is not None else None
            out.append((kind, alpha, beta))
        per = len(DEFAULT_ACTIVATIONS[self.op])
        return [out[d * per:(d + 1) * per] for d in range(directions)]

    def unrolled(self, x_shape: list[int]) -> list[onnx.NodeProto]:
        layout = self.attrs.get("layout", 0)
        steps, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
        direction = self.attrs.get("direction", "forward")
        dirs = [False, True] if direction == "bidirectional" else [direction == "reverse"]
        x = self.node.input[0]
        if layout:
            x = self.transpose(x, [1, 0, 2], f"{self.base}/unroll/x_seq_major")
        funcs = self.functions(len(dirs))
        masks = self.masks(steps, batch)
        ys, hs, cs = [], [], []
        for d, reverse in enumerate(dirs):
            y, h, c = self.direction(d, reverse, x, steps, batch, funcs[d], masks)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        self.outputs(ys, hs, cs, layout)
        return self.live()

    def masks(self, steps: int, batch: int) -> list[tuple[str, str] | None]:
        """Per step, the mask ``m`` [1, batch, 1] of the batch entries whose sequence it is in
        and ``1 - m``, or None where every entry's is (no ``sequence_lens``: every step)."""
        if not self.has_input(4):
            return [None] * steps
        lens = self.const(4)
        if lens is not None:
            m = (np.arange(steps)[:, None] < lens[None, :]).astype(np.float32)[:, None, :, None]
            return [None if m[t].all() else (self.param(f"mask_t{t}", m[t]),
                                             self.param(f"unmask_t{t}", 1 - m[t]))
                    for t in range(steps)]
        rows = self.add("Reshape", [self.node.input[4], self.param(
            "lens_shape", np.array([1, batch, 1], np.int64))], "lens_rows")
        order = self.param("step_numbers", np.arange(steps, dtype=np.int64).reshape(steps, 1, 1))
        lens = self.add("Cast", [rows], "lens_i64", to=onnx.TensorProto.INT64)
        inside = self.add("Less", [order, lens], "inside")
        m = self.add("Cast", [inside], "masks", to=onnx.TensorProto.FLOAT)
        unmask = self.add("Sub", [self.param("one", np.float32(1)), m], "unmasks")
        return list(zip(self.split(m, [1] * steps, 0, "mask"),
                        self.split(unmask, [1] * steps, 0, "unmask")))

    def live(self) -> list[onnx.NodeProto]:
        """The nodes that lead to an output the layer names, and the params they read: what
        no output needs (Y when only Y_c is named, the last state) is not computed."""
        read = {o for o in self.node.output if o}
        nodes = []
        for node in reversed(self.nodes):
            if read & set(node.output):
                nodes.append(node)
                read.update(node.input)
        self.params = [p for p in self.params if p.name in read]
        return nodes[::-1]

    def state(self, i: int, d: int, batch: int, name: str) -> str | None:
        """Direction d's initial state from input i as ``[1, batch, hidden]`` (None: zeros)."""
        if not self.has_input(i):
            return None
        value = self.const(i)
        if value is not None:
            if not value.any():
                return None
            value = value.transpose(1, 0, 2) if self.attrs.get("layout", 0) else value
            return self.param(f"{name}{d}", value[d:d + 1])
        source = self.node.input[i]
        if self.attrs.get("layout", 0):
            source = f"{self.base}/unroll/{name}_seq_major"
            if d == 0:
                self.transpose(self.node.input[i], [1, 0, 2], source)
        if self.attrs.get("direction", "forward") != "bidirectional":
            return source
        out = f"{self.base}/unroll/{name}{d}"
        make_slice(self, source, out, [(0, d, d + 1, 1)], out)
        return out

    def direction(self, d: int, reverse: bool, x: str, steps: int, batch: int,
                  funcs: list, masks: list) -> tuple[str, str, str | None]:
        hid, gates = self.hidden, GATES[self.op]
        w = self.const(1)[d]  # [G·H, input]
        r = self.const(2)[d]  # [G·H, H]
        b = self.const(3)[d] if self.has_input(3) else np.zeros(2 * gates * hid, np.float32)
        wb, rb = b[:gates * hid], b[gates * hid:]
        lbr = self.op == "GRU" and self.attrs.get("linear_before_reset", 0)
        # the recurrent bias joins the input product's, except the GRU's candidate gate where
        # linear_before_reset puts it inside the reset product
        bias = wb + rb
        if lbr:
            bias[2 * hid:] = wb[2 * hid:]
        tag = f"d{d}"
        xw = self.add("MatMul", [x, self.param(f"{tag}_W", w.T)], f"{tag}_xw")
        xw = self.add("Add", [xw, self.param(f"{tag}_bias", bias.astype(np.float32))], f"{tag}_xwb")
        xs = self.split(xw, [1] * steps, 0, f"{tag}_steps")
        h = self.state(5, d, batch, "initial_h")
        c = self.state(6, d, batch, "initial_c") if self.op == "LSTM" else None
        peep = self.const(7)[d] if self.op == "LSTM" and self.has_input(7) else None
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        ys: dict[int, str] = {}
        for t in order:
            step = _Step(self, f"{tag}_t{t}", funcs, self.attrs.get("clip"))
            before = (h, c)
            if self.op == "LSTM":
                h, c = step.lstm(xs[t], h, c, r, peep)
            elif self.op == "GRU":
                h = step.gru(xs[t], h, r, rb[2 * hid:] if lbr else None)
            else:
                h = step.rnn(xs[t], h, r)
            ys[t] = h
            if masks[t] is not None:  # past its length an entry's state is frozen, its output 0
                ys[t] = step.add("Mul", [h, masks[t][0]], "y_masked")
                h = step.frozen(before[0], h, ys[t], masks[t], "h")
                if c is not None:
                    c = step.frozen(before[1], c, None, masks[t], "c")
        y = self.add("Concat", [ys[t] for t in range(steps)], f"{tag}_y", axis=0) \
            if steps > 1 else ys[0]
        return y, h, c

    def outputs(self, ys: list[str], hs: list[str], cs: list, layout: int) -> None:
        """Y ``[seq, dirs, batch, H]``, Y_h and Y_c ``[dirs, batch, H]`` (layout 1: batch first)."""
        names = [(0, "Y"), (1, "Y_h"), (2, "Y_c")]
        for i, name in names:
            if not (len(self.node.output) > i and self.node.output[i]):
                continue
            if i == 0:
                parts = [self.unsqueezed(y, f"y{d}") for d, y in enumerate(ys)]
                perm = [2, 0, 1, 3]
                axis = 1
            else:
                parts, perm, axis = (hs if i == 1 else cs), [1, 0, 2], 0
            self.joined(parts, axis, perm if layout else None, self.node.output[i], name)

    def unsqueezed(self, x: str, name: str) -> str:
        """``x`` with a directions axis of 1 at axis 1."""
        out = f"{self.base}/unroll/{name}_dirs"
        make_axes_node(self, "Unsqueeze", [x], [out], [1], out)
        return out

    def joined(self, parts: list[str], axis: int, perm: list[int] | None, out: str,
               name: str) -> None:
        if len(parts) == 1 and perm is None:
            self.nodes.append(helper.make_node("Identity", parts, [out], name=f"{self.base}/unroll/"
                                               f"{name}"))
            return
        whole = out if perm is None else f"{self.base}/unroll/{name}_seq_major"
        if len(parts) == 1:
            whole = parts[0]
        else:
            self.nodes.append(helper.make_node("Concat", parts, [whole], axis=axis,
                                               name=f"{self.base}/unroll/{name}"))
        if perm is not None:
            self.transpose(whole, perm, out)


class _Step:
    """One time step of one direction: its gates, cell and new state."""

    def __init__(self, layer: _Layer, tag: str, funcs: list, clip: float | None):
        self.layer, self.tag, self.funcs, self.clip = layer, tag, funcs, clip
        self.direction = tag.split("_")[0]  # the weights' owner: d0 or d1

    def add(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        return self.layer.add(op, inputs, f"{self.tag}_{name}", **attrs)

    def frozen(self, old: str | None, new: str, masked: str | None, mask: tuple[str, str],
               name: str) -> str:
        """``old·(1-m) + new·m`` (``new·m`` when ``masked`` has it, ``old`` None: zeros):
        one product is 0, so the sum is exact."""
        masked = masked or self.add("Mul", [new, mask[0]], f"{name}_new")
        if old is None:
            return masked
        kept = self.layer.product_by(old, mask[1], f"{self.tag}_{name}_old")
        return self.add("Add", [kept, masked], f"{name}_frozen")

    def act(self, which: int, x: str, name: str) -> str:
        # clip bounds the gates' inputs; ONNX Runtime leaves the LSTM's output activation be
        clipped = self.clip is not None and not (self.layer.op == "LSTM" and which == 2)
        if clipped and self.layer.opset < CLIP_INPUTS_OPSET:
            x = self.add("Clip", [x], f"{name}_clip", min=-self.clip, max=self.clip)
        elif clipped:
            x = self.add("Clip", [x, self.layer.shared("clip_lo", np.float32(-self.clip)),
                                  self.layer.shared("clip_hi", np.float32(self.clip))],
                         f"{name}_clip")
        kind, alpha, beta = self.funcs[which]
        return self.layer.activation(kind, alpha, beta, x, f"{self.tag}_{name}")

    def recurrent(self, h: str | None, r: np.ndarray, xw: str, name: str) -> str:
        """``xw + h · rᵀ`` (xw alone without a state)."""
        if h is None:
            return xw
        hr = self.layer.product(h, r.T, f"{self.tag}_{name}_hr",
                                f"{self.direction}_R")
        return self.add("Add", [xw, hr], f"{name}_pre")

    def lstm(self, xw: str, h: str | None, c: str | None, r: np.ndarray,
             peep: np.ndarray | None) -> tuple[str, str]:
        hid = self.layer.hidden
        pre = self.recurrent(h, r, xw, "gates")
        gi, go, gf, gc = self.layer.split(pre, [hid] * 4, 2, f"{self.tag}_gate")
        if peep is not None and c is not None:
            gi = self.peephole(gi, c, peep[:hid], "i")
            gf = self.peephole(gf, c, peep[2 * hid:], "f")
        i = self.act(0, gi, "i")
        f = self.act(0, gf, "f") if c is not None else None  # else it forgets nothing
        cell = self.add("Mul", [i, self.act(1, gc, "c")], "ig")
        if f is not None:
            cell = self.add("Add", [self.add("Mul", [f, c], "fc"), cell], "cell")
        if peep is not None:
            go = self.peephole(go, cell, peep[hid:2 * hid], "o")
        o = self.act(0, go, "o")
        return self.add("Mul", [o, self.act(2, cell, "h")], "hidden"), cell

    def peephole(self, gate: str, c: str, p: np.ndarray, name: str) -> str:
        if c in self.layer.values:  # a constant initial cell
            pc = self.layer.param(f"{self.tag}_p{name}",
                                  (self.layer.values[c] * p).astype(np.float32))
        else:
            weight = self.layer.shared(f"{self.direction}_P{name}", p.astype(np.float32))
            pc = self.add("Mul", [c, weight], f"p{name}")
        return self.add("Add", [gate, pc], f"{name}_peep")

    def gru(self, xw: str, h: str | None, r: np.ndarray, rbh: np.ndarray | None) -> str:
        hid = self.layer.hidden
        xz, xr, xh = self.layer.split(xw, [hid] * 3, 2, f"{self.tag}_xgate")
        if h is None:  # zero state: z · h is 0, the reset product is its bias
            z = self.act(0, xz, "z")
            if rbh is not None:
                rr = self.act(0, xr, "r")
                xh = self.add("Add", [xh, self.add("Mul", [rr, self.layer.shared(
                    f"{self.direction}_Rbh", rbh.astype(np.float32))], "r_rbh")], "h_pre")
            n = self.act(1, xh, "n")
            return self.add("Sub", [n, self.add("Mul", [z, n], "zn")], "hidden")
        zr = self.add("Add", [self.layer.add("Concat", [xz, xr], f"{self.tag}_xzr", axis=2),
                              self.layer.product(h, r[:2 * hid].T, f"{self.tag}_hzr",
                                                 f"{self.direction}_Rzr")], "zr_pre")
        gz, gr = self.layer.split(zr, [hid] * 2, 2, f"{self.tag}_zr")
        z, rr = self.act(0, gz, "z"), self.act(0, gr, "r")
        rh = r[2 * hid:].T
        if rbh is not None:  # r · (h · Rhᵀ + Rbh)
            if h in self.layer.values:
                hh = self.layer.param(f"{self.tag}_hhb", (self.layer.values[h] @ rh + rbh)
                                      .astype(np.float32))
            else:
                bias = self.layer.shared(f"{self.direction}_Rbh", rbh.astype(np.float32))
                hh = self.add("Add", [self.layer.product(h, rh, f"{self.tag}_hh",
                                                         f"{self.direction}_Rh"), bias], "hhb")
            cand = self.add("Mul", [rr, hh], "rhh")
        else:  # (r · h) · Rhᵀ
            cand = self.add("MatMul", [self.add("Mul", [rr, h], "rh"),
                                       self.layer.shared(f"{self.direction}_Rh", rh)], "rhh")
        n = self.act(1, self.add("Add", [xh, cand], "h_pre"), "n")
        # (1 - z) · n + z · h = n + z · (h - n)
        return self.add("Add", [n, self.add("Mul", [z, self.add("Sub", [h, n], "h_n")], "zhn")],
                        "hidden")

    def rnn(self, xw: str, h: str | None, r: np.ndarray) -> str:
        return self.act(0, self.recurrent(h, r, xw, "gates"), "hidden")


def attributes(node: onnx.NodeProto) -> dict:
    """The node's attributes, strings (and lists of them) decoded."""
    return {a.name: _decoded(helper.get_attribute_value(a)) for a in node.attribute}


def _decoded(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value
