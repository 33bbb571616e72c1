"""TensorFlow frontend: frozen GraphDef, SavedModel, Keras and TFLite models → ONNX via tf2onnx.

`convert` turns the source model into ONNX; `run_source` runs the same model in its own
framework (TF graph, SavedModel signature, Keras model, TFLite interpreter) so that the import
stage can prove the conversion. Both resolve names the same way, so `run_source` is fed by the
ONNX model's input names and returns values in the ONNX model's output order.

How names map (source → ONNX graph inputs and outputs):

- a tensor named in the recipe keeps the recipe's spelling (``x`` or ``x:0``, both accepted);
- the others keep the source's own name: the signature key (SavedModel), the Keras input or
  output name (Keras), the tensor name (TFLite). A frozen graph has no signature, so the recipe
  must name its inputs and outputs.
- outputs come in the recipe's order, else in the source's: the Keras model's, the TFLite
  graph's, or the sorted signature keys (the order TensorFlow flattens them in).

Recipe shapes fix dynamic dims (batch ``None`` → 1); static dims must match the model's.
TensorFlow and tf2onnx are imported inside functions only: `import npubuild` stays fast.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import tempfile
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import onnx

from npubuild.errors import BuildError, Location, UserError
from npubuild import onnx_io
from npubuild.onnx_io import with_loadable_ir

FORMATS = ("tf_frozen", "saved_model", "keras", "tflite")
_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
_NOISY_LOGGERS = ("tensorflow", "tf2onnx", "absl", "keras")
_ORT_DOMAINS = ("com.microsoft",)  # contrib ops ONNX Runtime executes without a schema in onnx
_LISTED = 8  # candidate names shown in an error


@dataclass(frozen=True)
class Port:
    """One model input or output: its ONNX name, the source's name for it, the shape to use."""

    name: str
    key: str
    shape: list[int] | None = None


def convert(path: Path, fmt: str, inputs: list, outputs: list[str] | None,
            opset: int = 17) -> onnx.ModelProto:
    """Convert a TensorFlow-family model to ONNX at `opset` (see the module doc for names).

    `inputs` are the recipe's `InputSpec`s, `outputs` the recipe's output tensor names (or
    None: the model's own). Unreadable files, unknown tensor names, shapes that do not fit and
    ops tf2onnx cannot convert raise `UserError`.
    """
    path = Path(path)
    with _quiet():
        source = _open(path, fmt, inputs, outputs)
        try:
            model = source.to_onnx(opset)
        except UserError:
            raise
        except Exception as exc:  # tf2onnx and TF raise anything from ValueError to KeyError
            raise UserError(f"tf2onnx cannot convert this {fmt} model: {_brief(exc)}",
                            location=Location(str(path)),
                            hint="cut the model before the failing part with model.outputs, "
                                 "or try another model.opset") from None
    _check_converted(model, path)
    _order_outputs(model, source.outputs)
    _set_input_shapes(model, source.inputs)
    _pad_transposes_as_tensorflow(model)
    return with_loadable_ir(model)


def signature(path: Path, fmt: str, inputs: list, outputs: list[str] | None) -> dict:
    """The model's input and output names (ONNX spelling) after resolving the recipe's names,
    without converting: what `npubuild validate` checks. Unknown names raise `UserError`."""
    _check_installed()  # a TFLite signature is read without them, but run needs them
    with _quiet():
        source = _open(Path(path), fmt, inputs, outputs)
    return {"inputs": [p.name for p in source.inputs], "outputs": [p.name for p in source.outputs]}


def run_source(path: Path, fmt: str, feeds: dict[str, np.ndarray], inputs: list,
               outputs: list[str] | None) -> list[np.ndarray]:
    """Run the source model in its own framework on `feeds` (keyed by the ONNX input names);
    the results come in the converted ONNX model's output order."""
    values = _run_in_framework(path, fmt, feeds, inputs, outputs, lambda s, arrays: s.run(arrays))
    return [np.asarray(v) for v in values]


def source_tensors(path: Path, fmt: str, feeds: dict[str, np.ndarray], inputs: list,
                   outputs: list[str] | None) -> dict[str, np.ndarray] | None:
    """Every tensor a quantized TFLite source computes on `feeds`, by its name (the names
    tf2onnx keeps); None for every other source (its import is proved on the outputs)."""
    if fmt != "tflite":
        return None
    return _run_in_framework(path, fmt, feeds, inputs, outputs,
                             lambda s, arrays: s.run_every_tensor(arrays))


def _run_in_framework(path: Path, fmt: str, feeds: dict[str, np.ndarray], inputs: list,
                      outputs: list[str] | None, run):
    """``run(source, arrays)`` on the opened source, quietly; a missing feed or a failure
    inside the framework is the import's `BuildError`."""
    with _quiet():
        source = _open(Path(path), fmt, inputs, outputs)
        missing = [p.name for p in source.inputs if p.name not in feeds]
        if missing:
            raise BuildError(f"no value fed for input(s) {missing}", stage="import")
        try:
            return run(source, [np.asarray(feeds[p.name]) for p in source.inputs])
        except Exception as exc:
            raise BuildError(f"the {fmt} model failed to run in TensorFlow: {_brief(exc)}",
                             stage="import") from None


# --- the four source formats ----------------------------------------------------------------
# Each reads its model in __init__ (bad files -> UserError), resolves the recipe's names into
# `inputs` and `outputs` ports, and offers `to_onnx(opset)` and `run(arrays)`.


class _FrozenGraph:
    """A frozen GraphDef (.pb): variables are constants; the recipe names inputs and outputs."""

    def __init__(self, path: Path, inputs: list, outputs: list[str] | None):
        tf = _tensorflow()
        what = "a frozen TensorFlow GraphDef"
        self.graph_def = _load(path, what, lambda: _read_graph_def(tf, path))
        self.graph = _load(path, what, lambda: _import_graph(tf, self.graph_def))
        tensors = {t.name: t for op in self.graph.get_operations() for t in op.outputs}
        placeholders = [t for t, v in tensors.items() if v.op.type.startswith("Placeholder")]
        sinks = [t for t, v in tensors.items() if not v.consumers() and _computed(v.op)]
        input_hint = f"placeholders in this graph: {_few(placeholders)}"
        output_hint = f"tensors nothing consumes: {_few(sinks)}"
        _require(inputs, "model.inputs", path, input_hint)
        _require(outputs, "model.outputs", path, output_hint)
        available = {t: (_dims(v.shape), v.dtype.name) for t, v in tensors.items()}
        self.inputs = list(_named_inputs(inputs, available, path, input_hint).values())
        self.outputs = _output_ports(outputs, sinks, tensors, path, output_hint)

    def to_onnx(self, opset: int) -> onnx.ModelProto:
        return _graph_def_to_onnx(self.graph_def, self.inputs, self.outputs, opset)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        tf = _tensorflow()
        with tf.compat.v1.Session(graph=self.graph) as session:
            return session.run([p.key for p in self.outputs],
                               {p.key: a for p, a in zip(self.inputs, arrays)})


