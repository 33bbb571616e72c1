"""Convs the chip refuses for their kernel or dilation, rewritten as ones it runs
(`npubuild.split.legalize`): equal to the original in ONNX Runtime, and placed whole on the NPU."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.split import check_placement, split_model
from npubuild.split.legalize import _rewrite, legal_convs
from npubuild.targets import load_chip


def conv_model(x_shape, w_shape, *, strides=None, dilations=None, pads=None, group=1,
               auto_pad=None, opset=17, bias=True, seed=0, name="conv") -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(w_shape).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        inputs.append("b")
    attrs = {"group": group}
    for key, value in (("strides", strides), ("dilations", dilations), ("pads", pads),
                       ("auto_pad", auto_pad)):
        if value is not None:
            attrs[key] = value
    conv = helper.make_node("Conv", inputs, ["y"], name=name, **attrs)
    relu = helper.make_node("Relu", ["y"], ["z"], name="relu")
    return onnx.shape_inference.infer_shapes(
        graph_model([conv, relu], inits, x_shape, ("z", None), opset=opset))


def graph_model(nodes, inits, x_shape, output, opset=17) -> onnx.ModelProto:
    """``nodes`` reading the float input ``x`` of ``x_shape``, giving ``output`` (name, shape
    or None), at ``opset`` and IR version 8."""
    name, shape = output
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         x_shape)],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def small_chip(max_kernel=5, max_dilation=2, max_pad=3, max_stride=4, **conv):
    chip = load_chip("npu-16m")
    ops = dict(chip.ops)
    ops["Conv"] = ops["Conv"].model_copy(update={"max_kernel": max_kernel, "max_dilation": max_dilation,
                                                 "max_pad": max_pad, "max_stride": max_stride,
                                                 **conv})
    ops["Pad"] = ops["Pad"].model_copy(update={"max_pad": max_pad})
    for pool in ("MaxPool", "AveragePool"):  # a pool's stride up to its kernel
        ops[pool] = ops[pool].model_copy(update={"max_kernel": max_kernel, "max_stride": max_kernel,
                                                 "max_pad": max_pad})
    return chip.model_copy(update={"ops": ops})


CASES = {  # x shape, w shape, conv attributes
    "long_kernel_same": ([1, 3, 4, 40], [4, 3, 1, 17], {"pads": [0, 8, 0, 8]}),
    "long_kernel_valid": ([1, 3, 4, 40], [4, 3, 1, 12], {}),
    "long_kernel_both_axes": ([1, 2, 20, 21], [3, 2, 7, 9], {"pads": [3, 1, 2, 5]}),
    "long_kernel_strided": ([1, 3, 6, 45], [2, 3, 3, 11], {"strides": [2, 3], "pads": [1, 5, 1, 4]}),
    "long_kernel_dilated": ([1, 2, 4, 60], [2, 2, 1, 8], {"dilations": [1, 2], "pads": [0, 7, 0, 6]}),
    "long_kernel_grouped": ([1, 4, 4, 33], [6, 2, 1, 13], {"group": 2, "pads": [0, 6, 0, 6]}),
    "long_kernel_depthwise": ([1, 3, 5, 30], [3, 1, 3, 8], {"group": 3, "pads": [1, 0, 1, 7]}),
    "dilation": ([1, 2, 8, 70], [3, 2, 1, 3], {"dilations": [1, 16], "pads": [0, 16, 0, 16]}),
    "dilation_both": ([1, 2, 20, 20], [2, 2, 3, 2], {"dilations": [3, 5], "strides": [1, 2]}),
    "dilation_depthwise": ([1, 4, 3, 40], [4, 1, 1, 3], {"group": 4, "dilations": [1, 7],
                                                         "pads": [0, 7, 0, 7]}),
    "pads_only": ([1, 2, 9, 9], [3, 2, 3, 3], {"pads": [5, 1, 4, 6]}),
    "pads_and_long_kernel": ([1, 2, 12, 30], [3, 2, 3, 9], {"pads": [6, 4, 5, 4], "strides": [2, 1]}),
    "same_upper": ([1, 2, 4, 31], [2, 2, 1, 10], {"auto_pad": "SAME_UPPER"}),
    "same_lower_strided": ([1, 2, 4, 31], [2, 2, 1, 10], {"auto_pad": "SAME_LOWER", "strides": [1, 2]}),
    "old_opset": ([1, 2, 4, 30], [2, 2, 1, 9], {"pads": [0, 4, 0, 4], "opset": 10}),
    # a stride beyond max_stride (4) where no window overlaps the next: space-to-depth
    "patch_embedding": ([1, 3, 32, 32], [6, 3, 8, 8], {"strides": [8, 8]}),
    "patch_embedding_cut_tail": ([1, 3, 35, 37], [4, 3, 6, 6], {"strides": [6, 6]}),
    "stride_kernel_shorter": ([1, 2, 30, 30], [3, 2, 3, 5], {"strides": [6, 7], "pads": [1, 2, 2, 0]}),
    "stride_1d_widened": ([1, 2, 1, 100], [4, 2, 1, 10], {"strides": [1, 10]}),
    "stride_along_h_only": ([1, 2, 48, 9], [3, 2, 8, 3], {"strides": [8, 1], "pads": [0, 1, 0, 1]}),
    "stride_other_axis_long": ([1, 2, 12, 40], [3, 2, 9, 8], {"strides": [1, 8], "pads": [4, 0, 4, 0]}),
    "stride_dilated": ([1, 2, 6, 60], [3, 2, 1, 3], {"strides": [1, 9], "dilations": [1, 3]}),
    "stride_grouped": ([1, 4, 20, 20], [6, 2, 5, 5], {"strides": [5, 5], "group": 2}),
    "stride_depthwise_padded": ([1, 3, 14, 14], [3, 1, 4, 4], {"strides": [6, 6], "group": 3,
                                                               "pads": [2, 2, 3, 3]}),
    "stride_same_upper": ([1, 2, 30, 30], [3, 2, 5, 5], {"strides": [6, 6], "auto_pad": "SAME_UPPER"}),
}


def run(model, x):
    return onnx_io.run(model, {"x": x}, ["z"])["z"]


def assert_equal_and_on_npu(model, rewritten, chip, x_shape, atol):
    """``rewritten`` computes ``model``'s output in ONNX Runtime, and the split places every
    node of ``model`` (rewritten by it) on ``chip``'s NPU."""
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=1e-5, atol=atol)
    placed = check_placement(model, chip)
    assert {p.device for p in placed if p.op != "Constant"} == {"npu"}, \
        [(p.name, p.reasons) for p in placed]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewrite_equals_the_conv_and_runs_on_the_npu(case):
    x_shape, w_shape, attrs = CASES[case]
    attrs = dict(attrs)
    opset = attrs.pop("opset", 17)
    model = conv_model(x_shape, w_shape, opset=opset, **attrs)
    chip = small_chip()
    rewritten, names = legal_convs(model, chip)
    assert names == ["conv"]
    assert_equal_and_on_npu(model, rewritten, chip, x_shape, atol=1e-4)


