"""A frozen TensorFlow graph's ``While`` bodies written as tf2onnx's Keras RNN rewriters read them.

tf2onnx writes a Keras LSTM or GRU as one ONNX ``LSTM`` or ``GRU`` when the ``While`` body
Keras traced matches its patterns, else as a ``Loop`` over the steps (slow in ONNX Runtime;
import unrolls it only when short). The patterns are tf.keras 2's graphs; Keras 3 traces the
same cells in other ops, which `for_tf2onnx` writes back, each the same values:

- a step's two products summed by Keras 3's ``ops.add`` at batch 1 are
  ``BiasAdd(x·W, Squeeze(h·R))`` (the state's ``[1, n]`` product looks like a bias):
  ``AddV2(x·W, h·R)`` (`_product_sums_as_adds`);
- a value a body computes from the layer's weights alone, the same at every step (a GRU's
  ``ops.split(bias, 2)`` into the input's and the state's biases, each squeezed), is computed
  once and given to the loop as a constant of its own, as tf.keras 2 did
  (`_weight_slices_hoisted`);
- a product plus a 1-D constant is the ``BiasAdd`` of a bias (a GRU's ``h·R + b``;
  `_bias_sums_as_bias_adds`);
- a product cut by ``StridedSlice`` into equal consecutive column blocks (a GRU's state
  product, ``matrix_inner[:, :u]``, ``[:, u:2u]``, ``[:, 2u:]``) is one ``Split``
  (`_column_slices_as_split`);
- a GRU resetting before its recurrent product (``reset_after=False``), for which tf2onnx has
  no Keras pattern, is written as TensorFlow 1's ``GRUCell``, which it has
  (`_reset_before_grus_as_tf1_cells`; `read_gru_cells_without_identities` lets tf2onnx's
  pattern read that cell's weights without the Identities TensorFlow 1 put before them).

A masked LSTM or GRU stays a ``Loop``: Keras selects each step's state by the step's mask row,
and tf2onnx reads a length only from TensorFlow 1's ``sequence_length`` comparisons; a length
(ONNX's ``sequence_lens``) would be the same only where every mask is a prefix, which the data
decide, not the graph (the mask is ``ids != 0``).

Only ``While`` loops of the top-level graph whose body and condition no other node calls are
edited; everything else is left as it is. The import proof checks the converted model.
"""

from __future__ import annotations

import numpy as np

from npubuild.surgery.graph import unique_name

# ops a Keras cell applies to its weights inside a step (what `_weight_slices_hoisted` computes
# once): slicing and reshaping, nothing that reads the step's data
_WEIGHT_OPS = ("Identity", "Split", "SplitV", "Squeeze", "StridedSlice")


def for_tf2onnx(graph_def) -> None:
    """Edit `graph_def`'s loop bodies in place (see the module's docstring)."""
    for function in graph_def.library.function:
        _product_sums_as_adds(function)
    for loop, body, cond in _loops(graph_def):
        constants = _weight_slices_hoisted(graph_def, loop, body, cond)
        _reset_before_grus_as_tf1_cells(graph_def, loop, body, cond, constants)
        _bias_sums_as_bias_adds(body, constants)
        _column_slices_as_split(body, constants)


def _product_sums_as_adds(function) -> None:
    """``BiasAdd(MatMul, Squeeze(MatMul))`` becomes ``AddV2(MatMul, MatMul)``.

    A Keras 3 LSTM cell sums its input's and its state's products with ``ops.add``, which
    TensorFlow's Keras backend writes as ``BiasAdd(x1, Squeeze(x2))`` wherever ``x2`` looks
    like a bias: at batch 1 the state's product ``[1, 4·units]`` does. tf2onnx's Keras LSTM
    rewriter looks for the sum as ``Add(MatMul, MatMul)`` (what Keras writes at any other
    batch), so at batch 1 it left the layer a ``Loop``. Only a squeeze (no dims given) of a
    MatMul's product added to another MatMul's is undone: the squeeze is 1-D (``BiasAdd`` takes
    no other), and both products have the rows of what a step multiplies (its input, the
    state: the batch), so the squeezed one is ``[1, n]``, which ``AddV2`` broadcasts as
    ``BiasAdd`` adds its squeeze, the same sums."""
    nodes = {node.name: node for node in function.node_def}
    renamed: dict[str, str] = {}
    for node in function.node_def:
        if node.op != "BiasAdd" or _attr(node, "data_format", "s", b"") not in (b"", b"NHWC"):
            continue
        squeeze = nodes.get(_name(node.input[1]))
        if squeeze is None or squeeze.op != "Squeeze" or _attr(squeeze, "squeeze_dims", "list"):
            continue
        products = [nodes.get(_name(name)) for name in (node.input[0], squeeze.input[0])]
        if any(n is None or n.op != "MatMul" or _transposed(n) for n in products):
            continue
        node.op = "AddV2"
        node.input[1] = squeeze.input[0]
        if "data_format" in node.attr:
            del node.attr["data_format"]
        renamed[f"{node.name}:output:0"] = f"{node.name}:z:0"  # AddV2's output arg
    _rename_inputs(function, renamed)


