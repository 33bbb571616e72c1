"""The IR dump (seed 004, TF2IR): one JSON per submodel plus its tensors as ``.npy`` files.

``compile/graph_ir_<i>/graph_<i>.json`` lists the layers in dependency order; each is a JSON
object in the seed's style — ``name``, ``operation`` (``conv``, ``dwconv``, ``group_conv``,
``fc``, ``add``, ``sub``, ``mul``, ``matmul``, ``layernorm``, ``lrn``, ``rescale``, ``concat``, ``max_pool``, ``avg_pool``,
``resize_nearest``, ``resize_bilinear``, ``lut``, ``softmax``, ``reshape``, ``transpose``, ``depth_to_space``, ``slice``,
``split``, ``pad``, ``float``), sizes (``input_size``/``output_size`` ``{height, width}`` and
channel counts for 4-D tensors, ``input_shape``/``output_shape`` otherwise), ``padding``,
``stride``, ``dilations``, ``kernel_size``, the ``*_dtype`` fields, the quantization fields
(pow2 graphs: ``*_log2scale``, ``output_shift``, ``bias_shift``, ``output_shift_bit``,
``input_pre_ls``; other schemes: ``*_scale``, ``*_zero_point``, ``multiplier``, ``shift``),
``previous_layer`` (``"input"`` for a graph input, ``"constant"`` for a quantized constant) and
``next_layer`` (``"endpoint"`` for a graph output). ``tensors`` names the layer's files (a
``softmax``'s ``exp_table`` is read at ``min(max − x, length − 1)``: an int16 input's table ends
at its first 0, an int8 input's has all 256 entries; a ``lut``'s ``table`` covers the input
integers ``table_lo`` to ``table_hi``, where its output changes: an input is clamped to them and
reads entry ``x − table_lo``).

Tensor files follow the seed's layouts: conv weight HWCiCo, depthwise weight HWC, bias C,
feature maps HWC (NHWC when the batch is larger than one; tensors that are not 4-D keep their
shape). Every layer's output is saved from one sample (``<layer>_output.npy``); a layer's
inputs are its producers' output files (``tensors.input``) or ``input_<tensor>.npy`` for graph
inputs. The document is validated against ``schemas/npu_ir.schema.json`` when it is written.
File names come from layer and tensor names through `npubuild.filenames` (safe, bounded, a
short hash where a name had to change); ``names.json`` maps every file back to its name and role.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from npubuild import schemas
from npubuild.atomic import atomic_path, write_bytes, write_json
from npubuild.filenames import safe_stem
from npubuild.quant import schemes
from npubuild.quant.qgraph import QGraph, QLayer, QTensor

FORMAT = "npubuild.ir"
VERSION = 1
ACTIVATIONS = {"none": "None", "relu": "Relu", "clip": "Clip"}
DIMS = "NCHW"
NAME_MAP = "names.json"
PREFIXED = ("input", "constant")  # roles written before the name: input_<tensor>.npy


def dump_ir(qgraph: QGraph, directory: str | Path, values: Mapping[str, np.ndarray] | None,
            sample: str | None) -> Path:
    """Write the IR of ``qgraph`` into ``directory``; ``values``: every tensor of one sample
    (``run_reference``), described by ``sample`` — or None: no feature maps, only the layers'
    parameters (weights, biases, tables, constants). Returns the JSON path."""
    directory = Path(directory)
    files = _Files(directory)
    producers = {t: layer.name for layer in qgraph.layers for t in layer.outputs}
    consumers: dict[str, list[str]] = {}
    for layer in qgraph.layers:
        for t in dict.fromkeys(layer.inputs):
            consumers.setdefault(t, []).append(layer.name)
    outputs: dict[str, str | None] = {}
    for t in qgraph.inputs:
        outputs[t] = files.save(t, "input", feature_map(values[t])) if values else None
    for t, value in qgraph.constants.items():
        outputs[t] = files.save(t, "constant", feature_map(value))
    doc_layers = []
    for layer in qgraph.layers:
        entry = _Layer(qgraph, layer, producers, consumers).describe()
        entry["tensors"] = _layer_files(qgraph, layer, files, values, outputs)
        doc_layers.append(entry)
    doc = {"format": FORMAT, "version": VERSION, "graph": qgraph.name, "scheme": qgraph.scheme,
           "granularity": qgraph.granularity, "sample": sample,
           "layouts": {"conv_weight": "HWCiCo", "dwconv_weight": "HWC", "bias": "C",
                       "feature_map": "HWC (NHWC when N > 1; other ranks as is)"},
           "inputs": [_io(qgraph.tensors[t], outputs[t]) for t in qgraph.inputs],
           "outputs": [_io(qgraph.tensors[t], outputs.get(t)) for t in qgraph.outputs],
           "constants": [_io(qgraph.tensors[t], outputs[t]) for t in qgraph.constants],
           "layers": doc_layers}
    schemas.validate(doc, "npu_ir")
    files.write_map()
    return write_json(directory / f"{qgraph.name}.json", doc)


def feature_map(value: np.ndarray) -> np.ndarray:
    """NCHW → HWC (N = 1) or NHWC; other ranks unchanged."""
    value = np.asarray(value)
    if value.ndim != 4:
        return value
    nhwc = value.transpose(0, 2, 3, 1)
    return nhwc[0] if value.shape[0] == 1 else nhwc


def conv_weight(weight: np.ndarray, depthwise: bool) -> np.ndarray:
    """[Co, Ci/g, kh, kw] → HWCiCo, or HWC for a depthwise conv (one input channel each)."""
    if depthwise:
        return np.ascontiguousarray(weight[:, 0].transpose(1, 2, 0))
    return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


class _Files:
    """The dump's files: names made safe and bounded from layer and tensor names
    (`npubuild.filenames`), and the map from every file back to the name and role it holds."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.names: dict[str, dict[str, str]] = {}

    def name(self, name: str, role: str, suffix: str) -> str:
        stem = f"{role}_{name}" if role in PREFIXED else f"{name}_{role}"
        entry = {"name": name, "role": role}
        file = f"{safe_stem(stem)}{suffix}"
        if self.names.get(file, entry) != entry:  # two plain names met (input_x vs layer input)
            file = f"{safe_stem(stem, hashed=True)}{suffix}"
        self.names[file] = entry
        return file

    def save(self, name: str, role: str, value: np.ndarray) -> str:
        file = self.name(name, role, ".npy")
        with atomic_path(self.directory / file) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, np.asarray(value), allow_pickle=False)
        return file

    def save_bytes(self, name: str, role: str, suffix: str, data: bytes) -> str:
        file = self.name(name, role, suffix)
        write_bytes(self.directory / file, data)
        return file

    def write_map(self) -> Path:
        """``names.json``: file → the layer or tensor name it was made from, and its role."""
        return write_json(self.directory / NAME_MAP, dict(sorted(self.names.items())))