def _saved_model(path: Path, inputs: list, outputs: list[str] | None):
    """A SavedModel through its revived serving function, else (an older TensorFlow or Keras
    wrote objects this one cannot revive, such as Keras 2 optimizer slots) through its MetaGraph
    as TensorFlow reads a TensorFlow 1 SavedModel; when neither loads, the error says which
    TensorFlow wrote it."""
    tf = _tensorflow()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as revive_error:  # noqa: BLE001 - TF raises anything from a bad object graph
        try:
            return _SavedModelGraph(path, inputs, outputs)
        except UserError:
            raise
        except Exception as graph_error:  # noqa: BLE001
            raise _unreadable_saved_model(path, revive_error, graph_error) from None
    return _SavedModel(path, inputs, outputs, loaded)


class _SavedModel:
    """A SavedModel directory, converted and run through its serving signature."""

    def __init__(self, path: Path, inputs: list, outputs: list[str] | None, loaded):
        self._loaded = loaded
        self.fn = _serving_signature(self._loaded, path)
        specs = self.fn.structured_input_signature[1]
        available = {k: (_dims(specs[k].shape), specs[k].dtype.name) for k in sorted(specs)}
        self.inputs = _all_inputs(inputs, available, path)
        keys = sorted(self.fn.structured_outputs)
        self.outputs = _output_ports(outputs, keys, (), path, _cut_hint("signature", keys))

    def to_onnx(self, opset: int) -> onnx.ModelProto:
        return _function_to_onnx(self.fn, self.inputs, self.outputs, opset)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        tf = _tensorflow()
        result = self.fn(**{p.key: tf.constant(a) for p, a in zip(self.inputs, arrays)})
        return [result[p.key].numpy() for p in self.outputs]


class _SavedModelGraph:
    """A SavedModel read as TensorFlow 1 read one: the MetaGraph tagged ``serve`` into a session,
    its variables restored and frozen into constants; named, converted and run through its
    serving signature as `_SavedModel` is (the signature's keys are the ONNX names)."""

    def __init__(self, path: Path, inputs: list, outputs: list[str] | None):
        tf = _tensorflow()
        graph = tf.Graph()
        with tf.compat.v1.Session(graph=graph) as session:
            meta = tf.compat.v1.saved_model.loader.load(session, _serving_tags(path), str(path))
            signature = _serving_signature_def(meta.signature_def, path)
            self.tensors = {k: v.name for k, v in [*signature.inputs.items(),
                                                    *signature.outputs.items()]}
            self.graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(),
                [v.name.split(":")[0] for v in signature.outputs.values()])
        self.graph = _import_graph(tf, self.graph_def)
        available = {k: (_dims(tf.TensorShape(v.tensor_shape)), tf.as_dtype(v.dtype).name)
                     for k, v in sorted(signature.inputs.items())}
        self.inputs = _all_inputs(inputs, available, path)
        keys = sorted(signature.outputs)
        self.outputs = _output_ports(outputs, keys, (), path, _cut_hint("signature", keys))

    def to_onnx(self, opset: int) -> onnx.ModelProto:
        return _graph_def_to_onnx(
            self.graph_def, [Port(p.name, self.tensors[p.key], p.shape) for p in self.inputs],
            [Port(p.name, self.tensors[p.key]) for p in self.outputs], opset)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        tf = _tensorflow()
        with tf.compat.v1.Session(graph=self.graph) as session:
            return session.run([self.tensors[p.key] for p in self.outputs],
                               {self.tensors[p.key]: a for p, a in zip(self.inputs, arrays)})


def _meta_graphs(path: Path) -> list:
    """The MetaGraphs in ``saved_model.pb`` (empty when the file cannot be parsed)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString((path / "saved_model.pb").read_bytes())
    except Exception:  # noqa: BLE001 - a missing or damaged file: no MetaGraph to read
        return []
    return list(saved.meta_graphs)


def _serving_tags(path: Path) -> list[str]:
    """The tags of the MetaGraph to load: ``serve`` when one has it, else the first one's."""
    tags = [list(m.meta_info_def.tags) for m in _meta_graphs(path)]
    return next((t for t in tags if "serve" in t), tags[0] if tags else ["serve"])


def _unreadable_saved_model(path: Path, revive_error: Exception, graph_error: Exception
                            ) -> UserError:
    """Neither TensorFlow 2's loader nor the MetaGraph reads it: say which TensorFlow wrote it
    (``meta_info_def.tensorflow_version``) and what to do."""
    import tensorflow as tf

    written = sorted({m.meta_info_def.tensorflow_version for m in _meta_graphs(path)} - {""})
    if not written:
        return UserError(f"cannot read a SavedModel: {_brief(revive_error)}",
                         location=Location(str(path)),
                         hint="check that model.path is a SavedModel folder (saved_model.pb and "
                              "variables/) and model.format matches")
    return UserError(
        f"cannot read this SavedModel, written by TensorFlow {', '.join(written)}, with "
        f"TensorFlow {tf.__version__}: {_brief(revive_error)}; as a TensorFlow 1 MetaGraph: "
        f"{_brief(graph_error)}", location=Location(str(path)),
        hint=f"re-export it: load it with TensorFlow {written[-1]} and save it with "
             f"tf.saved_model.save for TensorFlow {tf.__version__}; or give model.path an ONNX or "
             "TFLite export of the model")


