"""Outputs a CPU part selects from the NPU's tensors by an index it chose by comparing values
(`npubuild.split.selection`): isbnx's end-to-end YOLO head, TopK over the best class score,
then the boxes gathered by its indices."""

from __future__ import annotations

from onnx import TensorProto, helper

from npubuild.split.selection import selected_outputs


def head_graph():
    """boxes [1, 8, 4] and scores [1, 8, 3] from the NPU; the top 3 anchors' boxes (by index),
    their best scores (TopK's values) and a mean of the scores (no selection)."""
    k = helper.make_tensor("k", TensorProto.INT64, [1], [3])
    nodes = [helper.make_node("ReduceMax", ["scores"], ["best"], axes=[2], keepdims=0),
             helper.make_node("TopK", ["best", "k"], ["values", "indices"], axis=1),
             helper.make_node("Gather", ["boxes", "indices"], ["picked"], axis=1),
             helper.make_node("Identity", ["values"], ["top_scores"]),
             helper.make_node("ReduceMean", ["scores"], ["mean"], axes=[1], keepdims=0)]
    return helper.make_graph(
        nodes, "head",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 8, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ("picked", "top_scores", "mean")], [k])


def test_an_output_gathered_by_a_topk_index_is_judged_on_what_it_selects_from():
    selected = selected_outputs([head_graph()], ["picked", "top_scores", "mean"],
                                ["boxes", "scores"])
    # the boxes picked by TopK's indices read both hand-overs (the scores choose the rows);
    # TopK's values are the sorted scores themselves, continuous in them; the mean selects nothing
    assert selected == {"picked": ["boxes", "scores"]}


def test_a_selection_of_model_inputs_alone_is_no_npu_selection():
    assert selected_outputs([head_graph()], ["picked"], []) == {}


def test_an_argmax_over_one_peak_is_judged_as_it_is():
    """SwiftF0's pitch, read at its best bin: stable, its cosine 1.0000 in the zoo."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("ArgMax", ["logits"], ["bin"], axis=1),
             helper.make_node("Cast", ["bin"], ["pitch"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "pitch", [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 360])],
        [helper.make_tensor_value_info("pitch", TensorProto.FLOAT, None)])
    assert selected_outputs([graph], ["pitch"], ["logits"]) == {}