def _layer_files(qgraph: QGraph, layer: QLayer, files: _Files, values, outputs) -> dict:
    found: dict[str, Any] = {}
    if layer.kind == "conv" and not layer.attrs.get("fc"):
        depthwise = _operation(qgraph, layer) == "dwconv"
        found["weight"] = files.save(layer.name, "weight",
                                     conv_weight(layer.arrays["weight"], depthwise))
    elif layer.kind == "conv":
        found["weight"] = files.save(layer.name, "weight", layer.arrays["weight"][:, :, 0, 0].T)
    if layer.kind == "conv":
        bias = layer.params.get("bias_int8")
        found["bias"] = files.save(layer.name, "bias", np.asarray(
            bias, np.int8) if bias is not None else layer.arrays["bias"])
    if layer.kind == "layernorm":  # Scale and B over the output scale, per normalized element
        found["weight"] = files.save(layer.name, "weight", layer.arrays["gain"])
        found["bias"] = files.save(layer.name, "bias", layer.arrays["offset"])
    if layer.kind == "lut":
        found["table"] = files.save(layer.name, "table", layer.arrays["table"])
    if layer.kind == "softmax":
        found["table"] = files.save(layer.name, "exp_table", layer.arrays["exp_table"])
    if layer.kind == "float":
        found["model"] = files.save_bytes(layer.name, "model", ".onnx", layer.arrays["model"].tobytes())
    if values is None:
        return found
    found["input"] = [outputs[t] for t in layer.inputs]
    found["output"] = []
    for t in layer.outputs:
        role = "output" + (f"_{len(found['output'])}" if len(layer.outputs) > 1 else "")
        outputs[t] = files.save(layer.name, role, feature_map(values[t]))
        found["output"].append(outputs[t])
    return found


