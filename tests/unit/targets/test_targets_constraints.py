"""The op-support checks: each constraint's reason text on a one-node model written inline."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import UserError
from npubuild.recipe.model import SplitSpec
from npubuild.split import split_model
from npubuild.targets import load_chip
from npubuild.targets.constraints import CONSTRAINTS, node_reasons
from npubuild.targets.docs import supported_ops_markdown
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView
from tests.conftest import REPO
from tests.unit.split.split_models import Net, fused_conv_act


def reasons_of(model: onnx.ModelProto, chip: str | Chip, node: str | None = None) -> list[str]:
    chip = load_chip(chip) if isinstance(chip, str) else chip
    facts = GraphFacts.from_model(model)
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    target = next(n for n in nodes if n.name == node) if node else nodes[-1]
    return node_reasons(NodeView(target, facts), chip)


def one(op: str, shapes: list[list[int]], consts: dict[int, object] | None = None,
        dtype: int = TensorProto.FLOAT, infer: bool = True, **attrs) -> onnx.ModelProto:
    """A model of one ``op`` node: inputs of ``shapes``; ``consts[k]`` makes input k constant."""
    net = Net()
    names = []
    for k, shape in enumerate(shapes):
        if consts and k in consts:
            names.append(net.init(f"c{k}", consts[k]))
        else:
            names.append(net.input(f"x{k}", shape, dtype))
    for k in sorted(set(consts or {}) - set(range(len(shapes)))):
        names.append(net.init(f"c{k}", consts[k]) if consts[k] is not None else "")
    out = net.op(op, names, name="n", **attrs)
    return net.model([out], infer=infer)


def conv(k=3, stride=1, dilation=1, pad=None, group=1, cin=4, cout=4, size=16) -> onnx.ModelProto:
    net = Net()
    x = net.input("x", [1, cin, size, size])
    y = net.conv(x, cin, cout, k=k, name="n", group=group, strides=[stride] * 2,
                 dilations=[dilation] * 2, pads=[k // 2 if pad is None else pad] * 4)
    return net.model([y])


W = np.ones((4, 4, 3, 3), np.float32)
CASES = {
    "kernel not in the set": (conv(k=4, pad=1), "npu-strict",
                              "Kernel size is not 1, 3, 5 or 7: kernel [4, 4]"),
    "kernel too large": (conv(k=9), "npu-tiny", "Kernel is larger than 8: kernel [9, 9]"),
    "stride": (conv(stride=3), "npu-strict", "Stride is larger than 2: strides [3, 3]"),
    "dilation": (conv(dilation=3), "npu-strict", "Dilation is larger than 2: dilations [3, 3]"),
    "pad": (conv(k=3, pad=5), "npu-strict", "Padding is larger than 3: pads [5, 5, 5, 5]"),
    "groups": (conv(group=2), "npu-strict", "Convolution groups are not 1 or depthwise "
                                           "(groups = channels): group=2, 4 input channels"),
    "conv input channels": (conv(cin=1032, cout=4, size=4), "npu-tiny",
                            "Each output channel reads more than 1024 input channels (the "
                            "compiler splits output channels, not input channels): weight "
                            "'n.w' has shape [4, 1032, 3, 3]"),
    "channels": (one("ConvTranspose", [[1, 12, 4, 4], [12, 4, 3, 3]],
                     {1: np.zeros((12, 4, 3, 3), np.float32)}),
                 load_chip("npu-16m").model_copy(update={"ops": {
                     "ConvTranspose": load_chip("npu-16m").ops["ConvTranspose"].model_copy(
                         update={"max_channels": 8})}}),
                 "Channels are more than 8: 'x0' has 12 channels"),
    "3-D input": (one("Relu", [[1, 4, 8]]), "npu-strict",
                  "Input is not 4D tensor: 'x0' has shape [1, 4, 8]"),
    "broadcast": (one("Add", [[1, 4, 8, 8], [1, 1, 8, 1]]), "npu-strict",
                  "Operands are not the same shape, a scalar or per-channel [1, C, 1, 1]: "
                  "'x1' has shape [1, 1, 8, 1], the output [1, 4, 8, 8]"),
    "concat axis": (one("Concat", [[1, 4, 8, 8], [1, 4, 8, 8]], axis=0), "npu-strict",
                    "Axis is not 1, 2 or 3: axis 0 of a 4-D tensor"),
    "resize mode": (one("Resize", [[1, 4, 8, 8], [0], [4]],
                        {1: np.zeros(0, np.float32), 2: np.array([1, 1, 2, 2], np.float32)},
                        mode="linear"), "npu-strict", "Resize mode is not nearest: mode 'linear'"),
    "resize scale": (one("Resize", [[1, 4, 8, 8], [0], [4]],
                         {1: np.zeros(0, np.float32), 2: np.array([1, 1, 1.5, 1.5], np.float32)},
                         coordinate_transformation_mode="asymmetric"),
                     "npu-strict", "Resize scale is not an integer: scales [1.0, 1.0, 1.5, 1.5]"),
    "resize channels": (one("Resize", [[1, 4, 8, 8], [0], [4]],
                            {1: np.zeros(0, np.float32), 2: np.array([1, 2, 2, 2], np.float32)},
                            coordinate_transformation_mode="asymmetric"),
                        "npu-strict", "Resize changes the batch or channel dimension: "
                                      "scales [1.0, 2.0, 2.0, 2.0]"),
    "empty constant": (one("Concat", [[1, 4, 8, 8], [1, 0, 8, 8]],
                           {1: np.zeros((1, 0, 8, 8), np.float32)}, axis=1), "npu-16m",
                       "Constant input has no elements: 'c1' has shape [1, 0, 8, 8]"),
    "pad mode": (one("Pad", [[1, 4, 8, 8], [8]], {1: np.array([0, 0, 1, 1, 0, 0, 1, 1])},
                     mode="reflect"), "npu-strict", "Pad mode is not constant: mode 'reflect'"),
    "slice step": (one("Slice", [[1, 4, 8, 8], [1], [1], [1], [1]],
                       {1: np.array([0]), 2: np.array([8]), 3: np.array([2]), 4: np.array([2])}),
                   "npu-strict", "Stride is larger than 1: strides [2]"),
    "slice axis": (one("Slice", [[2, 4, 8, 8], [1], [1], [1]],
                       {1: np.array([0]), 2: np.array([1]), 3: np.array([0])}),
                   "npu-strict", "Axis is not 1, 2 or 3: axis 0 of a 4-D tensor"),
    "runtime shape": (one("Reshape", [[1, 4, 8, 8], [2]], dtype=TensorProto.FLOAT), "npu-16m",
                      "Parameter input is not constant: 'x1' is computed at run time"),
    "int64": (one("Add", [[1, 4], [1, 4]], dtype=TensorProto.INT64), "npu-16m",
              "Tensor type is not float32 or float16: 'x0' is int64"),
    "unknown shape": (one("Relu", [["N", 4]]), "npu-16m",
                      "Tensor shape is unknown or not static: 'x0' has shape [N, 4]; "
                      "'n_out' has shape [N, 4]"),
    "not in the table": (one("Softmax", [[1, 4, 8, 8]]), "npu-strict",
                         "op Softmax is not supported by chip npu-strict"),
    "unlisted op": (one("Log", [[1, 4]]), "npu-16m", "op Log is not supported by chip npu-16m"),
    "other domain": (one("FusedConv", [[1, 4, 8, 8]], domain="com.microsoft", infer=False), "npu-16m",
                     "op com.microsoft.FusedConv is not supported by chip npu-16m"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_constraint_gives_its_reason(case):
    model, chip, reason = CASES[case]
    assert reason in reasons_of(model, chip)


@pytest.mark.parametrize("model,chip", [
    (conv(group=4), "npu-strict"),                              # depthwise
    (one("Add", [[1, 4, 8, 8], [1, 4, 1, 1]]), "npu-strict"),   # per-channel operand
    (one("Mul", [[1, 4, 8, 8], [4, 1, 1]], {1: np.ones((4, 1, 1), np.float32)}),
     "npu-strict"),  # per-channel as Caffe2 exports it: broadcast aligns from the right
    (one("Mul", [[1, 4, 8, 8], [1]], {1: np.array([2.0], np.float32)}), "npu-strict"),  # scalar
    (one("Concat", [[1, 4, 8, 8], [1, 2, 8, 8]], axis=1), "npu-16m"),
    (one("Reshape", [[1, 4, 8, 8], [3]], {1: np.array([1, 4, 64])}), "npu-16m"),
], ids=["depthwise", "per-channel", "per-channel rank 3", "scalar", "concat",
        "constant-shape reshape"])
def test_supported_nodes_have_no_reasons(model, chip):
    assert reasons_of(model, chip) == []


def test_control_flow_stays_on_the_cpu_even_when_the_table_lists_it():
    from tests.unit.split.split_models import if_model

    chip = load_chip("npu-16m").model_copy(update={"ops": {**load_chip("npu-16m").ops,
                                                           "If": load_chip("npu-16m").ops["Relu"]}})
    assert reasons_of(if_model(), chip, "branch") == ["Op has a subgraph (control flow runs on the CPU)"]


def test_fused_op_is_checked_through_its_body_at_real_shapes():
    assert reasons_of(fused_conv_act(3), "npu-strict") == []
    assert reasons_of(fused_conv_act(4), "npu-strict") == [
        "in its body, Conv: Kernel size is not 1, 3, 5 or 7: kernel [4, 4]"]


def test_fused_op_must_be_listed_unless_the_chip_accepts_fused_bodies():
    strict = load_chip("npu-strict")
    unlisted = strict.model_copy(update={"ops": {k: v for k, v in strict.ops.items() if k != "ConvAct"}})
    assert reasons_of(fused_conv_act(3), unlisted) == [
        "fused op ConvAct is not supported by chip npu-strict"]
    accepting = unlisted.model_copy(update={"accept_fused_bodies": True})
    assert reasons_of(fused_conv_act(3), accepting) == []


def test_fused_op_without_its_function_says_so():
    model = fused_conv_act(3)
    del model.functions[:]
    assert reasons_of(model, "npu-16m") == [
        "fused op ConvAct: its function body is missing from the model"]


def test_chip_file_rejects_a_constraint_that_cannot_apply(tmp_path):
    from npubuild.targets import load_chip as load

    text = (REPO / "npubuild/targets/npu-tiny.yaml").read_text().replace(
        "  Add: {ranks: [1, 2, 3, 4]}", "  Add: {ranks: [1, 2, 3, 4], max_kernel: 3}")
    path = tmp_path / "chip.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match="Add: max_kernel does not apply to Add"):
        load(str(path))


def test_every_constraint_has_a_one_line_reason():
    for c in CONSTRAINTS:
        assert c.check.__doc__ and "\n" not in c.check.__doc__.strip(), c.name


def test_supported_ops_doc_is_generated_from_the_checks():
    doc = (REPO / "docs" / "SUPPORTED_OPS.md").read_text()
    assert doc == supported_ops_markdown(), (
        "docs/SUPPORTED_OPS.md is stale: run `python -c 'from npubuild.targets.docs "
        "import supported_ops_markdown as m; print(m(), end=\"\")' > docs/SUPPORTED_OPS.md`")
    assert ("| Conv | Input is not 4D tensor; Output is not 4D tensor; Each output channel reads "
            "more than 2048 input channels") in doc


def test_presets_are_honest_about_being_simulated_or_say_whose_list_they_follow():
    from npubuild.targets import preset_names

    for name in preset_names():
        chip = load_chip(name)
        assert chip.modelled_on
        if chip.backend == "simulated":
            assert "simulated" in chip.description
        else:  # a real chip: its vendor, its name in the vendor's toolchain, its op list
            assert chip.vendor and chip.platform and chip.support_source


def test_an_average_pool_leaving_padding_out_stays_on_npu_only_with_tflites_same_padding():
    """Ethos-U: TFLite's AVERAGE_POOL_2D leaves padding out of the count only with SAME pads;
    other pads (ShuffleNet's [1, 1, 1, 1] at stride 2 on an even size) go to the CPU, named."""
    def reasons(pads, size=8, include=0):
        net = Net()
        y = net.op("AveragePool", [net.input("x", [1, 4, size, size])], kernel_shape=[3, 3],
                   strides=[2, 2], pads=pads, count_include_pad=include, name="p")
        return reasons_of(net.model([y]), "ethos-u55-256", "p")

    assert reasons([0, 0, 1, 1]) == []                       # SAME on 8: 0 before, 1 after
    assert reasons([1, 1, 1, 1], include=1) == []            # padding counted: PAD + VALID
    assert "not TFLite's SAME" in " ".join(reasons([1, 1, 1, 1]))


def test_a_node_on_constants_only_stays_off_the_npu_with_the_fold_hint(tmp_path):
    # An unfolded Relu of a Constant crashed split's LMEM check (a layer with no input to
    # tile); Silero's OpenVINO export's constant Unsqueezes crashed quantize on main
    value = numpy_helper.from_array(np.ones((1, 4, 8, 8), np.float32), "c")
    weight = numpy_helper.from_array(np.full((4, 3, 1, 1), 0.1, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=value, name="k"),
         helper.make_node("Relu", ["k"], ["kr"], name="relu_const"),
         helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
         helper.make_node("Add", ["conv", "kr"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": np.zeros((1, 3, 8, 8), np.float32)}
    split_model(model, load_chip("npu-16m"), SplitSpec(), tmp_path, feeds=feeds)
    placed = {n["name"]: n for n in json.loads((tmp_path / "support.json").read_text())["nodes"]}
    assert placed["relu_const"]["device"] == "cpu"
    assert placed["relu_const"]["reasons"][0].startswith("Node computes on constants only")
    assert placed["conv"]["device"] == "npu" and placed["add"]["device"] == "npu"


def activation_matmul() -> onnx.ModelProto:
    """q [1, 4, 16, 8] @ kᵀ [1, 4, 8, 16], both activations (attention's scores)."""
    return one("MatMul", [[1, 4, 16, 8], [1, 4, 8, 16]])


def test_a_matmul_of_two_activations_runs_on_the_npu_in_ours_or_the_vendors_kernel():
    """npubuild's integer ``matmul`` takes it on any chip whose table lists MatMul; where the
    chip's op table names its vendor's kernel (`vendor_kernel`; rk3588: rknn-toolkit2's
    exMatMul, int8) that one runs it — read from the chip data."""
    rk3588 = load_chip("rk3588")
    assert rk3588.ops["MatMul"].vendor_kernel == "int8"
    without = rk3588.model_copy(update={"ops": {**rk3588.ops, "MatMul": rk3588.ops["MatMul"]
                                                .model_copy(update={"vendor_kernel": None})}})
    for chip in (rk3588, without, "npu-16m"):
        assert reasons_of(activation_matmul(), chip) == []
    # a constant 3-D right operand: no kernel of ours, and beside a float constant the
    # toolkit stops on the quantized result: the CPU runs it
    constant_3d = one("MatMul", [[1, 4, 16, 8], [1, 4, 8, 16]],
                      {1: np.ones((1, 4, 8, 16), np.float32)})
    for chip in (rk3588, "npu-16m"):
        assert reasons_of(constant_3d, chip) == [
            "The quantizer has no integer kernel for it: MatMul takes two activations or a "
            "constant 2-D right operand"]


def test_the_supported_ops_doc_says_which_vendor_kernel_takes_what_ours_cannot():
    doc = supported_ops_markdown([load_chip("rk3588")])
    row = next(line for line in doc.splitlines() if line.startswith("| MatMul |"))
    assert "unless every input is an activation" in row and "runs such a node on the NPU in int8" in row


def test_a_simulated_chip_cannot_claim_a_vendor_kernel(tmp_path):
    """npubuild's simulator runs npubuild's own kernels, never a vendor's: on a simulated chip
    `vendor_kernel` is refused, not silently run as something else."""
    from npubuild.targets import load_chip as load

    text = (REPO / "npubuild/targets/npu-tiny.yaml").read_text()
    assert "  MatMul: {ranks: [2, 3]}" in text
    path = tmp_path / "chip.yaml"
    path.write_text(text.replace("  MatMul: {ranks: [2, 3]}",
                                 "  MatMul: {ranks: [2, 3], vendor_kernel: int8}"))
    with pytest.raises(UserError, match="MatMul: vendor_kernel names a vendor toolchain"):
        load(str(path))


@pytest.mark.parametrize("chip", ["npu-tiny", "npu-strict"])
def test_a_listed_table_op_runs_whatever_ops_its_body_is_written_in(chip):
    """PP-OCR's HardSwish, x * Relu6(x + 3) / 6, fused: its body has a Div, which neither chip
    lists; quantize makes the whole body one lookup table, so the chip's HardSwish entry is what
    decides (ppocr-v4-det as written placed its 24 HardSwish on the CPU of both chips)."""
    from npubuild.fusions.activation import hard_swish
    from tests.unit.stages.test_fusion_rules_downstream import rule_model

    model, _ = hard_swish(rule_model("hard_swish"))
    fused = next(n for n in model.graph.node if n.op_type == "HardSwish")
    assert "Div" in {n.op_type for f in model.functions for n in f.node}
    assert reasons_of(model, chip, fused.name) == []
