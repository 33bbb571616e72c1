"""The IR dump (seed 004): schema-valid JSON, the seed's field rules and tensor layouts."""

import json

import jsonschema
import jsonschema_rs
import numpy as np
import pytest

from npubuild import schemas
from npubuild.npu.ir_dump import dump_ir
from npubuild.quant.reference import run_reference
from tests.unit.npu.qstacks import Stack, int_inputs, quantize


def _qgraph(scheme="pow2_symmetric"):
    s = Stack((1, 4, 10, 12))
    a = s.conv("x", 8, 3, 2)
    b = s.conv(a, 8, 3, depthwise=True)
    c = s.binary(a, b)
    d = s.pool(c, "avg", 3, 1, 1)
    return quantize(s.model([s.concat([d, c]), s.reshape(c, [1, 8, 30])]), scheme)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    qgraph = _qgraph()
    values = run_reference(qgraph, int_inputs(qgraph))
    directory = tmp_path_factory.mktemp("ir")
    path = dump_ir(qgraph, directory, values, "seeded random int8")
    return qgraph, values, directory, json.loads(path.read_text())


def test_ir_dump_validates_against_its_schema(dumped):
    qgraph, _, directory, doc = dumped
    jsonschema.validate(doc, schemas.load("npu_ir"))
    assert doc["graph"] == "graph_0" and [l["name"] for l in doc["layers"]] == [
        l.name for l in qgraph.layers]
    for layer in doc["layers"]:
        for files in layer["tensors"].values():
            for name in files if isinstance(files, list) else [files]:
                assert (directory / name).is_file()


def test_conv_weight_is_hwcico_dwconv_hwc_bias_c_and_feature_maps_hwc(dumped):
    qgraph, values, directory, doc = dumped
    by_name = {l["name"]: l for l in doc["layers"]}
    conv, dw = qgraph.layers[0], qgraph.layers[1]
    weight = np.load(directory / by_name[conv.name]["tensors"]["weight"])
    assert weight.shape == (3, 3, 4, 8)  # H, W, Ci, Co
    for h, w, ci, co in [(0, 0, 0, 0), (2, 1, 3, 7), (1, 2, 2, 5)]:
        assert weight[h, w, ci, co] == conv.arrays["weight"][co, ci, h, w]
    dw_weight = np.load(directory / by_name[dw.name]["tensors"]["weight"])
    assert by_name[dw.name]["operation"] == "dwconv" and dw_weight.shape == (3, 3, 8)
    np.testing.assert_array_equal(dw_weight, dw.arrays["weight"][:, 0].transpose(1, 2, 0))
    bias = np.load(directory / by_name[conv.name]["tensors"]["bias"])
    np.testing.assert_array_equal(bias, conv.arrays["bias"])
    out = np.load(directory / by_name[conv.name]["tensors"]["output"][0])
    np.testing.assert_array_equal(out, values[conv.outputs[0]][0].transpose(1, 2, 0))  # HWC
    reshape = next(l for l in doc["layers"] if l["operation"] == "reshape")
    assert np.load(directory / reshape["tensors"]["output"][0]).shape == (1, 8, 30)


def test_pow2_fields_follow_seed_004(dumped):
    _, _, _, doc = dumped
    conv, dw, add = doc["layers"][:3]
    assert conv["previous_layer"] == ["input"] and conv["next_layer"] == [dw["name"], add["name"]]
    assert conv["output_shift"] == (conv["input_log2scale"] + conv["weight_log2scale"]
                                    - conv["output_log2scale"])
    assert conv["bias_shift"] == (conv["input_log2scale"] + conv["weight_log2scale"]
                                  - conv["bias_log2scale"])
    assert conv["padding"] == {"top": 1, "bottom": 1, "left": 1, "right": 1}
    assert conv["stride"] == {"height": 2, "width": 2} and conv["kernel_size"]["height"] == 3
    assert conv["input_size"] == {"height": 10, "width": 12} and conv["output_channel_num"] == 8
    assert add["pl_name"] == conv["name"] and add["add_name"] == dw["name"]
    assert add["output_shift_bit"] == add["output_log2scale"] - max(add["pl_log2scale"],
                                                                    add["add_log2scale"])
    ends = [l for l in doc["layers"] if "endpoint" in l["next_layer"]]
    assert sorted(l["operation"] for l in ends) == ["concat", "reshape"]
    pool = next(l for l in doc["layers"] if l["operation"] == "avg_pool")
    assert "input_pre_ls" in pool and pool["kernel_size"] == {"height": 3, "width": 3}


def test_float_scales_carry_scale_zero_point_multiplier_and_shift(tmp_path):
    qgraph = _qgraph("asymmetric")
    doc = json.loads(dump_ir(qgraph, tmp_path, None, None).read_text())
    conv = doc["layers"][0]
    assert {"input_scale", "input_zero_point", "output_scale", "multiplier", "shift"} <= set(conv)
    assert "output_shift" not in conv and "output_shift_bit" not in doc["layers"][2]
    assert "output" not in conv["tensors"] and "weight" in conv["tensors"]  # no feature maps


def test_the_schema_rejects_a_conv_without_its_shifts(dumped):
    *_, doc = dumped
    broken = json.loads(json.dumps(doc))
    del broken["layers"][0]["output_shift"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schemas.load("npu_ir"))


