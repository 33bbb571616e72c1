"""Loops of a static trip count (ONNX Loop, Scan) unrolled at import
(`npubuild.frontends.loops`): the unrolled graph computes what ONNX Runtime computes for the
loop, on random weights; a loop whose iterations the values decide stays whole and says why
(in import and in split)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.frontends import loops

STEPS, HIDDEN, FEATURES = 6, 4, 3
INT64_MAX = np.iinfo(np.int64).max


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def while_model(trip_count=INT64_MAX, stop_at: int | None = STEPS, data_dependent: bool = False,
                masked: bool = False, nested_if: bool = False, opset: int = 17,
                steps: int = STEPS) -> onnx.ModelProto:
    """tf2onnx's Keras RNN layer as a Loop: a counter ``i`` carried from 0, the step's row of
    ``X`` [steps, 1, F] Gathered by it, ``h = tanh(x·W + h·R)`` carried and scanned out; the
    condition ``i + 1 < stop_at`` (the counter's, static) or, ``data_dependent``, ``sum(h) <
    100`` too. ``masked``: tf2onnx's Keras mask (``M`` [steps, 1, 1] bool) picks the new or the
    old state per step (Cast, Not, Mul, Add). ``nested_if``: the new state goes through an If
    whose branches read body tensors."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(_f32(rng, FEATURES, HIDDEN), "W"),
             numpy_helper.from_array(_f32(rng, HIDDEN, HIDDEN, scale=0.5), "R"),
             numpy_helper.from_array(np.zeros((1, HIDDEN), np.float32), "h0"),
             numpy_helper.from_array(np.array(0, np.int32), "i0"),
             numpy_helper.from_array(np.array(True), "go")]
    if trip_count is not None:
        inits.append(numpy_helper.from_array(np.array(trip_count, np.int64), "trips"))
    body_nodes = [
        helper.make_node("Gather", ["X", "i"], ["x_t3"], axis=0),
        helper.make_node("Squeeze", ["x_t3", "zero_axis"], ["x_t"]),
        helper.make_node("MatMul", ["x_t", "W"], ["xw"]),
        helper.make_node("MatMul", ["h", "R"], ["hr"]),
        helper.make_node("Add", ["xw", "hr"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_new"]),
        helper.make_node("Add", ["i", "one"], ["i_next"]),
        helper.make_node("Less", ["i_next", "stop"], ["cond_out"] if not data_dependent else
                         ["more"]),
    ]
    body_inits = [numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
                  numpy_helper.from_array(np.array(1, np.int32), "one"),
                  numpy_helper.from_array(np.array(stop_at or 0, np.int32), "stop")]
    state = "h_new"
    if masked:
        body_nodes += [
            helper.make_node("Gather", ["M", "i"], ["m_t3"], axis=0),
            helper.make_node("Squeeze", ["m_t3", "zero_axis"], ["m_t"]),
            helper.make_node("Cast", ["m_t"], ["keep_new"], to=TensorProto.FLOAT),
            helper.make_node("Not", ["m_t"], ["not_m"]),
            helper.make_node("Cast", ["not_m"], ["keep_old"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["keep_new", "h_new"], ["new_part"]),
            helper.make_node("Mul", ["keep_old", "h"], ["old_part"]),
            helper.make_node("Add", ["new_part", "old_part"], ["h_masked"])]
        state = "h_masked"
    if nested_if:
        then = helper.make_graph([helper.make_node("Mul", [state, "two"], ["doubled"])], "then",
                                 [], [helper.make_tensor_value_info("doubled", TensorProto.FLOAT,
                                                                    None)])
        other = helper.make_graph([helper.make_node("Identity", [state], ["same"])], "else", [],
                                  [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)])
        body_nodes += [helper.make_node("Less", ["i", "three"], ["early"]),
                       helper.make_node("If", ["early"], ["h_if"], then_branch=then,
                                        else_branch=other)]
        body_inits += [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                       numpy_helper.from_array(np.array(3, np.int32), "three")]
        state = "h_if"
    if data_dependent:
        body_nodes += [helper.make_node("ReduceSum", [state], ["total"], keepdims=0),
                       helper.make_node("Less", ["total", "hundred"], ["small"]),
                       helper.make_node("And", ["more", "small"], ["cond_out"])]
        body_inits.append(numpy_helper.from_array(np.array(100.0, np.float32), "hundred"))
    body_nodes.append(helper.make_node("Identity", [state], ["h_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i", TensorProto.INT32, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, HIDDEN])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i_next", TensorProto.INT32, []),
         helper.make_tensor_value_info(state if state != "h_new" else "h_new", TensorProto.FLOAT,
                                       [1, HIDDEN]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, HIDDEN])],
        body_inits)
    loop = helper.make_node("Loop", ["trips" if trip_count is not None else "", "go", "i0", "h0"],
                            ["i_final", "h_final", "hs"], name="while_loop", body=body)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, 1, FEATURES])]
    if masked:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.BOOL, [steps, 1, 1]))
    graph = helper.make_graph([loop], "g", inputs,
                              [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("hs", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def scan_model(input_direction: int = 0, output_direction: int = 0, input_axis: int = 0,
               output_axis: int = 0) -> onnx.ModelProto:
    """A Scan (opset 9+) of ``h = tanh(x·W + h·R)`` over ``X``'s axis ``input_axis``."""
    rng = np.random.default_rng(2)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("MatMul", ["h", "R"], ["hr"]),
         helper.make_node("Add", ["xw", "hr"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_new"]),
         helper.make_node("Identity", ["h_new"], ["y"])], "body",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, HIDDEN]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FEATURES])],
        [helper.make_tensor_value_info("h_new", TensorProto.FLOAT, [1, HIDDEN]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HIDDEN])])
    shape = [STEPS, 1, FEATURES] if input_axis == 0 else [1, STEPS, FEATURES]
    scan = helper.make_node("Scan", ["h0", "X"], ["h_final", "ys"], name="scan", body=body,
                            num_scan_inputs=1, scan_input_axes=[input_axis],
                            scan_input_directions=[input_direction],
                            scan_output_axes=[output_axis],
                            scan_output_directions=[output_direction])
    inits = [numpy_helper.from_array(_f32(rng, FEATURES, HIDDEN), "W"),
             numpy_helper.from_array(_f32(rng, HIDDEN, HIDDEN, scale=0.5), "R")]
    graph = helper.make_graph(
        [scan], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape),
                      helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, HIDDEN])],
        [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def feeds_of(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(1)
    feeds = {}
    for v in model.graph.input:
        shape = onnx_io.value_shape(v)
        if v.type.tensor_type.elem_type == TensorProto.BOOL:
            feeds[v.name] = rng.random(shape) < 0.6
        else:
            feeds[v.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_unrolled_same(source: onnx.ModelProto, trips: int) -> onnx.ModelProto:
    model, kept, unrolled = loops.unroll(source)
    assert not kept and list(unrolled.values()) == [trips]
    assert not {n.op_type for n in model.graph.node} & {"Loop", "Scan"}
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_of(source)
    want, got = onnx_io.run(source, feeds), onnx_io.run(model, feeds)
    for name in want:
        assert want[name].shape == got[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    return model


@pytest.mark.parametrize("trip_count, stop_at, trips", [
    (INT64_MAX, STEPS, STEPS),  # tf2onnx: no trip count to speak of, the counter stops it
    (None, STEPS, STEPS),  # no trip count at all
    (3, STEPS, 3),  # the trip count stops it first
    (STEPS, None, 1),  # the condition is false after the first iteration
])
def test_a_loop_whose_iterations_the_constants_decide_unrolls_to_what_onnx_runtime_computes(
        trip_count, stop_at, trips):
    """nakdimon's four masked LSTM directions reached ONNX as tf2onnx Loops (a counter against
    the sequence length) and ran whole on the CPU: 42 of 55 nodes, every LSTM step."""
    model = assert_unrolled_same(while_model(trip_count, stop_at), trips)
    assert "i_final" not in {o for n in model.graph.node for o in n.output}  # nothing reads it


def test_a_masked_loop_casts_its_mask_once_not_per_iteration():
    """tf2onnx's Keras mask (Gather the step's row, Not, Cast) copied into every iteration
    would be CPU work between NPU steps: it is computed once over the whole mask."""
    model = assert_unrolled_same(while_model(masked=True), STEPS)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Not") == 1 and ops.count("Cast") == 2


def test_a_nested_if_in_a_loop_body_reads_its_iteration_s_tensors():
    assert_unrolled_same(while_model(nested_if=True), STEPS)


@pytest.mark.parametrize("input_direction, output_direction, input_axis, output_axis",
                         [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 1, 0), (1, 1, 1, 1), (0, 0, 0, 2)])
def test_a_scan_over_a_static_axis_unrolls_to_what_onnx_runtime_computes(
        input_direction, output_direction, input_axis, output_axis):
    assert_unrolled_same(scan_model(input_direction, output_direction, input_axis, output_axis),
                         STEPS)


@pytest.mark.parametrize("source, reason", [
    (while_model(data_dependent=True), "its condition depends on values the model computes"),
    (while_model(stop_at=2000, steps=2000), "more than import unrolls (10240 nodes)"),
])
def test_a_loop_import_cannot_unroll_stays_whole_and_split_says_why(source, reason):
    """slanet-plus's attention GRU decoder stops on its end token: how many iterations it runs
    is the values' to say."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    model, kept, trips = loops.unroll(source)
    assert model is source and not trips and reason in kept["while_loop"]
    (placed,) = check_placement(model, load_chip("npu-16m"))
    assert placed.device == "cpu" and reason in placed.reasons[0], placed.reasons


def stacked_while_model() -> onnx.ModelProto:
    """tf2onnx's two stacked Keras LSTMs (chars2vec's en_300): `while_model`'s loop, then a
    second Loop over its scanned-out states whose trip count is their first dim as tf2onnx
    reads it (Shape, Slice, Squeeze, Cast): a constant only once the first loop is unrolled."""
    first = while_model()
    axis = numpy_helper.from_array(np.array([0], np.int64), "s_axis")
    one = numpy_helper.from_array(np.array([1], np.int64), "s_one")
    body = helper.make_graph(
        [helper.make_node("Gather", ["hs", "b2_iter"], ["b2_row"], axis=0),
         helper.make_node("Squeeze", ["b2_row", "b2_axis"], ["b2_x"]),
         helper.make_node("Add", ["b2_acc", "b2_x"], ["b2_acc_new"]),
         helper.make_node("Identity", ["b2_cond_in"], ["b2_cond_out"])], "body2",
        [helper.make_tensor_value_info("b2_iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("b2_cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("b2_acc", TensorProto.FLOAT, [1, HIDDEN])],
        [helper.make_tensor_value_info("b2_cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("b2_acc_new", TensorProto.FLOAT, [1, HIDDEN])],
        [numpy_helper.from_array(np.array([0], np.int64), "b2_axis")])
    graph = first.graph
    graph.node.extend([
        helper.make_node("Shape", ["hs"], ["hs_shape"]),
        helper.make_node("Slice", ["hs_shape", "s_axis", "s_one", "s_axis"], ["hs_steps1"]),
        helper.make_node("Squeeze", ["hs_steps1", "s_axis"], ["hs_steps"]),
        helper.make_node("Cast", ["hs_steps"], ["trips2"], to=TensorProto.INT64),
        helper.make_node("Loop", ["trips2", "go", "h0"], ["total"], name="while_loop_2",
                         body=body)])
    graph.initializer.extend([axis, one])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("total", TensorProto.FLOAT, None))
    return first


def test_a_loop_whose_trip_count_reads_an_earlier_loop_s_output_unrolls_after_it():
    """chars2vec's second LSTM (a Loop over the first one's states, its trip count their
    Shape) stayed whole on the CPU, "its trip count is not a constant", though the first
    loop's unrolling made that Shape static."""
    from npubuild.stages.importer import unroll_loops

    source = stacked_while_model()
    model, figures = unroll_loops(source, feeds_of(source))
    assert figures["unrolled"] == {"while_loop": STEPS, "while_loop_2": STEPS}, figures
    assert "kept" not in figures and "Loop" not in {n.op_type for n in model.graph.node}
    feeds = feeds_of(source)
    np.testing.assert_allclose(onnx_io.run(model, feeds)["total"],
                               onnx_io.run(source, feeds)["total"], rtol=1e-6, atol=1e-6)
