"""One truth about placement: a node the split's checks place on the NPU is quantized to integer
layers and compiled to NPU (or DMA) steps, never silently kept in float; a node the quantizer
cannot lower is placed on the CPU with the quantizer's own reason. Checked on one small model
per op (and per known fallback variant) of every preset chip's op table."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild.npu.from_qgraph import layers_from_qgraph
from npubuild.targets import load_chip, preset_names
from npubuild.targets.constraints import integer_kernel
from npubuild.targets.integer import conditions
from tests.unit.quant.helpers import feeds_for, quantize
from tests.unit.split.split_models import Net, chain
from tests.unit.targets.test_targets_constraints import conv, one, reasons_of

X = [1, 4, 8, 8]
F = np.float32


def c(*shape, value=None):
    return np.full(shape, value, F) if value is not None else \
        np.random.default_rng(len(shape)).uniform(0.5, 1.5, shape).astype(F)


def rms_normalization() -> onnx.ModelProto:
    """RMSNormalization (opset 23) over the last axis with a constant Scale."""
    net = Net()
    out = net.op("RMSNormalization", [net.input("x0", [1, 6, 8]), net.init("c1", c(8))], name="n",
                 axis=-1, epsilon=1e-6)
    return net.model([out], opset=23)


def split_two() -> onnx.ModelProto:
    net = Net()
    a, b = net.op("Split", [net.input("x0", X), net.init("c1", np.array([1, 3]))], name="n",
                  outputs=2, axis=1)
    return net.model([a, b])


def fused(rule: str, model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the fusion rule ``rule`` applied once (a model-local function node)."""
    from npubuild.fusions import load_builtins

    model, report = load_builtins()[rule].apply(model)
    assert report.fired == 1
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def silu(after_conv: bool) -> onnx.ModelProto:
    net = Net()
    x = net.input("x", X)
    x = net.conv(x, 4, 4) if after_conv else x
    return net.model([net.op("Mul", [x, net.op("Sigmoid", [x])])])


def gemm_relu() -> onnx.ModelProto:
    net = Net()
    y = net.op("Gemm", [net.input("x", [1, 8]), net.init("w", c(4, 8))], transB=1)
    return net.model([net.op("Relu", [y])])


def gelu() -> onnx.ModelProto:
    net = Net()  # an ONNX op from opset 20
    return net.model([net.op("Gelu", [net.input("x", X)], name="n")], opset=20)


