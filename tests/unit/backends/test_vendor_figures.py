"""The vendors' own words, read: RKNN's layer table, Vela's summary CSV, TPU-MLIR's tables,
and the figures report.html and diff show beside npubuild's estimate."""

from __future__ import annotations

from npubuild.backends.figures import handover_lines, table_rows, vendor_figures
from npubuild.backends.rknn import (feature_tensors, layer_figures, original_name, qdq_coverage,
                                    suggested_config)
from npubuild.backends.tpu_mlir import _named, npubuild_table
from npubuild.backends.vendor import Ranges
from npubuild.backends.vela import summary_figures
from npubuild.errors import BuildError

RKNN_LOG = """\
D RKNN: ID   OpType             DataType Target InputShape                               OutputShape            Cycles(DDR/NPU/Total)    RW(KB)       FullName
D RKNN: 0    InputOperator      INT8     CPU    \\                                        (1,3,16,16)            0/0/0                    0            InputOperator:x
D RKNN: 1    ConvRelu           INT8     NPU    (1,3,16,16),(8,3,3,3),(8)                (1,8,16,16)            266/2304/2304            2            Conv:c
D RKNN: 2    Softmax            FLOAT16  CPU    (1,8,16,16)                              (1,8,16,16)            0/0/100                  4            Softmax:s
D RKNN: 3    OutputOperator     INT8     CPU    (1,4,16,16)                              \\                      0/0/0                    8            OutputOperator:y
D RKNN: Total Internal Memory Size: 16.75KB
D RKNN: Total Weight Memory Size: 3.6875KB
"""


def test_rknn_figures_come_from_its_layer_table():
    f = layer_figures(RKNN_LOG)
    assert (f["npu_ops"], f["cpu_ops"], f["cycles"], f["rw_bytes"]) == (1, 1, 2404, 6 * 1024)
    assert f["internal_memory_bytes"] == 17152 and f["weight_memory_bytes"] == 3776


RKNN_FEATURES = """\
D RKNN: Network Layer Information Table
D RKNN: 1    ConvExSwish        INT8     NPU    (1,4,8,8),(4,4,3,3),(4)                  (1,4,8,8)              122/576/576              1            Conv:c
D RKNN: Feature Tensor Information Table
D RKNN: ID  User           Tensor             DataType  DataFormat   OrigShape    NativeShape  |     [Start       End)       Size
D RKNN: 1   ConvExSwish    x                  INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,3)  | 0x00000000 0x00000180 0x00000180
D RKNN: 2   ConvClip       a::q               INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,16) | 0x00000180 0x00000980 0x00000800
D RKNN: 3   Add            a::q               INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,16) | 0x00000180 0x00000980 0x00000800
D RKNN: 3   Add            mid                INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,16) | 0x00000980 0x00001180 0x00000800
D RKNN: 3   Add            a::q-rs            INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,16) | 0x00000980 0x00001180 0x00000800
D RKNN: 4   Softmax        s                  FLOAT16   NCHW         (1,4,8,8)    (1,4,8,8)    | 0x00000000 0x00000800 0x00000800
D RKNN: 5   OutputOperator y                  INT8      NC1HWC2      (1,4,8,8)    (1,2,8,8,16) | 0x00000800 0x00001000 0x00000800
D RKNN: Const Tensor Information Table
D RKNN: 1   ConvExSwish   c::weight INT8      (4,4,3,3)    | 0x00000000 0x00000240 0x00000240
"""