DEPTHWISE_1D_CASES = {  # a temporal depthwise conv written in 2-D: x shape, w shape, attributes
    "along_h_strided": ([1, 6, 49, 1], [6, 1, 9, 1], {"group": 6, "strides": [2, 2],
                                                      "pads": [3, 0, 4, 0]}),
    "along_w_padded": ([1, 4, 1, 40], [4, 1, 1, 13], {"group": 4, "pads": [0, 6, 0, 6]}),
    "along_w_multiplier": ([1, 3, 1, 30], [6, 1, 1, 11], {"group": 3}),
}


@pytest.mark.parametrize("case", sorted(DEPTHWISE_1D_CASES))
def test_a_long_depthwise_1d_conv_stays_depthwise_on_a_chip_without_grouped_convs(case):
    # stacked in channels the copies made a conv of 2 inputs per group, which a chip running
    # only plain or depthwise convs refused: the conv stayed on the CPU
    x_shape, w_shape, attrs = DEPTHWISE_1D_CASES[case]
    model = conv_model(x_shape, w_shape, **attrs)
    chip = small_chip(max_kernel=8, groups="one_or_depthwise")
    rewritten, names = legal_convs(model, chip)
    assert names == ["conv"]
    conv = next(n for n in rewritten.graph.node if n.op_type == "Conv")
    assert helper.get_attribute_value(next(a for a in conv.attribute if a.name == "group")) \
        == x_shape[1]
    assert_equal_and_on_npu(model, rewritten, chip, x_shape, atol=1e-4)