# op → small models; the comment names what the quantizer cannot lower (expected on the CPU)
MODELS = {
    "Conv": [conv()],
    "ConvTranspose": [one("ConvTranspose", [X, [4, 4, 3, 3]], {1: c(4, 4, 3, 3)}, pads=[1] * 4)],
    "Conv 1-D": [one("Conv", [[1, 4, 16], [4, 4, 3]], {1: c(4, 4, 3)}, pads=[1, 1])],
    "MaxPool": [one("MaxPool", [X], kernel_shape=[2, 2], strides=[2, 2])],
    "AveragePool": [one("AveragePool", [X], kernel_shape=[3, 3], pads=[1] * 4)],
    "GlobalAveragePool": [one("GlobalAveragePool", [X])],
    "GlobalMaxPool": [one("GlobalMaxPool", [X])],
    "Sum": [one("Sum", [X, X])],
    "Add": [one("Add", [X, X]), one("Add", [X, [1, 4, 1, 1]])],
    "Sub": [one("Sub", [X, X])],
    "Mul": [one("Mul", [X, X]), one("Mul", [X, [1]], {1: c(1)})],
    "Div": [one("Div", [X, [1]], {1: c(1)}), one("Div", [X, [1, 4, 1, 1]], {1: c(1, 4, 1, 1)})],
    "Div by a tensor": [one("Div", [X, [1, 4, 1, 1]])],
    "Max": [one("Max", [X, X])],
    "Min": [one("Min", [X, X])],
    "Concat": [one("Concat", [X, [1, 2, 8, 8]], axis=1)],
    "Split": [split_two()],
    "Slice": [one("Slice", [X, [1], [1], [1]], {1: np.array([1]), 2: np.array([7]),
                                                  3: np.array([2])})],
    "Reshape": [one("Reshape", [X, [3]], {1: np.array([1, 4, 64])})],
    "Flatten": [one("Flatten", [X], axis=1)],
    "Squeeze": [one("Squeeze", [[1, 4, 1, 8], [1]], {1: np.array([2])})],
    "Unsqueeze": [one("Unsqueeze", [[1, 4, 8], [1]], {1: np.array([3])})],
    "Transpose": [one("Transpose", [X], perm=[0, 1, 3, 2])],
    "DepthToSpace": [one("DepthToSpace", [X], blocksize=2)],
    "SpaceToDepth": [one("SpaceToDepth", [X], blocksize=2)],
    "Pad": [one("Pad", [X, [8]], {1: np.array([0, 0, 1, 1, 0, 0, 1, 1])})],
    "Resize": [one("Resize", [X], {1: None, 2: np.array([1, 1, 2, 2], F)}, mode="nearest")],
    "Relu": [one("Relu", [X])],
    "LeakyRelu": [one("LeakyRelu", [X], alpha=0.1)],
    "PRelu": [one("PRelu", [X, [1]], {1: c(1, value=0.25)})],
    "PRelu per channel": [one("PRelu", [X, [4, 1, 1]], {1: c(4, 1, 1)})],
    "Clip": [one("Clip", [X, [], []], {1: np.array(0.0, F), 2: np.array(6.0, F)})],
    "Sigmoid": [one("Sigmoid", [X])],
    "HardSigmoid": [one("HardSigmoid", [X])],
    "HardSwish": [one("HardSwish", [X])],
    "Tanh": [one("Tanh", [X])],
    "Softmax": [one("Softmax", [X], axis=1)],
    "Gemm": [one("Gemm", [[1, 8], [4, 8]], {1: c(4, 8)}, transB=1)],
    "MatMul": [one("MatMul", [[1, 8], [8, 4]], {1: c(8, 4)})],
    "BatchNormalization": [one("BatchNormalization", [X, [4], [4], [4], [4]],
                               {1: c(4), 2: c(4), 3: c(4), 4: c(4)})],
    "ReduceMean": [one("ReduceMean", [X], axes=[2, 3], keepdims=1)],
    "ReduceMean over channels": [one("ReduceMean", [X], axes=[1], keepdims=1)],
    "Identity": [one("Identity", [X])],
    "Exp": [one("Exp", [X])],
    "Abs": [one("Abs", [X])],
    "Sqrt": [chain("Abs", "Sqrt")],  # of what is not negative: a NaN stops calibration
    "Neg": [one("Neg", [X])],
    "Erf": [one("Erf", [X])],
    "Gelu": [gelu()],
    "Pow": [one("Pow", [X, []], {1: np.array(3.0, F)})],
    "LayerNormalization": [one("LayerNormalization", [[1, 6, 8], [8], [8]], {1: c(8), 2: c(8)})],
    "Elu": [one("Elu", [X])],
    "Softplus": [one("Softplus", [X])],
    "Softsign": [one("Softsign", [X])],
    "InstanceNormalization": [one("InstanceNormalization", [X, [4], [4]], {1: c(4), 2: c(4)})],
    "LRN": [one("LRN", [X], size=3)],
    "RMSNormalization": [rms_normalization()],
    "ReduceSum": [one("ReduceSum", [X, [2]], {1: np.array([2, 3])}, keepdims=1)],
    "ReduceMax": [one("ReduceMax", [X], axes=[2, 3], keepdims=1)],
    "ConvAct": [fused("conv_act", chain("Conv", "Relu"))],
    "ConvSilu": [fused("conv_silu", silu(after_conv=True))],
    "Silu": [fused("silu", silu(after_conv=False))],
    "GemmAct": [fused("gemm_act", gemm_relu())],
}
# what the issue found quantize running in float while the split said NPU
NO_INTEGER_KERNEL = ["ConvTranspose", "Conv 1-D", "Max", "Div by a tensor",
                     "ReduceMean over channels"]
