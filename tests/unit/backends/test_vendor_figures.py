"""The vendors' own words, read: RKNN's layer table, Vela's summary CSV, TPU-MLIR's tables,
and the figures report.html and diff show beside npubuild's estimate."""

from __future__ import annotations

from npubuild.backends.figures import table_rows, vendor_figures
from npubuild.backends.rknn import layer_figures, suggested_config
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
    text, coverage = npubuild_table(table, ranges)
    assert text.splitlines()[1:] == ["x 0.7500000 -0.5000000 0.7500000",
                                     "relu_Relu 4.0000000 0.0000000 4.0000000",
                                     "conv:0__1_Conv 3.0000000 -2.0000000 3.0000000",
                                     "mystery_Conv 3.0 -3.0 2.0"]
    assert (coverage["applied"], coverage["entries"], coverage["inner"]) == (3, 4, 1)
    assert coverage["fell_back"] == ["mystery_Conv"]
    assert coverage["summary"].endswith("1 kept the vendor's own: mystery_Conv")


def test_model_runner_outputs_are_matched_by_name_then_prefix_then_order():
    import numpy as np

    got = {"0:y_Sigmoid": np.ones(2), "0:z": np.zeros(2)}
    named = _named(got, ["y", "w"], 1)
    assert named["0:y"].tolist() == [1, 1] and named["0:w"].tolist() == [0, 0]


def test_report_and_diff_show_the_vendors_figures_beside_npubuilds_estimate():
    report = {"vendor": {"npu_ops": 3, "cycles": 576, "artifact_bytes": 28735,
                         "toolchain": {"toolchain": "rknn", "rknn-toolkit2": "2.5.0"}},
              "estimate": {"cycles": 30, "fps": 10.0},
              "compile": {"graphs": {"graph_0": {"deployed": "vendor", "quantizers": {
                  "vendor": {"proof": {"y": {"cosine": 0.9989}}}}}}}}
    assert ("cycles", 576, 30) in table_rows(report)
    figures = vendor_figures(report)
    assert figures["vendor NPU ops"] == 3 and figures["toolchain"] == "rknn-toolkit2==2.5.0"
    assert figures["vendor quantizer cosine graph_0:y"] == 0.9989