def test_an_unnamed_conv_is_rewritten_and_named_after_its_output():
    model = conv_model([1, 3, 4, 40], [4, 3, 1, 17], pads=[0, 8, 0, 8], name="", bias=False)
    rewritten, names = legal_convs(model, small_chip())
    assert names == ["y"]
    x = np.random.default_rng(1).standard_normal([1, 3, 4, 40]).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=1e-5, atol=1e-4)


def test_fine_conv_is_left_alone():
    model = conv_model([1, 3, 8, 8], [4, 3, 3, 3], pads=[1, 1, 1, 1])
    assert legal_convs(model, small_chip()) == (model, [])


def test_conv_stays_whole_where_the_rewrite_would_not_run():
    # the stacked conv reads 3 * 4 channels; a chip allowing 8 keeps the conv on the CPU
    model = conv_model([1, 3, 4, 40], [4, 3, 1, 17], pads=[0, 8, 0, 8])
    chip = small_chip(max_channels=8)
    assert legal_convs(model, chip) == (model, [])
    placed = {p.name: p for p in check_placement(model, chip)}
    assert placed["conv"].device == "cpu"


def test_conv1d_rewrite_equals_the_conv_but_is_kept_where_the_chip_lacks_1d():
    # import widens 1-D convs to 2-D; the quantizer has no 1-D kernel, so the rewrite is
    # refused as a whole (its Pads and Slices would run on the NPU around a CPU conv)
    model = conv_model([1, 3, 50], [4, 3, 19], pads=[9, 9])
    assert legal_convs(model, small_chip()) == (model, [])
    rewritten, _ = _rewrite(model, ["y"], small_chip())
    x = np.random.default_rng(1).standard_normal([1, 3, 50]).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=1e-5, atol=1e-4)


def test_rewrite_is_deterministic():
    model = conv_model([1, 3, 6, 45], [2, 3, 3, 11], strides=[2, 3], pads=[1, 5, 1, 4])
    one, _ = legal_convs(model, small_chip())
    two, _ = legal_convs(onnx_io.clone(model), small_chip())
    assert one.SerializeToString() == two.SerializeToString()


def test_split_proves_the_rewrite(tmp_path):
    model = conv_model([1, 2, 8, 70], [3, 2, 1, 3], dilations=[1, 16], pads=[0, 16, 0, 16])
    report = split_model(model, small_chip(), None, tmp_path)
    assert report["npu_segments"] == 1 and report["cpu_segments"] == 0
    assert report["legal_convs"]["convs"] == ["conv"]
    assert report["legal_convs"]["max_rel"] <= 1e-5


