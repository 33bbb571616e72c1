"""Small float ONNX stacks (conv/pool/add/concat/resize/lut), quantized with the quant library,
compiled for a chip and run by the simulator — the helpers of the compile tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npubuild.npu import build_program, estimate
from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph
from npubuild.npu.program_file import ProgramFile, program_document
from npubuild.quant import calibrate, quantizer
from npubuild.quant.lower import lower
from npubuild.quant.reference import run_reference
from npubuild.runtime.simulator import Simulator


@dataclass
class Stack:
    """An ONNX graph written layer by layer, tracking NCHW shapes."""

    shape: tuple[int, int, int, int]
    seed: int = 0
    nodes: list = field(default_factory=list)
    inits: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)

    def __post_init__(self):
        self.shapes["x"] = tuple(self.shape)
        self.rng = np.random.default_rng(self.seed)

    def _name(self, op: str) -> str:
        return f"{op.lower()}{len(self.nodes)}"

    def _const(self, name: str, value) -> str:
        self.inits[name] = np.asarray(value)
        return name

    def conv(self, x: str, cout: int, k: int = 3, s: int = 1, d: int = 1, depthwise: bool = False,
             pads: tuple[int, int, int, int] | None = None) -> str:
        n, c, h, w = self.shapes[x]
        cout, group = (c, c) if depthwise else (cout, 1)
        p = pads or ((k - 1) * d // 2,) * 4
        name = self._name("Conv")
        weight = self._const(f"{name}_w", self.rng.normal(0, 0.3, (cout, c // group, k, k)))
        bias = self._const(f"{name}_b", self.rng.normal(0, 0.2, cout))
        self.nodes.append(helper.make_node("Conv", [x, weight, bias], [name], name=name,
                                           kernel_shape=[k, k], strides=[s, s],
                                           dilations=[d, d], pads=list(p), group=group))
        ho = (h + p[0] + p[2] - d * (k - 1) - 1) // s + 1
        wo = (w + p[1] + p[3] - d * (k - 1) - 1) // s + 1
        self.shapes[name] = (n, cout, ho, wo)
        return name

    def pool(self, x: str, mode: str = "max", k: int = 3, s: int = 1, p: int = 1,
             count_include_pad: int = 0) -> str:
        n, c, h, w = self.shapes[x]
        op = "MaxPool" if mode == "max" else "AveragePool"
        name = self._name(op)
        extra = {"count_include_pad": count_include_pad} if mode == "avg" else {}
        self.nodes.append(helper.make_node(op, [x], [name], name=name, kernel_shape=[k, k],
                                           strides=[s, s], pads=[p] * 4, **extra))
        self.shapes[name] = (n, c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
        return name

    def unary(self, x: str, op: str = "Sigmoid") -> str:
        name = self._name(op)
        self.nodes.append(helper.make_node(op, [x], [name], name=name))
        self.shapes[name] = self.shapes[x]
        return name

    def binary(self, a: str, b: str, op: str = "Add") -> str:
        name = self._name(op)
        self.nodes.append(helper.make_node(op, [a, b], [name], name=name))
        self.shapes[name] = self.shapes[a]
        return name

    def concat(self, xs: list[str], axis: int = 1) -> str:
        name = self._name("Concat")
        self.nodes.append(helper.make_node("Concat", xs, [name], name=name, axis=axis))
        shape = list(self.shapes[xs[0]])
        shape[axis] = sum(self.shapes[x][axis] for x in xs)
        self.shapes[name] = tuple(shape)
        return name

    def resize(self, x: str, mode: str = "nearest", scale: int = 2,
               ctm: str = "asymmetric") -> str:
        n, c, h, w = self.shapes[x]
        name = self._name("Resize")
        scales = self._const(f"{name}_scales", np.array([1, 1, scale, scale], np.float32))
        extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
        self.nodes.append(helper.make_node("Resize", [x, "", scales], [name], name=name, mode=mode,
                                           coordinate_transformation_mode=ctm, **extra))
        self.shapes[name] = (n, c, h * scale, w * scale)
        return name

    def reshape(self, x: str, shape: list[int]) -> str:
        name = self._name("Reshape")
        target = self._const(f"{name}_shape", np.array(shape, np.int64))
        self.nodes.append(helper.make_node("Reshape", [x, target], [name], name=name))
        self.shapes[name] = tuple(shape)
        return name

    def transpose(self, x: str, perm: list[int]) -> str:
        name = self._name("Transpose")
        self.nodes.append(helper.make_node("Transpose", [x], [name], name=name, perm=perm))
        self.shapes[name] = tuple(self.shapes[x][p] for p in perm)
        return name

    def channel_shuffle(self, x: str, groups: int, spelling: str = "rank5") -> str:
        """ShuffleNet's channel shuffle, spelled as ShuffleNet does (``rank5``: Reshape to
        (N, g, C/g, H, W), Transpose of the two channel axes, Reshape back) or another way
        to the same permutation (``rank4``: the pixels flattened, (N, g, C/g, H·W);
        ``gather``: a Gather by the channel order as import writes it, a Slice per run of
        consecutive channels and a Concat)."""
        n, c, h, w = self.shapes[x]
        if spelling == "gather":
            order = [(i % groups) * (c // groups) + i // groups for i in range(c)]
            runs = [[order[0]]]
            for i in order[1:]:
                runs[-1].append(i) if i == runs[-1][-1] + 1 else runs.append([i])
            return self.concat([self.slice(x, run[0], run[-1] + 1) for run in runs])
        if spelling == "rank5":
            grouped = self.reshape(x, [n, groups, c // groups, h, w])
            swapped = self.transpose(grouped, [0, 2, 1, 3, 4])
        else:
            grouped = self.reshape(x, [n, groups, c // groups, h * w])
            swapped = self.transpose(grouped, [0, 2, 1, 3])
        return self.reshape(swapped, [n, c, h, w])

    def slice(self, x: str, start: int, end: int, axis: int = 1) -> str:
        name = self._name("Slice")
        bounds = [self._const(f"{name}_{k}", np.array([v], np.int64))
                  for k, v in (("starts", start), ("ends", end), ("axes", axis))]
        self.nodes.append(helper.make_node("Slice", [x, *bounds], [name], name=name))
        shape = list(self.shapes[x])
        shape[axis] = end - start
        self.shapes[name] = tuple(shape)
        return name

    def pad(self, x: str, pads: list[int], value: float = 0.0) -> str:
        """A constant Pad (ONNX order: begins of every axis, then ends)."""
        name = self._name("Pad")
        amounts = self._const(f"{name}_pads", np.array(pads, np.int64))
        fill = self._const(f"{name}_value", np.array(value, np.float32))
        self.nodes.append(helper.make_node("Pad", [x, amounts, fill], [name], name=name,
                                           mode="constant"))
        rank = len(pads) // 2
        self.shapes[name] = tuple(d + pads[i] + pads[i + rank]
                                  for i, d in enumerate(self.shapes[x]))
        return name

    def gemm(self, x: str, cout: int) -> str:
        """A fully connected layer on a 2-D [N, K] input."""
        n, k = self.shapes[x]
        name = self._name("Gemm")
        weight = self._const(f"{name}_w", self.rng.normal(0, 0.1, (k, cout)))
        bias = self._const(f"{name}_b", self.rng.normal(0, 0.2, cout))
        self.nodes.append(helper.make_node("Gemm", [x, weight, bias], [name], name=name))
        self.shapes[name] = (n, cout)
        return name

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        def value(name):
            return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(self.shapes[name]))

        graph = helper.make_graph(self.nodes, "stack", [value("x")], [value(o) for o in outputs],
                                  [numpy_helper.from_array(v if v.dtype.kind in "iu" else
                                                           v.astype(np.float32), k)
                                   for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model


def quantize(model: onnx.ModelProto, scheme: str = "pow2_symmetric", samples: int = 2,
             seed: int = 0, granularity: str = "per_tensor", **config):
    """``config``: more `QuantConfig` fields (int16 tensors, W16A16 inputs ...)."""
    fg, probe = lower(model)
    rng = np.random.default_rng(seed)
    shape = [int(d.dim_value) for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"x": rng.uniform(-1, 1.5, shape).astype(np.float32)} for _ in range(samples)]
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    config = quantizer.QuantConfig(scheme=scheme, granularity=granularity, **config)
    return quantizer.quantize_graph(fg, stats, config, "graph_0")[0]


def int_inputs(qgraph, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t: rng.integers(-128, 128, qgraph.tensors[t].shape).astype(qgraph.tensors[t].dtype)
            for t in qgraph.inputs}


def compile_qgraph(qgraph, chip, grouping: bool = True, on_no_fit: str = "error"):
    """(QLayers, Program, ProgramFile) of ``qgraph`` on ``chip``."""
    layers = layers_from_qgraph(qgraph)
    program = build_program(plan_qgraph(layers, chip, grouping=grouping, on_no_fit=on_no_fit))
    return layers, program, ProgramFile(*program_document(program, layers, estimate(program)))


def simulate_and_compare(qgraph, program_file: ProgramFile, inputs=None) -> dict:
    """Run the simulator; every GMEM tensor must equal the integer reference. Returns them."""
    inputs = inputs or int_inputs(qgraph)
    got = Simulator(program_file).run(inputs)
    want = run_reference(qgraph, inputs)
    for t, value in got.items():
        assert np.array_equal(value, want[t]), f"tensor {t!r} differs from the reference"
    return got


@st.composite
def stacks(draw) -> tuple[Stack, list[str]]:
    """Random conv/pool/add/concat/resize/lut stacks on [1, C, H, 128] inputs (big enough that
    npu-tiny slices H most of the time), with the tiled layout layers too (H pads, spatial
    reshapes, concats along H, channel softmax, channel shuffles) and a reshape across
    channels (a breaker)."""
    c = draw(st.sampled_from([8, 16, 16]))
    stack = Stack((1, c, draw(st.integers(48, 128)), 128), seed=draw(st.integers(0, 99)))
    cur, seen = "x", ["x"]
    for _ in range(draw(st.integers(2, 6))):
        n, c, h, w = stack.shapes[cur]
        kind = draw(st.sampled_from(["conv", "conv", "dwconv", "maxpool", "avgpool", "add",
                                     "concat", "resize", "lut", "reshape", "hpad", "hconcat",
                                     "softmax", "shuffle", "channel_shuffle"]))
        if kind in ("conv", "dwconv"):
            k = draw(st.sampled_from([1, 3, 5]))
            s = draw(st.sampled_from([1, 1, 2])) if h >= 16 else 1
            d = draw(st.sampled_from([1, 1, 2])) if k > 1 and s == 1 else 1
            cur = stack.conv(cur, draw(st.sampled_from([8, 16])), k, s, d,
                             depthwise=kind == "dwconv")
        elif kind in ("maxpool", "avgpool"):
            k = draw(st.sampled_from([2, 3]))
            s = draw(st.sampled_from([1, 2])) if h >= 16 else 1
            cur = stack.pool(cur, kind[:3], k, s, draw(st.integers(0, k // 2)),
                             draw(st.sampled_from([0, 1])) if kind == "avgpool" else 0)
        elif kind == "add":
            same = [t for t in seen if stack.shapes[t] == stack.shapes[cur] and t != cur]
            cur = (stack.binary(cur, draw(st.sampled_from(same))) if same
                   else stack.unary(cur, "Relu"))
        elif kind == "concat":
            same = [t for t in seen if stack.shapes[t][2:] == stack.shapes[cur][2:] and t != cur]
            cur = stack.concat([cur, draw(st.sampled_from(same))] if same else [cur, cur])
        elif kind == "resize" and h <= 80:
            mode = draw(st.sampled_from(["nearest", "linear"]))
            cur = stack.resize(cur, mode, 2, "asymmetric" if mode == "nearest" else
                               draw(st.sampled_from(["half_pixel", "align_corners"])))
        elif kind == "reshape" and w % 2 == 0 and h <= 96:  # H x W regrouped: tiled
            cur = stack.reshape(cur, [n, c, h * 2, w // 2])
        elif kind == "shuffle" and c % 2 == 0 and w % 2 == 0:  # across channels: a breaker
            cur = stack.reshape(cur, [n, c // 2, h, w * 2])
        elif kind == "channel_shuffle":  # ShuffleNet's, or another spelling of it: tiled
            groups = draw(st.sampled_from([g for g in (2, 4) if c % g == 0] or [1]))
            spelling = draw(st.sampled_from(["rank5", "rank4", "gather"]))
            cur = (stack.channel_shuffle(cur, groups, spelling) if groups > 1
                   else stack.unary(cur, "Relu"))
        elif kind == "hpad":  # Keras' ZeroPadding2D: a window of one row along H
            top, bottom = draw(st.integers(0, 2)), draw(st.integers(0, 2))
            cur = stack.pad(cur, [0, 0, top, 0, 0, 0, bottom, draw(st.integers(0, 1))])
        elif kind == "hconcat" and h <= 96:  # along H: each output row from one input
            same = [t for t in seen if stack.shapes[t][:2] == (n, c)
                    and stack.shapes[t][3] == w and stack.shapes[t][2] <= 48]
            cur = stack.concat([cur, draw(st.sampled_from(same))] if same else [cur, cur], axis=2)
        elif kind == "softmax":  # along the channels
            cur = stack.unary(cur, "Softmax")
            stack.nodes[-1].attribute.extend([helper.make_attribute("axis", 1)])
        else:
            cur = stack.unary(cur, "Sigmoid")
        seen.append(cur)
    return stack, [cur]