def _loops(graph_def):
    """The top-level ``While`` nodes with their body and condition, each called by it alone."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    calls: dict[str, int] = {}
    for node in [*graph_def.node, *(n for f in functions.values() for n in f.node_def)]:
        for value in node.attr.values():
            if value.HasField("func"):
                calls[value.func.name] = calls.get(value.func.name, 0) + 1
    for node in graph_def.node:
        if node.op not in ("While", "StatelessWhile"):
            continue
        body, cond = (functions.get(node.attr[key].func.name) for key in ("body", "cond"))
        if body is not None and cond is not None and all(
                calls[f.signature.name] == 1 for f in (body, cond)):
            yield node, body, cond


def _weight_slices_hoisted(graph_def, loop, body, cond) -> dict[str, np.ndarray]:
    """Values the body computes from constants alone (a GRU's biases split and squeezed) become
    constants the loop is given; returns every body argument that is a constant (the loop's
    own and the new ones) by name, with its value."""
    constants = _constant_arguments(graph_def, loop, body)
    nodes = {node.name: node for node in body.node_def}
    fixed = {name for name, node in nodes.items() if node.op == "Const"}
    derived: set[str] = set()  # computed from the constants by more than an Identity
    changed = True
    while changed:
        changed = False
        for node in body.node_def:
            if node.name in fixed or node.op not in _WEIGHT_OPS:
                continue
            data = [name for name in node.input if not name.startswith("^")]
            if len(data) != len(node.input) or not all(
                    name in constants or _name(name) in fixed for name in data):
                continue
            fixed.add(node.name)
            changed = True
            if node.op != "Identity" or any(_name(name) in derived for name in data):
                derived.add(node.name)
    read = sorted({name for node in body.node_def if node.name not in fixed
                   for name in node.input if _name(name) in derived}
                  | {name for name in body.ret.values() if _name(name) in derived})
    if not read:
        return constants
    values = _evaluate(body, constants, fixed, read)
    arguments = {}
    for name, value in zip(read, values):
        arguments[name] = _add_loop_constant(graph_def, loop, body, cond, value)
        constants[arguments[name]] = value
    _rename_inputs(body, arguments)
    _drop_unread(body, derived)
    return constants


def _constant_arguments(graph_def, loop, body) -> dict[str, np.ndarray]:
    """The body's arguments the loop passes through unchanged from a ``Const`` of the graph."""
    from tensorflow import make_ndarray

    outer = {node.name: node for node in graph_def.node}
    constants = {}
    for index, (arg, out) in enumerate(zip(body.signature.input_arg, body.signature.output_arg)):
        source = outer.get(_name(loop.input[index]))
        if body.ret[out.name] == arg.name and source is not None and source.op == "Const":
            constants[arg.name] = make_ndarray(source.attr["value"].tensor)
    return constants


def _evaluate(body, constants: dict[str, np.ndarray], fixed: set[str],
              read: list[str]) -> list[np.ndarray]:
    """The values of the body's tensors `read` (function-style names), computed by TensorFlow
    from the constant arguments through the body's nodes `fixed`."""
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    for name, value in constants.items():
        graph_def.node.add().CopyFrom(_const_node(tf, name, value))
    for node in body.node_def:
        if node.name in fixed:
            copy = graph_def.node.add()
            copy.CopyFrom(node)
            copy.input[:] = [_graph_style(name) for name in node.input if not name.startswith("^")]
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run([_graph_style(name) for name in read])


def _const_node(tf, name: str, value: np.ndarray):
    node = tf.compat.v1.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return node


def _add_loop_constant(graph_def, loop, body, cond, value: np.ndarray) -> str:
    """`value` as a new constant of the graph passed through the loop: a new argument of the
    body (returned as it came) and of the condition; returns the body's argument's name."""
    import tensorflow as tf

    taken = {node.name for node in graph_def.node}
    source = unique_name(f"{loop.name}/hoisted", taken)
    graph_def.node.add().CopyFrom(_const_node(tf, source, value))
    dtype = tf.as_dtype(value.dtype).as_datatype_enum
    shape = tf.TensorShape(value.shape).as_proto()
    loop.input.append(source)
    loop.attr["T"].list.type.append(dtype)
    for key in ("output_shapes", "_output_shapes"):
        if key in loop.attr:
            loop.attr[key].list.shape.add().CopyFrom(shape)
    if "_num_original_outputs" in loop.attr:
        loop.attr["_num_original_outputs"].i += 1
    names = {arg.name for arg in body.signature.input_arg} | {
        arg.name for arg in body.signature.output_arg} | {node.name for node in body.node_def}
    arg = unique_name("hoisted", names)
    out = unique_name(f"{arg}_out", names)
    body.signature.input_arg.add(name=arg, type=dtype)
    body.signature.output_arg.add(name=out, type=dtype)
    body.ret[out] = arg
    cond_names = {a.name for a in cond.signature.input_arg} | {n.name for n in cond.node_def}
    cond.signature.input_arg.add(name=unique_name("hoisted", cond_names), type=dtype)
    return arg


def _drop_unread(function, candidates: set[str]) -> None:
    """Remove the nodes of `candidates` nothing reads any more (and the constants they read)."""
    while True:
        read = {_name(name.lstrip("^")) for node in function.node_def for name in node.input}
        read |= {_name(name) for name in function.ret.values()}
        unread = [i for i, node in enumerate(function.node_def)
                  if node.name not in read and (node.name in candidates or node.op == "Const")]
        if not unread:
            return
        for i in reversed(unread):
            del function.node_def[i]


def _bias_sums_as_bias_adds(body, constants: dict[str, np.ndarray]) -> None:
    """``AddV2(MatMul, b)`` with ``b`` a 1-D constant argument becomes ``BiasAdd(MatMul, b)``
    (a Keras 3 GRU's ``matrix_inner += recurrent_bias``; tf2onnx reads a bias only from
    ``BiasAdd``): the product is ``[rows, n]`` and ``b`` ``[n]``, the same sums."""
    nodes = {node.name: node for node in body.node_def}
    renamed: dict[str, str] = {}
    for node in body.node_def:
        if node.op not in ("Add", "AddV2") or len(node.input) != 2:
            continue
        first, bias = node.input
        product = nodes.get(_name(first))
        if product is None or product.op != "MatMul":
            bias, first = node.input
            product = nodes.get(_name(first))
        if product is None or product.op != "MatMul" or constants.get(bias) is None:
            continue
        width = _product_width(product, constants, nodes)
        if constants[bias].ndim != 1 or width is None or constants[bias].shape[0] != width:
            continue
        node.op = "BiasAdd"
        node.input[:] = [first, bias]
        node.attr["data_format"].s = b"NHWC"
        renamed[f"{node.name}:z:0"] = f"{node.name}:output:0"  # BiasAdd's output arg
    _rename_inputs(body, renamed)


def _column_slices_as_split(body, constants: dict[str, np.ndarray]) -> None:
    """A step's product (a ``MatMul``, or its ``BiasAdd``) of known width read only by
    ``StridedSlice``s that cut its last axis into equal consecutive blocks covering it (the
    other axes whole, step 1) becomes one ``Split`` into those blocks."""
    while _one_column_split(body, constants):
        pass


def _one_column_split(body, constants: dict[str, np.ndarray]) -> bool:
    """`_column_slices_as_split` on the first product it applies to; whether there was one."""
    import tensorflow as tf

    nodes = {node.name: node for node in body.node_def}
    readers: dict[str, list] = {}
    for node in body.node_def:
        for name in node.input:
            readers.setdefault(_name(name.lstrip("^")), []).append((node, name))
    for name, node in nodes.items():
        width = _product_width(node, constants, nodes)
        if width is None or not readers.get(name) or name in body.ret.values():
            continue
        blocks = [(_column_block(reader, nodes, width), reader.name, value)
                  for reader, value in readers[name]]
        if len({value for _, _, value in blocks}) != 1 or any(b is None for b, _, _ in blocks):
            continue
        spans = sorted((span, reader) for span, reader, _ in blocks)
        count, rank = len(spans), spans[0][0][2]
        size = width // count
        if count < 2 or size * count != width or any(
                span != (i * size, (i + 1) * size, rank) for i, (span, _) in enumerate(spans)):
            continue
        taken = set(nodes)
        axis = body.node_def.add(name=unique_name(f"{name}/columns/axis", taken), op="Const")
        axis.attr["dtype"].type = tf.int32.as_datatype_enum
        axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.int32(rank - 1)))
        taken.add(axis.name)
        split = body.node_def.add(name=unique_name(f"{name}/columns", taken), op="Split",
                                  input=[f"{axis.name}:output:0", blocks[0][2]])
        split.attr["num_split"].i = count
        split.attr["T"].CopyFrom(nodes[spans[0][1]].attr["T"])
        _rename_inputs(body, {f"{reader}:output:0": f"{split.name}:output:{i}"
                              for i, (_, reader) in enumerate(spans)})
        _drop_unread(body, {reader for _, reader in spans})
        return True
    return False


