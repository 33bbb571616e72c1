"""The quantized graph: what ``quantize`` hands to ``compile`` and what the reference runs.

A ``QGraph`` is an ordered (topologically sorted) list of layers over named tensors. It is saved
as two files beside each other, ``graph_<i>.qgraph.json`` (structure and parameters) and
``graph_<i>.qgraph.npz`` (integer arrays; read with ``allow_pickle=False``)::

    {"format": "npubuild.qgraph", "version": 1, "name": "graph_1",
     "scheme": "pow2_symmetric" | "symmetric" | "asymmetric",
     "granularity": "per_tensor" | "per_channel", "rounding": "half_up" | "half_even",
     "inputs": [tensor, ...], "outputs": [tensor, ...],
     "tensors": {name: {"shape": [1, 16, 160, 160], "dtype": "int8" | "int16" | "float32",
                        "scale": 0.0625, "zero_point": 0, "log2scale": 4 | null}},
     "constants": {name: "<npz key>"},        # quantized constant operands (anchors, ...)
     "layers": [{"name": "/model.0/conv/Conv", "kind": "conv", "device": "npu" | "cpu",
                 "inputs": [tensor, ...], "outputs": [tensor, ...],
                 "attrs": {...}, "params": {...},
                 "arrays": {"weight": {"key": "L0.weight", "dtype": "int8", "shape": [...]}, ...},
                 "source_nodes": [ONNX node names]}]}

Equal arrays are stored once: a layer's ``key`` names the first layer's array of the same
dtype, shape and bytes (an unrolled recurrence's steps share their weights), and the arrays a
loaded graph holds are read-only.

Real value of a tensor: ``(q - zero_point) · scale``; ``log2scale`` is set for pow2 graphs
(``scale == 2^-log2scale``). Float tensors (``dtype: float32``) only touch ``cpu`` layers.
Every layer that rounds (conv, add, mul, rescale, concat, avgpool, resize linear) computes
``requantize(acc, multiplier, shift)`` of ``npubuild.quant.schemes`` with ties rounded as its
``params.rounding`` says (the graph's ``rounding``: half_up for pow2, half_even for float
scales) and clamps to ``[qmin, qmax]`` (params); the others move data and keep their input's parameters.
The integer semantics of every kind are defined in ``npubuild.quant.schemes`` and computed by
``npubuild.quant.reference``; the fields each kind carries:

=========  =================================================================================
kind       attrs / params / arrays
=========  =================================================================================
conv       attrs: kernel [kh,kw], stride, dilation, pads [top,bottom,left,right], group,
           fc (Gemm/MatMul: input [..., K], weight [Cout, K, 1, 1]); params: input_zp,
           output_zp, output_dtype, qmin, qmax (folded Relu/Clip), activation, weight_scale
           [Cout]; arrays: weight int8 [Cout, Cin/group, kh, kw], bias int32 [Cout] (at scale
           s_x·s_w), multiplier int64 [Cout], shift [Cout]; W16A16 (an int16 input chosen
           ``w16a16``): weight int16 and bias int64 (|bias| < 2^40); pow2 also: input_log2scale,
           weight_log2scale [Cout], output_log2scale, output_shift [Cout] (= in + w - out), and
           with ``bias: int8_shift``: bias_int8, bias_log2scale, bias_shift (bias = b8 << shift)
add        (add, sub, sum of two) params: input_zps, multipliers [M_a, ±M_b], shift,
           output_zp, qmin, qmax; pow2 also output_shift_bit = output_log2scale − max(input
           log2scales) (seed 004's left shift; both inputs are first aligned exactly to the
           finer scale, where the seed aligns to the coarser ``min`` and drops low bits)
mul        params: input_zps, multiplier, shift, output_zp, qmin, qmax
matmul     (MatMul of two activations, batch dimensions broadcast) attrs: factor (a folded
           scalar Mul/Div, absent for 1); params: input_zps, multiplier, shift, output_zp,
           qmin, qmax: ``(a - zp_a) @ (b - zp_b)`` requantized
layernorm  (LayerNormalization; an RMS norm written in primitives, with rms) attrs: axis
           (the first normalized axis, non-negative), epsilon, rms (true: no mean subtracted,
           the row over the root of its mean square plus epsilon); params: input_zp,
           epsilon_steps (epsilon over the input's squared scale), output_zp, qmin, qmax; arrays: gain, offset (Scale and B over the output scale, one
           per normalized element): integer row statistics, the normalization in float64
lrn        (LRN) attrs: size, alpha, beta, bias; params: input_zp, alpha_steps (alpha / size
           over the input's squared scale), input_over_output (the input's scale over the
           output's), output_zp, qmin, qmax: the channel window's sum of squares of
           ``x - zp`` in exact integers, the normalization in float64
rescale    (Mul/Div by a scalar constant; PRelu, LeakyRelu) attrs: factor, and for PRelu and
           LeakyRelu function, negative_factor (one, or a list along axis); params: input_zp,
           multiplier, shift, output_zp; arrays: negative_multiplier, negative_shift [1 or
           size of axis] (the factor where x - input_zp < 0). A model's integer I/O
           (``integer_io``: input | output, `ops.integer_io`): an input's DequantizeLinear
           ``s · (x - z)`` has ``input_offset`` z (in input_zp), an output's QuantizeLinear
           ``y / s + z`` has ``divisor`` s and ``output_offset`` z (in output_zp)
concat     attrs: axis; params: input_zps, multipliers [..], shifts [..], output_zp
maxpool    attrs: kernel, stride, dilation, pads (no arithmetic: pads hold qmin)
avgpool    attrs: kernel, stride, pads, count_include_pad, global; params: input_zp,
           output_zp; arrays: counts, multiplier, shift (one pair per window count);
           pow2 also input_pre_ls
resize     attrs: mode nearest|linear, coordinate_transformation_mode, nearest_mode,
           output_size [H, W]; linear params: input_zp, output_zp, multiplier, shift
lut        attrs: function; params: table_lo; arrays: table (the input integers from
           table_lo on where the output changes: y = table[clamp(q, lo, lo + size - 1)
           - lo], `schemes.trim_lut`), model (the float fragment it was built from)
reshape    attrs: shape          transpose  attrs: perm
depth_to_space  attrs: blocksize, mode (CRD | DCR): ONNX DepthToSpace of a 4-D tensor
slice      attrs: starts, ends, axes, steps      split  attrs: axis, sizes
pad        attrs: pads (ONNX order), value (integer, = zero point)
float      device cpu: arrays: model (a serialized one-node ONNX model, float in/out); int
           inputs are dequantized before it and int outputs quantized after it
=========  =================================================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npubuild.atomic import atomic_path, write_json
from npubuild.engine.hashing import sha256_array
from npubuild.errors import BuildError
from npubuild.quant import schemes
from npubuild.quant.schemes import QParams

FORMAT = "npubuild.qgraph"
VERSION = 1
KINDS = ("conv", "add", "mul", "matmul", "layernorm", "lrn", "rescale", "concat", "maxpool", "avgpool", "resize", "lut", "softmax",
         "reshape", "transpose", "depth_to_space", "slice", "split", "pad", "float")
#: Layers that only move integers: the output keeps the input's scale and zero point.
DATA_MOVEMENT = ("maxpool", "reshape", "transpose", "depth_to_space", "slice", "split", "pad")


@dataclass
class QTensor:
    """One tensor of the graph and its quantization parameters."""

    name: str
    shape: list[int]
    dtype: str = "int8"
    scale: float | None = None
    zero_point: int = 0
    log2scale: int | None = None

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    @property
    def params(self) -> QParams:
        if self.is_float:
            raise BuildError(f"tensor {self.name!r} is float: it has no quantization parameters")
        return QParams(float(self.scale), int(self.zero_point), self.log2scale, self.dtype)

    def as_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "scale": self.scale,
                "zero_point": self.zero_point, "log2scale": self.log2scale}


@dataclass
class QLayer:
    """One operation: integer kernels for NPU layers, a float ONNX node for CPU ones."""

    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    source_nodes: list[str] = field(default_factory=list)
    device: str = "npu"


@dataclass
class QGraph:
    name: str
    scheme: str
    granularity: str
    inputs: list[str]
    outputs: list[str]
    tensors: dict[str, QTensor]
    layers: list[QLayer]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def tensor(self, name: str) -> QTensor:
        return self.tensors[name]

    def producers(self) -> dict[str, QLayer]:
        return {t: layer for layer in self.layers for t in layer.outputs}

    def consumers(self) -> dict[str, list[QLayer]]:
        found: dict[str, list[QLayer]] = {}
        for layer in self.layers:
            for t in layer.inputs:
                found.setdefault(t, []).append(layer)
        return found

    def cpu_layers(self) -> list[QLayer]:
        return [layer for layer in self.layers if layer.device == "cpu"]

    # ---- files ---------------------------------------------------------------------------

    def save(self, json_path: str | Path) -> tuple[Path, Path]:
        """Write ``<stem>.qgraph.json`` and ``<stem>.qgraph.npz`` (atomically)."""
        json_path = Path(json_path)
        npz_path = npz_path_for(json_path)
        arrays: dict[str, np.ndarray] = {}
        doc = self._document(arrays)
        doc["arrays_file"] = npz_path.name
        with atomic_path(npz_path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
        write_json(json_path, doc)
        return json_path, npz_path

    def _document(self, arrays: dict[str, np.ndarray]) -> dict:
        layers = []
        stored: dict[bytes, str] = {}  # content -> the key it went under first
        for i, layer in enumerate(self.layers):
            refs = {}
            for key, value in layer.arrays.items():
                value = np.asarray(value)
                npz_key = _stored_once(arrays, stored, f"L{i}.{key}", value)
                refs[key] = {"key": npz_key, "dtype": str(value.dtype), "shape": list(value.shape)}
            layers.append({"name": layer.name, "kind": layer.kind, "device": layer.device,
                           "inputs": layer.inputs, "outputs": layer.outputs,
                           "attrs": layer.attrs, "params": layer.params, "arrays": refs,
                           "source_nodes": layer.source_nodes})
        constants = {}
        for j, (name, value) in enumerate(self.constants.items()):
            constants[name] = f"C{j}"
            arrays[f"C{j}"] = np.asarray(value)
        return {"format": FORMAT, "version": VERSION, "name": self.name, "scheme": self.scheme,
                "granularity": self.granularity,
                "rounding": schemes.rounding_for(self.scheme),
                "inputs": self.inputs, "outputs": self.outputs,
                "tensors": {n: t.as_dict() for n, t in self.tensors.items()},
                "constants": constants, "layers": layers}

    @classmethod
    def load(cls, json_path: str | Path) -> "QGraph":
        json_path = Path(json_path)
        doc = json.loads(json_path.read_text())
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise BuildError(f"{json_path} is not a {FORMAT} v{VERSION} file")
        with np.load(npz_path_for(json_path), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        for value in arrays.values():  # layers may share one (`_stored_once`): none writes it
            value.flags.writeable = False
        tensors = {n: QTensor(n, **t) for n, t in doc["tensors"].items()}
        layers = [QLayer(name=d["name"], kind=d["kind"], inputs=d["inputs"], outputs=d["outputs"],
                         attrs=d["attrs"], params=d["params"], source_nodes=d["source_nodes"],
                         device=d["device"],
                         arrays={k: arrays[ref["key"]] for k, ref in d["arrays"].items()})
                  for d in doc["layers"]]
        constants = {n: arrays[k] for n, k in doc["constants"].items()}
        return cls(doc["name"], doc["scheme"], doc["granularity"], doc["inputs"], doc["outputs"],
                   tensors, layers, constants)


def _stored_once(arrays: dict[str, np.ndarray], stored: dict[bytes, str], key: str,
                 value: np.ndarray) -> str:
    """The key ``value`` is stored under in ``arrays``: ``key``, or the key of an equal array
    stored before. The layers of an unrolled recurrence each hold the same recurrent weights
    (nakdimon: 256 copies of four 400x1600 weights, 375 MB of a 27 MB model's file)."""
    first = stored.setdefault(sha256_array(value), key)
    if first == key:
        arrays[key] = value
    return first


def npz_path_for(json_path: Path) -> Path:
    name = json_path.name
    stem = name[: -len(".json")] if name.endswith(".json") else name
    return json_path.with_name(stem + ".npz")
