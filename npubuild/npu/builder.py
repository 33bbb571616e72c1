"""Write a `LayerGraph` by hand: each call adds one layer and returns its output tensor's name.

    b = GraphBuilder({"x": (1, 3, 64, 64)})
    y = b.conv("x", 16, k=3, s=2, p=1)
    z = b.add(y, b.lut(y))
    graph = b.build([z])

For tests, examples and hypothesis-generated stacks; shapes, MACs and weight bytes follow the
same rules as `from_onnx` (int8 weights, int32 biases, int8 activations).
"""

from __future__ import annotations

from math import prod

from npubuild.npu.from_onnx import LUT_BYTES
from npubuild.npu.layers import LayerGraph, LayerSpec, Shape


class GraphBuilder:
    def __init__(self, inputs: dict[str, Shape]):
        self.inputs = tuple(inputs)
        self.shapes: dict[str, Shape] = {k: tuple(v) for k, v in inputs.items()}
        self.layers: list[LayerSpec] = []

    def _add(self, op: str, ins: list[str], outs: list[Shape], **fields) -> list[str]:
        name = f"{op}{len(self.layers)}"
        names = [f"{name}_out{i}" if len(outs) > 1 else f"{name}_out" for i in range(len(outs))]
        self.shapes.update(zip(names, outs))
        self.layers.append(LayerSpec(name, op, tuple(ins), tuple(names),
                                     tuple(self.shapes[t] for t in ins), tuple(outs), **fields))
        return names

    def conv(self, x: str, c_out: int, k: int = 3, s: int = 1, p: int | None = None, d: int = 1,
             groups: int = 1, bias: bool = True) -> str:
        n, c, h, w = self.shapes[x]
        p = (k - 1) * d // 2 if p is None else p
        ho, wo = (h + 2 * p - (k - 1) * d - 1) // s + 1, (w + 2 * p - (k - 1) * d - 1) // s + 1
        op = "dwconv" if groups > 1 and groups == c == c_out else "conv"
        attrs = (("kernel", (k, k)), ("stride", (s, s)), ("pads", (p, p, p, p)),
                 ("dilation", (d, d)), ("group", groups), ("bias", bias))
        return self._add(op, [x], [(n, c_out, ho, wo)],
                         weight_bytes=c_out * (c // groups) * k * k + 4 * c_out * bias,
                         macs=n * c_out * ho * wo * (c // groups) * k * k, kernel_h=k, stride_h=s,
                         pad_top=p, pad_bottom=p, dilation_h=d, attrs=attrs)[0]

    def pool(self, x: str, k: int = 2, s: int | None = None, p: int = 0, mode: str = "max") -> str:
        n, c, h, w = self.shapes[x]
        s = s or k
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        attrs = (("kernel", (k, k)), ("stride", (s, s)), ("pads", (p, p, p, p)),
                 ("dilation", (1, 1)), ("mode", mode))
        return self._add("pool", [x], [(n, c, ho, wo)], macs=n * c * ho * wo * k * k,
                         kernel_h=k, stride_h=s, pad_top=p, pad_bottom=p,
                         scratch_elem_bytes=2 * (mode == "avg"), attrs=attrs)[0]

    def add(self, a: str, b: str) -> str:
        return self._add("add", [a, b], [self.shapes[a]], macs=prod(self.shapes[a]),
                         attrs=(("fn", "add"),))[0]

    def mul(self, a: str, b: str) -> str:
        return self._add("eltwise", [a, b], [self.shapes[a]], macs=prod(self.shapes[a]),
                         scratch_elem_bytes=2, attrs=(("fn", "mul"),))[0]

    def lut(self, x: str, fn: str = "Sigmoid") -> str:
        return self._add("lut", [x], [self.shapes[x]], weight_bytes=LUT_BYTES,
                         macs=prod(self.shapes[x]), attrs=(("fn", fn),))[0]

    def concat(self, xs: list[str]) -> str:
        n, _, h, w = self.shapes[xs[0]]
        if any(self.shapes[x][::2] + self.shapes[x][3:] != (n, h, w) for x in xs):
            raise ValueError(f"concat of {[self.shapes[x] for x in xs]}: N, H, W must agree")
        shape = (n, sum(self.shapes[x][1] for x in xs), h, w)
        return self._add("concat", list(xs), [shape], macs=prod(shape), attrs=(("axis", 1),))[0]

    def split(self, x: str, sizes: list[int]) -> list[str]:
        n, _, h, w = self.shapes[x]
        return self._add("split", [x], [(n, c, h, w) for c in sizes], macs=prod(self.shapes[x]),
                         attrs=(("axis", 1), ("split", tuple(sizes))))

    def resize(self, x: str, scale: int = 2) -> str:
        n, c, h, w = self.shapes[x]
        return self._add("resize", [x], [(n, c, h * scale, w * scale)],
                         macs=n * c * h * w * scale * scale, scale_h=scale,
                         attrs=(("scale", (scale, scale)), ("mode", "nearest")))[0]

    def build(self, outputs: list[str], constants: tuple[str, ...] = ()) -> LayerGraph:
        """The graph; ``constants``: inputs that are constants (kept with the weights)."""
        return LayerGraph(tuple(self.layers), self.inputs, tuple(outputs), dict(self.shapes),
                          constants=frozenset(constants))
