"""Loading, saving and running ONNX models: the one place every stage does it.

Loading turns a missing, corrupt or unsafe model into a `UserError`; saving is atomic (a
temporary file renamed into place); running uses ONNX Runtime on the CPU. Models are saved with
an IR version ONNX Runtime reads (onnx 1.23 writes IR 14 by default, onnxruntime 1.31 reads ≤ 13).
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Iterable, Mapping

import lazy_loader as lazy

from npubuild import threads
from npubuild.atomic import atomic_path
from npubuild.errors import BuildError, Location, UserError

np = lazy.load("numpy")
onnx = lazy.load("onnx")

MAX_ORT_IR_VERSION = 10
# Initializers larger than this (elements) are weights: structural tools (shape inference,
# the version converter, the inliner) work on a skeleton without them, and ONNX Runtime
# receives them as in-memory external data instead of inside the serialized model. A VGG-19
# carries 574 MB of weights; serializing and parsing them once per session, per inference
# and per conversion cost minutes per stage.
LARGE_ELEMENTS = 4096
LARGE_SESSION_BYTES = 1 << 24
STANDARD_DOMAINS = ("", "ai.onnx")  # the default domain, by either name
RUNTIME_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")  # ops ONNX Runtime implements  # what onnxruntime ≥ 1.16 reads; onnx ≥ 1.15 can write it


def load_model(path: str | Path, *, load_external: bool = True) -> onnx.ModelProto:
    """Read an ONNX model, refusing external-data paths that leave the model's folder."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"model file not found: {path}", hint="check model.path in the recipe")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise UserError(f"not a readable ONNX model ({type(exc).__name__}: {exc})",
                        location=Location(str(path))) from None
    if not model.graph.node and not model.graph.output:
        raise UserError("not a readable ONNX model (empty graph)", location=Location(str(path)))
    _check_text(model, path)
    _check_external_data(model, path)
    if load_external:
        _read_external_data(model, path)
    return model