def _two_conv_model() -> onnx.ModelProto:
    """A 1x17 conv (SAME pads) and a conv dilated 4 along W, each with a ReLU."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal([8, 2, 1, 17]).astype(np.float32) / 6, "w1"),
             numpy_helper.from_array(rng.standard_normal([4, 8, 1, 3]).astype(np.float32) / 5, "w2"),
             numpy_helper.from_array(rng.standard_normal([4]).astype(np.float32) / 10, "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="long", pads=[0, 8, 0, 8]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dilated",
                              dilations=[1, 4], pads=[0, 4, 0, 4]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    return graph_model(nodes, inits, [1, 2, 4, 48], ("y", [1, 4, 4, 48]))


def test_a_recipe_with_a_long_and_a_dilated_conv_builds_whole_on_the_npu(tmp_path):
    from tests.conftest import REPO, build_on_npy_data

    chip = (REPO / "npubuild/targets/npu-16m.yaml").read_text()
    conv = "  Conv: {max_kernel: 15, max_stride: 15, max_dilation: 15,"
    assert conv in chip
    chip = chip.replace(conv, "  Conv: {max_kernel: 5, max_stride: 15, max_dilation: 2,")
    (tmp_path / "chip.yaml").write_text(chip.replace("name: npu-16m", "name: npu-small-kernel"))
    rng = np.random.default_rng(4)
    data = lambda: {"cal": rng.standard_normal([4, 1, 2, 4, 48]),  # noqa: E731
                    "ver": rng.standard_normal([3, 1, 2, 4, 48])}
    result, build = build_on_npy_data(tmp_path, "taps", "taps.onnx", _two_conv_model, data,
                                      target="chip.yaml")
    assert result.returncode == 0, result.stderr
    report = json.loads((build / "report.json").read_text())
    split = report["split"]
    assert (split["npu_segments"], split["cpu_segments"], split["cpu_nodes"]) == (1, 0, 0)
    assert split["legal_convs"]["convs"] == ["long", "dilated"]
    assert report["verify"]["passed"] and report["simulator"]["bit_exact"]
    assert report["accuracy"]["outputs"]["y"]["min_sample_cosine"] > 0.99


def test_a_conv_the_recipe_forces_to_the_cpu_stays_whole():
    from npubuild.recipe.model import SplitSpec

    model = conv_model([1, 3, 4, 40], [4, 3, 1, 17], pads=[0, 8, 0, 8])
    placed = {p.name: p for p in check_placement(model, small_chip(), SplitSpec(force_cpu=["conv"]))}
    assert placed["conv"].device == "cpu" and "conv/taps0" not in placed


def test_a_rewrite_that_would_not_fit_lmem_in_int16_is_not_made():
    """basic-pitch's constant-Q conv (1 channel, 256 taps, a 10,973-sample row): its 18 stacked
    one-channel copies sit on one lane and fit npu-16m's 256 KiB in int8 (208 KB), so the
    split placed them on the NPU; the precision search then chose int16 for them and compile
    refused the stack (417 KB), failing a recipe that passed before. The rewrite must fit in
    int16 too, or the conv stays whole."""
    model = conv_model([1, 1, 1, 10973], [8, 1, 1, 256], pads=[0, 127, 0, 128])
    chip = load_chip("npu-16m")
    assert legal_convs(model, chip) == (model, [])
    shorter = conv_model([1, 1, 1, 2000], [8, 1, 1, 256], pads=[0, 127, 0, 128])
    assert legal_convs(shorter, chip)[1] == ["conv"]


def test_an_overlapping_stride_beyond_the_chip_stays_whole():
    # kernel > stride (an STFT's hop): moving it to int8 hurt audio front ends; left as it was
    model = conv_model([1, 1, 1, 200], [4, 1, 1, 16], strides=[1, 8])
    chip = small_chip()
    assert legal_convs(model, chip) == (model, [])
    placed = {p.name: p for p in check_placement(model, chip)}
    assert placed["conv"].device == "cpu"


def test_a_destrided_conv_stays_whole_where_the_chip_lacks_transpose():
    model = conv_model([1, 3, 32, 32], [6, 3, 8, 8], strides=[8, 8])
    chip = small_chip()
    chip = chip.model_copy(update={"ops": {k: v for k, v in chip.ops.items() if k != "Transpose"}})
    assert legal_convs(model, chip) == (model, [])


def test_destride_is_deterministic():
    model = conv_model([1, 3, 35, 37], [4, 3, 6, 6], strides=[6, 6], pads=[1, 1, 0, 0])
    one, _ = legal_convs(model, small_chip())
    two, _ = legal_convs(onnx_io.clone(model), small_chip())
    assert one.SerializeToString() == two.SerializeToString()
    assert [n.name for n in one.graph.node] == [
        "conv/pad0", "conv/blocks", "conv/s2d0_split", "conv/s2d0_moved", "conv/s2d0_channels",
        "conv/s2d1_split", "conv/s2d1_moved", "conv/s2d1_channels", "conv", "relu"]


def pool_model(op, x_shape, kernel, strides, *, pads=None, **attrs) -> onnx.ModelProto:
    pool = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=kernel, strides=strides,
                            **({"pads": pads} if pads else {}), **attrs)
    relu = helper.make_node("Relu", ["y"], ["z"], name="relu")
    return onnx.shape_inference.infer_shapes(graph_model([pool, relu], [], x_shape, ("z", None)))


POOL_CASES = {  # op, x shape, kernel, strides, attributes
    # ShallowTemp's mean over 40 mel bands (round 9), its time axis shortened
    "avg_40x1": ("AveragePool", [1, 6, 40, 32], [40, 1], [40, 1], {}),
    "max_8x8": ("MaxPool", [1, 3, 33, 35], [8, 8], [8, 8], {}),
    "avg_kernel_shorter_than_stride": ("AveragePool", [1, 2, 50, 7], [6, 1], [12, 1], {}),
    "max_1d_widened": ("MaxPool", [1, 4, 1, 100], [1, 18], [1, 9], {}),
    "max_padded_other_axis": ("MaxPool", [1, 2, 9, 64], [3, 16], [1, 16],
                              {"pads": [1, 0, 1, 0]}),
    "max_ceil_no_extra_window": ("MaxPool", [1, 2, 24, 24], [12, 12], [12, 12], {"ceil_mode": 1}),
    "avg_prime_as_one_conv": ("AveragePool", [1, 2, 34, 4], [17, 1], [17, 1], {}),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_chain_equals_the_pool_and_runs_on_the_npu(case):
    op, x_shape, kernel, strides, attrs = POOL_CASES[case]
    model = pool_model(op, x_shape, kernel, strides, **attrs)
    chip = small_chip()
    rewritten, names = legal_convs(model, chip)
    assert names == ["pool"]
    # a mean of no padding is one depthwise conv after a space-to-depth; any other a chain
    mean = op == "AveragePool" and "pads" not in attrs
    assert [n.op_type for n in rewritten.graph.node if n.op_type in (op, "Conv")] == \
        (["Conv"] if mean else [op] * len([n for n in rewritten.graph.node if n.op_type == op]))
    assert mean or len([n for n in rewritten.graph.node if n.op_type == op]) > 1
    assert_equal_and_on_npu(model, rewritten, chip, x_shape, atol=1e-6)


def test_a_max_pool_of_the_whole_input_is_a_global_pool():
    model = pool_model("MaxPool", [1, 3, 16, 16], [16, 16], [16, 16])
    rewritten, names = legal_convs(model, small_chip())
    assert names == ["pool"]
    assert [n.op_type for n in rewritten.graph.node] == ["GlobalMaxPool", "Relu"]
    assert_equal_and_on_npu(model, rewritten, small_chip(), [1, 3, 16, 16], atol=1e-6)


@pytest.mark.parametrize("op, x_shape, kernel, strides, attrs", [
    ("MaxPool", [1, 2, 34, 4], [17, 1], [17, 1], {}),  # 17 has no factor within 5
    ("MaxPool", [1, 2, 30, 4], [8, 1], [8, 1], {"pads": [2, 0, 2, 0]}),  # padded along it
    ("MaxPool", [1, 2, 30, 4], [8, 1], [8, 1], {"ceil_mode": 1}),  # a partial last window
    # a mean other than one conv: a chain or a global pool sums in another order (selfie
    # segmentation's 128x128 means moved its output 6.2e-5 of its scale, past the proof)
    ("AveragePool", [1, 2, 9, 64], [3, 16], [1, 16], {"pads": [1, 0, 1, 0]}),
    ("AveragePool", [1, 3, 16, 16], [16, 16], [16, 16], {}),  # a mean of the whole input
])
def test_a_pool_without_an_exact_chain_stays_whole(op, x_shape, kernel, strides, attrs):
    model = pool_model(op, x_shape, kernel, strides, **attrs)
    assert legal_convs(model, small_chip()) == (model, [])


def test_a_mean_stays_whole_where_the_chip_lacks_transpose():
    model = pool_model("AveragePool", [1, 6, 40, 32], [40, 1], [40, 1])
    chip = small_chip()
    chip = chip.model_copy(update={"ops": {k: v for k, v in chip.ops.items() if k != "Transpose"}})
    assert legal_convs(model, chip) == (model, [])


def _patch_and_pool_model() -> onnx.ModelProto:
    """A patch embedding (8x4 windows, stride 8 along H) and a mean over 8 rows (stride 8)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal([6, 2, 8, 4]).astype(np.float32) / 8, "w"),
             numpy_helper.from_array(rng.standard_normal([6]).astype(np.float32) / 10, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="patches", strides=[8, 4]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("AveragePool", ["r"], ["y"], name="mean", kernel_shape=[8, 1],
                              strides=[8, 1])]
    return graph_model(nodes, inits, [1, 2, 64, 16], ("y", [1, 6, 1, 4]))


