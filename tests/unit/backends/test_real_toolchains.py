"""Each vendor backend end to end on the tiny recipe, through the real toolchain (no mocks):
compile writes the vendor artifact into the graph's context_dir with the vendor's figures, and
verify runs it (RKNN's simulator, the int8 TFLite Vela compiles, TPU-MLIR's cmodel). Slow; each
skips, saying how to install it, when its toolchain environment is absent."""

from __future__ import annotations

import json

import pytest

from npubuild import toolchains
from npubuild.split import graph_infos
from npubuild.toolchains.env import find
from tests.conftest import TINY_MODEL, TINY_RECIPE, write_recipe

pytestmark = pytest.mark.slow


def needs(name: str) -> None:
    if find(toolchains.get(name)) is None:
        pytest.skip(f"the {name} toolchain is not installed (npubuild toolchain install {name})")


def build(cli, tmp_path, chip: str, extra: str = "", base: str = TINY_RECIPE) -> tuple[dict, object]:
    """The tiny recipe (``base``, plus ``extra`` YAML) built for ``chip``; the vendor's scratch
    folders (in a TMPDIR of the test's own) are all gone afterwards."""
    body = base.replace("name: tiny", f"name: tiny-{chip}") + f"target: {chip}\n" + \
        "verify: {data: 'pkg:skimage/data/[d-h]*.png', samples: 2, min_cosine: 0.98}\n" + extra
    recipe = write_recipe(tmp_path, body)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = cli("run", str(recipe), "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"), cwd=tmp_path, timeout=1800,
                 env={"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in scratch.iterdir() if p.name.startswith("npubuild-")] == []
    root = tmp_path / "build" / f"tiny-{chip}"
    return json.loads((root / "report.json").read_text()), root


def test_rknn_builds_an_rknn_and_verify_runs_it_in_the_simulator(cli, tmp_path):
    needs("rknn")
    report, root = build(cli, tmp_path, "rk3588")
    infos = graph_infos.read(root / "split")
    npu = [g for g in infos["graphs"] if g["device"] == "npu"]
    assert (root / "compile" / npu[0]["context_dir"] / "graph_0.vendor.rknn").is_file()
    assert report["vendor"]["npu_ops"] >= 2 and report["vendor"]["reproducible"] is False
    graph = report["compile"]["graphs"]["graph_0"]
    assert set(graph["quantizers"]) == {"vendor", "npubuild"}  # side by side
    # every integer tensor the toolkit holds carries npubuild's Q/DQ: none fell back
    coverage = graph["quantizers"]["npubuild"]["quantization"]
    assert coverage["entries"] >= 2 and coverage["fell_back"] == []
    # npubuild's integer reference against the simulator running npubuild's QDQ model
    agreement = graph["quantizers"]["npubuild"]["integer_reference"]
    assert set(agreement["outputs"]) == {"y"}
    assert agreement["bit_exact"] == sum(r["max_steps"] == 0 for r in agreement["outputs"].values())
    assert "Conv+SiLU" in agreement["why"]  # the measured reason they are not bit-exact
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98
    assert report["compile"]["toolchain"]["rknn-toolkit2"] == "2.5.0"


def tokens_model(path):
    """Two convs, then: their feature map as 16 tokens of 8 channels through a Linear with its
    bias ([1, 16, 8] @ [8, 6] + b, Relu); tokens @ tokens^T (``gram``, forced to the CPU in the
    test below: a graph of its own, whose [1, 16, 16] result feeds an NPU graph with a 3-D
    input); and a classifier head
    (global pool, Gemm ``head`` on [1, 8], whose output an integer Add reads)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits = {"w1": rng.normal(0, 0.3, (8, 3, 3, 3)), "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
             "tokens": np.array([1, 8, 16], np.int64), "wl": rng.normal(0, 0.3, (8, 6)),
             "bl": rng.normal(0, 0.3, 6), "wh": rng.normal(0, 0.3, (5, 8)), "bh": rng.normal(0, 0.3, 5)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Reshape", ["r2", "tokens"], ["t"]),
             helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tt", "wl"], ["mm"]),
             helper.make_node("Add", ["mm", "bl"], ["lin"]),
             helper.make_node("Relu", ["lin"], ["y"]),
             helper.make_node("MatMul", ["tt", "t"], ["gram"], name="gram"),
             helper.make_node("Relu", ["gram"], ["z"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "wh", "bh"], ["logits"], transB=1, name="head"),
             helper.make_node("Add", ["logits", "logits"], ["h"])]
    outputs = {"y": [1, 16, 6], "z": [1, 16, 16], "h": [1, 5]}
    graph = helper.make_graph(
        nodes, "tokens", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outputs.items()],
        [numpy_helper.from_array(np.asarray(v, v.dtype if v.dtype.kind == "i" else np.float32), k)
         for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
              path)
    return path


def test_rknn_builds_what_the_toolkit_cannot_take_as_int8_in_float16(cli, tmp_path):
    """The fully connected layers rknn-toolkit2 stops on when given them in a QDQ model: an int8
    Linear with its bias on a 3-D input ("Invalid w_par['dtype'] = float16"), and a Gemm kept
    in float (here by an override, as the precision search may) whose output an integer layer
    reads ("Conv bias scale ... is empty"). rk3588's chip file says so (fc_integer_ranks), so
    quantize keeps both in float, outputs included, and the toolkit runs them in float16, the
    reason in the report; in pow2_symmetric, whose tie-breaking Adds the toolkit is not given;
    an NPU graph with a 3-D input runs in the simulator."""
    needs("rknn")
    base = TINY_RECIPE.replace(str(TINY_MODEL), str(tokens_model(tmp_path / "tokens.onnx"))) \
        .replace("scheme: symmetric", "scheme: pow2_symmetric") \
        .replace("quantization:\n", "quantization:\n  overrides: [{nodes: [head], precision: float}]\n")
    report, root = build(cli, tmp_path, "rk3588",
                         "compile: {quantizer: npubuild, compare_quantizers: false}\n"
                         "split: {force_cpu: [gram]}\n", base)
    infos = graph_infos.read(root / "split")
    assert [g["device"] for g in infos["graphs"]] == ["npu", "cpu", "npu"]
    floats = [entry["reason"] for entry in report["quantization"]["graphs"]["graph_0"]["cpu_layers"]]
    assert any("fully connected layer in int8 only on a 2-D input (this one is 3-D)" in r
               for r in floats)
    layers = (root / "compile" / "graph_ir_0" / "graph_0.npubuild.log").read_text()
    assert "FLOAT16" in layers and "ConvClip           INT8" in layers  # convs int8, the rest float16
    assert report["verify"]["passed"]
    assert min(report["accuracy"]["outputs"][t]["cosine"] for t in ("y", "z", "h")) > 0.98


def attention_model(path):
    """A MatMul of two activations as attention computes Q·Kᵀ: two 1x1 convs make q
    [1, 4, 16, 8] and kᵀ [1, 4, 8, 16], ``scores`` multiplies them, a conv reads the result."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32), w)
               for w in ("wq", "wk", "wo")]
    nodes = [helper.make_node("Conv", ["a", "wq"], ["q"], name="q"),
             helper.make_node("Conv", ["b", "wk"], ["kt"], name="k"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Conv", ["s", "wo"], ["y"], name="out")]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 16, 8]),
                             helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
              path)
    for k in range(6):
        np.savez(path.parent / f"ab_{k}.npz", a=rng.normal(size=(1, 4, 16, 8)).astype(np.float32),
                 b=rng.normal(size=(1, 4, 8, 16)).astype(np.float32))
    return path


def build_attention(cli, tmp_path, name: str, overrides: str = "[]") -> tuple[dict, object]:
    """`attention_model` built for rk3588 with npubuild's quantizer deployed."""
    model = tmp_path / "attention.onnx"
    if not model.is_file():
        attention_model(model)
    recipe = write_recipe(tmp_path, f"""\
        version: 1
        name: {name}
        model:
          path: {model}
          inputs:
            - {{name: a, shape: [1, 4, 16, 8]}}
            - {{name: b, shape: [1, 4, 8, 16]}}
        target: rk3588
        quantization:
          scheme: symmetric
          calibration: {{data: "ab_[0-3].npz", samples: 4}}
          overrides: {overrides}
        compile: {{quantizer: npubuild}}
        verify: {{data: "ab_[4-5].npz", samples: 2, min_cosine: 0.99}}
        """, name=f"{name}.yaml")
    result = cli("run", str(recipe), "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"), cwd=tmp_path, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    root = tmp_path / "build" / name
    return json.loads((root / "report.json").read_text()), root


def matmul_rows(root, quantizer: str) -> list[list[str]]:
    """The toolkit's layer-table rows (op, data type, target) of its exMatMul layers."""
    log = (root / "compile" / "graph_ir_0" / f"graph_0.{quantizer}.log").read_text()
    return [line.split()[3:6] for line in log.splitlines() if line.startswith("D RKNN:")
            and line.split()[-1].startswith("exMatMul:")]  # the table's full names


def test_rknn_runs_a_matmul_of_two_activations_on_the_npu_in_int8(cli, tmp_path):
    """npubuild has no integer kernel for a MatMul of two activations; rknn-toolkit2 2.5.0 runs
    it on the NPU (its exMatMul) in INT8 from the Q/DQ around it in npubuild's QDQ model, and in
    INT8 from its own quantizer on the float model. rk3588's op table says so (MatMul:
    vendor_kernel: int8), so the split keeps the whole model in one NPU graph, quantize keeps
    none of it in float, and the simulator's result matches the float model. With an input kept
    in float (an override, as the precision search may) it runs in FLOAT16, still on the NPU."""
    needs("rknn")
    report, root = build_attention(cli, tmp_path, "attention")
    assert [g["device"] for g in graph_infos.read(root / "split")["graphs"]] == ["npu"]
    assert report["quantization"]["graphs"]["graph_0"]["cpu_layers"] == []
    for quantizer in ("npubuild", "vendor"):
        assert matmul_rows(root, quantizer) == [["exMatMul", "INT8", "NPU"]], quantizer
    graph = report["compile"]["graphs"]["graph_0"]["quantizers"]
    assert graph["npubuild"]["quantization"]["fell_back"] == []
    assert graph["npubuild"]["cpu_ops"] == 0 and graph["vendor"]["cpu_ops"] == 0
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.99

    report, root = build_attention(cli, tmp_path, "attention-float-q",
                                   "[{tensors: [q], precision: float}]")
    floats = {e["layer"]: e["reason"] for e in report["quantization"]["graphs"]["graph_0"]["cpu_layers"]}
    assert "runs it on the NPU in float16" in floats["scores"]
    assert matmul_rows(root, "npubuild") == [["exMatMul", "FLOAT16", "NPU"]]
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.99


def test_rknn_builds_a_model_whose_tensor_names_are_longer_than_it_keeps(cli, tmp_path):
    """TFLite exports name tensors after every op fused into them (154 characters on
    microWakeWord): the toolkit cut them to 128 and then stopped on a KeyError looking the
    tensor up by its full name. The worker hands it shorter names; the report keeps the model's."""
    import onnx

    needs("rknn")
    model = onnx.load(TINY_MODEL)
    long = {n: "model_1/activation_6/Relu;model_1/batch_normalization_6/FusedBatchNormV3;"
               f"model_1/conv2d_11/Conv2D;model_1/stream_6/conv2d_6/Conv2D_prequant/{n}"
            for n in ("x", "conv", "relu", "pool")}
    for value in model.graph.input:
        value.name = long.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [long.get(n, n) for n in node.input]
        node.output[:] = [long.get(n, n) for n in node.output]
    onnx.save(model, tmp_path / "long_names.onnx")
    base = TINY_RECIPE.replace(str(TINY_MODEL), str(tmp_path / "long_names.onnx")).replace(
        "- name: x", f"- name: '{long['x']}'")
    report, root = build(cli, tmp_path, "rk3588", base=base)
    assert min(map(len, long.values())) > 128
    coverage = report["compile"]["graphs"]["graph_0"]["quantizers"]["npubuild"]["quantization"]
    assert coverage["fell_back"] == [] and coverage["entries"] >= 2
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98


def test_vela_compiles_the_int8_tflite_and_verify_runs_it(cli, tmp_path):
    needs("vela")
    report, root = build(cli, tmp_path, "ethos-u55-256")
    folder = root / "compile" / "graph_ir_0"
    assert (folder / "graph_0.vendor_vela.tflite").is_file()
    assert report["vendor"]["npu_ops"] >= 2 and report["vendor"]["cpu_ops"] == 0
    assert report["vendor"]["cycles"] > 0 and report["vendor"]["inferences_per_second"] > 0
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98


def test_tpu_mlir_builds_a_bmodel_and_verify_runs_it_on_the_cmodel(cli, tmp_path):
    needs("tpu-mlir")
    report, root = build(cli, tmp_path, "bm1684x")
    assert (root / "compile" / "graph_ir_0" / "graph_0.vendor.bmodel").is_file()
    # every calibration-table entry took npubuild's range under TPU-MLIR's name: none fell back
    coverage = report["compile"]["graphs"]["graph_0"]["quantizers"]["npubuild"]["quantization"]
    assert coverage["entries"] >= 2 and coverage["applied"] == coverage["entries"]
    assert coverage["fell_back"] == []
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98


def test_what_npubuild_keeps_in_float_runs_in_f16_in_the_bmodel(cli, tmp_path):
    """npubuild's precision decisions reach TPU-MLIR as its quantize table: the tensor the
    recipe keeps in float (an override, as the precision search would) runs in F16."""
    needs("tpu-mlir")
    base = TINY_RECIPE.replace("quantization:\n", "quantization:\n  overrides: "
                               "[{tensors: [relu], precision: float}]\n")
    report, root = build(cli, tmp_path, "bm1684x",
                         "compile: {quantizer: npubuild, compare_quantizers: false}\n", base)
    qtable = (root / "compile" / "graph_ir_0" / "graph_0.npubuild.qtable").read_text()
    coverage = report["compile"]["graphs"]["graph_0"]["quantizers"]["npubuild"]["quantization"]
    assert coverage["float16"] >= 1 and coverage["fell_back"] == []
    assert qtable and all(line.endswith(" F16") for line in qtable.splitlines())
    assert any(line.startswith("relu") for line in qtable.splitlines())
    assert report["verify"]["passed"]


def test_a_failing_rknn_build_leaves_no_scratch_folder_and_keeps_its_log(tmp_path, monkeypatch):
    import tempfile

    from npubuild.backends import rknn
    from npubuild.backends.vendor import NpuGraph
    from npubuild.errors import BuildError
    from npubuild.toolchains.env import require

    needs("rknn")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    folder = tmp_path / "graph_ir_0"
    folder.mkdir()
    (folder / "g.onnx").write_bytes(b"not an ONNX model")
    job = {"onnx": "g.onnx", "platform": "rk3588", "inputs": ["x"], "outputs": ["y"],
           "input_shapes": [[1, 3, 8, 8]], "quantize": False, "dataset": [],
           "export": "graph_0.vendor.rknn", "proof": [], "proof_outputs": "proof_outputs.npz"}
    graph = NpuGraph(0, "graph_0", ["x"], ["y"], folder / "g.onnx")
    with pytest.raises(BuildError, match="graph_0: rknn failed") as err:
        rknn._run(require(toolchains.get("rknn")), graph, folder, job, tmp_path / "logs")
    kept = tmp_path / "logs" / "compile.graph_0.vendor.rknn_worker.log"
    assert list(scratch.iterdir()) == [] and kept.is_file()
    assert f"the whole log: {kept}" in err.value.hint
