"""layer_norm: the decomposed layer normalisation fused into one LayerNorm function node."""

import numpy as np
import pytest

X = {"x": [2, 3, 8]}


def layer_norm_nodes(node, square="Pow", affine="Affine", axes=(-1,), opset=17):
    def mean(src, out):
        if opset >= 18:
            return node("ReduceMean", [src, "axes"], [out])
        return node("ReduceMean", [src], [out], axes=list(axes))

    nodes = [mean("x", "mu"), node("Sub", ["x", "mu"], ["d"]),
             node("Pow", ["d", "two"], ["sq"]) if square == "Pow" else node("Mul", ["d", "d"], ["sq"]),
             mean("sq", "var"), node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["std"]),
             node("Div", ["d", "std"], ["n" if affine != "Plain" else "y"])]
    if affine in ("Affine", "Scale"):
        nodes.append(node("Mul", ["n", "gamma"], ["s" if affine == "Affine" else "y"]))
    if affine == "Affine":
        nodes.append(node("Add", ["s", "beta"], ["y"]))
    return nodes


def ln_model(tiny, nodes, outputs=("y",), opset=17, axes=(-1,)):
    inits = {"two": np.float32(2), "eps": np.float32(1e-5), "gamma": tiny.rand(8), "beta": tiny.rand(8),
             "axes": np.array(axes, np.int64)}
    used = {t for n in nodes for t in n.input}
    return tiny.model(nodes, X, list(outputs), {k: v for k, v in inits.items() if k in used}, opset)


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("affine", ["Affine", "Scale", "Plain"])
def test_layer_norm_fuses_each_decomposition_into_one_node(tiny, make_node, square, affine):
    fused, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, layer_norm_nodes(make_node, square, affine)))
    overload = affine + ("" if square == "Pow" else "MulSquare")
    assert report.fired == 1 and tiny.ops(fused) == {f"LayerNorm:{overload}": 1}
    got = tiny.attrs(tiny.fused(fused)[0])
    assert got["axis"] == -1 and got["epsilon"] == pytest.approx(1e-5)


def test_layer_norm_reads_axes_from_the_input_of_opset_18(tiny, make_node):
    nodes = layer_norm_nodes(make_node, opset=18)
    fused, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, nodes, opset=18))
    assert report.fired == 1 and list(tiny.fused(fused)[0].input) == ["x", "gamma", "beta"]


def test_layer_norm_refuses_a_normalisation_over_a_leading_axis(tiny, make_node):
    nodes = layer_norm_nodes(make_node, affine="Plain", axes=(1,))
    _, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, nodes))
    assert report.fired == 0 and "not the trailing axes" in report.near_misses[0]


def test_layer_norm_does_not_fuse_when_the_mean_is_also_a_graph_output(tiny, make_node):
    _, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, layer_norm_nodes(make_node), ("y", "mu")))
    assert report.fired == 0 and "'mu'" in report.near_misses[0]
    assert "graph output" in report.near_misses[0]


def test_layer_norm_does_not_fuse_when_the_centred_input_has_another_consumer(tiny, make_node):
    nodes = [*layer_norm_nodes(make_node), make_node("Add", ["y", "d"], ["z"])]
    _, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, nodes, ("z",)))
    assert report.fired == 0 and "also feeds Add" in " ".join(report.near_misses)


def test_layer_norm_fired_nowhere_says_import_wrote_the_onnx_op(tiny, make_node):
    """Import writes the decompositions it can as ONNX LayerNormalization, so a recipe that
    still lists the rule is told why it fired nowhere."""
    nodes = [make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1)]
    _, report = tiny.fuse_and_check("layer_norm", ln_model(tiny, nodes))
    assert report.fired == 0
    assert report.near_misses[0] == ("import already wrote 1 layer norm(s) as ONNX "
                                     "LayerNormalization, which chips run whole")
