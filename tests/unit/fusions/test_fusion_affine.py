"""fold_affine: per-channel constant Mul/Add folded into the Conv or BatchNormalization before it."""

import numpy as np

X = {"x": [1, 3, 6, 6]}


def test_conv_then_scale_and_shift_fold_into_one_conv(tiny, make_node):
    inits = {"w": tiny.rand(4, 3, 3, 3), "b": tiny.rand(4), "s": tiny.rand(1, 4, 1, 1),
             "t": tiny.rand(4, 1, 1)}
    nodes = [make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             make_node("Mul", ["c", "s"], ["m"]), make_node("Add", ["t", "m"], ["y"])]
    fused, report = tiny.fuse_and_check("fold_affine", tiny.model(nodes, X, ["y"], inits), exact=False)
    assert report.fired == 2 and tiny.ops(fused) == {"Conv": 1}
    assert fused.graph.node[0].output[0] == "y"


def test_batchnorm_then_scale_and_shift_fold_into_the_batchnorm(tiny, make_node):
    inits = {"scale": tiny.rand(3), "beta": tiny.rand(3), "mean": tiny.rand(3),
             "var": tiny.rand(3, low=0.1), "s": tiny.rand(1, 3, 1, 1), "t": np.float32(0.25)}
    nodes = [make_node("BatchNormalization", ["x", "scale", "beta", "mean", "var"], ["n"]),
             make_node("Mul", ["n", "s"], ["m"]), make_node("Add", ["m", "t"], ["y"]),
             make_node("Relu", ["y"], ["r"])]
    fused, report = tiny.fuse_and_check("fold_affine", tiny.model(nodes, X, ["r"], inits), exact=False)
    assert report.fired == 2 and tiny.ops(fused) == {"BatchNormalization": 1, "Relu": 1}


def test_a_constant_that_broadcasts_along_width_is_not_folded(tiny, make_node):
    inits = {"w": tiny.rand(4, 3, 3, 3), "s": tiny.rand(6)}  # [6] scales the last axis (W)
    nodes = [make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), make_node("Mul", ["c", "s"], ["y"])]
    fused, report = tiny.fuse_and_check("fold_affine", tiny.model(nodes, X, ["y"], inits))
    assert report.fired == 0 and tiny.ops(fused)["Mul"] == 1
    assert "not one value per channel" in report.near_misses[0]


def test_a_conv_output_read_elsewhere_is_not_folded(tiny, make_node):
    inits = {"w": tiny.rand(4, 3, 3, 3), "s": tiny.rand(1, 4, 1, 1)}
    nodes = [make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), make_node("Mul", ["c", "s"], ["m"]),
             make_node("Add", ["c", "m"], ["y"])]
    fused, report = tiny.fuse_and_check("fold_affine", tiny.model(nodes, X, ["y"], inits))
    assert report.fired == 0 and any("also feeds Add" in m for m in report.near_misses)