def load_skeleton(path: str | Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The model as stored (its external data not read) and its `skeleton`, whose small
    initializers hold their values even where the file keeps them outside: an exporter that
    writes a ``.onnx.data`` file (PyTorch's) moves biases and norms there too, and the checker
    and shape inference need the values they propagate. The large weights stay typed inputs,
    never read."""
    path = Path(path)
    source = load_model(path, load_external=False)
    light = skeleton(source)
    _read_external_data(light, path)
    return source, light


def _read_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Read every tensor's external data (locations checked by `_check_external_data`)."""
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:  # onnx's ValidationError, OSError, ...: the file's fault
        raise UserError(f"cannot read the model's external data ({type(exc).__name__}: "
                        f"{exc})", location=Location(str(path))) from None


def _check_text(model: onnx.ModelProto, path: Path) -> None:
    """Every string field is UTF-8, as ONNX requires: protobuf hands a non-UTF-8 one (a
    producer, a node or tensor name) over as ``bytes``, which later breaks every name lookup,
    message and JSON file. Numeric and ``bytes`` fields (the weights) are not walked; the
    field's path is worked out only for a model that has such a string."""
    if _bytes_in_strings(model):
        where, name, value = _bytes_in_strings(model, with_path=True)
        raise UserError(f"not a valid ONNX model: {_field_name(where, name)} is not UTF-8 "
                        f"text ({value[:40]!r})", location=Location(str(path)),
                        hint="ONNX strings must be UTF-8; re-export the model")


def _bytes_in_strings(model: onnx.ModelProto, with_path: bool = False):
    """The first string field holding ``bytes``: truthy (with ``with_path``: (where, field
    name, value), ``where`` as nested (parent, field, index) tuples), else None."""
    from google.protobuf.descriptor import FieldDescriptor

    string, message_type = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    stack: list = [(model, ())]
    while stack:
        message, where = stack.pop()
        for fd, value in message.ListFields():
            kind = fd.type
            if kind == message_type:
                if not fd.is_repeated:
                    stack.append((value, (where, fd.name, None) if with_path else ()))
                elif with_path:
                    stack.extend((item, (where, fd.name, i)) for i, item in enumerate(value))
                else:
                    stack.extend((item, ()) for item in value)
            elif kind == string:
                items = value if fd.is_repeated else (value,)
                for i, item in enumerate(items):
                    if type(item) is bytes:
                        name = f"{fd.name}[{i}]" if fd.is_repeated else fd.name
                        return (where, name, item) if with_path else True
    return None


def _field_name(where: tuple, name: str) -> str:
    """``graph.node[3].name`` from the nested (parent, field, index) tuples of `_check_text`."""
    parts = [name]
    while where:
        where, field, index = where
        parts.append(field if index is None else f"{field}[{index}]")
    return ".".join(reversed(parts))


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` (initializer or attribute) keeps its data in another file."""
    return any(tensor.data_location == onnx.TensorProto.EXTERNAL
               for tensor in onnx.external_data_helper._get_all_tensors(model))


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    base = path.parent.resolve()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        refuse = _refusal(tensor.name, location, path)
        if not location or "\0" in location or location.endswith(("/", "\\")):
            raise refuse("which is not a file name")
        try:
            target = (base / location).resolve()
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a too-long name
            raise refuse(f"which cannot be resolved ({exc.__class__.__name__}: "
                         f"{getattr(exc, 'strerror', None) or exc})") from None
        if base not in target.parents:
            raise refuse("outside the model's folder; refusing to read it")
        if not target.is_file():  # a directory, a FIFO or a device: nothing onnx can read
            raise refuse("which is not a regular file")
        try:
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
        except ValueError:
            end = -1
        if end < 0 or end > target.stat().st_size:
            raise UserError(f"tensor {tensor.name!r}: its external data (offset + length {end}) "
                            f"does not lie inside {info.get('location')!r} "
                            f"({target.stat().st_size} bytes)", location=Location(str(path)))


def _refusal(tensor: str, location: str, path: Path):
    """The error for one tensor's external-data location, given why it is refused."""
    def refuse(why: str) -> UserError:
        return UserError(f"tensor {tensor!r} keeps its data at {location[:200]!r}, {why}",
                         location=Location(str(path)))
    return refuse


def with_loadable_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    """Cap the IR version at what ONNX Runtime reads (a copy only when it changes)."""
    if model.ir_version > MAX_ORT_IR_VERSION:
        model = clone(model)
        model.ir_version = MAX_ORT_IR_VERSION
    return model


def save_model(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write atomically; the saved model always has an IR version ONNX Runtime reads."""
    path = Path(path)
    with atomic_path(path) as tmp:
        onnx.save(with_loadable_ir(model), str(tmp))
    return path


def clone(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))


def _copy_except(message, skipped: str):
    """A copy of a protobuf message without one field (which is never copied)."""
    copy = type(message)()
    for fd, value in message.ListFields():
        if fd.name == skipped:
            continue
        if fd.is_repeated:
            getattr(copy, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(copy, fd.name).CopyFrom(value)
        else:
            setattr(copy, fd.name, value)
    return copy


def weight_bytes(model: onnx.ModelProto) -> int:
    """The initializers' size from their dims (``ByteSize`` walks the data: seconds for GBs)."""
    return sum(_elements(t) * itemsize(t.data_type) for t in model.graph.initializer)


def itemsize(data_type: int) -> int:
    """Bytes per element of an ONNX tensor type (0 for strings and for a type code onnx does
    not know, which the checker refuses)."""
    try:
        return 0 if data_type == onnx.TensorProto.STRING else \
            onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except KeyError:
        return 0


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of everything but the graph's initializers, which are never copied."""
    light = _copy_except(model, "graph")
    light.graph.CopyFrom(_copy_except(model.graph, "initializer"))
    return light


def skeleton(model: onnx.ModelProto, max_elements: int = LARGE_ELEMENTS) -> onnx.ModelProto:
    """A copy for structural tools: initializers over ``max_elements`` become typed graph
    inputs (shape inference, the version converter and the inliner see the same types and
    shapes, and the small constants they propagate, without copying the weights)."""
    light = _without_initializers(model)
    large = [t for t in model.graph.initializer if _elements(t) > max_elements]
    names = {t.name for t in large}
    listed = {i.name for i in light.graph.input}  # old IR lists initializers as inputs
    light.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in large if t.name not in listed)
    light.graph.initializer.extend(t for t in model.graph.initializer if t.name not in names)
    return light


def with_weights(skeleton_model: onnx.ModelProto, original: onnx.ModelProto,
                 max_elements: int = LARGE_ELEMENTS) -> onnx.ModelProto:
    """``skeleton_model`` (a structural transform of ``skeleton(original)``) with the large
    initializers of ``original`` back in place of the graph inputs that stood for them."""
    large = [t for t in original.graph.initializer if _elements(t) > max_elements]
    names = {t.name for t in large}
    listed = {i.name for i in original.graph.input} & names  # old IR lists them as inputs
    kept = [i for i in skeleton_model.graph.input if i.name not in names or i.name in listed]
    del skeleton_model.graph.input[:]
    skeleton_model.graph.input.extend(kept)
    used = {i for n in skeleton_model.graph.node for i in n.input} | listed
    skeleton_model.graph.initializer.extend(t for t in large if t.name in used)
    return skeleton_model


def infer_shapes(model: onnx.ModelProto, **kwargs) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` on the skeleton (no weights copied): the result
    types every value; its large initializers are graph inputs, so use it for types only."""
    return onnx.shape_inference.infer_shapes(skeleton(model), **kwargs)


def _external_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with its large initializers as in-memory external data (for ONNX Runtime's
    ``add_external_initializers``), and their values."""
    light = _without_initializers(model)
    values = {}
    for tensor in model.graph.initializer:
        if (_elements(tensor) <= LARGE_ELEMENTS or tensor.data_type == onnx.TensorProto.STRING
                or tensor.data_location == onnx.TensorProto.EXTERNAL):
            light.graph.initializer.append(tensor)
            continue
        values[tensor.name] = np.ascontiguousarray(onnx.numpy_helper.to_array(tensor))
        ref = light.graph.initializer.add(name=tensor.name, data_type=tensor.data_type,
                                          dims=tensor.dims, data_location=onnx.TensorProto.EXTERNAL)
        ref.external_data.add(key="location", value="in-memory")
    return light, values


def session(model: onnx.ModelProto | str | Path, optimized: bool = False,
            spinning: bool = False):
    """An ONNX Runtime CPU session (graph optimisations off: we check *our* rewrites; on with
    ``optimized``, as a deployment opens one). ``spinning``: its pool's threads spin while
    they wait, as ONNX Runtime's default has them (for a session timed alone)."""
    import onnxruntime as ort

    if not isinstance(model, (str, Path)) and (missing := missing_functions(model)):
        raise BuildError(f"the model calls {', '.join(missing)} but carries no function for "
                         "it (a model-local function was dropped on the way)",
                         hint="every model a stage writes must keep the functions its nodes "
                              "call; report this with the recipe")
    # Fatal only: every error ONNX Runtime logs also reaches us as its exception, which we
    # word for the user; printed too, it is noise (and warnings more so).
    ort.set_default_logger_severity(4)
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 4
    # Threads and spinning: npubuild.threads' policy (a build holds many sessions at once, one
    # per CPU layer of the integer reference, per segment, per probe, often beside another
    # build); ``spinning`` opens one as a deployment runs it (≤ 2 threads, spinning).
    threads.apply_to_session(options, deployed=spinning)
    weights: dict[str, np.ndarray] = {}
    if isinstance(model, (str, Path)):
        source = str(model)
    else:
        if weight_bytes(model) > LARGE_SESSION_BYTES:
            model, weights = _external_weights(model)
            names = list(weights)
            options.add_external_initializers(
                names, [ort.OrtValue.ortvalue_from_numpy(weights[n]) for n in names])
        source = with_loadable_ir(model).SerializeToString()
    try:
        sess = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BuildError(f"ONNX Runtime cannot load the model: {exc}") from None
    sess.npubuild_weights = weights  # ONNX Runtime reads them in place: keep them alive
    return sess


def run(model_or_session, feeds: Mapping[str, np.ndarray],
        outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run a model (or a session) and return its outputs by name."""
    sess = model_or_session if hasattr(model_or_session, "run") else session(model_or_session)
    names = outputs or [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    values = sess.run(names, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(names, values))


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: graph inputs that are not initializers (old models list both)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def opset_of(model: onnx.ModelProto, domain: str = "") -> int:
    """The version ``model`` imports of ``domain`` (the default domain, also spelled
    ``ai.onnx``, unless named); 1 when it imports none."""
    for entry in model.opset_import:
        if entry.domain in (domain, "ai.onnx" if domain == "" else domain):
            return entry.version
    return 1


def value_shape(value: onnx.ValueInfoProto) -> list[int | str | None]:
    """Dims of a value: ints when known, the dim_param string when symbolic, else None."""
    dims = value.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]


def value_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)


def with_outputs(model: onnx.ModelProto, names: list[str],
                 typed: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``model`` whose graph outputs are ``names`` (any tensors it computes), typed from
    ``typed``'s values or, by default, from the model's own shape inference; shapes are left
    for ONNX Runtime to find (a cut or a dynamic source may not know them)."""
    if [o.name for o in model.graph.output] == list(names):
        return model
    source = typed if typed is not None else infer_shapes(model)
    graph = source.graph
    known = {v.name: v for v in [*graph.value_info, *graph.output, *graph.input]}
    out = clone(model)
    del out.graph.output[:]
    for name in names:
        value = onnx.ValueInfoProto()
        if name in known:
            value.CopyFrom(known[name])
            value.type.tensor_type.ClearField("shape")
        else:
            value.name = name
        out.graph.output.append(value)
    return out


def reinfer_shapes(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    """A copy with stale shapes forgotten (value_info, symbolic output dims, what control-flow
    bodies declare) and inferred again from the inputs (type-checked, with data propagation so
    shape computations fold; ``strict``: a node whose inference fails is an error, not a tensor
    left without a shape). An output inference cannot shape keeps the rank it declared, its
    dims unknown: the checker refuses a graph output with no shape at all (a Loop kept whole
    whose body's shapes inference cannot follow)."""
    model = clone(model)
    del model.graph.value_info[:]
    forget_body_shapes(model.graph)
    declared = {}
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            if out.type.tensor_type.HasField("shape"):
                declared[out.name] = len(out.type.tensor_type.shape.dim)
            out.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=strict,
                                                 data_prop=True)
    for out in inferred.graph.output:
        tensor = out.type.tensor_type
        if out.type.HasField("tensor_type") and not tensor.HasField("shape") \
                and out.name in declared:
            tensor.shape.CopyFrom(onnx.TensorShapeProto(
                dim=[onnx.TensorShapeProto.Dimension()] * declared[out.name]))
    return inferred


def fix_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, list[int]]) -> onnx.ModelProto:
    """A copy whose named inputs have these fixed dims, with every shape inferred again."""
    model = clone(model)
    for value in model.graph.input:
        if value.name in shapes:
            value.type.tensor_type.ClearField("shape")
            value.type.tensor_type.shape.dim.extend(
                onnx.TensorShapeProto.Dimension(dim_value=d) for d in shapes[value.name])
    return reinfer_shapes(model)


def convert_version(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ONNX opset ``opset``, its model-local functions included (their
    bodies converted too): ``onnx.version_converter`` alone drops ``model.functions``, which
    leaves every fused op (``npubuild.fused``) unresolvable downstream."""
    from onnx import version_converter

    converted = version_converter.convert_version(model, opset)
    del converted.functions[:]
    converted.functions.extend(_convert_function(f, opset) for f in model.functions)
    return converted


def _convert_function(function: onnx.FunctionProto, opset: int) -> onnx.FunctionProto:
    from onnx import version_converter

    current = next((o.version for o in function.opset_import if o.domain in STANDARD_DOMAINS), None)
    if current is None or current == opset:
        return function
    body = onnx.helper.make_graph(list(function.node), function.name,
                                  [onnx.ValueInfoProto(name=i) for i in function.input],
                                  [onnx.ValueInfoProto(name=o) for o in function.output])
    wrapper = onnx.helper.make_model(body, opset_imports=list(function.opset_import),
                                     ir_version=MAX_ORT_IR_VERSION)
    try:
        converted = version_converter.convert_version(wrapper, opset)
    except Exception as exc:
        raise BuildError(f"cannot convert the body of function {function.domain}:{function.name} "
                         f"from opset {current} to {opset}: {exc}") from None
    out = onnx.FunctionProto()
    out.CopyFrom(function)
    del out.node[:]
    out.node.extend(converted.graph.node)
    del out.opset_import[:]
    out.opset_import.extend(converted.opset_import)
    return out


def missing_functions(model: onnx.ModelProto) -> list[str]:
    """``domain:op`` of every node (in the graph or a function body) whose domain is neither
    ONNX's nor one ONNX Runtime implements and whose function the model does not carry."""
    carried = {(f.domain, f.name) for f in model.functions}
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    missing = {f"{n.domain}:{n.op_type}" for n in nodes
               if n.domain not in RUNTIME_DOMAINS and (n.domain, n.op_type) not in carried}
    return sorted(missing)


# ---- control flow: what If/Loop/Scan bodies read ---------------------------------------------

def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The bodies of an If, Loop or Scan node (none for other ops)."""
    out = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def rename_outer_reads(graph: onnx.GraphProto, names: Mapping[str, str]) -> None:
    """In a nested body, the outer names it reads renamed as ``names`` says (the names it
    defines itself kept), through its own nested bodies: what a rename or a bypass of the outer
    graph must do too, or a body goes on reading a tensor no node produces any more."""
    defined = ({v.name for v in graph.input} | {t.name for t in graph.initializer}
               | {o for n in graph.node for o in n.output})
    inner = {k: v for k, v in names.items() if k not in defined}
    if not inner:
        return
    for node in graph.node:
        node.input[:] = [inner.get(i, i) for i in node.input]
        for sub in subgraphs(node):
            rename_outer_reads(sub, inner)
    for output in graph.output:
        if output.name in inner:
            output.name = inner[output.name]


def forget_body_shapes(graph: onnx.GraphProto) -> None:
    """Clear the shapes every If, Loop or Scan body in ``graph`` declares (its value_info, its
    outputs' shapes), at any depth; their types stay, so inference still checks them. Exporters
    declare stale ones (Paddle: a scalar where the body computes [1]), which ONNX Runtime merges
    leniently and strict inference refuses."""
    for node in graph.node:
        for body in subgraphs(node):
            del body.value_info[:]
            for output in body.output:
                if output.type.HasField("tensor_type"):
                    output.type.tensor_type.ClearField("shape")
            forget_body_shapes(body)


def outer_refs(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads but does not define: its outer-scope captures."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        defined.update(node.output)
        used.update(i for i in node.input if i)
        for sub in subgraphs(node):
            used |= outer_refs(sub)
    return used - defined


def upstream(tensors: Iterable[str], producers: Mapping[str, onnx.NodeProto],
             stop: Collection[str] = ()) -> set[str]:
    """``tensors`` and every tensor they are computed from through ``producers`` (name ->
    node); a name in ``stop`` is reached but not walked past."""
    seen: set[str] = set()
    todo = list(tensors)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is not None and name not in stop:
            todo.extend(i for i in node.input if i)
    return seen


def node_uses(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs, then what its bodies read from outside."""
    names = [i for i in node.input if i]
    for sub in subgraphs(node):
        names += sorted(outer_refs(sub))
    return list(dict.fromkeys(names))