def _keras_writer(path: Path) -> str:
    """The Keras version an HDF5 model file says wrote it (``keras_version``), or ''."""
    try:
        import h5py

        with h5py.File(path, "r") as handle:
            version = handle.attrs.get("keras_version", "")
    except Exception:  # noqa: BLE001 - not HDF5, or damaged: nothing to say about its writer
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


def _older_keras(path: Path) -> str:
    """The version of the older Keras (1 or 2) that wrote this HDF5 model, or ''."""
    import keras

    written = _keras_writer(path)
    major = written.split(".")[0]
    if not major.isdigit() or int(major) >= int(keras.__version__.split(".")[0]):
        return ""
    return written


def _read_keras(path: Path):
    """A Keras model file read as its writer computed it. A file an older Keras (1 or 2) wrote
    is read from its configuration rewritten for Keras 3 (`keras_legacy`: Keras 3 reads some
    of them as another model, with no error: Keras 2's ``hard_sigmoid``, a Keras 2.3
    Sequential's input shape), and by Keras 3 as it is only where the rewrite fails on
    something else; a UserError naming the writer when neither reads it."""
    import keras

    from npubuild.frontends import keras_legacy

    tf = _tensorflow()
    written, rewrite_error = _older_keras(path), None
    if written:
        try:
            return keras_legacy.load(path, keras)
        except keras_legacy.ComputesAnotherModel as exc:
            raise _unreadable_keras(path, written, exc) from None
        except Exception as exc:  # noqa: BLE001 - any other failure: Keras 3 may still read it
            rewrite_error = exc
    try:
        return _load(path, "a Keras model",
                     lambda: tf.keras.models.load_model(str(path), compile=False))
    except UserError:
        if rewrite_error is None:
            raise
        raise _unreadable_keras(path, written, rewrite_error) from None


def _unreadable_keras(path: Path, written: str, exc: Exception) -> UserError:
    """An HDF5 model that Keras 3 cannot read, written by an older Keras (1 or 2: their layer
    configurations and a Sequential's list of layers differ from Keras 3's): say which Keras
    wrote it, why, and what to do."""
    import keras

    return UserError(
        f"cannot read this Keras model, written by Keras {written}, with Keras "
        f"{keras.__version__}: its loader for older HDF5 files does not read this one "
        f"(layer configurations and defaults changed between them: {_brief(exc)})",
        location=Location(str(path)),
        hint=f"re-export it: load it with Keras {written} (or tf_keras) and save it as a "
             "SavedModel (tf.saved_model.save) or convert it to ONNX or TFLite; give "
             "model.path that file")


def _without_dropout(model) -> None:
    """Zero the dropout rates of `model`'s layers and recurrent cells. Dropout does nothing at
    inference, but Keras 3's TensorFlow LSTM and GRU with a rate above 0 still draw a mask and
    advance their seed generator's variable in an inference call: a variable update that
    freezing cannot make a constant ("AssignVariableOp was passed int64 ... expected resource")."""
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for rate in ("dropout", "recurrent_dropout"):
            if isinstance(vars(layer).get(rate), float) and vars(layer)[rate] > 0:
                setattr(layer, rate, 0.0)


@contextmanager
def _fused_recurrent_cells(model) -> Iterator[None]:
    """Trace `model`'s LSTM and GRU cells as ``implementation=2`` (restored after): one MatMul
    of the input by the whole kernel and one of the state by the recurrent kernel per step, the
    gates split after, the form tf2onnx's Keras LSTM and GRU rewriters recognise as an ONNX
    ``LSTM`` or ``GRU``. ``implementation=1`` (Keras 2's default for an LSTM: Shakkala's; what
    Keras 3 gives any cell with a ``recurrent_dropout``) multiplies by the kernel's column
    blocks one by one: the same products, but tf2onnx leaves the layer a ``Loop`` over its
    steps, which ONNX Runtime runs slowly and import unrolls only when short. The two differ
    only in their dropout masks, and a converted model runs without dropout
    (`_without_dropout`); the model as written, with its own implementation, is what the import
    proof runs (`run`)."""
    cells = [layer for layer in model._flatten_layers(include_self=True, recursive=True)
             if type(layer).__name__ in ("LSTMCell", "GRUCell")
             and vars(layer).get("implementation") == 1]
    for cell in cells:
        cell.implementation = 2
    try:
        yield
    finally:
        for cell in cells:
            cell.implementation = 1


class _Keras:
    """A Keras 3 model file (.keras, or legacy .h5), traced at the recipe's input shapes."""

    def __init__(self, path: Path, inputs: list, outputs: list[str] | None):
        self.model = _read_keras(path)
        _without_dropout(self.model)
        symbolic = _keras_inputs(self.model, path)
        names = _keras_file_input_names(path, len(symbolic)) or [t.name for t in symbolic]
        self.dims = {name: _dims(t.shape) for name, t in zip(names, symbolic)}
        self.dtypes = {name: getattr(t.dtype, "name", str(t.dtype))
                       for name, t in zip(names, symbolic)}
        available = {k: (self.dims[k], self.dtypes[k]) for k in self.dims}
        self.inputs = _all_inputs(inputs, available, path)
        self.output_names = _keras_output_names(self.model)
        self.outputs = _output_ports(outputs, self.output_names, (), path,
                                     _cut_hint("Keras model", self.output_names))

    def to_onnx(self, opset: int) -> onnx.ModelProto:
        tf = _tensorflow()
        specs = [tf.TensorSpec(p.shape or self.dims[p.key], self.dtypes[p.key], name=p.key)
                 for p in self.inputs]
        fn = tf.function(lambda *xs: self._call(xs), input_signature=specs)
        with _fused_recurrent_cells(self.model):
            concrete = fn.get_concrete_function()
        return _function_to_onnx(concrete, self.inputs, self.outputs, opset)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        tf = _tensorflow()
        result = self._call([tf.constant(a) for a in arrays])
        return [result[p.key].numpy() for p in self.outputs]

    def _call(self, tensors) -> dict:
        """The model's outputs by name (a dict, so a traced function keeps the names)."""
        tf = _tensorflow()
        result = self.model(tensors[0] if len(tensors) == 1 else list(tensors), training=False)
        if isinstance(result, dict):
            return dict(result)
        return dict(zip(self.output_names, tf.nest.flatten(result)))


