"""Issue 11, class 10: chip limits an NPU compiler works around instead of leaving to the CPU.

A convolution wider than the chip computes in one step is split by output channels, and
Reshape-family ops between two NPU ops are layout no-ops on the NPU (on every chip).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from npubuild.recipe.model import SplitSpec
from npubuild.split import plan_split
from npubuild.targets import load_chip
from tests.unit.split.split_models import Net
from tests.unit.targets.test_targets_constraints import reasons_of

TINY = load_chip("npu-tiny")
STRICT = load_chip("npu-strict")


def pointwise(cin: int, cout: int) -> "onnx.ModelProto":  # noqa: F821
    net = Net()
    return net.model([net.conv(net.input("x", [1, cin, 7, 7]), cin, cout, k=1, name="n")])


def test_a_1280_channel_1x1_conv_runs_on_the_1024_channel_chip():
    assert TINY.ops["Conv"].max_channels == 1024
    assert reasons_of(pointwise(320, 1280), TINY) == []


def test_a_conv_reading_more_input_channels_than_the_chip_allows_says_why():
    [reason] = reasons_of(pointwise(1280, 16), TINY)
    assert reason == ("Each output channel reads more than 1024 input channels (the compiler "
                      "splits output channels, not input channels): weight 'n.w' has shape "
                      "[16, 1280, 1, 1]")


def test_a_wide_depthwise_conv_is_split_by_channels_too():
    net = Net()
    x = net.input("x", [1, 1280, 7, 7])
    model = net.model([net.conv(x, 1280, 1280, k=3, group=1280, name="n")])
    assert reasons_of(model, TINY) == []


def _conv_reshape_conv(op: str) -> "onnx.ModelProto":  # noqa: F821
    """conv -> (Flatten | Squeeze + Unsqueeze | Reshape) -> conv on 4-D tensors."""
    net = Net()
    a = net.conv(net.input("x", [1, 8, 1, 1]), 8, 8, k=1, name="a")
    if op == "Flatten":
        mid = net.op("Reshape", [net.op("Flatten", [a], name="flat"),
                                 net.init("shape4", np.array([1, 8, 1, 1], np.int64))],
                     name="back")
    elif op == "Squeeze":
        sq = net.op("Squeeze", [a, net.init("axes", np.array([3], np.int64))], name="squeeze")
        mid = net.op("Unsqueeze", [sq, net.init("axes2", np.array([3], np.int64))],
                     name="unsqueeze")
    else:
        mid = net.op("Reshape", [a, net.init("shape", np.array([1, 2, 4, 1], np.int64))],
                     name="reshape")
    return net.model([net.conv(mid, 8 if op != "Reshape" else 2, 4, k=1, name="b")])


def test_reshape_family_between_npu_ops_stays_on_the_npu_on_every_chip():
    for op in ("Flatten", "Squeeze", "Reshape"):
        for chip in (TINY, STRICT):
            plan = plan_split(_conv_reshape_conv(op), chip, SplitSpec())
            assert all(plan.on_npu), (op, chip.name, plan.reasons)
            assert len(plan.segments) == 1


def test_an_identity_between_npu_ops_stays_on_the_npu_on_every_chip():
    """Import's inlined Ifs leave their outputs as Identity nodes (Silero VAD v5's decoder: 16)
    and exporters leave float-to-float Casts (its STFT: 3), which neither npu-tiny nor
    npu-strict lists: each was a CPU hop inside an NPU run."""
    net = Net()
    a = net.conv(net.input("x", [1, 8, 4, 4]), 8, 8, k=1, name="a")
    mid = net.op("Identity", [net.op("Identity", [a], name="first")], name="second")
    mid = net.op("Cast", [mid], name="float_to_float", to=TensorProto.FLOAT)
    model = net.model([net.conv(mid, 8, 4, k=1, name="b")])
    for chip in (TINY, STRICT):
        plan = plan_split(model, chip, SplitSpec())
        assert all(plan.on_npu), (chip.name, plan.reasons)
        assert len(plan.segments) == 1


def test_a_reshape_at_the_edge_or_forced_to_the_cpu_stays_on_the_cpu():
    net = Net()
    a = net.conv(net.input("x", [1, 8, 2, 2]), 8, 8, k=1, name="a")
    out = net.op("Flatten", [a], name="flat")  # its output leaves the model: CPU post-processing
    plan = plan_split(net.model([out]), STRICT, SplitSpec())
    assert plan.on_npu == [True, False]
    assert plan.reasons[1] == ["op Flatten is not supported by chip npu-strict"]
    forced = plan_split(_conv_reshape_conv("Squeeze"), STRICT, SplitSpec(force_cpu=["squeeze"]))
    devices = {forced.graph.label(i): npu for i, npu in enumerate(forced.on_npu)}
    assert devices == {"a": True, "squeeze": False, "unsqueeze": False, "b": True}


def test_channel_padding_is_a_fill_not_a_window_border():
    """TFLite's channel padding (zeros appended along C, as in MediaPipe's face models) is not
    bounded by max_pad, which is about the spatial border a kernel reads."""
    from tests.unit.targets.test_targets_constraints import one

    channels = one("Pad", [[1, 4, 8, 8], [8]], {1: np.array([0, 0, 0, 0, 0, 64, 0, 0])})
    spatial = one("Pad", [[1, 4, 8, 8], [8]], {1: np.array([0, 0, 16, 0, 0, 0, 16, 0])})
    assert reasons_of(channels, "npu-16m") == []
    assert reasons_of(spatial, "npu-16m") == ["Padding is larger than 15: pads [16, 0, 16, 0]"]


def test_a_layer_that_fits_lmem_in_no_slicing_goes_to_the_cpu_with_the_compilers_reason():
    """A 1x1 conv over rows of 70,000 pixels: no N, H or C slice brings one row under
    npu-tiny's 32 KiB per lane, so compile would refuse it; split asks compile's own search."""
    net = Net()
    model = net.model([net.conv(net.input("x", [1, 8, 4, 70000]), 8, 8, k=1, name="n")])
    [reason] = reasons_of(model, TINY)
    assert reason.startswith("Does not fit the NPU's local memory even alone (compile would "
                             "refuse it): layer 'n' (conv) does not fit in LMEM even alone")


def test_what_split_places_on_the_npu_compile_compiles():
    """EfficientNet's 1152-channel depthwise conv on npu-tiny (1024 channels per step): split
    places it on the NPU and compile runs it in channel slices (it used to refuse it)."""
    from npubuild.npu.from_onnx import layers_from_onnx
    from npubuild.npu.layer_group import fits_alone

    net = Net()
    x = net.input("x", [1, 1152, 6, 6])
    model = net.model([net.conv(x, 1152, 1152, k=5, group=1152, name="dw")])
    assert reasons_of(model, TINY) == []
    (layer,) = layers_from_onnx(model).layers
    assert fits_alone(layer, TINY) is None


def test_a_vendor_chip_tiles_for_itself_so_lmem_never_sends_a_node_to_the_cpu():
    """The same too-wide conv on rk3588 and ethos-u65-256: their compilers tile it (their chip
    files' LMEM only feeds npubuild's estimate), so split leaves it on the NPU."""
    net = Net()
    model = net.model([net.conv(net.input("x", [1, 8, 4, 70000]), 8, 8, k=1, name="n")])
    for chip in ("rk3588", "ethos-u65-256"):
        assert not any("local memory" in r for r in reasons_of(model, chip)), chip


def _shuffle_model(spelling: str, shape=(1, 12, 8, 8), groups: int = 3):
    """conv -> a channel shuffle (ShuffleNet's rank-5 spelling or the rank-4 one) -> conv."""
    from tests.unit.npu.qstacks import Stack

    s = Stack(shape)
    a = s.conv("x", shape[1], 3)
    if spelling == "unsqueezed":  # back to rank 3 by a Reshape, then an Unsqueeze of N
        n, c, h, w = shape
        swapped = s.transpose(s.reshape(a, [n, groups, c // groups, h, w]), [0, 2, 1, 3, 4])
        flat = s.reshape(swapped, [c, h, w])
        shuffled = s._name("Unsqueeze")
        s.nodes.append(helper.make_node("Unsqueeze", [flat, s._const(
            f"{shuffled}_axes", np.array([0], np.int64))], [shuffled], name=shuffled))
        s.shapes[shuffled] = shape
    else:
        shuffled = s.channel_shuffle(a, groups, spelling)
    return s, shuffled, s.model([s.conv(shuffled, 8, 3)])


def test_a_channel_shuffle_runs_on_the_npu_of_every_chip_npubuild_compiles_for():
    """npu-tiny refuses the rank-5 Reshape and Transpose of ShuffleNet's shuffle (ranks 1 to
    4), npu-strict any Transpose: each shuffle was a CPU round trip between two NPU parts
    (light-shufflenet: 16 of them). Compile folds the chain into one channel permutation in
    the convs' layer group (whatever lowers to a reshape may be in it: an Unsqueeze), so split
    keeps it on the NPU, and compile compiles what split placed: one group, bit-exact."""
    from tests.unit.npu.qstacks import compile_qgraph, quantize, simulate_and_compare

    for spelling in ("rank5", "rank4", "unsqueezed"):
        s, shuffled, model = _shuffle_model(spelling)
        qgraph = quantize(model)
        for chip in (TINY, STRICT):
            plan = plan_split(model, chip, SplitSpec())
            assert all(plan.on_npu), (spelling, chip.name, plan.reasons)
            assert len(plan.segments) == 1
            layers, program, program_file = compile_qgraph(qgraph, chip)
            assert [spec.op for spec in layers.graph.layers] == ["conv", "permute", "conv"]
            assert len(program.groups) == 1
            simulate_and_compare(qgraph, program_file)


def test_reshapes_and_transposes_that_do_not_permute_channels_keep_the_tables_answer():
    """H and W swapped through a rank-5 tensor move rows, not channels: compile would not fold
    them, so npu-tiny's rank check stands (and npu-strict's missing Transpose)."""
    net = Net()
    a = net.conv(net.input("x", [1, 8, 6, 6]), 8, 8, k=1, name="a")
    grouped = net.op("Reshape", [a, net.init("s5", np.array([1, 2, 4, 6, 6], np.int64))],
                     name="grouped")
    swapped = net.op("Transpose", [grouped], name="swapped", perm=[0, 1, 2, 4, 3])
    back = net.op("Reshape", [swapped, net.init("s4", np.array([1, 8, 6, 6], np.int64))],
                  name="back")
    model = net.model([net.conv(back, 8, 4, k=1, name="b")])
    for chip in (TINY, STRICT):
        plan = plan_split(model, chip, SplitSpec())
        devices = {plan.graph.label(i): npu for i, npu in enumerate(plan.on_npu)}
        assert not devices["swapped"], chip.name


def test_a_channel_shuffle_forced_to_the_cpu_or_on_a_vendor_chip_stays_where_it_was():
    """The recipe's force_cpu stands; a vendor's compiler takes the nodes one by one, so on
    ethos-u55-256 its op table answers for each."""
    _, shuffled, model = _shuffle_model("rank5")
    plan = plan_split(model, TINY, SplitSpec(force_cpu=["Transpose"]))
    devices = {plan.graph.label(i): npu for i, npu in enumerate(plan.on_npu)}
    assert [npu for name, npu in devices.items() if name.startswith("transpose")] == [False]
    vendor = plan_split(model, load_chip("ethos-u55-256"), SplitSpec())
    ops = {vendor.graph.nodes[i].op_type: npu for i, npu in enumerate(vendor.on_npu)}
    assert ops["Transpose"] is False


def test_a_prelu_runs_on_npu_tiny_as_vela_runs_it_on_an_ethos_u55():
    """npu-tiny is the Ethos-U55 size class, and Vela 5.2.0 runs PRELU there (an activation op
    of `tflite_supported_operators`, lowered to LeakyRelu or Min/Mul/Relu/Add). Its table
    lacked PRelu, so each PRelu of a MediaPipe landmark model was a CPU round trip
    (iris-landmark: 38 NPU graphs). A per-channel PRelu between two convs is one NPU graph, and
    compile runs it bit-exact."""
    from tests.unit.npu.qstacks import compile_qgraph, quantize, simulate_and_compare

    net = Net()
    a = net.conv(net.input("x", [1, 8, 6, 6]), 8, 8, k=3, name="a")
    slope = net.init("slope", np.linspace(0.05, 0.4, 8, dtype=np.float32).reshape(8, 1, 1))
    model = net.model([net.conv(net.op("PRelu", [a, slope], name="act"), 8, 4, k=3, name="b")])
    plan = plan_split(model, TINY, SplitSpec())
    assert all(plan.on_npu), plan.reasons
    assert len(plan.segments) == 1
    qgraph = quantize(model, scheme="symmetric")
    _, program, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)