def _column_block(reader, nodes, width: int):
    """(start, stop, rank) of the columns a ``StridedSlice`` takes along the last axis of a
    tensor `width` wide, the other axes whole and every step 1; None for any other reader."""
    from tensorflow import make_ndarray

    if reader.op != "StridedSlice" or any(_attr(reader, m, "i", 0) for m in (
            "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")):
        return None
    parts = [nodes.get(_name(name)) for name in reader.input[1:4]]
    if any(p is None or p.op != "Const" for p in parts):
        return None
    begin, end, strides = (make_ndarray(p.attr["value"].tensor).tolist() for p in parts)
    rank = len(begin)
    whole = (1 << (rank - 1)) - 1  # every axis but the last taken from its start to its end
    begins, ends = (_attr(reader, m, "i", 0) for m in ("begin_mask", "end_mask"))
    if rank < 2 or set(strides) != {1} or (begins & whole) != whole or (ends & whole) != whole:
        return None
    last = 1 << (rank - 1)
    start = 0 if begins & last else begin[-1]
    stop = width if ends & last else end[-1]
    start, stop = (v + width if v < 0 else min(v, width) for v in (start, stop))
    return start, stop, rank


def _product_width(node, constants: dict[str, np.ndarray], nodes=None) -> int | None:
    """The columns of a body's ``MatMul`` by a constant argument (or its Identity), or of its
    ``BiasAdd``; None where unknown."""
    if node.op == "BiasAdd" and nodes is not None:
        node = nodes.get(_name(node.input[0]))
        if node is None:
            return None
    if node.op != "MatMul":
        return None
    weight = node.input[1]
    if nodes is not None:
        while weight not in constants and nodes.get(_name(weight)) is not None \
                and nodes[_name(weight)].op == "Identity":
            weight = nodes[_name(weight)].input[0]
    value = constants.get(weight)
    if value is None or value.ndim != 2:
        return None
    return int(value.shape[0] if _attr(node, "transpose_b", "b", False) else value.shape[1])