CASES = [(name, k) for name, models in MODELS.items() for k in range(len(models))]


def test_every_op_of_every_preset_chip_has_a_model():
    covered = {name.split(" ")[0] for name in MODELS}
    for chip in preset_names():
        assert set(load_chip(chip).ops) <= covered, chip


@pytest.mark.parametrize("chip", ["npu-16m", "npu-strict"])
@pytest.mark.parametrize("name,k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_a_node_placed_on_the_npu_is_quantized_and_compiled_to_npu_code(name, k, chip):
    model = MODELS[name][k]
    if reasons_of(model, chip):
        return  # the CPU runs it, in float: nothing for quantize to keep or drop
    qgraph, _, _ = quantize(model, feeds_for(model, n=2))
    assert [(layer.name, layer.attrs.get("reason")) for layer in qgraph.cpu_layers()] == []
    breakers = layers_from_qgraph(qgraph).breakers.values()
    assert [b.layer for b in breakers if b.executes == "cpu"] == []


@pytest.mark.parametrize("name", NO_INTEGER_KERNEL)
def test_what_quantize_cannot_lower_is_placed_on_the_cpu_with_the_quantizers_reason(name):
    reasons = reasons_of(MODELS[name][0], "npu-16m")
    assert any(r.startswith(integer_kernel.__doc__) for r in reasons), reasons


def test_the_reason_carries_the_quantizers_own_detail():
    reasons = reasons_of(MODELS["Div by a tensor"][0], "npu-16m")
    assert reasons == ["The quantizer has no integer kernel for it: division by a tensor that "
                       "is not constant"]


def test_conditions_are_read_from_the_lowering_rules():
    assert "division by a tensor that is not constant" in conditions("Div")
    assert "ReduceMean other than over H and W of a 4-D tensor, dimensions kept" in conditions(
        "ReduceMean")
    assert conditions("ConvTranspose") == ("always (no lowering rule for the op)",)
    assert "PRelu with a non-constant slope" in conditions("PRelu")


# TPU-MLIR's Active op computes these as lookup tables, and so does npubuild's quantizer
# (``quant.ops.LUT_FUNCTIONS``): a chip whose table follows TPU-MLIR's coverage runs them
TABLED_ACTIVATIONS = ["Elu", "Softplus", "Softsign", "Exp", "Abs", "Sqrt"]


@pytest.mark.parametrize("name", TABLED_ACTIVATIONS)
def test_an_activation_the_quantizer_tables_runs_on_the_npu_of_a_tpu_mlir_like_chip(name):
    """tempo-cnn's FCN (Keras ELUs after every conv, round 9) ran 10 ELUs on the CPU between 10
    NPU segments on npu-16m, 259 fps deployed against 7,757 for the NPU alone: npu-16m runs
    Sigmoid, Tanh, Erf and Gelu as tables but did not list ELU, Softplus or Softsign, which
    TPU-MLIR's Active op computes the same way and the quantizer already lowers to a table."""
    from npubuild.quant.ops import LUT_FUNCTIONS

    assert name in LUT_FUNCTIONS
    assert reasons_of(MODELS[name][0], "npu-16m") == []


def test_neg_runs_on_the_npu_of_a_tpu_mlir_like_chip_as_a_rescale_by_minus_one():
    """basic-pitch's constant-Q front end negates 9 tensors; npu-16m placed each Neg on the
    CPU though the quantizer lowers it to a rescale by -1 (TPU-MLIR's MulConst)."""
    from npubuild.quant.ops import RULES

    assert "Neg" in RULES
    assert reasons_of(MODELS["Neg"][0], "npu-16m") == []
