"""The bit-exact NPU simulator: one chip instance executing a compiled program file.

The chip has a real LMEM — an int8 array of ``lanes × lmem_bytes_per_lane`` — and a GMEM byte
array. The simulator executes ``compile/graph_<i>/program.npz`` (`npubuild.npu.program_file`)
and nothing else: it never sees the ONNX graph nor the quantized graph's structure. For every
group and slice it runs the steps in order:

- ``load``: a DMA from GMEM (NCHW, the tensor's GMEM element width) into LMEM at the step's
  address, in the lane layout of ``plan.json`` (channel ``c`` in lane ``c % lanes``); a weight
  load copies output-channel records (or a lookup table, to every lane);
- ``compute``: reads each operand's rows from LMEM at its address, reads the layer's weights
  back from LMEM, calls the integer kernel of ``npubuild.quant.reference`` with the step's
  effective paddings (or output rows, for a resize) and writes the result rows to LMEM (a
  layer's scratch buffer gets its intermediate, so an overlapping buffer is clobbered);
- ``store``: a DMA from LMEM back to the tensor in GMEM.

Group breakers (CPU and DMA items) run their kernel on whole tensors in GMEM.

Every LMEM address carries the id of the buffer *instance* that last wrote it (a buffer starts a
new instance in every slice; a weight buffer at every load; a write reaches every lane at the same
per-lane address, so one tag per address serves all lanes; ids keep counting across runs). Reading a range whose bytes were not
written by the buffer's current instance — a halo row never loaded, a buffer another live buffer
overwrote, a weight clobbered — is a `SimulatorFault` naming the group, slice, step, tensor,
buffer and who wrote the byte instead. So is a write that reaches into another buffer live at the
same timestep (an allocation overlap), a step outside its buffer's lifetime, an address that is
not its buffer's, a write past the buffer's end, or a load or store of a range outside its
tensor in GMEM. A wrong allocation or halo fails loudly;
anything subtler shows as a bit difference from the integer reference.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from math import ceil, prod
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from npubuild.errors import BuildError
from npubuild.npu.from_qgraph import WeightRecord, unpack_weights
from npubuild.npu.program_file import ProgramFile, load_program, to_gmem
from npubuild.quant import reference, schemes
from npubuild.quant.qgraph import QLayer

NEVER = 0  # the tag of a byte no buffer has written


class SimulatorFault(BuildError):
    """The program did something a correct program never does (the message says what)."""

    def __init__(self, message: str, *, group: int | None = None, slice: int | None = None,
                 tensor: str | None = None):
        super().__init__(message)
        self.group, self.slice, self.tensor = group, slice, tensor


@dataclass(frozen=True)
class Kernel:
    layer: QLayer
    record: WeightRecord | None


@dataclass
class Stats:
    steps: int = 0
    loads: int = 0
    stores: int = 0
    computes: int = 0
    breakers: int = 0
    dma_bytes: int = 0
    seconds: float = 0.0


@dataclass
class _Where:
    """The step being executed, for messages."""

    graph: str
    group: int | None = None
    slice: int | None = None
    step: dict | None = None

    def __str__(self) -> str:
        if self.group is None:
            return self.graph
        s = self.step or {}
        what = s.get("layer") or s.get("tensor") or ""
        return (f"{self.graph} group {self.group} slice {self.slice} timestep "
                f"{s.get('timestep')} ({s.get('op')} {what})")


@dataclass
class _Instances:
    """Buffer instances of the running group: who may be read, who wrote what."""

    current: dict[int, int] = field(default_factory=dict)
    owner: dict[int, tuple[int, str, int | None]] = field(default_factory=dict)
    next_id: int = 1

    def start(self, buffer: dict, slice_index: int | None) -> int:
        self.current[buffer["id"]] = self.next_id
        self.owner[self.next_id] = (buffer["id"], buffer["name"], slice_index)
        self.next_id += 1
        return self.next_id - 1


_THREAD = threading.local()
TAG_LIMIT = 2 ** 31 - 1  # instance ids are int32 tags


@dataclass
class ChipMemory:
    """LMEM, its tags and the next free buffer-instance id, for one chip geometry.