def _attr(node, key: str, field: str, default=None):
    """``node``'s attribute ``key``'s ``field`` (``s``, ``b``, ``i``, ``list``: a list's values,
    empty or not), or ``default`` where the node has no such attribute; the node is left as it
    was. Attributes are read with it, never by indexing: indexing a protobuf map adds the key,
    and a SavedModel leaves out attributes at their defaults (a BiasAdd's ``data_format``, a
    MatMul's ``transpose_a``, a StridedSlice's masks), which then had an attribute of no type
    TensorFlow refused when tf2onnx instantiated the function: "Failed to bind all placeholders
    in <Unknown AttrValue type>" (basic-pitch's SavedModel, s2super's)."""
    if key not in node.attr:
        return default
    value = getattr(node.attr[key], field)
    return list(value.i) + list(value.s) + list(value.type) if field == "list" else value


def _transposed(matmul) -> bool:
    return bool(_attr(matmul, "transpose_a", "b", False)
                or _attr(matmul, "transpose_b", "b", False))


def _rename_inputs(function, renamed: dict[str, str]) -> None:
    if not renamed:
        return
    for node in function.node_def:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for key, name in function.ret.items():
        function.ret[key] = renamed.get(name, name)


def _name(tensor: str) -> str:
    """The node (or argument) a function-style tensor name (``node:arg:index``) belongs to."""
    return tensor.split(":")[0]