def test_a_recipe_with_a_patch_embedding_and_a_long_pool_builds_whole_on_the_npu(tmp_path):
    from tests.conftest import REPO, build_on_npy_data

    chip = (REPO / "npubuild/targets/npu-16m.yaml").read_text()
    limits = {"  Conv: {max_kernel: 15, max_stride: 15,": "  Conv: {max_kernel: 15, max_stride: 4,",
              "  AveragePool: {max_kernel: 15, max_stride: 15,":
              "  AveragePool: {max_kernel: 5, max_stride: 5,"}
    for old, new in limits.items():
        assert old in chip
        chip = chip.replace(old, new)
    (tmp_path / "chip.yaml").write_text(chip.replace("name: npu-16m", "name: npu-small-stride"))
    rng = np.random.default_rng(6)
    data = lambda: {"cal": rng.standard_normal([4, 1, 2, 64, 16]),  # noqa: E731
                    "ver": rng.standard_normal([3, 1, 2, 64, 16])}
    result, build = build_on_npy_data(tmp_path, "patches", "patches.onnx", _patch_and_pool_model,
                                      data, target="chip.yaml")
    assert result.returncode == 0, result.stderr
    report = json.loads((build / "report.json").read_text())
    split = report["split"]
    assert (split["npu_segments"], split["cpu_segments"], split["cpu_nodes"]) == (1, 0, 0)
    assert split["legal_convs"]["convs"] == ["patches", "mean"]
    assert split["legal_convs"]["max_rel"] <= 1e-5
    assert report["verify"]["passed"] and report["simulator"]["bit_exact"]
    assert report["accuracy"]["outputs"]["y"]["min_sample_cosine"] > 0.99


