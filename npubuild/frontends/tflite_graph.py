"""TFLite flatbuffers as the import edits and runs them (TensorFlow's own flatbuffer classes).

- `cut` keeps the operators the recipe's outputs need, from the recipe's inputs: tf2onnx then
  converts, and the interpreter runs, exactly the cut model, so an op after the cut (a custom op
  nothing can run) plays no part in either.
- `densify` turns sparse weights into dense constants (tf2onnx reads a sparse tensor at its
  dense shape and fails: "cannot reshape array of size 96 into shape (16,1,1,24)").
- `dequantize_weights` turns the int8 weights of a dynamic-range quantized model (float
  activations, hybrid kernels) into the float weights they stand for: npubuild imports the
  float model, and TFLite runs the same float model for the proof.
- `complex_abs_next_to_fft` moves the squeeze between a spectrum and its magnitude after the
  magnitude, the form tf2onnx converts.
- `fft_parts_as_matmul` writes a spectrum of which only the real (or imaginary) part is read as
  the product by that part's DFT basis: tf2onnx converts no other reader of an RFFT2D.
- `unsupported_custom_ops` names custom ops npubuild cannot lower, with the cut that avoids them.
- `with_readable_options` rewrites the C-struct options of the custom ops npubuild lowers
  (`tflite_custom.CUSTOM_OPS`) as the flexbuffer map tf2onnx reads (and checks those stored as
  one already).
- `run` evaluates a model whose custom ops the interpreter lacks: the builtin operators between
  them run in TensorFlow Lite's interpreter, each custom op in its numpy reference.

Tensors are named by their index in subgraph 0 (what the model runs); the other subgraphs
(bodies of WHILE/IF) are kept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.frontends.tflite_custom import CUSTOM_OPS

# TFLite TensorType → numpy (what the interpreter and the references read)
DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
          7: np.int16, 9: np.int8, 10: np.float64}


def read(path: Path | bytes):
    """The model (a file, or a flatbuffer's bytes) as TensorFlow's mutable flatbuffer object
    (``ModelT``)."""
    from tensorflow.lite.tools import flatbuffer_utils

    content = path if isinstance(path, bytes) else Path(path).read_bytes()
    return flatbuffer_utils.read_model_from_bytearray(bytearray(content))


def to_bytes(model) -> bytes:
    from tensorflow.lite.tools import flatbuffer_utils

    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def op_type(model, op) -> str:
    """A builtin op's schema name (``CONV_2D``), or a custom op's code."""
    code = model.operatorCodes[op.opcodeIndex]
    if code.customCode:
        return code.customCode.decode()
    return _builtin_names()[max(code.builtinCode, code.deprecatedBuiltinCode)]


def _builtin_names() -> dict[int, str]:
    from tensorflow.lite.python import schema_py_generated as schema

    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def is_custom(model, op) -> bool:
    return bool(model.operatorCodes[op.opcodeIndex].customCode)


def tensor_name(model, index: int) -> str:
    return model.subgraphs[0].tensors[index].name.decode()


def is_constant(model, index: int) -> bool:
    """Whether a tensor is a constant of the file (a weight), rather than computed or fed: it
    holds data, or it has no elements and a buffer of its own (an empty constant, such as the
    zero-row operand a converted ``tf.cond`` hands its IF; buffer 0 is the file's "no data")."""
    tensor = model.subgraphs[0].tensors[index]
    data = model.buffers[tensor.buffer].data if 0 <= tensor.buffer < len(model.buffers) else None
    if data is not None and len(data) > 0:
        return True
    empty = tensor.shape is not None and 0 in list(tensor.shape)
    return empty and tensor.buffer > 0 and index not in _written(model)


def _written(model) -> set[int]:
    """The tensors an operator of subgraph 0 writes."""
    return {t for op in model.subgraphs[0].operators for t in _writes(op)}


def constant(model, index: int) -> np.ndarray:
    tensor = model.subgraphs[0].tensors[index]
    data = np.asarray(model.buffers[tensor.buffer].data, np.uint8).tobytes()
    return np.frombuffer(data, DTYPES[tensor.type]).reshape(list(tensor.shape))


def computed(model) -> list[int]:
    """Every tensor an operator writes, in graph order."""
    return [t for op in model.subgraphs[0].operators for t in _writes(op)]


def has_integer_activations(model) -> bool:
    """Whether the model computes quantized tensors (int8, uint8 or int16): its integer kernels
    requantize in fixed point, so ONNX Runtime's float requantization differs by a step here
    and there, and a deep network carries those steps to its outputs."""
    tensors = model.subgraphs[0].tensors
    return any(tensors[t].type in _QUANTIZED_TYPES for t in computed(model))


_QUANTIZED_TYPES = (3, 7, 9)


def _reads(op) -> list[int]:
    return [int(t) for t in op.inputs if t >= 0]


def _writes(op) -> list[int]:
    return [int(t) for t in op.outputs if t >= 0]


# --- cutting ----------------------------------------------------------------------------------


def cut(model, inputs: list[int], outputs: list[int]) -> None:
    """Keep (in place) only the operators that compute `outputs` from `inputs` and constants;
    they become the graph's inputs and outputs. Raises ValueError naming a tensor the kept
    operators need that is neither an input nor computed by them."""
    graph = model.subgraphs[0]
    stop = set(inputs)
    keep, needed = _needed(model, outputs, stop)
    made = {t for op in keep for t in _writes(op)}
    for t in sorted(needed - made - stop):
        if not is_constant(model, t):
            reader = next(op for op in keep if t in _reads(op))
            raise ValueError(f"tensor {tensor_name(model, t)!r} (shape "
                             f"{list(graph.tensors[t].shape)}, read by {op_type(model, reader)} "
                             f"writing {tensor_name(model, _writes(reader)[0])!r}) is needed for "
                             "the outputs but is neither a model input, a constant nor computed "
                             "from them")
    graph.operators = keep
    graph.inputs, graph.outputs = list(inputs), list(outputs)
    model.signatureDefs = []  # their tensor lists describe the uncut model


def _needed(model, outputs: list[int], stop: set[int]) -> tuple[list, set[int]]:
    """The operators of subgraph 0 that compute `outputs` (none past a tensor of `stop`), in
    order, and every tensor they and `outputs` need."""
    needed, keep = set(outputs), []
    for op in reversed(model.subgraphs[0].operators):
        if any(t in needed for t in _writes(op)) and not any(t in stop for t in _writes(op)):
            keep.append(op)
            needed.update(t for t in _reads(op) if t not in stop)
    keep.reverse()
    return keep, needed


def depends_on(model, outputs: list[int], tensors: list[int]) -> list[int]:
    """Those of `tensors` (graph inputs) that computing `outputs` reads, in their order."""
    read = {t for op in _needed(model, outputs, set(tensors))[0] for t in _reads(op)}
    return [t for t in tensors if t in read or t in outputs]


# --- custom ops -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsupported:
    """Custom ops npubuild cannot lower, and the outputs of the cut that avoids all of them."""

    ops: list[tuple[str, str]]  # (op, its first output tensor)
    cut_outputs: list[str]


def unsupported_custom_ops(model) -> Unsupported | None:
    """The custom ops without a lowering (None when there are none). The cut keeps every graph
    output that does not depend on them, and every computed tensor they read."""
    graph = model.subgraphs[0]
    bad = [op for op in graph.operators if is_custom(model, op)
           and op_type(model, op) not in CUSTOM_OPS and not op_type(model, op).startswith("Flex")]
    if not bad:
        return None
    computed, tainted = set(int(t) for t in graph.inputs), set()
    for op in graph.operators:
        if any(t in computed for t in _reads(op)):
            computed.update(_writes(op))
        if any(op is b for b in bad) or any(t in tainted for t in _reads(op)):
            tainted.update(_writes(op))
    before = [t for op in bad for t in _reads(op) if t in computed and t not in tainted]
    keep = [int(t) for t in graph.outputs if int(t) not in tainted] + before
    names = list(dict.fromkeys(tensor_name(model, t) for t in keep))
    return Unsupported([(op_type(model, op), tensor_name(model, _writes(op)[0])) for op in bad],
                       names)


# Ops of a model that keeps state between invocations in resource variables (a streaming model:
# microWakeWord's ring buffers); tf2onnx converts none of them.
STATE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE")


def state_ops(model) -> dict[str, int]:
    """How many of each `STATE_OPS` op the model's subgraphs hold (empty: a stateless model)."""
    found: dict[str, int] = {}
    for graph in model.subgraphs:
        for op in graph.operators:
            name = op_type(model, op)
            if name in STATE_OPS:
                found[name] = found.get(name, 0) + 1
    return found


@dataclass
class Variable:
    """A resource variable written as explicit state: the graph input that holds its value
    before a step, the graph output that holds it after (None when the step never assigns it),
    and the value CALL_ONCE's initialisation assigns (what a user feeds on the first step)."""

    name: str
    input: int
    output: int | None
    initial: np.ndarray | None
    written: str | None = None  # the stateful model's name of `output`



def variables_as_io(model) -> list[Variable]:
    """Rewrite (in place) a streaming model's resource variables as explicit state: each
    variable's first READ_VARIABLE output becomes a graph input named after the variable (its
    shape, type and quantization are the read's), its last ASSIGN_VARIABLE value a graph output
    ``<name>_out``; a read after an assignment reads the assigned value. VAR_HANDLE,
    READ_VARIABLE, ASSIGN_VARIABLE and CALL_ONCE leave subgraph 0, and the subgraphs CALL_ONCE
    runs are emptied once their constant initial values are recorded. Returns the variables in
    the order the graph first reads or assigns them (empty: a stateless model). Raises
    ValueError when a variable is assigned before it is read with no initial value known from
    its initialisation, or when an assigned value is already a graph input or output."""
    graph = model.subgraphs[0]
    tensors = graph.tensors
    names: dict[int, str] = {}  # VAR_HANDLE output -> variable name
    initial: dict[str, np.ndarray] = {}
    init_graphs: list[int] = []
    for op in graph.operators:
        kind = op_type(model, op)
        if kind == "VAR_HANDLE":
            names[_writes(op)[0]] = _variable_name(op)
        elif kind == "CALL_ONCE":
            init_graphs.append(int(op.builtinOptions.initSubgraphIndex))
    if not names:
        return []
    for index in init_graphs:
        initial.update(_initial_values(model, index))
    current: dict[str, int] = {}  # variable name -> the tensor holding its value now
    inputs: dict[str, int] = {}
    rewired: dict[int, int] = {}
    kept = []
    for op in graph.operators:
        kind = op_type(model, op)
        if kind in ("VAR_HANDLE", "CALL_ONCE"):
            continue
        if kind == "READ_VARIABLE":
            name, read = names[_reads(op)[0]], _writes(op)[0]
            if name in current:
                rewired[read] = current[name]
            else:
                inputs[name] = current[name] = read
            continue
        if kind == "ASSIGN_VARIABLE":
            name, value = names[int(op.inputs[0])], int(op.inputs[1])
            current[name] = rewired.get(value, value)
            continue
        op.inputs = [rewired.get(int(t), int(t)) for t in op.inputs]
        kept.append(op)
    graph.operators = kept
    graph.outputs = [rewired.get(int(t), int(t)) for t in graph.outputs]
    for handle, name in names.items():  # the handles' names go to the state tensors
        tensors[handle].name = name.encode() + b"/handle"
    variables, outputs = [], {int(t) for t in graph.outputs}
    for name in dict.fromkeys(list(inputs) + list(current)):
        if name not in inputs:  # assigned, never read: its value before the step is unused
            if name not in initial:
                raise ValueError(f"variable {name!r} is assigned before any read and has no "
                                 "constant initial value")
            inputs[name] = _new_input(model, name, initial[name], tensors[current[name]])
        output = current[name] if current[name] != inputs[name] else None
        if output is not None and (output in outputs or output in graph.inputs
                                   or output in inputs.values()):
            raise ValueError(f"variable {name!r} is assigned tensor "
                             f"{tensor_name(model, output)!r}, which is already a graph input or "
                             "output")
        tensors[inputs[name]].name = name.encode()
        written = tensor_name(model, output) if output is not None else None
        if output is not None:
            tensors[output].name = name.encode() + b"_out"
        variables.append(Variable(name, inputs[name], output, initial.get(name), written))
    graph.inputs = [int(t) for t in graph.inputs] + [v.input for v in variables]
    graph.outputs = [int(t) for t in graph.outputs] + [v.output for v in variables
                                                       if v.output is not None]
    for index in init_graphs:
        model.subgraphs[index].operators = []
    model.signatureDefs = []  # their tensor lists describe the stateful model
    return variables


def _variable_name(op) -> str:
    options = op.builtinOptions
    container = (options.container or b"").decode()
    shared = (options.sharedName or b"").decode()
    return f"{container}/{shared}" if container else shared


def _initial_values(model, index: int) -> dict[str, np.ndarray]:
    """The constant values subgraph `index` (a CALL_ONCE initialisation) assigns, by variable."""
    graph = model.subgraphs[index]
    names = {_writes(op)[0]: _variable_name(op) for op in graph.operators
             if op_type(model, op) == "VAR_HANDLE"}
    values = {}
    for op in graph.operators:
        if op_type(model, op) == "ASSIGN_VARIABLE":
            tensor = graph.tensors[int(op.inputs[1])]
            data = model.buffers[tensor.buffer].data if tensor.buffer > 0 else None
            if data is not None and len(data):
                values[names[int(op.inputs[0])]] = np.frombuffer(
                    np.asarray(data, np.uint8).tobytes(), DTYPES[tensor.type]
                ).reshape(list(tensor.shape)).copy()
    return values


def _new_input(model, name: str, value: np.ndarray, like) -> int:
    """A graph input tensor of `like`'s shape, type and quantization (an unread state)."""
    from tensorflow.lite.python import schema_py_generated as schema

    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type = name.encode(), list(value.shape), like.type
    tensor.quantization, tensor.buffer = like.quantization, 0
    model.subgraphs[0].tensors.append(tensor)
    return len(model.subgraphs[0].tensors) - 1


def prove_variables_as_io(tf, original: bytes, rewritten: bytes, variables: list[Variable],
                          steps: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Step TFLite's interpreter on the `original` stateful model from its reset state over
    `steps` (input name -> value, one dict per call), and the `rewritten` model (`variables_as_io`)
    with each state fed what it output on the step before (its initial value on the first):
    every output and every new state must be equal. Returns the largest absolute difference by
    tensor name; raises ValueError naming the first that differs."""
    before = tf.lite.Interpreter(model_content=original, experimental_preserve_all_tensors=True,
                                 experimental_op_resolver_type=tf.lite.experimental.OpResolverType.
                                 BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    before.allocate_tensors()
    after = interpreter_for(tf, rewritten)
    after.allocate_tensors()
    states = {v.name: v.initial for v in variables}
    by_name = {d["name"]: d for d in before.get_tensor_details()}
    worst: dict[str, float] = {}
    for step, feeds in enumerate(steps):
        for detail in before.get_input_details():
            before.set_tensor(detail["index"], feeds[detail["name"]])
        before.invoke()
        for detail in after.get_input_details():
            value = states[detail["name"]] if detail["name"] in states else feeds[detail["name"]]
            after.set_tensor(detail["index"], value)
        after.invoke()
        got = {d["name"]: after.get_tensor(d["index"]) for d in after.get_output_details()}
        expected = {d["name"]: before.get_tensor(d["index"]) for d in before.get_output_details()}
        for v in variables:  # the original's new state: the value its last assignment wrote
            if v.output is not None:
                expected[f"{v.name}_out"] = before.get_tensor(
                    by_name[v.written]["index"])
        for name, value in expected.items():
            diff = float(np.max(np.abs(got[name].astype(np.float64) - value.astype(np.float64)),
                                initial=0.0))
            worst[name] = max(worst.get(name, 0.0), diff)
            if diff > 0:
                raise ValueError(f"step {step}: {name!r} differs from the stateful model's by "
                                 f"{diff:g}")
        states.update({v.name: got[f"{v.name}_out"] for v in variables if v.output is not None})
    return worst


def with_readable_options(model) -> None:
    """Rewrite (in place) the options of every custom op npubuild lowers as a flexbuffer map of
    its struct's fields. Raises ValueError naming the op when its options do not parse."""
    from flatbuffers import flexbuffers

    for op in model.subgraphs[0].operators:
        if is_custom(model, op) and op_type(model, op) in CUSTOM_OPS:
            options = _options(model, op)  # checked, also where already a flexbuffer map
            if CUSTOM_OPS[op_type(model, op)].flexbuffer:
                continue
            op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), np.uint8)


def _options(model, op) -> dict:
    name = op_type(model, op)
    raw = bytes(np.asarray(op.customOptions if op.customOptions is not None else [], np.uint8))
    try:
        return CUSTOM_OPS[name].options(raw)
    except ValueError as exc:
        raise ValueError(f"custom op {name!r} (output {tensor_name(model, _writes(op)[0])!r}): "
                         f"{exc}") from None


# --- running ----------------------------------------------------------------------------------


def run(tf, model, feeds: dict[int, np.ndarray], wanted: list[int]) -> dict[int, np.ndarray]:
    """Evaluate `wanted` tensors from `feeds` (tensor index → value): runs of builtin operators
    in the interpreter, each lowered custom op in its numpy reference, in graph order."""
    values = dict(feeds)
    for segment in _segments(model):
        if is_custom(model, segment[0]):
            op = segment[0]
            args = [values[t] if t in values else constant(model, t) for t in _reads(op)]
            results = CUSTOM_OPS[op_type(model, op)].reference(*args, _options(model, op))
            values.update(zip(_writes(op), results))
        else:
            values.update(_run_builtin(tf, model, segment, values))
    return {t: values[t] for t in wanted}


def _segments(model) -> list[list]:
    """Operators in graph order, grouped: each custom op alone, builtin ops in runs."""
    segments: list[list] = []
    for op in model.subgraphs[0].operators:
        custom = is_custom(model, op)
        if segments and not custom and not is_custom(model, segments[-1][0]):
            segments[-1].append(op)
        else:
            segments.append([op])
    return segments


def _run_builtin(tf, model, ops: list, values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run `ops` alone in the interpreter: a copy of the model whose inputs are the computed
    tensors they read and whose outputs are every tensor they write."""
    graph = model.subgraphs[0]
    saved = graph.operators, graph.inputs, graph.outputs, model.signatureDefs
    made = {t for op in ops for t in _writes(op)}
    inputs = sorted({t for op in ops for t in _reads(op)
                     if t not in made and not is_constant(model, t)})
    outputs = sorted(made)
    graph.operators, graph.inputs, graph.outputs, model.signatureDefs = ops, inputs, outputs, []
    try:
        content = to_bytes(model)
    finally:
        graph.operators, graph.inputs, graph.outputs, model.signatureDefs = saved
    interpreter = interpreter_for(tf, content)
    details = interpreter.get_input_details()
    order = [d["index"] for d in details]
    for detail, tensor in zip(details, inputs):  # the interpreter keeps subgraph tensor indices
        if list(detail["shape"]) != list(values[tensor].shape):
            interpreter.resize_tensor_input(detail["index"], values[tensor].shape)
    interpreter.allocate_tensors()
    for index, tensor in zip(order, inputs):
        interpreter.set_tensor(index, values[tensor])
    interpreter.invoke()
    return {t: interpreter.get_tensor(t).copy() for t in outputs}


def interpreter_for(tf, content: bytes):
    """The interpreter on builtin kernels without the XNNPACK delegate: no start-up banner, and
    the model's own float math."""
    resolver = tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    return tf.lite.Interpreter(model_content=content, experimental_op_resolver_type=resolver)


# --- sparse weights ---------------------------------------------------------------------------


def densify(tf, model) -> bool:
    """Replace (in place) every DENSIFY operator by a constant holding its dense result; True
    when there was one. The interpreter computes them (they read constants only)."""
    graph = model.subgraphs[0]
    ops = [op for op in graph.operators if op_type(model, op) == "DENSIFY"]
    if not ops:
        return False
    from tensorflow.lite.python import schema_py_generated as schema

    dense = _run_builtin(tf, model, ops, {})
    for op in ops:
        out = _writes(op)[0]
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(dense[out].tobytes(), np.uint8)
        model.buffers.append(buffer)
        # the sparse input too: tf2onnx reads every constant, used or not, at its dense shape
        for index in (out, _reads(op)[0]):
            graph.tensors[index].buffer = len(model.buffers) - 1
            graph.tensors[index].sparsity = None
    graph.operators = [op for op in graph.operators if not any(op is d for d in ops)]
    return True


# --- spectra ----------------------------------------------------------------------------------

# Operators that only move data: an element-wise op commutes with them
_MOVES_DATA = ("SQUEEZE", "RESHAPE", "EXPAND_DIMS", "TRANSPOSE")


def complex_abs_next_to_fft(model) -> int:
    """Move the data movement between an RFFT2D and the COMPLEX_ABS of its spectrum after the
    COMPLEX_ABS (in place; returns how many operators moved). The magnitude is element-wise, so
    it commutes with a squeeze or a reshape, bit for bit; tf2onnx converts an RFFT2D only when
    COMPLEX_ABS reads it directly, and TFLite Model Maker's speech-commands spectrogram squeezes
    the complex spectrum first ("Current implementation of RFFT2D only allows ComplexAbs as
    consumer not {'Squeeze'}")."""
    graph = model.subgraphs[0]
    tensors = graph.tensors
    moved = 0
    while True:
        producers = {t: op for op in graph.operators for t in _writes(op)}
        readers: dict[int, int] = {}
        for op in graph.operators:
            for t in _reads(op):
                readers[t] = readers.get(t, 0) + 1
        outputs = {int(t) for t in graph.outputs}
        swap = None
        for op in graph.operators:
            if op_type(model, op) != "COMPLEX_ABS":
                continue
            mover = producers.get(int(op.inputs[0]))
            if (mover is None or op_type(model, mover) not in _MOVES_DATA
                    or readers.get(int(mover.outputs[0])) != 1 or int(mover.outputs[0]) in outputs
                    or not _from_fft(model, producers, mover)):
                continue
            swap = op, mover
            break
        if swap is None:
            return moved
        op, mover = swap
        spectrum, moved_spectrum, magnitude = int(mover.inputs[0]), int(mover.outputs[0]), int(op.outputs[0])
        # COMPLEX_ABS(spectrum) -> moved_spectrum, now real at the spectrum's shape; the mover
        # then reshapes it into the magnitude tensor the rest of the graph reads
        tensors[moved_spectrum].type = tensors[magnitude].type
        tensors[moved_spectrum].shape = list(tensors[spectrum].shape)
        signature = tensors[spectrum].shapeSignature
        tensors[moved_spectrum].shapeSignature = None if signature is None else list(signature)
        op.inputs[0], op.outputs[0] = spectrum, moved_spectrum
        mover.inputs[0], mover.outputs[0] = moved_spectrum, magnitude
        graph.operators.remove(op)
        graph.operators.insert(next(i for i, o in enumerate(graph.operators) if o is mover), op)
        moved += 1


def _from_fft(model, producers: dict, op) -> bool:
    """Whether ``op`` reads an RFFT2D's spectrum through data movement only."""
    while op is not None:
        kind = op_type(model, op)
        if kind == "RFFT2D":
            return True
        if kind not in _MOVES_DATA:
            return False
        op = producers.get(int(op.inputs[0]))
    return False


# TFLite's COMPLEX64 tensor type, and the ops that read one part of a spectrum: TensorFlow's cast
# of a complex tensor to a real type keeps the real part (BirdNET's spectrogram is written so).
_COMPLEX64 = 8
_PART_BASIS = {"REAL": np.cos, "CAST": np.cos, "IMAG": lambda angle: -np.sin(angle)}


def fft_parts_as_matmul(model) -> int:
    """Replace (in place) each one-row RFFT2D whose spectrum is read, through data movement
    only, by one REAL, IMAG or CAST to a real type by a BATCH_MATMUL with that part's constant
    DFT basis (``cos(2πkn/L)``, ``-sin(2πkn/L)``); the part's operator goes, and the data
    movement between carries real values. Returns how many. tf2onnx converts an RFFT2D only
    when COMPLEX_ABS reads it ("could not convert these ops to ONNX: RFFT2D"); one part of a
    spectrum is a linear map of the frames, the form the rest of npubuild handles (the split
    keeps a spectrum's product on the CPU, `split/spectrum.py`)."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    tensors = graph.tensors
    replaced = 0
    for fft in [op for op in graph.operators if op_type(model, op) == "RFFT2D"]:
        chain = _part_reader(model, fft)
        if chain is None:
            continue
        movers, part = chain
        frames = int(fft.inputs[0])
        shape, signature = list(tensors[frames].shape), tensors[frames].shapeSignature
        length = [int(v) for v in constant(model, int(fft.inputs[1])).reshape(-1)]
        fixed = signature is None or all(int(v) > 0 for v in list(signature)[-2:])
        if len(shape) < 2 or shape[-2] != 1 or length[0] != 1 or not fixed:
            continue  # a 2-D transform, or frames of a length only known when it runs
        samples, bins = shape[-1], length[1] // 2 + 1
        n = np.arange(samples)[:, None]
        basis = _PART_BASIS[op_type(model, part)](2 * np.pi * n * np.arange(bins)[None] / length[1])
        basis[n[:, 0] >= length[1]] = 0.0  # the transform reads the first `length` samples only
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(basis.astype(np.float32).tobytes(), np.uint8)
        model.buffers.append(buffer)
        constant_tensor = schema.TensorT()
        constant_tensor.name = tensors[int(fft.outputs[0])].name + b"/dft_basis"
        constant_tensor.shape, constant_tensor.type = [samples, bins], 0
        constant_tensor.buffer = len(model.buffers) - 1
        tensors.append(constant_tensor)
        fft.opcodeIndex = _opcode(model, schema.BuiltinOperator.BATCH_MATMUL)
        fft.inputs = [frames, len(tensors) - 1]
        fft.builtinOptionsType = schema.BuiltinOptions.BatchMatMulOptions
        fft.builtinOptions = schema.BatchMatMulOptionsT()
        for op in [fft] + movers:
            tensors[int(op.outputs[0])].type = tensors[int(part.outputs[0])].type
        ([fft] + movers)[-1].outputs[0] = int(part.outputs[0])
        graph.operators = [op for op in graph.operators if op is not part]
        replaced += 1
    return replaced


def _part_reader(model, fft):
    """The data movement after ``fft`` and the REAL, IMAG or CAST (to float32) that then reads
    its spectrum, when each tensor on the way has that one reader and none is a graph output;
    else None."""
    graph = model.subgraphs[0]
    outputs = {int(t) for t in graph.outputs}
    tensor, movers = int(fft.outputs[0]), []
    while tensor not in outputs:
        readers = [op for op in graph.operators if tensor in _reads(op)]
        if len(readers) != 1:
            return None
        kind = op_type(model, readers[0])
        if kind in _MOVES_DATA:
            movers.append(readers[0])
            tensor = int(readers[0].outputs[0])
        elif kind in _PART_BASIS and graph.tensors[int(readers[0].outputs[0])].type == 0:
            return movers, readers[0]
        else:
            return None
    return None


def fully_connected_inputs_as_matrices(model) -> int:
    """Give each FULLY_CONNECTED that has a bias and reads an input of rank above 2 (without
    ``keep_num_dims``, so the op flattens it to rows of the weights' width) that flattening as
    a RESHAPE before it (in place; returns how many). The same values; tf2onnx 1.17 flattens
    such an input itself but then drops the bias ("replace_inputs(node, [reshape, weights])"):
    microWakeWord's last dense layer lost its int32 bias, 2 int8 steps on its logit."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    tensors = graph.tensors
    added = 0
    for op in list(graph.operators):
        if op_type(model, op) != "FULLY_CONNECTED" or len(op.inputs) < 3 or op.inputs[2] < 0:
            continue
        if op.builtinOptions is None or op.builtinOptions.keepNumDims:
            continue
        source, width = int(op.inputs[0]), int(list(tensors[int(op.inputs[1])].shape)[-1])
        shape = [int(d) for d in list(tensors[source].shape)]
        if len(shape) <= 2 or width <= 0 or int(np.prod(shape)) % width:
            continue
        rows = int(np.prod(shape)) // width
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(np.asarray([rows, width], np.int32).tobytes(), np.uint8)
        model.buffers.append(buffer)
        new_shape = schema.TensorT()
        new_shape.name = tensors[source].name + b"/as_matrix_shape"
        new_shape.shape, new_shape.type, new_shape.buffer = [2], 2, len(model.buffers) - 1
        matrix = schema.TensorT()
        matrix.name = tensors[source].name + b"/as_matrix"
        matrix.shape, matrix.type = [rows, width], tensors[source].type
        matrix.quantization, matrix.buffer = tensors[source].quantization, 0
        tensors.extend([new_shape, matrix])
        reshape = schema.OperatorT()
        reshape.opcodeIndex = _opcode(model, schema.BuiltinOperator.RESHAPE)
        reshape.inputs, reshape.outputs = [source, len(tensors) - 2], [len(tensors) - 1]
        reshape.builtinOptionsType = schema.BuiltinOptions.ReshapeOptions
        reshape.builtinOptions = schema.ReshapeOptionsT()
        reshape.builtinOptions.newShape = [rows, width]
        graph.operators.insert(next(i for i, o in enumerate(graph.operators) if o is op), reshape)
        op.inputs = [len(tensors) - 1] + [int(t) for t in op.inputs[1:]]
        added += 1
    return added


def _opcode(model, builtin: int) -> int:
    """The index of `builtin`'s operator code in the model, added when missing."""
    from tensorflow.lite.python import schema_py_generated as schema

    for index, code in enumerate(model.operatorCodes):
        if not code.customCode and max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


# --- dynamic-range quantized weights -------------------------------------------------------


def dequantize_weights(model) -> int:
    """Replace (in place) every quantized constant an operator reads beside float activations
    (a dynamic-range model's hybrid CONV_2D, FULLY_CONNECTED, LSTM...: int8 weights, float
    inputs) by the float32 constant it stands for, ``(q - zero_point) * scale`` per tensor or
    per channel; returns how many. A full-integer model's weights (read beside integer
    activations) and DEQUANTIZE's input are left as they are."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = model.subgraphs[0]
    tensors = graph.tensors
    done: set[int] = set()
    for op in graph.operators:
        if op_type(model, op) == "DEQUANTIZE":
            continue
        reads = _reads(op)
        activations = [t for t in reads if not is_constant(model, t)]
        if not activations or any(tensors[t].type != 0 for t in activations):
            continue
        weights = [t for t in reads if is_constant(model, t) and tensors[t].type in _QUANTIZED_TYPES
                   and tensors[t].quantization is not None
                   and tensors[t].quantization.scale is not None
                   and len(tensors[t].quantization.scale)]
        for t in weights:
            if t in done:
                continue
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(
                _dequantized(constant(model, t), tensors[t].quantization).tobytes(), np.uint8)
            model.buffers.append(buffer)
            tensors[t].buffer, tensors[t].type, tensors[t].quantization = len(model.buffers) - 1, 0, None
            done.add(t)
        if weights and hasattr(op.builtinOptions, "asymmetricQuantizeInputs"):
            op.builtinOptions.asymmetricQuantizeInputs = False  # a float kernel now, not hybrid
    return len(done)


def _dequantized(values: np.ndarray, q) -> np.ndarray:
    """``(q - zero_point) * scale``, per channel along ``quantizedDimension`` when there are
    several scales (float32 arithmetic, as TFLite's own DEQUANTIZE)."""
    scale = np.asarray(q.scale, np.float32)
    zero = np.asarray(q.zeroPoint if q.zeroPoint is not None else [0], np.float32)
    if scale.size > 1:
        shape = [1] * values.ndim
        shape[q.quantizedDimension] = scale.size
        scale = scale.reshape(shape)
        zero = zero.reshape(shape) if zero.size == scale.size else zero.reshape(())
    return ((values.astype(np.float32) - zero) * scale).astype(np.float32)