def _graph_style(tensor: str) -> str:
    """A function-style tensor name as a graph names it: ``node:index`` (every op evaluated
    here has one output argument)."""
    parts = tensor.split(":")
    return tensor if len(parts) == 1 else f"{parts[0]}:{parts[-1]}"


# --- a GRU resetting before the recurrent product, as TensorFlow 1's GRUCell ----------------

_OUTPUT_ARG = {"ConcatV2": "output", "MatMul": "product", "BiasAdd": "output", "Sigmoid": "y",
               "Split": "output", "Mul": "z", "Sub": "z", "AddV2": "z", "Tanh": "y",
               "Relu": "activations", "Const": "output"}


def _reset_before_grus_as_tf1_cells(graph_def, loop, body, cond,
                                    constants: dict[str, np.ndarray]) -> None:
    """A Keras GRU cell with ``reset_after=False`` written as TensorFlow 1's ``GRUCell``, the one
    form of such a GRU tf2onnx maps to an ONNX ``GRU`` (``linear_before_reset=0``).

    Keras: ``z = σ(x·Wz + bz + h·Rz)``, ``r = σ(x·Wr + br + h·Rr)``,
    ``h' = z·h + (1-z)·act(x·Wh + bh + (r·h)·Rh)`` (the input's product split in three, the
    state's by ``Rz|Rr`` sliced in two, ``Rh`` apart); TensorFlow 1: ``[r, z] = σ([x, h]·G +
    [br, bz])`` split in two, ``h' = z·h + (1-z)·act([x, r·h]·C + bh)`` with ``G`` the rows
    ``[Wr Wz; Rr Rz]`` and ``C`` ``[Wh; Rh]``: the same products, each summed over the input's
    and the state's terms at once. `G`, `C` and the biases become constants of the loop."""
    for out in list(body.node_def):
        cell = _reset_before_gru(body, constants, out)
        if cell is None:
            continue
        kernel, bias, state_rz, state_h = (constants[cell[k]] for k in (
            "kernel", "bias", "state_rz", "state_h"))
        u = state_h.shape[0]
        gates = np.concatenate([np.concatenate([kernel[:, u:2 * u], kernel[:, :u]], 1),
                                np.concatenate([state_rz[:, u:], state_rz[:, :u]], 1)], 0)
        candidate = np.concatenate([kernel[:, 2 * u:], state_h], 0)
        values = {"gates": gates, "gates_bias": np.concatenate([bias[u:2 * u], bias[:u]]),
                  "candidate": candidate, "candidate_bias": bias[2 * u:]}
        args = {}
        for name, value in values.items():
            args[name] = _add_loop_constant(graph_def, loop, body, cond, value)
            constants[args[name]] = value
        _write_tf1_cell(body, out, cell, args)