@pytest.mark.parametrize("square", ["Mul", "Pow"])
def test_a_strided_conv_that_is_squared_stays_whole(square):
    """basic-pitch's constant-Q convs (256 taps hopping 256, then squared and Log): on the NPU
    the model passed but ran slower; an audio front end's transform keeps its stride."""
    model = conv_model([1, 1, 1, 512], [8, 1, 1, 64], strides=[1, 64])
    relu = model.graph.node[1]
    if square == "Mul":
        relu.CopyFrom(helper.make_node("Mul", ["y", "y"], ["z"], name="square"))
    else:
        model.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
        relu.CopyFrom(helper.make_node("Pow", ["y", "two"], ["z"], name="square"))
    assert legal_convs(model, small_chip()) == (model, [])
    plain = conv_model([1, 1, 1, 512], [8, 1, 1, 64], strides=[1, 64])
    assert legal_convs(plain, small_chip())[1] == ["conv"]


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_a_pool_of_one_window_refused_only_for_its_stride_runs_with_stride_one(op):
    """An 8x8 pool of stride 8 over an 8x8 input (a TFLite AVERAGE_POOL_2D over the whole
    map): npu-tiny refuses stride 8 (max 3), though a pool of one window never uses its
    stride. It runs as the same pool of stride 1 (the same window in ONNX Runtime: equal to
    the bit), not on the CPU (a mean) or as a chain of three pools (a max)."""
    chip = load_chip("npu-tiny")
    model = pool_model(op, [1, 4, 8, 8], [8, 8], [8, 8])
    rewritten, names = legal_convs(model, chip)
    assert names == ["pool"]
    assert [n.op_type for n in rewritten.graph.node] == [op, "Relu"]
    (pool,) = [n for n in rewritten.graph.node if n.op_type == op]
    assert "strides" not in [a.name for a in pool.attribute]
    x = np.random.default_rng(1).standard_normal([1, 4, 8, 8]).astype(np.float32)
    np.testing.assert_array_equal(run(rewritten, x), run(model, x))
    assert_equal_and_on_npu(model, rewritten, chip, [1, 4, 8, 8], atol=0)


