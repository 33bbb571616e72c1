"""The compiled program file: everything the simulator executes, in one ``.npz``.

``compile/graph_<i>/program.npz`` (read with ``allow_pickle=False``) holds

- ``program``: UTF-8 JSON (a uint8 array), ``plan.json``'s document for this graph plus what
  execution needs::

      {"format": "npubuild.program/1", "graph": "graph_0", "scheme": "pow2_symmetric",
       "model_inputs": [the inputs a run is given; "inputs" adds the constants],
       ...plan.json keys (chip, layout, inputs, outputs, gmem, layers, groups, estimate)...,
       "tensors": {name: {"shape", "view", "dtype", "scale", "zero_point", "log2scale",
                          "constant", "gmem_elem_bytes" (null: never in GMEM)}},
       "kernels": {layer: {"kind", "attrs", "params", "arrays": {name: npz key},
                           "weights": {"fields": [[name, stored dtype, count, dtype]],
                                       "replicated", "bytes"}
                                      | null}},
       "gmem": {..., "image": {"key": "gmem_image", "bytes": n}}}

  NPU groups also carry ``elem_bytes`` (LMEM bytes per element of each tensor); CPU/DMA items
  (group breakers) carry ``kind``, ``executes`` (dma | cpu | npu), ``inputs`` and ``outputs``;
- ``gmem_image``: the initial GMEM bytes — every weight record and every quantized constant
  at its GMEM offset (activations start unwritten); layers whose weights are the same bytes
  share one offset (``gmem.weights``), so the image holds them once;
- ``k<j>.<name>``: the kernel arrays not stored in GMEM weight records (pooling tables, the
  ONNX node of a ``float`` layer).

A kernel's ``attrs`` are the layer's, with axes renumbered for the tensors' 4-D views when the
layer is tiled (``npubuild.npu.from_qgraph``); the simulator calls ``npubuild.quant.reference``
with them and with the weights it reads back from LMEM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npubuild.atomic import atomic_path
from npubuild.errors import BuildError
from npubuild.npu.estimate import Estimate
from npubuild.npu.from_qgraph import QLayers
from npubuild.npu.plan_json import plan_dict
from npubuild.npu.program import GroupProgram, Program

FORMAT = "npubuild.program/1"
IMAGE_KEY = "gmem_image"


def program_document(program: Program, layers: QLayers, estimate: Estimate | None = None
                     ) -> tuple[dict, dict[str, np.ndarray]]:
    """The program JSON and its arrays."""
    doc = {**plan_dict(program, estimate), "format": FORMAT, "graph": layers.qgraph.name,
           "scheme": layers.qgraph.scheme, "model_inputs": list(layers.qgraph.inputs)}
    annotate_groups(doc, program, layers)
    arrays: dict[str, np.ndarray] = {}
    doc["tensors"] = {t: {**info.as_dict(), "gmem_elem_bytes": _gmem_elem_bytes(program, layers, t)
                          if t in program.gmem.tensors else None}
                      for t, info in layers.tensors.items()}
    whole = {item.layer.name for item in program.groups if not isinstance(item, GroupProgram)}
    doc["kernels"] = _kernels(layers, arrays, whole)
    image = gmem_image(program, layers)
    arrays[IMAGE_KEY] = image
    doc["gmem"]["image"] = {"key": IMAGE_KEY, "bytes": int(image.size)}
    return doc, arrays


def annotate_groups(doc: dict, program: Program, layers: QLayers) -> None:
    """Breakers: what they are and how they run; NPU groups: LMEM element widths."""
    for item, entry in zip(program.groups, doc["groups"]):
        if isinstance(item, GroupProgram):
            entry["elem_bytes"] = dict(item.plan.group.elem_bytes)
            continue
        kernel = layers.kernels[item.layer.name]
        breaker = layers.breakers.get(item.layer.name)
        executes = breaker.executes if breaker else item.layer.attr("executes", "cpu")
        entry.update(kind=kernel.kind, executes=executes,
                     inputs=list(item.layer.inputs), outputs=list(item.layer.outputs))


def _gmem_elem_bytes(program: Program, layers: QLayers, tensor: str) -> int:
    _, size = program.gmem.tensors[tensor]
    return size // int(np.prod(layers.tensors[tensor].view))


def _kernels(layers: QLayers, arrays: dict[str, np.ndarray], whole: set[str]) -> dict[str, dict]:
    """Kernel parameters per layer; a layer run whole between groups (a breaker, or a layer
    ``on_no_fit: cpu`` moved off the NPU) keeps its own attrs. Weights in GMEM records (every
    conv's, fully connected layers' too) are read from there; the other arrays are kept."""
    originals = {layer.name: layer for layer in layers.qgraph.layers}
    out = {}
    for j, (name, kernel) in enumerate(layers.kernels.items()):
        record = layers.weights.get(name)
        kernel = originals[name] if name in whole else kernel
        in_record = {f[0] for f in record.fields} if record else set()
        refs = {}
        for key, value in kernel.arrays.items():
            if key not in in_record:
                refs[key] = f"k{j}.{key}"
                arrays[refs[key]] = np.asarray(value)
        out[name] = {"kind": kernel.kind, "attrs": kernel.attrs, "params": kernel.params,
                     "arrays": refs, "weights": record.as_dict() if record else None}
    return out


def gmem_image(program: Program, layers: QLayers) -> np.ndarray:
    """Weights and constants at their GMEM offsets; the image ends after the last of them.
    Weights several layers share (one offset) are packed once, by the first of them."""
    pieces: list[tuple[int, bytes]] = []
    packed: set[int] = set()
    for name, (offset, size) in program.gmem.weights.items():
        if offset in packed:
            continue
        packed.add(offset)
        data = layers.weight_bytes(name)
        if len(data) != size:
            raise BuildError(f"layer {name!r}: {len(data)} weight bytes packed, the plan "
                             f"reserved {size}", stage="compile")
        pieces.append((offset, data))
    for name, value in layers.qgraph.constants.items():
        if name in program.gmem.tensors:
            eb = _gmem_elem_bytes(program, layers, name)
            pieces.append((program.gmem.tensors[name][0], to_gmem(value, eb)))
    end = max((o + len(d) for o, d in pieces), default=0)
    image = np.zeros(end, np.uint8)
    for offset, data in pieces:
        image[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
    return image


def to_gmem(value: np.ndarray, elem_bytes: int) -> bytes:
    """A tensor's bytes in GMEM: C order, ``elem_bytes`` little-endian per element."""
    value = np.asarray(value)
    dtype = f"<f{elem_bytes}" if value.dtype.kind == "f" else f"<i{elem_bytes}"
    return np.ascontiguousarray(value.astype(dtype)).tobytes()


def write_program(path: str | Path, program: Program, layers: QLayers,
                  estimate: Estimate | None = None) -> Path:
    return save_program(path, *program_document(program, layers, estimate))


def save_program(path: str | Path, doc: dict, arrays: dict[str, np.ndarray]) -> Path:
    blob = np.frombuffer(json.dumps(doc, default=_jsonable).encode(), np.uint8)
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, program=blob, **arrays)
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


@dataclass(frozen=True)
class ProgramFile:
    """A loaded program: the JSON document and its arrays."""

    doc: dict
    arrays: dict[str, np.ndarray]

    @property
    def name(self) -> str:
        return self.doc["graph"]


def load_program(path: str | Path) -> ProgramFile:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path}: not a program file ({exc})") from None
    doc = json.loads(arrays.pop("program").tobytes().decode())
    if doc.get("format") != FORMAT:
        raise BuildError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    return ProgramFile(doc, arrays)