def _reset_before_gru(body, constants, out) -> dict | None:
    """The parts of a Keras ``reset_after=False`` GRU cell whose new state `out` is, or None."""
    nodes = {node.name: node for node in body.node_def}

    def node(tensor):
        return None if tensor is None else nodes.get(_name(tensor))

    def weight(tensor):  # a constant argument, through Identities
        while tensor not in constants and node(tensor) is not None \
                and node(tensor).op == "Identity":
            tensor = node(tensor).input[0]
        return tensor if tensor in constants else None

    def pair(n, ops):  # n's two inputs ordered so that the first one's op is in `ops`
        if n is None or len(n.input) < 2:
            return None, None
        a, b = n.input[:2]
        return (a, b) if node(a) is not None and node(a).op in ops else (b, a)

    if out.op not in ("Add", "AddV2") or len(out.input) != 2:
        return None
    keep, new = (node(t) for t in out.input)
    if keep is None or new is None or keep.op != "Mul" or new.op != "Mul":
        return None
    if node(new.input[0]) is not None and node(new.input[0]).op == "Sigmoid":
        keep, new = new, keep
    z, state = pair(keep, ("Sigmoid",))
    sub, act = pair(new, ("Sub",))
    if node(z) is None or node(z).op != "Sigmoid" or node(state) is not None \
            or node(sub) is None or node(act) is None or node(act).op not in (
                "Tanh", "Relu", "Sigmoid"):
        return None
    one, z_again = node(sub).input[:2]
    if z_again != z or node(one) is None or node(one).op != "Const":
        return None
    from tensorflow import make_ndarray

    if make_ndarray(node(one).attr["value"].tensor).tolist() != 1:
        return None
    x_h, reset = pair(node(node(act).input[0]), ("Split",))  # x_h + (r·h)·Rh
    if node(reset) is None or node(reset).op != "MatMul":
        return None
    r_state, state_h = node(reset).input[:2]
    state_h = weight(state_h)
    if node(r_state) is None or node(r_state).op != "Mul" or state_h is None:
        return None
    r, state_again = pair(node(r_state), ("Sigmoid",))
    if state_again != state or node(r) is None or node(r).op != "Sigmoid":
        return None
    parts = {}
    for gate, tensor in (("z", z), ("r", r)):
        summed = node(node(tensor).input[0])
        if summed is None or summed.op not in ("Add", "AddV2"):
            return None
        parts[gate] = pair(summed, ("Split",))  # (x_g, a column block of h·Rzr)
    split = node(x_h)
    if split is None or any(_name(parts[g][0]) != split.name for g in "zr") \
            or split.op != "Split" \
            or _attr(split, "num_split", "i", 0) != 3 or [parts["z"][0], parts["r"][0], x_h] != [
                f"{split.name}:output:{i}" for i in range(3)]:
        return None
    biased = node(split.input[1])
    if biased is None or biased.op != "BiasAdd":
        return None
    product, bias = node(biased.input[0]), weight(biased.input[1])
    if product is None or product.op != "MatMul" or bias is None:
        return None
    x, kernel = product.input[0], weight(product.input[1])
    blocks = [node(parts[g][1]) for g in "zr"]
    source = {b.input[0] for b in blocks if b is not None}
    if kernel is None or node(x) is None or node(x).op != "TensorListGetItem" \
            or None in blocks or len(source) != 1 or node(next(iter(source))) is None:
        return None
    state_product = node(next(iter(source)))
    state_rz = weight(state_product.input[1]) if state_product.op == "MatMul" else None
    if state_rz is None or state_product.input[0] != state:
        return None
    u = constants[state_h].shape[0]
    spans = [_column_block(b, nodes, 2 * u) for b in blocks]
    if spans != [(0, u, 2), (u, 2 * u, 2)] or constants[state_rz].shape != (u, 2 * u) \
            or constants[state_h].shape != (u, u) or constants[kernel].shape[1:] != (3 * u,) \
            or constants[bias].shape != (3 * u,) or _split_axis(nodes, split) not in (1, -1):
        return None
    if any(_transposed(n) for n in (product, state_product, node(reset))):
        return None
    return {"x": x, "state": state, "kernel": kernel, "bias": bias, "state_rz": state_rz,
            "state_h": state_h, "act": node(act).op, "T": out.attr["T"]}


def _split_axis(nodes, split) -> int | None:
    """The axis a ``Split`` cuts along, where a constant gives it."""
    from tensorflow import make_ndarray

    axis = nodes.get(_name(split.input[0]))
    return None if axis is None or axis.op != "Const" else int(
        make_ndarray(axis.attr["value"].tensor))