def test_rknn_coverage_says_whose_quantization_each_tensor_the_toolkit_holds_carries():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def qdq(t, src):
        return [helper.make_node("QuantizeLinear", [src, f"{t}::scale", f"{t}::zp"], [f"{t}::q"]),
                helper.make_node("DequantizeLinear", [f"{t}::q", f"{t}::scale", f"{t}::zp"], [f"{t}::dq"])]

    nodes = [*qdq("x", "x"), helper.make_node("Relu", ["x::dq"], ["a_pre"]), *qdq("a", "a_pre"),
             helper.make_node("Relu", ["a::dq"], ["mid"]), helper.make_node("Relu", ["mid"], ["y_pre"]),
             *qdq("y", "y_pre"), helper.make_node("Identity", ["y::dq"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), f"{t}::scale") for t in "xay"] + \
        [numpy_helper.from_array(np.array(0, np.int8), f"{t}::zp") for t in "xay"]
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 8])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [info("x")], [info("y")], inits))
    # integer tensors only, once each (a::q has two users; the FLOAT16 one and constants are none)
    tensors = feature_tensors(RKNN_FEATURES)
    assert tensors == ["x", "a::q", "mid", "a::q-rs", "y"]
    coverage = qdq_coverage(model, tensors)
    assert (coverage["applied"], coverage["entries"]) == (3, 5)
    assert coverage["derived"] == {"a::q-rs": "a"}  # a reshape the toolkit inserted after a
    assert coverage["fell_back"] == ["mid"]
    assert coverage["summary"].endswith("1 with no npubuild quantization the toolkit chose itself: mid")


def test_a_name_the_worker_cut_for_the_toolkit_reads_as_the_models_own_in_the_report():
    long = "model_1/activation_6/Relu;" * 6 + "conv"
    renamed = {"model_1/activation_6/Relu;model_1_0123456789abcdef": long}
    assert original_name("model_1/activation_6/Relu;model_1_0123456789abcdef", renamed) == long
    # a tensor of the toolkit's own rewrites, named after a cut name
    assert original_name("model_1/activation_6/Relu;model_1_0123456789abcdef_exSecondary",
                         renamed) == long + "_exSecondary"
    assert original_name("relu", renamed) == "relu"


def test_the_config_changes_the_toolkit_suggests_are_read_from_its_messages(tmp_path):
    exc = BuildError("graph_0: rknn failed: E build: rule fuse_pad_into_conv failed",
                     hint="rknn suggests: Please set disable_rules=['fuse_pad_into_conv']; log")
    assert suggested_config(exc) == {"disable_rules": ["fuse_pad_into_conv"]}
    log = tmp_path / "rknn_worker.log"
    log.write_text("W you can try changing config.optimization_level to 2.\nValueError: remove(x)\n")
    exc = BuildError("graph_6: rknn failed: ValueError: remove(x)", hint=f"the whole log: {log}")
    assert suggested_config(exc) == {"optimization_level": 2}
    assert suggested_config(BuildError("E build: no")) == {}


def test_vela_figures_come_from_its_summary_csv(tmp_path):
    path = tmp_path / "g_summary_Ethos_U55_High_End_Embedded.csv"
    path.write_text("experiment,core_clock,inferences_per_second,sram_memory_used,"
                    "off_chip_flash_memory_used,cycles_total,system_config\n"
                    "default,500000000.0,14951.7,6.75,1.046875,33441,Ethos_U55_High_End_Embedded\n")
    f = summary_figures(path)
    assert f == {"core_clock_hz": 500000000, "inferences_per_second": 14951.7,
                 "sram_bytes": 6912, "off_chip_flash_bytes": 1072, "cycles": 33441,
                 "system_config": "Ethos_U55_High_End_Embedded"}


def test_a_tpu_mlir_table_takes_npubuilds_ranges_and_names_every_entry_it_cannot():
    table = ("# op_name    threshold    min    max\n"
             "x 1.0 -1.0 1.0\nrelu_Relu 5.0 0.0 5.0\nconv:0__1_Conv 7.0 -7.0 6.0\n"
             "mystery_Conv 3.0 -3.0 2.0\n")
    ranges = Ranges({"x": (-0.5, 0.75), "relu": (0.0, 4.0)}, {"conv:0__1": (-2.0, 3.0)})
    text, qtable, coverage = npubuild_table(table, ranges)
    assert qtable == ""
    assert text.splitlines()[1:] == ["x 0.7500000 -0.5000000 0.7500000",
                                     "relu_Relu 4.0000000 0.0000000 4.0000000",
                                     "conv:0__1_Conv 3.0000000 -2.0000000 3.0000000",
                                     "mystery_Conv 3.0 -3.0 2.0"]
    assert (coverage["applied"], coverage["entries"], coverage["inner"]) == (3, 4, 1)
    assert coverage["fell_back"] == ["mystery_Conv"]
    assert coverage["summary"].endswith("1 kept the vendor's own: mystery_Conv")