def _io(t: QTensor, file: str | None) -> dict:
    entry = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "file": file}
    entry.update(_quant("", t))
    return entry


def _quant(role: str, t: QTensor) -> dict:
    """``<role>_log2scale`` for pow2 tensors, else ``<role>_scale`` and ``<role>_zero_point``."""
    prefix = f"{role}_" if role else ""
    if t.is_float:
        return {}
    if t.log2scale is not None:
        return {f"{prefix}log2scale": int(t.log2scale)}
    return {f"{prefix}scale": float(t.scale), f"{prefix}zero_point": int(t.zero_point)}


def _operation(qgraph: QGraph, layer: QLayer) -> str:
    kind, a = layer.kind, layer.attrs
    if kind == "conv":
        if a.get("fc"):
            return "fc"
        group = int(a.get("group", 1))
        cin = qgraph.tensors[layer.inputs[0]].shape[1]
        if group == 1:
            return "conv"
        return "dwconv" if layer.arrays["weight"].shape[1] == 1 and group == cin else "group_conv"
    if kind == "add":
        return "sub" if layer.params.get("sub") else "add"
    if kind in ("maxpool", "avgpool"):
        return f"{kind[:3]}_pool"
    if kind == "resize":
        return "resize_nearest" if a["mode"] == "nearest" else "resize_bilinear"
    return kind


def _hw(shape) -> dict:
    return {"height": int(shape[2]), "width": int(shape[3])}


def _single(values) -> Any:
    """A per-channel list whose entries are all equal is written as one value."""
    values = np.asarray(values).reshape(-1).tolist()
    return values[0] if values and all(v == values[0] for v in values) else values