class _TFLite:
    """A TFLite flatbuffer; its tensor names are the names (the recipe may cut at any tensor)."""

    def __init__(self, path: Path, inputs: list, outputs: list[str] | None):
        """Names are read from the flatbuffer: no TensorFlow until the model is converted or
        run (``npubuild validate`` stays fast)."""
        from npubuild.frontends import tflite_check

        tflite_check.check_tflite(path)  # the interpreter crashes the process on a truncated file
        self.path = path
        self.content, self.variables = path.read_bytes(), []
        if tflite_check.uses_variables(path):  # a streaming model: its state becomes explicit
            self.content, self.variables = _state_as_io(path)
        found = tflite_check.signature(self.content)
        self.index = {}
        for index, (name, _, _) in enumerate(found.tensors):  # converters write unique names
            self.index.setdefault(name, index)
        names = [name for name, _, _ in found.tensors]
        available = {found.tensors[i][0]: found.tensors[i][1:] for i in found.inputs}
        if _cuts_inputs(inputs, available, names):  # the recipe's inputs are the cut's inputs
            everything = {name: (dims, dtype) for name, dims, dtype in reversed(found.tensors)}
            hint = f"the model's inputs: {_few(available)}; any tensor may be cut at"
            self.inputs = list(_named_inputs(inputs, everything, path, hint).values())
        else:
            self.inputs = _all_inputs(inputs, available, path)
        self.graph_outputs = [names[i] for i in found.outputs]
        self.outputs = _output_ports(outputs, self.graph_outputs, names, path)
        if outputs and self.variables:
            self.outputs += self._state_outputs()

    def _state_outputs(self) -> list[Port]:
        """The new value of each state the recipe's outputs read (`<variable>_out`), which
        the recipe's `model.outputs` does not list: a cut keeps the state's loop."""
        from npubuild.frontends import tflite_graph

        listed = [self.index[p.key] for p in self.outputs]
        read = tflite_graph.depends_on(tflite_graph.read(self.content), listed,
                                       [v.input for v in self.variables])
        return [Port(name, name) for v in self.variables
                if v.input in read and v.output is not None
                for name in [f"{v.name}_out"] if self.index[name] not in listed]

    def to_onnx(self, opset: int) -> onnx.ModelProto:
        from npubuild.frontends import tf2onnx_process, tflite_graph

        _tensorflow()  # before tf2onnx: a missing TensorFlow is named as such
        model = self._prepared()
        # for tf2onnx only: the proof runs the source's own RFFT2D (`run`) against this product
        tflite_graph.fft_parts_as_matmul(model)
        tflite_graph.fully_connected_inputs_as_matrices(model)  # tf2onnx drops the bias else
        try:
            tflite_graph.with_readable_options(model)
        except ValueError as exc:
            raise UserError(f"cannot read the options of a TFLite {exc}",
                            location=Location(str(self.path))) from None
        with tempfile.TemporaryDirectory() as tmp:
            prepared = Path(tmp) / self.path.name
            prepared.write_bytes(tflite_graph.to_bytes(model))
            model = tf2onnx_process.convert({
                "kind": "tflite", "path": str(prepared), "opset": opset,
                "input_names": [p.key for p in self.inputs],
                "output_names": [p.key for p in self.outputs]})
        # tf2onnx keeps TFLite tensor names; give recipe-named tensors the recipe's spelling
        _rename_values(model.graph, {p.key: p.name for p in self.inputs + self.outputs})
        return model

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The cut model in the interpreter, its lowered custom ops in their numpy references."""
        from npubuild.frontends import tflite_graph

        model = self._prepared()
        feeds = {self.index[p.key]: np.asarray(a) for p, a in zip(self.inputs, arrays)}
        wanted = [self.index[p.key] for p in self.outputs]
        values = tflite_graph.run(_tensorflow(), model, feeds, wanted)
        return [values[t] for t in wanted]

    def run_every_tensor(self, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray] | None:
        """Every tensor the cut model computes, by name, when it computes integer tensors (an
        import of it is proved op by op); None for a float model (proved on its outputs)."""
        from npubuild.frontends import tflite_graph

        model = self._prepared()
        if not tflite_graph.has_integer_activations(model):
            return None
        feeds = {self.index[p.key]: np.asarray(a) for p, a in zip(self.inputs, arrays)}
        wanted = tflite_graph.computed(model)
        values = tflite_graph.run(_tensorflow(), model, feeds, wanted)
        spelling = {p.key: p.name for p in self.inputs + self.outputs}  # as `to_onnx` renames
        return {spelling.get(name, name): values[t]
                for t in wanted for name in [tflite_graph.tensor_name(model, t)]}

    def _prepared(self):
        """The flatbuffer cut to the recipe's inputs and outputs, with sparse weights made
        dense; a custom op npubuild cannot lower stops here, naming the cut that avoids it."""
        from npubuild.frontends import tflite_custom, tflite_graph

        model = tflite_graph.read(self.content)
        inputs = [self.index[p.key] for p in self.inputs]
        outputs = [self.index[p.key] for p in self.outputs]
        graph = model.subgraphs[0]
        whole = (sorted(inputs) == sorted(int(t) for t in graph.inputs)
                 and sorted(outputs) == sorted(int(t) for t in graph.outputs))
        try:
            tflite_graph.cut(model, inputs, outputs)
        except ValueError as exc:
            if whole:  # the recipe cuts nothing: the file itself reads what nothing provides
                raise UserError(f"the TFLite model cannot run as it is: {exc}",
                                location=Location(str(self.path)),
                                hint="check the file with TensorFlow Lite's interpreter, or cut "
                                     "the model before that operator (model.outputs)") from None
            raise UserError(f"cannot cut the TFLite model: {exc}", field="model.inputs",
                            location=Location(str(self.path)),
                            hint="name every input the cut outputs depend on") from None
        tflite_graph.densify(_tensorflow(), model)
        tflite_graph.dequantize_weights(model)  # a dynamic-range model is imported as float
        tflite_graph.complex_abs_next_to_fft(model)  # the spectrum's form tf2onnx converts
        unsupported = tflite_graph.unsupported_custom_ops(model)
        if unsupported:
            ops = "; ".join(f"{op} (the operator writing {tensor!r})" for op, tensor in unsupported.ops)
            outputs = ", ".join(json.dumps(name) for name in unsupported.cut_outputs)
            raise UserError(f"this TFLite model uses custom ops npubuild cannot lower to ONNX: "
                            f"{ops}; it lowers {', '.join(tflite_custom.CUSTOM_OPS)}",
                            location=Location(str(self.path)),
                            hint=f"cut the model before them: model.outputs: [{outputs}] (and "
                                 "run the rest on the host), or replace them in the source model")
        state = tflite_graph.state_ops(model)
        if state:
            ops = ", ".join(f"{count} {op}" for op, count in state.items())
            raise UserError(f"this TFLite model keeps state between calls in resource variables "
                            f"({ops}): a streaming model, which tf2onnx cannot convert",
                            location=Location(str(self.path)),
                            hint="convert the model it was exported from without streaming "
                                 "state (e.g. the non-streaming Keras or SavedModel), or export "
                                 "it with the state as inputs and outputs")
        return model


def _state_as_io(path: Path) -> tuple[bytes, list]:
    """The model with its resource variables as graph inputs and outputs
    (`tflite_graph.variables_as_io`), and the variables: rewritten once per content, as an
    import opens the source several times (the variables' listing, their proof, the conversion,
    the source's run)."""
    return _state_as_io_of(path, path.read_bytes())


@functools.lru_cache(maxsize=4)
def _state_as_io_of(path: Path, content: bytes) -> tuple[bytes, tuple]:
    from npubuild.frontends import tflite_graph

    _tensorflow()
    model = tflite_graph.read(content)
    try:
        variables = tflite_graph.variables_as_io(model)
    except ValueError as exc:
        raise UserError(f"cannot write this TFLite model's resource variables as inputs and "
                        f"outputs: {exc}", location=Location(str(path)),
                        hint="export the model with its state as inputs and outputs") from None
    for v in variables:  # shared by every open of this content
        if v.initial is not None:
            v.initial.setflags(write=False)
    return tflite_graph.to_bytes(model), tuple(variables)


def variables(path: Path, fmt: str, inputs: list, outputs: list[str] | None) -> list:
    """A streaming TFLite model's resource variables, as the import writes them
    (`tflite_graph.Variable`; empty for every other model)."""
    if fmt != "tflite":
        return []
    with _quiet():
        return _open(Path(path), fmt, inputs, outputs).variables


def prove_state(path: Path, fmt: str, feeds: dict[str, np.ndarray], inputs: list,
                outputs: list[str] | None, steps: int) -> dict | None:
    """The proof that a streaming TFLite model's state as inputs and outputs is the model:
    TFLite's interpreter steps the original `steps` times from its reset state on the proof
    inputs `feeds` (keyed by the ONNX names), and the rewritten model, its states fed their
    initial values and then what it output the step before, must give the same outputs and new
    states, bit for bit. None for a model without resource variables."""
    if fmt != "tflite":
        return None
    from npubuild.frontends import tflite_graph

    with _quiet():
        source = _open(Path(path), fmt, inputs, outputs)
        if not source.variables:
            return None
        states = {v.name for v in source.variables}
        step = {p.key: np.asarray(feeds[p.name]) for p in source.inputs
                if p.key not in states and p.name in feeds}
        try:
            worst = tflite_graph.prove_variables_as_io(
                _tensorflow(), Path(path).read_bytes(), source.content, source.variables,
                [step] * steps)
        except ValueError as exc:
            raise UserError(f"the TFLite model with its resource variables as inputs and "
                            f"outputs differs from the model: {exc}",
                            location=Location(str(path))) from None
    return {"steps": steps, "max_abs": worst}


def _cuts_inputs(specs: list, graph_inputs: dict, tensors: list[str]) -> bool:
    """Whether a recipe input names an inner tensor (``x`` or ``x:0``) rather than an input."""
    def inner(name: str) -> bool:
        guesses = (name, f"{name}:0", name.removesuffix(":0"))
        return not any(g in graph_inputs for g in guesses) and any(g in tensors for g in guesses)

    return any(inner(spec.name) for spec in specs)


_SOURCES = {"tf_frozen": _FrozenGraph, "saved_model": _saved_model, "keras": _Keras,
            "tflite": _TFLite}


def _open(path: Path, fmt: str, inputs: list, outputs: list[str] | None):
    """Read the model and resolve the recipe's names, or explain what is wrong."""
    if fmt not in _SOURCES:
        raise UserError(f"unknown TensorFlow model format {fmt!r}; known: {', '.join(FORMATS)}",
                        field="model.format")
    found = path.is_dir() if fmt == "saved_model" else path.is_file()
    if not found:
        what = "SavedModel directory" if fmt == "saved_model" else "model file"
        raise UserError(f"{what} not found: {path}", field="model.path",
                        hint="model.path is relative to the recipe file")
    return _SOURCES[fmt](path, list(inputs or []), list(outputs) if outputs else None)


# --- names and shapes ------------------------------------------------------------------------


def _lookup(name: str, known, field: str, path: Path, hint: str) -> str:
    """The source's name for `name`: as written, or with or without TensorFlow's ':0'."""
    for guess in (name, f"{name}:0", name.removesuffix(":0")):
        if guess in known:
            return guess
    raise UserError(f"{name!r} is not a tensor of this model", location=Location(str(path)),
                    field=field, hint=hint)


def _named_inputs(specs: list, available: dict, path: Path, hint: str) -> dict[str, Port]:
    """Ports for the inputs the recipe names, by source name, in the recipe's order.

    `available` maps a source name to its (dims, dtype); `hint` lists candidates for errors."""
    ports = {}
    for i, spec in enumerate(specs):
        field = f"model.inputs[{i}]"
        key = _lookup(spec.name, available, f"{field}.name", path, hint)
        ports[key] = Port(spec.name, key, _fit_shape(spec, *available[key], field, path))
    return ports


def _all_inputs(specs: list, available: dict, path: Path) -> list[Port]:
    """Every model input in the model's order; the recipe's specs applied to those it names."""
    named = _named_inputs(specs, available, path, f"the model's inputs: {_few(available)}")
    return [named.get(key, Port(key, key)) for key in available]


def _output_ports(names: list[str] | None, default: list[str], extra, path: Path,
                  hint: str | None = None) -> list[Port]:
    """The recipe's outputs (any of `default` or `extra`), else the model's `default` ones."""
    if not names:
        return [Port(key, key) for key in default]
    known = set(default) | set(extra)
    hint = hint or f"the model's outputs: {_few(default)}"
    return [Port(name, _lookup(name, known, f"model.outputs[{i}]", path, hint))
            for i, name in enumerate(names)]


def _fit_shape(spec, dims: list | None, dtype: str, field: str, path: Path) -> list[int] | None:
    """The recipe's shape for an input, checked against the model's dims and dtype."""
    if dtype == "string":  # the model tokenizes text itself: hash tables, sparse ops, no NPU
        raise UserError(f"input {spec.name!r} is a string tensor: the model reads text and turns "
                        "it into numbers itself (string and lookup-table ops, which neither "
                        "tf2onnx nor an NPU runs)", location=Location(str(path)),
                        field=f"{field}.name",
                        hint="build the part after the text processing: export it with numeric "
                             "inputs (the token ids or embeddings the model computes), and run "
                             "the tokenization beside the deployment")
    if spec.dtype is not None and spec.dtype != dtype:
        raise UserError(f"input {spec.name!r} is {dtype} in the model, not {spec.dtype}",
                        location=Location(str(path)), field=f"{field}.dtype",
                        hint=f"set dtype: {dtype} or leave it out")
    if spec.shape is None:
        return None
    fits = dims is None or (len(dims) == len(spec.shape)
                            and all(d in (None, s) for d, s in zip(dims, spec.shape)))
    if not fits:
        raise UserError(f"shape {spec.shape} does not fit input {spec.name!r} of shape "
                        f"{_show(dims)} in the model", location=Location(str(path)),
                        field=f"{field}.shape",
                        hint="a recipe shape may only fix the dynamic dims ('?')")
    return list(spec.shape)


def _require(value, field: str, path: Path, hint: str) -> None:
    if not value:
        raise UserError("a frozen graph does not say which tensors are its "
                        f"{field.split('.')[-1]}; name them in the recipe",
                        location=Location(str(path)), field=field, hint=hint)


def _cut_hint(what: str, outputs: list[str]) -> str:
    return (f"the {what}'s outputs: {_few(outputs)}; to cut inside the model, use a surgery "
            "step after import, or convert a frozen graph")


def _computed(op) -> bool:
    """Whether an op computes from the inputs (not a constant, nor a read of one)."""
    return op.type not in ("Const", "NoOp") and any(t.op.type != "Const" for t in op.inputs)


def _keras_inputs(model, path: Path) -> list:
    """The model's symbolic inputs; subclassed models have none to name or trace."""
    try:
        tensors = list(model.inputs or [])
    except (AttributeError, ValueError):
        tensors = []
    if not tensors:
        raise UserError("the Keras model has no symbolic inputs (a subclassed model?)",
                        location=Location(str(path)),
                        hint="export it as a SavedModel with model.export(dir) and use that")
    return tensors


def _keras_file_input_names(path: Path, count: int) -> list[str] | None:
    """The model's input names as its file's configuration gives them (`keras_legacy.
    input_names`), where it names all ``count``: stable, where Keras 3 may name an input by a
    counter of the process."""
    from npubuild.frontends.keras_legacy import input_names

    try:
        names = input_names(path)
    except Exception:  # noqa: BLE001 - a configuration Keras read but we cannot: its own names
        return None
    return names if names and len(names) == count else None


def _keras_output_names(model) -> list[str]:
    """Output names as Keras gives them: dict keys, else the output layers' names."""
    try:
        output = model.output
    except AttributeError:  # a Sequential built from its config, never called: `outputs` only
        output = None
    if isinstance(output, dict):
        return list(output)
    names = list(getattr(model, "output_names", None) or [])  # Functional models have them
    if len(names) != len(model.outputs):
        names = [model.layers[-1].name] if len(model.outputs) == 1 else \
            [f"output_{i}" for i in range(len(model.outputs))]
    return names


def _dims(shape) -> list[int | None] | None:
    """Dims as ints (None when dynamic), or None when even the rank is unknown."""
    try:
        dims = list(shape)
    except (TypeError, ValueError):  # TensorShape(None) refuses to iterate
        return None
    return [None if d is None or int(d) < 0 else int(d) for d in dims]


def _show(dims: list | None) -> str:
    if dims is None:
        return "unknown"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _few(names) -> str:
    names = list(names)
    more = f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else ""
    return (", ".join(names[:_LISTED]) or "(none)") + more


# --- TensorFlow and tf2onnx ------------------------------------------------------------------


def _tensorflow():
    """Import TensorFlow and tf2onnx with TF's C++ start-up logging off.

    TF reads TF_CPP_MIN_LOG_LEVEL when its library loads, and tf2onnx.convert overwrites it on
    import; it is restored afterwards so the process environment is left as it was."""
    saved = os.environ.get(_LOG_ENV)
    os.environ[_LOG_ENV] = "3"
    try:
        import tensorflow as tf
        import tf2onnx.convert  # noqa: F401
    except ImportError as exc:  # an ONNX-only install: say which extra brings TensorFlow in
        raise _not_installed(_missing(exc)) from None
    finally:
        if saved is None:
            os.environ.pop(_LOG_ENV, None)
        else:
            os.environ[_LOG_ENV] = saved
    _absl_to_real_stderr()
    _transposes_through_elementwise_ops()
    return tf


def _check_installed() -> None:
    """Raise what `_tensorflow` raises when TensorFlow or tf2onnx is missing, without importing
    them (importing TensorFlow takes seconds; `npubuild validate` needs only to know)."""
    import importlib.util

    for package in ("tensorflow", "tf2onnx"):
        if importlib.util.find_spec(package) is None:
            raise _not_installed(package)


def _not_installed(package: str) -> UserError:
    return UserError(f"this recipe's model is a TensorFlow model, and {package} is not "
                     "installed", hint="install npubuild's `tf` extra: "
                     "pip install 'npubuild[tf]' (tensorflow-cpu and tf2onnx)")


def _missing(exc: ImportError) -> str:
    """The top-level package an ImportError names (``tensorflow``), else both candidates."""
    return (exc.name or "").partition(".")[0] or "TensorFlow or tf2onnx"


# Elementwise ops tf2onnx 1.17's transpose optimizer has no handler for: a Transpose stops at
# them, so a TFLite MobileNetV3 (HARD_SWISH → ONNX HardSwish) keeps one pair per block.
_ELEMENTWISE_UNARY = ("HardSwish", "HardSigmoid", "Floor", "Ceil", "Round", "Sign", "Softsign",
                      "Celu", "Mish", "ThresholdedRelu", "Sin", "Cos", "Not", "Gelu")
_ELEMENTWISE_BINARY = ("Div", "Pow")


def _transposes_through_elementwise_ops() -> None:
    """Teach tf2onnx's transpose optimizer (patched once per process) what it misses, so that an
    NHWC model's NHWC↔NCHW Transposes cancel and only those at the graph's edges remain.

    - Every elementwise op above passes a Transpose through as Relu does (unary) or as Max
      does (binary, constants reshaped for the new layout).
    - ``Add(x, scalar)``: its handler takes ``max()`` of the constant's shape to merge it into a
      Conv bias; for a rank-0 constant (hard-swish's ``x + 3`` after a Conv, as Keras exports it)
      that raises, tf2onnx catches it and skips the whole transpose optimisation (MobileNetV3
      keeps two Transposes per Conv). A scalar is never a Conv bias, so it takes the broadcast
      handler too.
    - ``Mul(x, y)`` where ``y`` is computed, not constant (squeeze-and-excite's channel weights
      as a TFLite model reshapes them): the broadcast handler, which weighs the Transposes it
      would add against those it removes, instead of giving up.
    """
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    if getattr(TransposeOptimizer, "npubuild_patched", False):
        return
    add, mul = TransposeOptimizer._add_handler, TransposeOptimizer._mul_handler
    init = TransposeOptimizer._initialize_handlers

    def add_handler(self, trans, node):
        other = node.inputs[1]
        if other.is_const() and other.get_tensor_value(as_list=False).ndim == 0:
            return self._handle_node_having_branches(trans, node)
        return add(self, trans, node)

    def mul_handler(self, trans, node):
        if mul(self, trans, node):
            return True
        return self._handle_node_having_branches(trans, node)

    def initialize_handlers(self):
        init(self)
        for op in _ELEMENTWISE_UNARY:
            self._handler_map.setdefault(op, self._simple_through_handler)
        for op in _ELEMENTWISE_BINARY:
            self._handler_map.setdefault(op, self._maxmin_handler)

    TransposeOptimizer._add_handler = add_handler
    TransposeOptimizer._mul_handler = mul_handler
    TransposeOptimizer._initialize_handlers = initialize_handlers
    TransposeOptimizer.npubuild_patched = True


def _absl_to_real_stderr() -> None:
    """absl's log handler keeps the ``sys.stderr`` of the moment it was imported, which inside a
    doit action is doit's capture object; at exit absl would close that and print a traceback."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence TF, Keras, absl and tf2onnx Python logging and warnings, then restore them.

    Their deprecation notes and tf2onnx's error log are noise: failures become one UserError."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), _native_stderr_to_debug_log():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextmanager
def _native_stderr_to_debug_log() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 to the debug log instead of the terminal.

    TensorFlow's libraries log at load time through absl before any log level is read ("All
    log messages before absl::InitializeLog() ...", oneDNN and CUDA notes; TF_CPP_MIN_LOG_LEVEL
    no longer stops them), and the TFLite interpreter tf2onnx opens announces its XNNPACK
    delegate: one load per library, so they would print on every TensorFlow build."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 (a daemon): nothing to keep off the terminal
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace").strip()
            if text:
                logging.getLogger("npubuild").debug("TensorFlow wrote to stderr:\n%s", text)


def _load(path: Path, what: str, read):
    """Call `read`; any failure means the file is not `what` (or is damaged)."""
    try:
        return read()
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot read {what}: {_brief(exc)}", location=Location(str(path)),
                        hint=f"check that model.path is {what} and model.format matches "
                             "(leave model.format out to guess it from the file name)") from None


def _read_graph_def(tf, path: Path):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(path.read_bytes())
    if not graph_def.node:
        raise ValueError("the file holds no graph nodes")
    return graph_def


def _import_graph(tf, graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    return graph


def _serving_signature(loaded, path: Path):
    """The revived SavedModel's serving function (`_serving_signature_def` picks it)."""
    return _serving_signature_def(dict(loaded.signatures.items()), path)


def _serving_signature_def(signatures, path: Path):
    """'serving_default' if present, else the first public signature (as tf2onnx picks)."""
    public = {k: v for k, v in signatures.items() if not k.startswith("_")}
    if not public:
        raise UserError("the SavedModel has no signature to convert", location=Location(str(path)),
                        hint="export it with model.export(dir), or tf.saved_model.save(obj, dir, "
                             "signatures=...)")
    return public.get("serving_default") or next(iter(public.values()))


def _function_to_onnx(fn, inputs: list[Port], outputs: list[Port], opset: int) -> onnx.ModelProto:
    """Freeze a concrete function (variables → constants), then convert its graph."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    # Keep While/If functional, as tf2onnx does: it turns them into ONNX Loop/If
    frozen = convert_variables_to_constants_v2(fn, lower_control_flow=False,
                                               aggressive_inlining=True)
    args, kwargs = fn.structured_input_signature
    in_keys = [spec.name for spec in args] + sorted(kwargs)  # TF's flattening order
    in_tensors = dict(zip(in_keys, (t.name for t in frozen.inputs)))
    out_tensors = dict(zip(sorted(fn.structured_outputs), (t.name for t in frozen.outputs)))
    graph_def = frozen.graph.as_graph_def(add_shapes=True)
    return _graph_def_to_onnx(
        graph_def, [Port(p.name, in_tensors[p.key], p.shape) for p in inputs],
        [Port(p.name, out_tensors[p.key]) for p in outputs], opset)


def _graph_def_to_onnx(graph_def, inputs: list[Port], outputs: list[Port],
                       opset: int) -> onnx.ModelProto:
    """tf2onnx on a frozen graph (in its own process: `tf2onnx_process`); ports' keys are graph
    tensor names, their names ONNX's."""
    from npubuild.frontends import tf2onnx_process, tf_loops

    graph_def = _defaults_resolved(graph_def, {p.key.split(":")[0] for p in inputs})
    tf_loops.for_tf2onnx(graph_def)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.pb"
        path.write_bytes(graph_def.SerializeToString(deterministic=True))
        return tf2onnx_process.convert({
            "kind": "graph_def", "path": str(path), "opset": opset,
            "input_names": [p.key for p in inputs], "output_names": [p.key for p in outputs],
            "shape_override": {p.key: p.shape for p in inputs if p.shape is not None},
            "tensors_to_rename": {p.key: p.name for p in inputs + outputs if p.key != p.name}})


def _defaults_resolved(graph_def, fed: set[str]):
    """Each ``PlaceholderWithDefault`` as the recipe runs it: one the recipe feeds (by op name)
    becomes a ``Placeholder``; one it does not becomes an ``Identity`` of its default, which is
    what TensorFlow runs when nothing is fed. TensorFlow 1 graphs trained from a dataset have
    inputs that default to the iterator's next batch (deepbrain's ``img``) and switches that
    default to a constant (a ``training`` flag gating dropout through ``Switch``/``Merge``);
    tf2onnx stops on the first ("non-const default value ... is not supported"). A graph
    without one is returned as it is."""
    if not any(n.op == "PlaceholderWithDefault" for n in graph_def.node):
        return graph_def
    resolved = type(graph_def)()
    resolved.CopyFrom(graph_def)
    for node in resolved.node:
        if node.op != "PlaceholderWithDefault":
            continue
        dtype = node.attr["dtype"]
        if node.name in fed:
            node.op = "Placeholder"
            del node.input[:]
        else:
            node.op = "Identity"
            node.attr["T"].CopyFrom(dtype)
            del node.attr["dtype"]
            del node.attr["shape"]
    return resolved


# --- checking and tidying the ONNX result ----------------------------------------------------


def _check_converted(model: onnx.ModelProto, path: Path) -> None:
    """tf2onnx leaves ops it cannot map in place (continue_on_error): name them."""
    left = Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}"
                   for n in _nodes(model.graph) if not _runnable(n))
    if left:
        ops = ", ".join(f"{op} (×{count})" for op, count in left.most_common())
        raise UserError(f"tf2onnx could not convert these ops to ONNX: {ops}",
                        location=Location(str(path)),
                        hint="cut the model before them with model.outputs, or replace them in "
                             "the source model")