def test_compiles_validator_accepts_and_rejects_what_the_reference_validator_does(dumped):
    # dump_ir validates with jsonschema-rs (`schemas.validate`); jsonschema is the reference
    *_, doc = dumped
    schemas.validate(doc, "npu_ir")
    broken = json.loads(json.dumps(doc))
    del broken["layers"][0]["output_shift"]
    with pytest.raises(jsonschema_rs.ValidationError, match=r'instance\["layers"\]\[0\]'):
        schemas.validate(broken, "npu_ir")


def _long_names(model, prefix):
    """Every node and tensor but the input renamed to a TF-export-like scope far over 255 bytes."""
    rename = {}
    for node in model.graph.node:
        node.name = prefix + node.name
        for i, t in enumerate(node.output):
            rename[t] = prefix + t
            node.output[i] = rename[t]
    for node in model.graph.node:
        for i, t in enumerate(node.input):
            node.input[i] = rename.get(t, t)
    for value in model.graph.output:
        value.name = rename[value.name]
    return model


def test_long_and_unsafe_tensor_names_give_bounded_unique_files_and_a_name_map(tmp_path):
    """Class 7 of issue 11: the IR dump failed with `File name too long` on real models."""
    s = Stack((1, 4, 10, 12))
    a = s.conv("x", 8, 3, 2)
    b = s.conv(a, 8, 3, depthwise=True)
    prefix = "model/" + "very_long_scope:0 with spaces/" * 12
    qgraph = quantize(_long_names(s.model([s.binary(a, b)]), prefix))
    values = run_reference(qgraph, int_inputs(qgraph))
    first = dump_ir(qgraph, tmp_path / "a", values, "seeded")
    dump_ir(qgraph, tmp_path / "b", values, "seeded")
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())  # deterministic
    assert all(len(f.encode()) <= 120 and "/" not in f and " " not in f for f in files)
    names = json.loads((tmp_path / "a" / "names.json").read_text())
    doc = json.loads(first.read_text())
    for layer in doc["layers"]:
        assert layer["name"].startswith(prefix)
        assert names[layer["tensors"]["output"][0]] == {"name": layer["name"], "role": "output"}
        if "weight" in layer["tensors"]:
            assert names[layer["tensors"]["weight"]] == {"name": layer["name"], "role": "weight"}
    assert set(names) == set(files) - {"names.json", first.name}
    assert len(set(names)) == len(names)


@pytest.mark.slow
def test_a_real_models_ir_dump_has_a_name_map_and_bounded_file_names(ppocr_cls):
    build, result = ppocr_cls
    assert result.returncode == 0, result.stderr
    dumps = sorted((build / "compile").glob("graph_ir_*"))
    assert dumps
    for dump in dumps:
        names = json.loads((dump / "names.json").read_text())
        files = {p.name for p in dump.iterdir()} - {"names.json", f"graph_{dump.name[9:]}.json"}
        assert set(names) == files and all(len(f.encode()) <= 120 for f in files)


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "asymmetric"])
def test_a_prelu_is_a_rescale_with_its_negative_side_per_channel(tmp_path, scheme):
    s = Stack((1, 4, 6, 6))
    a = s.conv("x", 4, 3)
    slope = s._const("slope", np.float32([0.25, -0.1, 0.5, 0.02]).reshape(4, 1, 1))
    b = s.binary(a, slope, "PRelu")
    qgraph = quantize(s.model([s.unary(b, "LeakyRelu")]), scheme)
    doc = json.loads(dump_ir(qgraph, tmp_path, None, None).read_text())
    jsonschema.validate(doc, schemas.load("npu_ir"))
    prelu, leaky = (next(l for l in doc["layers"] if l["name"] == n) for n in (b, qgraph.layers[-1].name))
    assert prelu["operation"] == leaky["operation"] == "rescale"
    assert (prelu["function"], leaky["function"]) == ("PRelu", "LeakyRelu")
    assert prelu["slope_axis"] == 1
    assert prelu["negative_factor"] == pytest.approx([0.25, -0.1, 0.5, 0.02])
    assert prelu["negative_multiplier"] == qgraph.layers[1].arrays["negative_multiplier"].tolist()
    assert leaky["negative_factor"] == pytest.approx(0.01) and "slope_axis" not in leaky
    assert isinstance(leaky["negative_multiplier"], int) and isinstance(leaky["negative_shift"], int)


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "asymmetric"])
def test_a_w16a16_conv_dumps_int16_weights_and_an_int64_bias(tmp_path, scheme):
    s = Stack((1, 4, 6, 6))
    a = s.conv("x", 8, 3)
    qgraph = quantize(s.model([s.conv(a, 4, 3)]), scheme,
                      int16_tensors=frozenset({"x", a}), int16_weight_inputs=frozenset({"x", a}))
    doc = json.loads(dump_ir(qgraph, tmp_path, run_reference(qgraph, int_inputs(qgraph)),
                             "seeded random int16").read_text())
    jsonschema.validate(doc, schemas.load("npu_ir"))
    for layer, entry in zip(qgraph.layers, doc["layers"]):
        assert (entry["weight_dtype"], entry["bias_dtype"]) == ("int16", "int64")
        weight = np.load(tmp_path / entry["tensors"]["weight"])
        assert weight.dtype == np.int16 and weight.size == layer.arrays["weight"].size
        np.testing.assert_array_equal(np.load(tmp_path / entry["tensors"]["bias"]),
                                      layer.arrays["bias"])