class _Layer:
    def __init__(self, qgraph: QGraph, layer: QLayer, producers, consumers):
        self.q, self.layer = qgraph, layer
        self.producers, self.consumers = producers, consumers

    def t(self, name: str) -> QTensor:
        return self.q.tensors[name]

    def describe(self) -> dict:
        layer = self.layer
        entry: dict[str, Any] = {"name": layer.name, "operation": _operation(self.q, layer),
                                 "device": layer.device}
        entry.update(self.sizes())
        describe = getattr(self, f"_{layer.kind}", None)
        if describe:
            entry.update(describe())
        entry.update(self.dtypes())
        entry["input_tensors"] = list(layer.inputs)
        entry["output_tensors"] = list(layer.outputs)
        entry["previous_layer"] = list(dict.fromkeys(self.previous(t) for t in layer.inputs))
        entry["next_layer"] = self.next()
        return entry

    def previous(self, tensor: str) -> str:
        if tensor in self.producers:
            return self.producers[tensor]
        return "constant" if tensor in self.q.constants else "input"

    def next(self) -> list[str]:
        users = [c for t in self.layer.outputs for c in self.consumers.get(t, [])]
        if any(t in self.q.outputs for t in self.layer.outputs):
            users.append("endpoint")
        return list(dict.fromkeys(users))

    def sizes(self) -> dict:
        x, y = self.t(self.layer.inputs[0]), self.t(self.layer.outputs[0])
        out: dict[str, Any] = {}
        if len(x.shape) == 4:
            out.update(input_channel_num=int(x.shape[1]), input_size=_hw(x.shape))
        else:
            out["input_shape"] = list(x.shape)
        if len(y.shape) == 4:
            out.update(output_channel_num=int(y.shape[1]), output_size=_hw(y.shape))
        else:
            out["output_shape"] = list(y.shape)
        return out

    def dtypes(self) -> dict:
        x, y = self.t(self.layer.inputs[0]), self.t(self.layer.outputs[0])
        out = {"input_dtype": x.dtype, "output_dtype": y.dtype}
        if x.dtype == y.dtype:
            out["dtype"] = x.dtype
        return out

    def _requant(self) -> dict:
        p = self.layer.params
        return {"activation_type": ACTIVATIONS.get(p.get("activation", "none"),
                                                   str(p.get("activation"))),
                "qmin": p.get("qmin"), "qmax": p.get("qmax")}

    def _window(self) -> dict:
        a = self.layer.attrs
        top, bottom, left, right = a["pads"]
        (kh, kw), (sh, sw) = a["kernel"], a["stride"]
        dh, dw = a.get("dilation", [1, 1])
        return {"padding": {"top": top, "bottom": bottom, "left": left, "right": right},
                "stride": {"height": sh, "width": sw}, "dilations": {"height": dh, "width": dw},
                "kernel_size": {"height": kh, "width": kw}}

    def _conv(self) -> dict:
        layer, p = self.layer, self.layer.params
        out = {**self._requant(), "group": int(layer.attrs.get("group", 1)), "load_bias": True,
               "weight_dtype": str(layer.arrays["weight"].dtype)}
        if not layer.attrs.get("fc"):
            out.update(self._window())
        out.update(_quant("input", self.t(layer.inputs[0])))
        out.update(_quant("output", self.t(layer.outputs[0])))
        if "input_log2scale" in p:
            w_ls = np.asarray(p["weight_log2scale"])
            acc = int(p["input_log2scale"]) + w_ls
            bias_ls = p.get("bias_log2scale")
            out.update(weight_log2scale=_single(w_ls), output_shift=_single(p["output_shift"]),
                       bias_log2scale=_single(acc if bias_ls is None else bias_ls),
                       bias_shift=_single(p.get("bias_shift", np.zeros_like(acc))),
                       bias_dtype="int8" if "bias_int8" in p else str(layer.arrays["bias"].dtype))
        else:
            out.update(weight_scale=_single(p["weight_scale"]),
                       bias_dtype=str(layer.arrays["bias"].dtype))
        out.update(multiplier=_single(layer.arrays["multiplier"]),
                   shift=_single(layer.arrays["shift"]))
        return out

    def _add(self) -> dict:
        layer, p = self.layer, self.layer.params
        a, b = (self.t(t) for t in layer.inputs)
        out = {**self._requant(), "pl_name": self.previous(layer.inputs[0]),
               "add_name": self.previous(layer.inputs[1]),
               "multipliers": list(p["multipliers"]), "shift": p["shift"]}
        out.update(_quant("pl", a))
        out.update(_quant("add", b))
        out.update(_quant("output", self.t(layer.outputs[0])))
        if "output_shift_bit" in p:
            out.update(pl_shiftbit=a.log2scale, add_shiftbit=b.log2scale,
                       output_shift_bit=p["output_shift_bit"])
        return out

    def _mul(self) -> dict:
        out = {**self._requant(), "multiplier": self.layer.params["multiplier"],
               "shift": self.layer.params["shift"]}
        for i, t in enumerate(self.layer.inputs):
            out.update(_quant(f"input{i}", self.t(t)))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    _matmul = _mul  # the same fields: two inputs, one multiplier and shift

    def _rescale(self) -> dict:
        layer = self.layer
        out = {**self._requant(), "factor": layer.attrs.get("factor"),
               "multiplier": layer.params["multiplier"], "shift": layer.params["shift"]}
        if "negative_factor" in layer.attrs:  # PRelu, LeakyRelu: x < 0 has its own factor
            out.update(function=layer.attrs.get("function"),
                       negative_factor=layer.attrs["negative_factor"],
                       negative_multiplier=_single(layer.arrays["negative_multiplier"]),
                       negative_shift=_single(layer.arrays["negative_shift"]))
            if "axis" in layer.attrs:
                out["slope_axis"] = layer.attrs["axis"]
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    def _concat(self) -> dict:
        layer, p = self.layer, self.layer.params
        y = self.t(layer.outputs[0])
        axis = int(layer.attrs["axis"])
        out = {"dim": DIMS[axis] if len(y.shape) == 4 else axis, "input_num": len(layer.inputs),
               "multipliers": list(p["multipliers"]), "shifts": list(p["shifts"])}
        for i, t in enumerate(layer.inputs):
            x = self.t(t)
            if len(x.shape) == 4:
                out.update({f"input{i}_channel_num": int(x.shape[1]),
                            f"input{i}_size": _hw(x.shape)})
            else:
                out[f"input{i}_shape"] = list(x.shape)
            out[f"input{i}_dtype"] = x.dtype
            out.update(_quant(f"input{i}", x))
        out.update(_quant("output", y))
        return out

    def _pool(self) -> dict:
        layer = self.layer
        out = {**self._window(), "global": bool(layer.attrs.get("global", False))}
        out.update(_quant("input", self.t(layer.inputs[0])))
        out.update(_quant("output", self.t(layer.outputs[0])))
        return out

    def _maxpool(self) -> dict:
        return self._pool()

    def _avgpool(self) -> dict:
        layer, p = self.layer, self.layer.params
        out = {**self._pool(), **self._requant(),
               "count_include_pad": bool(layer.attrs.get("count_include_pad", 0)),
               "window_counts": layer.arrays["counts"].tolist(),
               "multiplier": layer.arrays["multiplier"].tolist(),
               "shift": layer.arrays["shift"].tolist()}
        if "input_pre_ls" in p:
            out["input_pre_ls"] = p["input_pre_ls"]
        return out

    def _resize(self) -> dict:
        a = self.layer.attrs
        out = {"align_corners": a["coordinate_transformation_mode"] == "align_corners",
               "coordinate_transformation_mode": a["coordinate_transformation_mode"],
               "nearest_mode": a.get("nearest_mode")}
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        if a["mode"] != "nearest":
            out.update(multiplier=self.layer.params["multiplier"],
                       shift=self.layer.params["shift"])
        return out

    def _lut(self) -> dict:
        x = self.t(self.layer.inputs[0])
        lo = int(self.layer.params.get("table_lo", schemes.qrange(x.dtype)[0]))
        out = {"function": self.layer.attrs.get("function"), "table_lo": lo,
               "table_hi": lo + int(self.layer.arrays["table"].size) - 1}
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    def _layernorm(self) -> dict:
        p = self.layer.params
        out = {"axis": self.layer.attrs["axis"], "epsilon": self.layer.attrs["epsilon"],
               "epsilon_steps": p["epsilon_steps"]}
        if self.layer.attrs.get("rms"):  # no mean subtracted
            out["rms"] = True
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    def _lrn(self) -> dict:
        a, p = self.layer.attrs, self.layer.params
        out = {k: a[k] for k in ("size", "alpha", "beta", "bias")}
        out.update(alpha_steps=p["alpha_steps"], input_over_output=p["input_over_output"])
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    def _softmax(self) -> dict:
        p = self.layer.params
        out = {"axis": self.layer.attrs["axis"], "multiplier": p["multiplier"],
               "shift": p["shift"]}
        out.update(_quant("input", self.t(self.layer.inputs[0])))
        out.update(_quant("output", self.t(self.layer.outputs[0])))
        return out

    def _moved(self) -> dict:
        x, y = self.t(self.layer.inputs[0]), self.t(self.layer.outputs[0])
        return {"input_shape": list(x.shape), "output_shape": list(y.shape), **_quant("", x)}

    def _reshape(self) -> dict:
        return {**self._moved(), "reshape_param": list(self.layer.attrs["shape"])}

    def _transpose(self) -> dict:
        return {**self._moved(), "perm": list(self.layer.attrs["perm"])}

    def _depth_to_space(self) -> dict:
        return {**self._moved(), "blocksize": self.layer.attrs["blocksize"],
                "mode": self.layer.attrs["mode"]}

    def _slice(self) -> dict:
        a = self.layer.attrs
        return {**self._moved(), **{k: list(a[k]) for k in ("starts", "ends", "axes", "steps")}}

    def _split(self) -> dict:
        return {**self._moved(), "axis": self.layer.attrs["axis"],
                "sizes": list(self.layer.attrs["sizes"])}

    def _pad(self) -> dict:
        a = self.layer.attrs
        return {**self._moved(), "pads": list(a["pads"]), "value": a.get("value"),
                "mode": a.get("mode", "constant")}

    def _float(self) -> dict:
        out = {"reason": self.layer.attrs.get("reason", "")}
        for i, t in enumerate(self.layer.inputs):
            out.update(_quant(f"input{i}", self.t(t)))
        return out