def test_what_npubuild_keeps_in_float_runs_in_f16_through_tpu_mlirs_quantize_table():
    table = ("# op_name    threshold    min    max\n"
             "x 1.0 -1.0 1.0\nconv:0__1_Conv 7.0 -7.0 6.0\nsig_Sigmoid 1.0 0.0 1.0\n"
             "y_Mul 5.0 -0.3 5.0\n")
    ranges = Ranges({"x": (-0.5, 0.75)}, {})
    text, qtable, coverage = npubuild_table(table, ranges, {"conv:0__1", "sig", "y"})
    assert qtable == "conv:0__1_Conv F16\nsig_Sigmoid F16\ny_Mul F16\n"
    assert text.splitlines()[1] == "x 0.7500000 -0.5000000 0.7500000"
    assert (coverage["applied"], coverage["float16"], coverage["fell_back"]) == (1, 3, [])
    assert "3 run in float16 as npubuild keeps them in float" in coverage["summary"]


def test_a_silu_npubuild_keeps_in_float_is_float_inside_too():
    from onnx import TensorProto, helper

    from npubuild.backends.vendor import float_values
    from npubuild.quant.qgraph import QGraph, QTensor

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 1])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [], [w]))

    def qgraph(x_dtype):
        tensors = {n: QTensor(n, [1], dtype) for n, dtype in (("x", x_dtype), ("c", "float32"),
                                                              ("y", "float32"), ("z", "int8"))}
        return QGraph(name="g", scheme="asymmetric", granularity="per_channel", inputs=["x"],
                      outputs=["z"], tensors=tensors, layers=[])
    assert float_values(model, qgraph("int8")) == {"c", "s", "y"}
    assert float_values(model, qgraph("float32")) == {"x", "c", "s", "y"}  # read by float only


def test_model_runner_outputs_are_matched_by_name_then_prefix_then_order():
    import numpy as np

    got = {"0:y_Sigmoid": np.ones(2), "0:z": np.zeros(2)}
    named = _named(got, ["y", "w"], 1)
    assert named["0:y"].tolist() == [1, 1] and named["0:w"].tolist() == [0, 0]


def test_report_and_diff_show_the_vendors_figures_beside_npubuilds_estimate():
    report = {"vendor": {"npu_ops": 3, "cycles": 576, "artifact_bytes": 28735,
                         "toolchain": {"toolchain": "rknn", "rknn-toolkit2": "2.5.0"}},
              "estimate": {"cycles": 30, "npu_fps": 10.0},
              "compile": {"graphs": {"graph_0": {"deployed": "vendor", "quantizers": {
                  "vendor": {"proof": {"y": {"cosine": 0.9989}}}}}}}}
    assert ("cycles", 576, 30) in table_rows(report) and ("inferences/s", None, 10.0) in table_rows(report)
    figures = vendor_figures(report)
    assert figures["vendor NPU ops"] == 3 and figures["toolchain"] == "rknn-toolkit2==2.5.0"
    assert figures["vendor quantizer cosine graph_0:y"] == 0.9989


def test_the_report_says_whose_quantization_each_vendor_artifact_carries():
    report = {"compile": {"graphs": {"graph_0": {"quantizers": {
        "vendor": {"proof": {}},
        "npubuild": {"quantization": {"summary": "npubuild's Q/DQ on 3 of 4 ..."},
                     "integer_reference": {"summary": "0 of 1 outputs bit-exact ...",
                                           "why": "fused kernels"}}}}}}}
    assert handover_lines(report) == ["graph_0, npubuild: npubuild's Q/DQ on 3 of 4 ...",
                                      "graph_0, npubuild: 0 of 1 outputs bit-exact ... — why: fused kernels"]