def _write_tf1_cell(body, out, cell: dict, args: dict[str, str]) -> None:
    """TensorFlow 1's GRUCell over `cell`'s input and state, its new state replacing `out`'s
    (its weights read as the body's arguments: `read_gru_cells_without_identities`)."""
    import tensorflow as tf

    taken = {node.name for node in body.node_def}

    def add(key, op, inputs, **attrs):
        node = body.node_def.add(name=unique_name(f"{out.name}/tf1_cell/{key}", taken), op=op)
        taken.add(node.name)
        node.input.extend(inputs)
        for name, value in attrs.items():
            node.attr[name].CopyFrom(value)
        return f"{node.name}:{_OUTPUT_ARG[op]}:0"

    t = cell["T"]
    i32 = tf.compat.v1.AttrValue(type=tf.int32.as_datatype_enum)
    no = tf.compat.v1.AttrValue(b=False)
    nhwc = tf.compat.v1.AttrValue(s=b"NHWC")

    def const(key, value):
        return add(key, "Const", [], dtype=tf.compat.v1.AttrValue(
            type=tf.as_dtype(value.dtype).as_datatype_enum),
            value=tf.compat.v1.AttrValue(tensor=tf.make_tensor_proto(value)))

    axis = const("axis", np.int32(1))
    two = tf.compat.v1.AttrValue(i=2)
    inputs = add("inputs", "ConcatV2", [cell["x"], cell["state"], axis], N=two, T=t, Tidx=i32)
    gates = add("gates", "BiasAdd", [
        add("gates_product", "MatMul", [inputs, args["gates"]], T=t, transpose_a=no,
            transpose_b=no), args["gates_bias"]], T=t, data_format=nhwc)
    split = add("split", "Split", [axis, add("sigmoid", "Sigmoid", [gates], T=t)], T=t,
                num_split=tf.compat.v1.AttrValue(i=2))
    r, z = split, f"{split.rsplit(':', 1)[0]}:1"
    reset = add("reset", "Mul", [r, cell["state"]], T=t)
    candidate_inputs = add("candidate_inputs", "ConcatV2", [cell["x"], reset, axis], N=two, T=t,
                           Tidx=i32)
    candidate = add("candidate", "BiasAdd", [
        add("candidate_product", "MatMul", [candidate_inputs, args["candidate"]], T=t,
            transpose_a=no, transpose_b=no), args["candidate_bias"]], T=t, data_format=nhwc)
    act = add("act", cell["act"], [candidate], T=t)
    one = const("one", np.array(1, tf.as_dtype(t.type).as_numpy_dtype))
    new = add("new", "AddV2", [add("keep", "Mul", [z, cell["state"]], T=t), add(
        "mix", "Mul", [add("sub", "Sub", [one, z], T=t), act], T=t)], T=t)
    _rename_inputs(body, {f"{out.name}:z:0": new})
    _drop_unread(body, _ancestors(body, out.name))


def _ancestors(function, name: str) -> set[str]:
    """`name` and the nodes of `function` its value is computed from."""
    nodes = {node.name: node for node in function.node_def}
    found, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in found or current not in nodes:
            continue
        found.add(current)
        todo.extend(_name(i) for i in nodes[current].input if not i.startswith("^"))
    return found


def read_gru_cells_without_identities() -> None:
    """Teach tf2onnx (in its process) TensorFlow 1's GRUCell with its weights the body's own
    arguments: its pattern reads each through an ``Identity`` (as TensorFlow 1's loops read a
    weight), which the graph optimizer tf2onnx runs first removes from a TensorFlow 2 loop
    body. A body the pattern as written does not match is tried again with
    the Identities left out; the rest of tf2onnx's GRU rewriter is its own. A tf2onnx whose
    internals are named otherwise is left as it is (such a GRU then stays a Loop, as before)."""
    from tf2onnx import tfonnx
    from tf2onnx.graph_matcher import OpTypePattern
    from tf2onnx.rewriter import gru_tf2_rewriter

    if not (callable(getattr(gru_tf2_rewriter, "rewrite_gru_tf2", None))
            and callable(getattr(gru_tf2_rewriter, "make_grucell_pattern", None))
            and hasattr(tfonnx, "rewrite_gru_tf2")):
        return
    rewrite, make = gru_tf2_rewriter.rewrite_gru_tf2, gru_tf2_rewriter.make_grucell_pattern
    weights = ("gate_bias", "gate_kernel", "hidden_bias", "hidden_kernel")

    def without_identities(pattern):
        for i, child in enumerate(pattern.inputs or []):
            named = [c.name for c in child.inputs or []]
            if child.op_type == "Identity" and len(named) == 1 and named[0] in weights:
                pattern.inputs[i] = OpTypePattern("Placeholder|PlaceholderV2", name=named[0])
            else:
                without_identities(child)
        return pattern

    def rewrite_gru(g, ops):
        ops = rewrite(g, ops)
        if g.gru_rewriter_context is not None or any(op.is_while() for op in ops):
            return ops  # matched, or a graph whose loops the first call rewrote
        gru_tf2_rewriter.make_grucell_pattern = lambda kind: without_identities(make(kind))
        try:
            return rewrite(g, ops)
        finally:
            gru_tf2_rewriter.make_grucell_pattern = make

    tfonnx.rewrite_gru_tf2 = rewrite_gru