Every write reaches all lanes at the same per-lane address (the LMEM layout contract), so one
tag per per-lane address says who last wrote that byte in every lane.

    Instance ids keep counting across runs (and across the programs sharing this memory), so
    a byte an earlier run wrote carries an id no current instance has: a read of it fails the
    tag check as a never-written byte would. Neither plane needs clearing between runs (80 MiB
    of memset per run on npu-16m); they are cleared only when the ids run out."""

    lmem: np.ndarray
    tags: np.ndarray
    next_id: int = 1

    def reset_if_exhausted(self, needed: int) -> None:
        if self.next_id + needed >= TAG_LIMIT:
            self.lmem.fill(0x5A)
            self.tags.fill(NEVER)
            self.next_id = 1


def _chip_memory(lanes: int, capacity: int) -> ChipMemory:
    """The chip memory for a geometry, one per thread: the simulators of one build share it.
    Each kept its own before, and a run touches every page (5 bytes per LMEM byte): a model
    split into 100 NPU graphs held 8 GB of them in verify."""
    pool = _THREAD.__dict__.setdefault("chip_memory", {})
    if (lanes, capacity) not in pool:
        lmem = np.full((lanes, capacity), 0x5A, np.int8)
        pool[lanes, capacity] = ChipMemory(lmem, np.zeros(capacity, np.int32))
    return pool[lanes, capacity]


class Simulator:
    """A chip instance for one compiled program; `run` may be called any number of times."""

    def __init__(self, program: ProgramFile | str | Path):
        self.program = program if isinstance(program, ProgramFile) else load_program(program)
        doc = self.program.doc
        chip = doc["chip"]
        self.lanes, self.capacity = chip["lanes"], chip["lmem_bytes_per_lane"]
        self.memory = _chip_memory(self.lanes, self.capacity)
        self.lmem, self.tags = self.memory.lmem, self.memory.tags
        self.gmem = np.zeros(doc["gmem"]["size"], np.uint8)
        self.tensors = doc["tensors"]
        self.kernels = {name: self._kernel(name, k) for name, k in doc["kernels"].items()}
        self.stats = Stats()
        self._clash_cache: dict[int, dict[int, list[dict]]] = {}
        self._instances_per_run = sum(
            len(g["slices"]) * len(g["buffers"]) + sum(len(p["steps"]) for p in g["slices"])
            for g in doc["groups"] if g["device"] == "npu")  # a bound: buffers and weight loads

    def _kernel(self, name: str, k: dict) -> Kernel:
        arrays = {key: self.program.arrays[ref] for key, ref in k["arrays"].items()}
        record = None
        if k["weights"]:
            record = WeightRecord(tuple(tuple(f) for f in k["weights"]["fields"]),
                                  k["weights"]["replicated"])
        return Kernel(QLayer(name, k["kind"], [], [], k["attrs"], k["params"], arrays), record)

    @property
    def name(self) -> str:
        return self.program.name

    # ---- running ----------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Integer inputs by name → every tensor that went through GMEM (real shapes)."""
        start = time.perf_counter()
        doc = self.program.doc
        self.memory = _chip_memory(self.lanes, self.capacity)  # this thread's
        self.lmem, self.tags = self.memory.lmem, self.memory.tags
        self.memory.reset_if_exhausted(self._instances_per_run)
        self.gmem.fill(0)
        image = self.program.arrays[doc["gmem"]["image"]["key"]]
        self.gmem[:image.size] = image
        self._inst = _Instances(next_id=self.memory.next_id)  # ids unique over every run
        for name in doc["model_inputs"]:  # constants are in the GMEM image already
            if name not in inputs:
                raise SimulatorFault(f"{self.name}: input {name!r} not given")
            self._write_input(name, inputs[name])
        for entry in doc["groups"]:
            if entry["device"] == "npu":
                self._group(entry)
            else:
                self._breaker(entry)
        self.memory.next_id = self._inst.next_id
        self.stats.seconds += time.perf_counter() - start
        return {t: self.read_tensor(t) for t in doc["gmem"]["tensors"]}

    def _write_input(self, name: str, value: np.ndarray) -> None:
        info = self.tensors[name]
        value = np.asarray(value)
        if list(value.shape) != info["shape"] or value.dtype != np.dtype(info["dtype"]):
            raise SimulatorFault(f"{self.name}: input {name!r} is {value.dtype}{list(value.shape)}"
                                 f", the program takes {info['dtype']}{info['shape']}")
        self.write_tensor(name, value)

    # ---- GMEM -------------------------------------------------------------------------------

    def _gmem_span(self, tensor: str) -> tuple[int, int, int]:
        entry = self.program.doc["gmem"]["tensors"][tensor]
        return entry["offset"], entry["bytes"], self.tensors[tensor]["gmem_elem_bytes"]

    def read_tensor(self, tensor: str) -> np.ndarray:
        offset, size, eb = self._gmem_span(tensor)
        info = self.tensors[tensor]
        kind = "f" if info["dtype"].startswith("float") else "i"
        raw = self.gmem[offset:offset + size].view(f"<{kind}{eb}")
        return raw.reshape(info["shape"]).astype(info["dtype"])

    def write_tensor(self, tensor: str, value: np.ndarray) -> None:
        offset, size, eb = self._gmem_span(tensor)
        data = np.frombuffer(to_gmem(value, eb), np.uint8)
        if data.size != size:
            raise SimulatorFault(f"{self.name}: tensor {tensor!r} is {data.size} bytes, its GMEM "
                                 f"slot {size}", tensor=tensor)
        self.gmem[offset:offset + size] = data

    def _gmem_view(self, tensor: str) -> np.ndarray:
        """The tensor's GMEM bytes as its 4-D view of integers (no copy)."""
        offset, size, eb = self._gmem_span(tensor)
        return self.gmem[offset:offset + size].view(f"<i{eb}").reshape(self.tensors[tensor]["view"])

    # ---- groups -----------------------------------------------------------------------------

    def _group(self, group: dict) -> None:
        self._buffers = {b["id"]: b for b in group["buffers"]}
        if group["index"] not in self._clash_cache:  # the program is static: once per group
            self._clash_cache[group["index"]] = self._address_clashes(group)
        self._clashes = self._clash_cache[group["index"]]
        self._elem = group["elem_bytes"]
        self._inst.current = {}
        for piece in group["slices"]:
            for b in group["buffers"]:
                if b["lifetime"][1] is not None:
                    self._inst.start(b, piece["index"])
            for step in piece["steps"]:
                self._where = _Where(self.name, group["index"], piece["index"], step)
                self.stats.steps += 1
                if step["op"] == "compute":
                    self._compute(step)
                elif step["rows"] is None:
                    self._weight_load(step, piece["index"])
                elif step["op"] == "load":
                    self._load(step)
                else:
                    self._store(step)

    def _fault(self, message: str, tensor: str | None = None) -> SimulatorFault:
        w = self._where
        return SimulatorFault(f"{w}: {message}", group=w.group, slice=w.slice, tensor=tensor)

    def _buffer(self, buffer_id: int, timestep: int, tensor: str) -> dict:
        buf = self._buffers[buffer_id]
        start, end = buf["lifetime"]
        if timestep < start or (end is not None and timestep > end):
            raise self._fault(f"touches buffer {buffer_id} ({buf['name']!r}) at timestep "
                              f"{timestep}, outside its lifetime [{start}, {end}]", tensor)
        return buf

    def _region(self, buf: dict, addr: int, nbytes: int, tensor: str):
        if addr != buf["addr"]:
            raise self._fault(f"addresses buffer {buf['id']} at {addr}, it is at {buf['addr']}",
                              tensor)
        if nbytes > buf["bytes_per_lane"] or addr + nbytes > self.capacity:
            raise self._fault(f"needs {nbytes} bytes per lane at {addr}; buffer {buf['id']} "
                              f"({buf['name']!r}) has {buf['bytes_per_lane']}", tensor)
        return self.lmem.view(np.uint8)[:, addr:addr + nbytes], self.tags[addr:addr + nbytes]

    @staticmethod
    def _address_clashes(group: dict) -> dict[int, list[dict]]:
        """Per buffer, the other buffers sharing LMEM bytes with it at some timestep (none in
        a sound allocation); a write is checked against these only, at its own timestep."""
        clashes: dict[int, list[dict]] = {}
        spans = sorted((b["addr"], b["addr"] + b["bytes_per_lane"], i)
                       for i, b in enumerate(group["buffers"]) if b["bytes_per_lane"])
        for k, (lo, hi, i) in enumerate(spans):
            for lo2, hi2, j in spans[k + 1:]:
                if lo2 >= hi:
                    break
                a, b = group["buffers"][i], group["buffers"][j]
                if _live_together(a["lifetime"], b["lifetime"]):
                    clashes.setdefault(a["id"], []).append(b)
                    clashes.setdefault(b["id"], []).append(a)
        return clashes

    def _writable(self, buf: dict, nbytes: int, timestep: int, tensor: str) -> None:
        """A write must not reach a buffer live at this timestep."""
        lo, hi = buf["addr"], buf["addr"] + nbytes
        for other in self._clashes.get(buf["id"], ()):
            start, end = other["lifetime"]
            if start <= timestep and (end is None or timestep <= end) and nbytes \
                    and lo < other["addr"] + other["bytes_per_lane"] and other["addr"] < hi:
                raise self._fault(
                    f"writes {tensor!r} to LMEM [{lo}, {hi}) over buffer {other['id']} "
                    f"({other['name']!r}, [{other['addr']}, "
                    f"{other['addr'] + other['bytes_per_lane']}), lifetime "
                    f"{other['lifetime']}), which is live at this timestep", tensor)

    def _block(self, operand: dict, timestep: int, write: bool = False):
        """LMEM bytes of an activation buffer, as (lanes, n, c/lanes, rows, W·eb), and its
        tags, as (n, c/lanes, rows, W·eb)."""
        t = operand["tensor"]
        buf = self._buffer(operand["buffer"], timestep, t)
        (b0, b1), (c0, c1), (r0, r1) = operand["batch"], operand["channels"], operand["rows_held"]
        w, eb = self.tensors[t]["view"][3], self._elem[t]
        shape = (self.lanes, b1 - b0, -(-(c1 - c0) // self.lanes), r1 - r0, w * eb)
        nbytes = shape[1] * shape[2] * shape[3] * shape[4]
        data, tags = self._region(buf, operand["addr"], nbytes, t)
        if write:
            self._writable(buf, nbytes, timestep, t)
        return buf, data.reshape(shape), tags.reshape(shape[1:])

    def _write_rows(self, operand: dict, timestep: int, value: np.ndarray, rows) -> None:
        buf, data, tags = self._block(operand, timestep, write=True)
        t = operand["tensor"]
        lo = rows[0] - operand["rows_held"][0]
        n, c, r, w = value.shape
        raw = np.ascontiguousarray(value.astype(f"<i{self._elem[t]}", copy=False)).view(np.uint8)
        raw = raw.reshape(n, c, r, -1)
        cpl = data.shape[2]
        if c == cpl * self.lanes:
            lanes_first = raw.reshape(n, cpl, self.lanes, r, -1).transpose(2, 0, 1, 3, 4)
            data[:, :, :, lo:lo + r] = lanes_first
        else:  # the last channel group fills only some lanes; the others keep their bytes
            full, rest = divmod(c, self.lanes)
            if full:
                data[:, :, :full, lo:lo + r] = raw[:, :full * self.lanes].reshape(
                    n, full, self.lanes, r, -1).transpose(2, 0, 1, 3, 4)
            data[:rest, :, full, lo:lo + r] = raw[:, full * self.lanes:].transpose(1, 0, 2, 3)
        tags[:, :, lo:lo + r] = self._inst.current[buf["id"]]

    def _read_rows(self, operand: dict, timestep: int, rows) -> np.ndarray:
        buf, data, tags = self._block(operand, timestep)
        t = operand["tensor"]
        lo, hi = rows[0] - operand["rows_held"][0], rows[1] - operand["rows_held"][0]
        self._check(buf, tags[:, :, lo:hi], t, f"rows [{rows[0]}, {rows[1]})")
        n, c = data.shape[1], operand["channels"][1] - operand["channels"][0]
        block = data[:, :, :, lo:hi].transpose(1, 2, 0, 3, 4).reshape(
            n, data.shape[2] * self.lanes, hi - lo, data.shape[4])[:, :c]
        eb = self._elem[t]
        value = np.ascontiguousarray(block).view(f"<i{eb}")
        return value.astype(self.tensors[t]["dtype"], copy=False)

    def _check(self, buf: dict, tags: np.ndarray, tensor: str, what: str) -> None:
        want = self._inst.current.get(buf["id"])
        bad = tags != want
        if want is not None and not bad.any():
            return
        first = np.argwhere(bad)[0] if bad.any() else None
        got = int(tags[tuple(first)]) if first is not None else NEVER
        who = self._inst.owner.get(got)
        by = (f"last written by buffer {who[0]} ({who[1]!r}) in slice {who[2]}" if who
              else "never written in this group")
        offset = int(np.ravel_multi_index(first, tags.shape)) if first is not None else 0
        raise self._fault(f"reads {what} of {tensor!r} from buffer {buf['id']} at LMEM "
                          f"{buf['addr']}: its byte {offset} (of the bytes read) was not "
                          f"written during the buffer's lifetime ({by})", tensor)

    # ---- DMA ----------------------------------------------------------------------------------

    def _gmem_block(self, step: dict) -> tuple[slice, slice, slice]:
        """The step's batch, channel and row ranges, checked against its tensor's view: numpy
        would clip a range past the end (a short copy) or fail to broadcast, naming nothing."""
        t, view = step["tensor"], self.tensors[step["tensor"]]["view"]
        ranges = (step["batch"], step["channels"], step["rows"])
        for axis, (lo, hi), size in zip("NCH", ranges, view):
            if not 0 <= lo <= hi <= size:
                raise self._fault(f"{step['op']}s {axis} [{lo}, {hi}) of {t!r}, outside its "
                                  f"view {tuple(view)}", t)
        return tuple(slice(lo, hi) for lo, hi in ranges)

    def _load(self, step: dict) -> None:
        t = step["tensor"]
        block = self._gmem_view(t)[self._gmem_block(step)].astype(self.tensors[t]["dtype"])
        self._write_rows(step, step["timestep"], block, step["rows"])
        self.stats.loads += 1
        self.stats.dma_bytes += step["bytes"]

    def _store(self, step: dict) -> None:
        t = step["tensor"]
        value = self._read_rows(step, step["timestep"], step["rows"])
        self._gmem_view(t)[self._gmem_block(step)] = value
        self.stats.stores += 1
        self.stats.dma_bytes += step["bytes"]

    def _weight_load(self, step: dict, slice_index: int) -> None:
        buf = self._buffer(step["buffer"], step["timestep"], step["tensor"])
        kernel = self.kernels[buf["layer"]]
        record, (c0, c1) = kernel.record, step["channels"]
        if record.replicated:
            raw = self.gmem[step["gmem"]:step["gmem"] + record.bytes]
            data, tags = self._region(buf, step["addr"], record.bytes, step["tensor"])
            self._writable(buf, record.bytes, step["timestep"], step["tensor"])
            data[:] = raw[None, :]
        else:
            size = record.bytes
            raw = self.gmem[step["gmem"] + c0 * size:step["gmem"] + c1 * size].reshape(-1, size)
            cpl = ceil((c1 - c0) / self.lanes)
            padded = np.zeros((cpl * self.lanes, size), np.uint8)
            padded[:c1 - c0] = raw
            data, tags = self._region(buf, step["addr"], cpl * size, step["tensor"])
            self._writable(buf, cpl * size, step["timestep"], step["tensor"])
            data[:] = padded.reshape(cpl, self.lanes, size).transpose(1, 0, 2).reshape(
                self.lanes, -1)
        tags[:] = self._inst.start(buf, slice_index)
        self.stats.loads += 1
        self.stats.dma_bytes += step["bytes"]

    def _read_weights(self, ref: dict, timestep: int, layer: str) -> dict[str, np.ndarray]:
        buf = self._buffer(ref["buffer"], timestep, f"{layer}/weight")
        record, (c0, c1) = self.kernels[layer].record, ref["channels"]
        if record.replicated:
            data, tags = self._region(buf, ref["addr"], record.bytes, buf["name"])
            self._check(buf, tags, buf["name"], "the lookup table")
            return unpack_weights(data[:1], record)
        cpl = ceil((c1 - c0) / self.lanes)
        data, tags = self._region(buf, ref["addr"], cpl * record.bytes, buf["name"])
        self._check(buf, tags, buf["name"], f"output channels [{c0}, {c1})")
        raw = data.reshape(self.lanes, cpl, record.bytes).transpose(1, 0, 2)
        return unpack_weights(raw.reshape(-1, record.bytes)[:c1 - c0], record)

    # ---- compute ------------------------------------------------------------------------------

    def _compute(self, step: dict) -> None:
        kernel = self.kernels[step["layer"]]
        ts = step["timestep"]
        xs = [self._read_rows(op, ts, op["rows"]) for op in step["inputs"]]
        layer = kernel.layer
        if step["weight"] is not None:
            arrays = {**layer.arrays, **self._read_weights(step["weight"], ts, step["layer"])}
            layer = _with(layer, arrays, self.program.doc["layers"][step["layer"]])
        if layer.attrs.get("fc"):
            outs = [self._fully_connected(layer, xs[0], step)]
        else:
            outs = _run_kernel(layer, xs, step)
        for op, value in zip(step["outputs"], outs):
            want = (op["batch"][1] - op["batch"][0], op["channels"][1] - op["channels"][0],
                    op["rows"][1] - op["rows"][0], self.tensors[op["tensor"]]["view"][3])
            if tuple(value.shape) != want:
                raise self._fault(f"kernel {layer.kind} made {list(value.shape)} for "
                                  f"{op['tensor']!r}, the step writes {list(want)}", op["tensor"])
            self._write_rows(op, ts, value, op["rows"])
        if step["scratch"] is not None:
            self._scratch(step, outs[0])
        self.stats.computes += 1

    def _fully_connected(self, layer: QLayer, x: np.ndarray, step: dict) -> np.ndarray:
        """A fully connected layer in a group: its vector (one channel, the features along H
        of the view; the step reads them all) in its real shape, the output rows written."""
        x = x.reshape(self.tensors[step["inputs"][0]["tensor"]]["shape"])
        out = step["outputs"][0]
        y = reference.conv2d(layer, x).reshape(self.tensors[out["tensor"]]["view"])
        return y[:, :, out["rows"][0]:out["rows"][1]]

    def _scratch(self, step: dict, value: np.ndarray) -> None:
        """The layer's intermediate (stood for by its result, widened) fills its scratch."""
        ref = step["scratch"]
        buf = self._buffer(ref["buffer"], step["timestep"], f"{step['layer']}/scratch")
        flat = np.ascontiguousarray(value.astype("<i2")).view(np.uint8).reshape(-1)
        size = min(buf["bytes_per_lane"], ceil(flat.size / self.lanes))
        data, tags = self._region(buf, ref["addr"], size, buf["name"])
        self._writable(buf, size, step["timestep"], buf["name"])
        padded = np.resize(flat, self.lanes * size).reshape(self.lanes, size)
        data[:] = padded
        tags[:] = self._inst.start(buf, self._where.slice)

    # ---- group breakers -----------------------------------------------------------------------

    def _breaker(self, entry: dict) -> None:
        self._where = _Where(self.name)
        name = entry["layer"]
        kernel = self.kernels[name]
        layer = kernel.layer
        if kernel.record is not None:  # its weights, from their GMEM records
            slot = self.program.doc["gmem"]["weights"][name]
            raw = self.gmem[slot["offset"]:slot["offset"] + slot["bytes"]]
            raw = raw[None, :kernel.record.bytes] if kernel.record.replicated else \
                raw.reshape(-1, kernel.record.bytes)
            arrays = {**layer.arrays, **unpack_weights(raw, kernel.record)}
            layer = _with(layer, arrays, self.program.doc["layers"][name])
        xs = [self.read_tensor(t) for t in entry["inputs"]]
        outs = reference.run_layer(layer, xs)
        for t, value in zip(entry["outputs"], outs):
            self.write_tensor(t, value)
        self.stats.breakers += 1


def _live_together(a: list, b: list) -> bool:
    """Whether two lifetimes ``[start, end]`` (end None: resident) share a timestep."""
    if a[1] is None or b[1] is None:
        return True
    return a[0] <= b[1] and b[0] <= a[1]


def _with(layer: QLayer, arrays: dict, spec: dict) -> QLayer:
    """The kernel with the weights read from LMEM (a C slice: its output channels only)."""
    attrs = layer.attrs
    weight = arrays.get("weight")
    if weight is not None:
        k = attrs["kernel"]
        arrays["weight"] = weight.reshape(weight.shape[0], -1, k[0], k[1])
        cout = spec["out_shapes"][0][1]
        if attrs.get("group", 1) > 1 and weight.shape[0] != cout:  # a C slice of a grouped conv
            attrs = {**attrs, "group": attrs["group"] * weight.shape[0] // cout}
    return QLayer(layer.name, layer.kind, layer.inputs, layer.outputs, attrs, layer.params,
                  arrays, layer.source_nodes, layer.device)


def _run_kernel(layer: QLayer, xs: list[np.ndarray], step: dict) -> list[np.ndarray]:
    kind = layer.kind
    if kind in ("conv", "maxpool", "avgpool"):
        left, right = layer.attrs["pads"][2:4]
        pads = (step["pad_top"], step["pad_bottom"], left, right)
        fn = {"conv": reference.conv2d, "maxpool": reference.maxpool2d,
              "avgpool": reference.avgpool2d}[kind]
        return [fn(layer, xs[0], pads)]
    if kind == "resize":
        out = step["outputs"][0]["rows"]
        return [reference.resize(layer, xs[0], out_rows=tuple(out),
                                 in_row0=step["inputs"][0]["rows"][0])]
    if kind == "pad":  # the slice's own padding along H, the layer's along the other axes
        pads = list(layer.attrs["pads"])
        pads[2], pads[6] = step["pad_top"], step["pad_bottom"]
        return reference.run_layer(_with_attrs(layer, pads=pads), xs)
    if kind == "channel_permute":  # the block's channels (all of them) in their new order
        return [np.take(xs[0], layer.attrs["order"], axis=1)]
    if kind == "reshape":  # H x W regrouped: the output rows' pixels, out of the rows read
        (a, b), r0 = step["outputs"][0]["rows"], step["inputs"][0]["rows"][0]
        x = xs[0]
        w_out = layer.attrs["shape"][-1] if len(layer.attrs["shape"]) == 4 else 1
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        start = a * w_out - r0 * x.shape[3]
        return [flat[:, :, start:start + (b - a) * w_out].reshape(x.shape[0], x.shape[1],
                                                                   b - a, w_out)]
    return reference.run_layer(layer, xs)


def _with_attrs(layer: QLayer, **attrs) -> QLayer:
    return QLayer(layer.name, layer.kind, layer.inputs, layer.outputs, {**layer.attrs, **attrs},
                  layer.params, layer.arrays, layer.source_nodes, layer.device)


# ---- the runner's NPU backend ---------------------------------------------------------------

def simulator_backend(build_dir: str | Path) -> Callable:
    """``backends={"npu": simulator_backend("build/yolov8n")}`` for `Runner`: float feeds are
    quantized with the program's input parameters, the simulator runs the compiled program of
    that graph (``compile/<graph>/program.npz``), the outputs are dequantized."""
    compile_dir = Path(build_dir) / "compile"

    @lru_cache(maxsize=None)
    def simulator(name: str) -> Simulator:
        path = compile_dir / name / "program.npz"
        if not path.is_file():
            raise BuildError(f"no compiled program {path}: build the compile stage first")
        return Simulator(path)

    @lru_cache(maxsize=None)
    def integer_outputs(path: Path) -> dict[str, np.dtype]:
        """The submodel's outputs of an integer type (a model's int8 output: `ops.integer_io`),
        handed back in that type as the model's own QuantizeLinear wrote them."""
        import onnx

        if not path.is_file():  # a runner handed a program alone
            return {}
        model = onnx.load(str(path), load_external_data=False)
        return {o.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
                for o in model.graph.output
                if o.type.tensor_type.elem_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)}

    def backend(graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sim = simulator(graph.name)
        ints = {name: quantize_feed(sim.tensors[name], feeds[name])
                for name in sim.program.doc["model_inputs"]}
        values = sim.run(ints)
        typed = integer_outputs(Path(graph.model_path))
        out = {t: dequantize(sim.tensors[t], values[t]) for t in graph.outputs}
        return {t: v.astype(typed[t]) if t in typed else v for t, v in out.items()}

    return backend


def quantize_feed(info: dict, value: np.ndarray) -> np.ndarray:
    if info["dtype"].startswith("float"):
        return np.asarray(value, np.float32)
    return schemes.quantize(np.asarray(value), info["scale"], info["zero_point"], info["dtype"])


def dequantize(info: dict, value: np.ndarray) -> np.ndarray:
    if info["dtype"].startswith("float"):
        return np.asarray(value, np.float32)
    return schemes.dequantize(value, info["scale"], info["zero_point"])

