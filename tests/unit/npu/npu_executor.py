"""A test-only executor: runs a `Program` on a real ``lanes × lmem_bytes_per_lane`` array.

Not the simulator (that comes with the quantized kernels): the ops are toy integer functions
(mod a prime) that depend on every row, channel and tap, so a wrong address, a wrong halo, a
wrong effective padding, a buffer clobbered by another or a lane-layout mistake changes the
result. Weight buffers hold a per-layer signature checked at every use; scratch buffers are
filled with garbage at every use. Layout per ``plan.json``'s ``layout``.
"""

from __future__ import annotations

import numpy as np

from npubuild.npu.backward_h import Rows
from npubuild.npu.program import Compute, CpuStep, Program

MOD = 9973


def pack(block: np.ndarray, lanes: int) -> np.ndarray:
    """(n, c, r, w) → (lanes, n · ceil(c/lanes) · r · w): channel c in lane c % lanes."""
    n, c, r, w = block.shape
    cpl = -(-c // lanes)
    padded = np.zeros((n, cpl * lanes, r, w), block.dtype)
    padded[:, :c] = block
    return padded.reshape(n, cpl, lanes, r, w).transpose(2, 0, 1, 3, 4).reshape(lanes, -1)


def unpack(flat: np.ndarray, n: int, c: int, r: int, w: int, lanes: int) -> np.ndarray:
    cpl = -(-c // lanes)
    block = flat.reshape(lanes, n, cpl, r, w).transpose(1, 2, 0, 3, 4).reshape(n, cpl * lanes, r, w)
    return block[:, :c]


def window(x: np.ndarray, layer, pad_top: int, pad_bottom: int, rows: int, fill: int):
    """The ``kernel_h`` taps of a sliding window, each (n, c, rows, w)."""
    x = np.concatenate([np.full(x.shape[:2] + (pad_top,) + x.shape[3:], fill, x.dtype), x,
                        np.full(x.shape[:2] + (pad_bottom,) + x.shape[3:], fill, x.dtype)], axis=2)
    s, d = layer.stride_h, layer.dilation_h
    return [x[:, :, i * d: i * d + (rows - 1) * s + 1: s] for i in range(layer.kernel_h)]


def apply(layer, ins, pad_top, pad_bottom, out_rows: Rows, channels: Rows, in_channels):
    """One layer on row slices; ``channels`` are the output channels computed."""
    rows, w_out = out_rows.size, layer.out_shapes[0][3]
    if layer.op in ("conv", "dwconv"):
        taps = window(ins[0], layer, pad_top, pad_bottom, rows, 0)
        summed = sum((i + 1) * t.sum(axis=3) for i, t in enumerate(taps)) % MOD  # (n, c, r)
        o = np.arange(channels.start, channels.stop)
        if layer.op == "dwconv":
            y = summed * (o % 5 + 1)[None, :, None]
        else:
            c = np.arange(in_channels[0].start, in_channels[0].stop)
            y = np.einsum("ncr,oc->nor", summed, (o[:, None] * 7 + c[None] * 3) % 5 + 1)
        return np.repeat((y % MOD)[..., None], w_out, axis=3)
    if layer.op == "pool":
        taps = window(ins[0], layer, pad_top, pad_bottom, rows, -1)
        y = np.max([t.max(axis=3) for t in taps], axis=0)
        return np.repeat(y[..., None], w_out, axis=3)
    if layer.op == "resize":
        f = layer.scale_h
        idx = np.arange(out_rows.start, out_rows.stop) // f - out_rows.start // f
        return np.repeat(ins[0], f, axis=3)[:, :, idx]
    if layer.op == "add":
        return (ins[0] + 2 * ins[1]) % MOD
    if layer.op == "eltwise":
        return (ins[0] * ins[1]) % MOD if len(ins) == 2 else (ins[0] * 5 + 3) % MOD
    if layer.op == "lut":
        return (3 * ins[0] + 1) % MOD
    if layer.op == "concat":
        return np.concatenate(ins, axis=1)
    if layer.op == "move":
        return ins[0]
    raise NotImplementedError(layer.op)


def reference(layers, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor, untiled, with the layers' declared paddings."""
    values = dict(inputs)
    for layer in layers:
        ins = [values[t] for t in layer.inputs]
        h_in, h_out = layer.in_shapes[0][2], layer.h_out
        bottom = max(0, (h_out - 1) * layer.stride_h - layer.pad_top
                     + (layer.kernel_h - 1) * layer.dilation_h + 1 - h_in)
        pads = (layer.pad_top, bottom) if layer.op in ("conv", "dwconv", "pool") else (0, 0)
        if layer.op == "split":
            bounds = np.cumsum([s[1] for s in layer.out_shapes])[:-1]
            outs = np.split(ins[0], bounds, axis=1)
        else:
            outs = [apply(layer, ins, *pads, Rows(0, h_out), Rows(0, layer.c_out),
                          [Rows(0, s[1]) for s in layer.in_shapes])]
        values.update(zip(layer.outputs, outs))
    return values


class Executor:
    def __init__(self, program: Program, seed: int = 0):
        self.program, self.chip = program, program.chip
        self.lanes = program.chip.lanes
        self.lmem = np.full((self.lanes, program.chip.lmem_bytes_per_lane), -7, np.int64)
        self.rng = np.random.default_rng(seed)
        self.layers = {layer.name: layer for layer in program.graph.layers}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = self.program.graph.shapes
        self.gmem = {t: np.full(shapes[t], -9, np.int64) for t in self.program.gmem.tensors}
        self.gmem.update(inputs)
        for group in self.program.groups:
            if isinstance(group, CpuStep):
                self._cpu(group.layer)
                continue
            self.plan = group.plan
            for piece in group.slices:
                for step in piece.steps:
                    self._step(step)
        return self.gmem

    def _cpu(self, layer):
        ref = reference([layer], {t: self.gmem[t] for t in layer.inputs})
        self.gmem.update({t: ref[t] for t in layer.outputs})

    def _signature(self, name: str) -> int:
        return 1000 + sum(map(ord, name)) % 5000

    def _step(self, step):
        if isinstance(step, Compute):
            return self._compute(step)
        buf = self.plan.buffers[step.buffer]
        if step.rows is None:  # weight
            self.lmem[:, step.addr:step.addr + buf.size] = self._signature(buf.name)
        elif step.op == "load":
            block = self.gmem[step.tensor][step.batch.start:step.batch.stop,
                                           step.channels.start:step.channels.stop,
                                           step.rows.start:step.rows.stop]
            flat = pack(block, self.lanes)
            assert flat.shape[1] <= buf.size
            self.lmem[:, step.addr:step.addr + flat.shape[1]] = flat
        else:
            block = self._read(step.tensor, step.addr, step.batch, step.channels, step.rows_held)
            r = step.rows.start - step.rows_held.start
            target = self.gmem[step.tensor]
            target[step.batch.start:step.batch.stop, step.channels.start:step.channels.stop,
                   step.rows.start:step.rows.stop] = block[:, :, r:r + step.rows.size]

    def _read(self, tensor, addr, batch, channels, rows):
        w = self.program.graph.shapes[tensor][3]
        size = batch.size * -(-channels.size // self.lanes) * rows.size * w
        return unpack(self.lmem[:, addr:addr + size], batch.size, channels.size, rows.size, w,
                      self.lanes)

    def _compute(self, step: Compute):
        layer = self.layers[step.layer]
        if step.weight is not None:
            buf = self.plan.buffers[step.weight["buffer"]]
            a = step.weight["addr"]
            assert (self.lmem[:, a:a + buf.size] == self._signature(buf.name)).all(), \
                f"weight of {layer.name} clobbered"
        if step.scratch is not None:
            buf = self.plan.buffers[step.scratch["buffer"]]
            a = step.scratch["addr"]
            self.lmem[:, a:a + buf.size] = self.rng.integers(0, MOD, (self.lanes, buf.size))
        ins = []
        for op in step.inputs:
            block = self._read(op.tensor, op.addr, op.batch, op.channels, op.rows_held)
            r = op.rows.start - op.rows_held.start
            ins.append(block[:, :, r:r + op.rows.size])
        out0 = step.outputs[0]
        if layer.op == "split":
            bounds = np.cumsum([s[1] for s in layer.out_shapes])[:-1]
            outs = np.split(ins[0], bounds, axis=1)
        else:
            outs = [apply(layer, ins, step.pad_top, step.pad_bottom, out0.rows, out0.channels,
                          [op.channels for op in step.inputs])]
        for op, value in zip(step.outputs, outs):
            flat = pack(value, self.lanes)
            assert flat.shape[1] <= self.plan.buffers[op.buffer].size, f"{op.tensor} overflows"
            self.lmem[:, op.addr:op.addr + flat.shape[1]] = flat


def check_program(program: Program, seed: int = 0) -> None:
    """Run tiled and untiled; every stored tensor must match bit for bit."""
    rng = np.random.default_rng(seed)
    inputs = {t: rng.integers(0, MOD, program.graph.shapes[t]) for t in program.graph.inputs}
    expected = reference(program.graph.layers, inputs)
    got = Executor(program, seed).run(inputs)
    for t in got:
        assert np.array_equal(got[t], expected[t]), f"tensor {t!r} differs"