def _runnable(node: onnx.NodeProto) -> bool:
    if node.domain in _ORT_DOMAINS:
        return True
    return onnx.defs.has(node.op_type, node.domain)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, including those in If/Loop bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from _nodes(sub)


def _rename_values(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename values everywhere they appear (a no-op for names not in `names`)."""
    names = {old: new for old, new in names.items() if old != new}
    if not names:
        return
    for value in [*graph.input, *graph.output, *graph.value_info]:
        value.name = names.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        for attr in node.attribute:  # bodies may read outer-scope values by name
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                _rename_values(sub, names)


def _order_outputs(model: onnx.ModelProto, outputs: list[Port]) -> None:
    """Put graph outputs in the ports' order, the order `run_source` returns values in.

    tf2onnx keeps the order it is asked for; this makes that an invariant checked here
    rather than an assumption about tf2onnx."""
    by_name = {o.name: o for o in model.graph.output}
    wanted = [p.name for p in outputs]
    if sorted(by_name) != sorted(wanted):
        raise BuildError(f"tf2onnx produced outputs {sorted(by_name)}, expected {wanted}",
                         stage="import")
    ordered = [by_name[name] for name in wanted]
    del model.graph.output[:]
    model.graph.output.extend(ordered)


def _set_input_shapes(model: onnx.ModelProto, inputs: list[Port]) -> None:
    """Write the recipe's shapes into the graph inputs (tf2onnx's TFLite path ignores them)."""
    shapes = {p.name: p.shape for p in inputs if p.shape is not None}
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = size


def _pad_transposes_as_tensorflow(model: onnx.ModelProto) -> None:
    """Explicit pads, as TensorFlow places them, on each ConvTranspose tf2onnx left with only an
    ``output_shape``: it does so where its input's size was unknown while converting (deepbrain's
    Conv3DBackpropInputV2 after a dropout ``tf.cond``). With ``output_shape`` and no pads ONNX
    (and ONNX Runtime) puts an odd total padding's extra row at the start; TensorFlow's SAME puts
    it at the end, so the output was shifted by one voxel (deepbrain's brain mask: off by 1 of
    1). Where the size is known now (the recipe's input shapes) the pads are written out, the
    start ``total // 2`` as tf2onnx writes them where it knows the size; else ``auto_pad:
    SAME_UPPER``, which ONNX defines the same way."""
    left = [n for n in model.graph.node if n.op_type == "ConvTranspose"
            and {a.name for a in n.attribute} & {"output_shape", "pads"} == {"output_shape"}]
    if not left:
        return
    known = {v.name: onnx_io.value_shape(v) for v in
             [*onnx.shape_inference.infer_shapes(model).graph.value_info, *model.graph.input]}
    for node in left:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        dims = (known.get(node.input[0]) or [None, None])[2:]
        out, kernel = attrs["output_shape"], attrs["kernel_shape"]
        strides = attrs.get("strides", [1] * len(out))
        dilations = attrs.get("dilations", [1] * len(out))
        extra = attrs.get("output_padding", [0] * len(out))
        keep = [a for a in node.attribute if a.name not in ("output_shape", "auto_pad")]
        if len(dims) != len(out) or not all(isinstance(d, int) and d > 0 for d in dims):
            keep = [a for a in node.attribute if a.name != "auto_pad"]
            del node.attribute[:]
            node.attribute.extend([*keep, onnx.helper.make_attribute("auto_pad", "SAME_UPPER")])
            continue
        total = [s * (d - 1) + e + (k - 1) * r + 1 - o
                 for s, d, e, k, r, o in zip(strides, dims, extra, kernel, dilations, out)]
        start = [t // 2 for t in total]
        del node.attribute[:]
        node.attribute.extend([*keep, onnx.helper.make_attribute(
            "pads", start + [t - b for t, b in zip(total, start)])])


def _brief(exc: BaseException) -> str:
    """The first line of an exception's message (TF's run to pages), with its type (for a
    conversion that failed in its own process, the type raised there)."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return f"{getattr(exc, 'kind', type(exc).__name__)}: {line[:300]}"