PHASE_CASES = {  # a widened 1-D conv dilated beyond max_dilation (2) whose one copy per tap
    # reads more than max_channels (8): x, w, conv attributes
    "along_w_same": ([1, 3, 1, 104], [4, 3, 1, 5], {"dilations": [1, 8], "pads": [0, 16, 0, 16]}),
    "along_w_valid_tail": ([1, 3, 1, 103], [4, 3, 1, 5], {"dilations": [1, 8]}),
    "along_h_uneven_pads": ([1, 3, 97, 1], [4, 3, 5, 1], {"dilations": [8, 1], "pads": [8, 0, 24, 0]}),
    "depthwise": ([1, 4, 1, 90], [4, 1, 1, 9], {"group": 4, "dilations": [1, 7], "pads": [0, 28, 0, 28]}),
    "long_kernel": ([1, 2, 1, 120], [3, 2, 1, 9], {"dilations": [1, 4], "pads": [0, 16, 0, 16]}),
}


@pytest.mark.parametrize("case", sorted(PHASE_CASES))
def test_a_dilated_1d_conv_runs_as_its_phases(case):
    x_shape, w_shape, attrs = PHASE_CASES[case]
    model = conv_model(x_shape, w_shape, **attrs)
    chip = small_chip(max_channels=8)
    rewritten, names = legal_convs(model, chip)
    assert names == ["conv"]
    assert any(n.name.startswith("conv/poly_phases") for n in rewritten.graph.node)
    assert_equal_and_on_npu(model, rewritten, chip, x_shape, atol=1e-4)


def test_a_long_signal_dilated_beyond_the_chip_runs_on_the_npu():
    """SpliceAI's widest residual convs: 41 taps dilated 25 over 11,000 bases, 32 channels.
    One copy per tap stacked 1,312 channels of one 11,000-wide row, which no slicing of
    npu-16m's LMEM holds (a 1-D signal is one row), so the eight convs ran on the CPU (3.7 of
    7.8 GMAC, 418 ms a frame). As the conv over its 25 phases the stack is 3 groups of 14
    taps over 440 rows of 25, which the NPU slices by rows."""
    model = conv_model([1, 32, 1, 11000], [32, 32, 1, 41], dilations=[1, 25], pads=[0, 500, 0, 500])
    chip = load_chip("npu-16m")
    rewritten, names = legal_convs(model, chip)
    assert names == ["conv"]
    assert_equal_and_on_npu(model, rewritten, chip, [1, 32, 1, 11000], atol=1e-3)


def test_a_dilated_conv_keeps_the_taps_rewrite_where_it_runs_or_phases_do_not_apply():
    # one copy per tap, as before: where its stack fits (3 taps of 2 channels: OpenSpindleNet's
    # convs dilated up to 4,096 would pad to whole blocks in dozens of Pads), pads not a
    # multiple of the dilation, or a second spatial axis
    for x_shape, attrs in (([1, 2, 1, 100], {"dilations": [1, 16]}),
                           ([1, 3, 1, 100], {"dilations": [1, 8], "pads": [0, 5, 0, 5]}),
                           ([1, 3, 4, 100], {"dilations": [1, 8], "pads": [0, 16, 0, 16]})):
        model = conv_model(x_shape, [4, x_shape[1], 1, 5 if x_shape[1] == 3 else 3], **attrs)
        rewritten, names = legal_convs(model, small_chip())
        assert names == ["conv"]
        assert not any("poly" in n.name for n in rewritten.graph.node)
        assert_equal_and_on_npu(model, rewritten, small_chip(), x_shape, atol=1e-4)
