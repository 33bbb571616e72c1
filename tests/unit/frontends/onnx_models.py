"""Small ONNX models, written inline, that reproduce what real exports do to the import stage."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def paddle_reshape(opset: int = 12) -> onnx.ModelProto:
    """Paddle's Flatten before a classifier (PP-OCR's cls and rec heads): the Reshape's shape is
    Concat(Cast(Slice(Cast(Shape(x), float))), [-1]); the float Cast stops onnx's data
    propagation, so inference leaves the Reshape, the MatMul after it and the output unshaped."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Shape", ["pooled"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        _const("starts", np.array([0], np.int64)), _const("ends", np.array([1], np.int64)),
        _const("axes", np.array([0], np.int64)),
        helper.make_node("Slice", ["shape_f", "starts", "ends", "axes"], ["batch_f"]),
        helper.make_node("Cast", ["batch_f"], ["batch"], to=TensorProto.INT64),
        _const("rest_f", np.array([4.0], np.float32)),
        helper.make_node("Cast", ["rest_f"], ["rest"], to=TensorProto.INT64),
        helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["pooled", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "paddle_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def reflect_pad_of_constants(opset: int = 15) -> onnx.ModelProto:
    """PyTorch's export of ``F.pad(x, (0, 64), "reflect")`` (Silero VAD's STFT padding): the
    pads are computed from Constant nodes alone (no Shape read): Concat → Reshape → reversing
    Slice → Transpose → Reshape → Cast. Inference cannot evaluate that chain, so the Pad and
    everything after it are unshaped though every value is known."""
    nodes = [
        _const("torch_pads", np.array([0, 64], np.int64)),
        _const("zeros", np.array([0, 0], np.int64)),
        helper.make_node("Concat", ["torch_pads", "zeros"], ["pairs_flat"], axis=0),
        _const("pair_shape", np.array([-1, 2], np.int64)),
        helper.make_node("Reshape", ["pairs_flat", "pair_shape"], ["pairs"]),
        _const("rev_start", np.array([-1], np.int64)), _const("rev_end", np.array([-(2**62)], np.int64)),
        _const("rev_axis", np.array([0], np.int64)), _const("rev_step", np.array([-1], np.int64)),
        helper.make_node("Slice", ["pairs", "rev_start", "rev_end", "rev_axis", "rev_step"], ["reversed"]),
        helper.make_node("Transpose", ["reversed"], ["by_end"], perm=[1, 0]),
        _const("flat_shape", np.array([-1], np.int64)),
        helper.make_node("Reshape", ["by_end", "flat_shape"], ["onnx_pads"]),
        helper.make_node("Cast", ["onnx_pads"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Relu", ["padded"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "reflect_pad_of_constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def if_branches(declare_output: bool) -> onnx.ModelProto:
    """An If whose branches give different ranks (a flag picks the flattened map or the map):
    inference cannot give its output a shape; the exporter may or may not declare one."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        node = (helper.make_node("Flatten", ["x"], [f"{name}_out"]) if op == "flatten"
                else helper.make_node("Relu", ["x"], [f"{name}_out"]))
        return helper.make_graph([node], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch("then", "flatten"),
                            else_branch=branch("else", "relu"))
    out_shape = ["N", "C", "A", "B"] if declare_output else None
    graph = helper.make_graph(
        [node], "if_branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def if_on_a_shape() -> onnx.ModelProto:
    """Silero VAD's decoder: an If on ``Shape(x)[1] == 4`` (true once the input shape is
    fixed) whose then-branch holds the real work, a Conv with its own weights inside the
    branch and a nested If on a constant flag; the else-branch passes the input through."""
    conv_w = numpy_helper.from_array(np.full((4, 4, 1, 1), 0.25, np.float32), "inner_w")
    inner = helper.make_node(
        "If", ["flag"], ["inner_out"],
        then_branch=helper.make_graph([helper.make_node("Relu", ["conv"], ["relu"])], "t2", [],
                                      [helper.make_tensor_value_info("relu", TensorProto.FLOAT, None)]),
        else_branch=helper.make_graph([helper.make_node("Neg", ["conv"], ["neg"])], "e2", [],
                                      [helper.make_tensor_value_info("neg", TensorProto.FLOAT, None)]))
    then_branch = helper.make_graph(
        [helper.make_node("Conv", ["x", "inner_w"], ["conv"]), _const("flag", np.array(True)), inner],
        "then", [], [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, None)], [conv_w])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["passed"])], "else", [],
        [helper.make_tensor_value_info("passed", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("one", np.array(1, np.int64)),
        helper.make_node("Gather", ["shape", "one"], ["channels"], axis=0),
        _const("four", np.array(4, np.int64)),
        helper.make_node("Equal", ["channels", "four"], ["is_four"]),
        helper.make_node("If", ["is_four"], ["y"], then_branch=then_branch, else_branch=else_branch),
    ]
    graph = helper.make_graph(
        nodes, "if_on_a_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def if_on_an_input() -> onnx.ModelProto:
    """Silero VAD's main model: the whole network inside an If on ``Equal(sr, 16000)``, ``sr`` a
    scalar int64 input; the 16 kHz branch a Conv + Relu, the 8 kHz one a Neg."""
    weight = numpy_helper.from_array(np.full((2, 2, 1, 1), 0.5, np.float32), "w16k")
    then_branch = helper.make_graph(
        [helper.make_node("Conv", ["x", "w16k"], ["conv"]), helper.make_node("Relu", ["conv"], ["r"])],
        "rate_16k", [], [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)], [weight])
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"])], "rate_8k", [],
        [helper.make_tensor_value_info("n", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [_const("rate", np.array(16000, np.int64)),
         helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
         helper.make_node("If", ["is_16k"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "if_on_an_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def lstm_behind_constant_pads() -> onnx.ModelProto:
    """Silero VAD's OpenVINO export in small: pads computed from constants alone before an LSTM
    whose weights are Unsqueezes of Constant nodes. Import folds both; ONNX Runtime prepacks the
    LSTM's weights once they are initializers, and its result moves by ~1e-7."""
    rng = np.random.default_rng(0)
    hidden, features = 128, 64
    nodes = [
        _const("zeros", np.zeros(3, np.int64)), _const("tail", np.array([0, 0, 0], np.int64)),
        helper.make_node("Concat", ["zeros", "tail"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),
        _const("w2", (rng.standard_normal((4 * hidden, features)) * 0.1).astype(np.float32)),
        _const("r2", (rng.standard_normal((4 * hidden, hidden)) * 0.1).astype(np.float32)),
        _const("first", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["w2", "first"], ["w"]),
        helper.make_node("Unsqueeze", ["r2", "first"], ["r"]),
        helper.make_node("LSTM", ["padded", "w", "r"], ["states", "h"], hidden_size=hidden),
    ]
    graph = helper.make_graph(
        nodes, "lstm_behind_constant_pads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 1, features])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def old_ir_conv_bn() -> onnx.ModelProto:
    """IR 3 as the onnx wheel's light_* models are written: every initializer is also a graph
    input. A Conv + BatchNormalization + Relu, so fusion rewrites it and split extracts it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "scale"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "old_ir", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)


FINFO_MIN = float(np.finfo(np.float32).min)


def masked_attention(mask: str = "sub_mul", neg: float = FINFO_MIN, tokens: int = 8,
                     width: int = 16, heads: int = 2, seed: int = 0) -> onnx.ModelProto:
    """One self-attention of ``heads`` heads over ``x`` [1, tokens, width] with the padding mask
    ``attention_mask`` [1, tokens] (int64, 1 on the tokens) added to the scores before the
    Softmax, as exports write it (``mask``):

    - ``sub_mul``: Hugging Face's ``(1 - Cast(Unsqueeze(Unsqueeze(mask)))) · neg`` [1, 1, 1, T];
    - ``where_bias``: ``Where(Cast(mask, bool), 0, neg)``, the bias added;
    - ``masked_fill``: ``Where(Not(Cast(mask, bool)), neg, scores)``, the scores replaced;
    - ``causal``: ``sub_mul`` plus a constant causal bias [T, T] of 0 and ``neg``;
    - ``causal_position_bias``: ``sub_mul`` plus one constant [1, heads, T, T], a relative
      position bias (per head, -40 .. 10) with ``neg`` added above the diagonal, as export folds
      T5's decoder's causal mask into its position bias at a fixed length;
    - ``scaled_after``: ``sub_mul`` added before the 1/sqrt(d) scale (a Mul between the mask
      and the Softmax: not a mask this rewrite may bound);
    - ``sliced``: ``sub_mul``'s bias cut by Slices along the key positions and joined again by
      a Concat (T5's encoder adds its mask to the position bias through a Slice);
    - ``lookup``: a learned bias per head looked up by index from a table [2, heads] whose row 0
      (padding) is ``neg`` and row 1 small biases (a Graphormer-style spatial encoding:
      ``Gather(table, index)``, index the mask itself), transposed to [1, heads, 1, T] and added.
    """
    rng = np.random.default_rng(seed)
    d = width // heads
    weights = [numpy_helper.from_array((rng.normal(size=(width, width)) / np.sqrt(width) * 3)
                                       .astype(np.float32), name) for name in ("wq", "wk", "wv")]
    floats = {"one": np.float32(1.0), "neg": np.float32(neg), "zero": np.float32(0.0),
              "scale": np.float32(1 / np.sqrt(d))}
    nodes = [_const(name, value) for name, value in floats.items()] + [
        _const("heads_shape", np.array([1, tokens, heads, d], np.int64)),
        _const("out_shape", np.array([1, tokens, width], np.int64)),
        _const("ax1", np.array([1], np.int64)), _const("ax2", np.array([2], np.int64))]
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", "w" + name], [name + "_flat"]),
                  helper.make_node("Reshape", [name + "_flat", "heads_shape"], [name + "_heads"])]
    nodes += [helper.make_node("Transpose", ["q_heads"], ["q"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k_heads"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v_heads"], ["v"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"])]
    bias_chain = [helper.make_node("Unsqueeze", ["attention_mask", "ax1"], ["m3"]),
                  helper.make_node("Unsqueeze", ["m3", "ax2"], ["m4"]),
                  helper.make_node("Cast", ["m4"], ["m4f"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "m4f"], ["dropped"]),
                  helper.make_node("Mul", ["dropped", "neg"], ["bias"])]
    if mask in ("sub_mul", "causal", "causal_position_bias"):
        nodes += [helper.make_node("Mul", ["qk", "scale"], ["scores"]), *bias_chain,
                  helper.make_node("Add", ["scores", "bias"], ["masked"])]
        if mask == "causal":
            causal = np.triu(np.full((tokens, tokens), neg, np.float32), 1)
            nodes += [_const("causal_bias", causal),
                      helper.make_node("Add", ["masked", "causal_bias"], ["masked_causal"])]
        elif mask == "causal_position_bias":
            distance = np.arange(tokens)[None, :] - np.arange(tokens)[:, None]  # key - query
            per_head = rng.uniform(-40.0, 10.0, size=(heads, 2 * tokens - 1))
            position = per_head[:, distance + tokens - 1][None].astype(np.float32)
            folded = (position + np.triu(np.full((tokens, tokens), neg, np.float32), 1)
                      ).astype(np.float32)
            nodes += [_const("causal_bias", folded),
                      helper.make_node("Add", ["masked", "causal_bias"], ["masked_causal"])]
    elif mask == "sliced":
        half = tokens // 2
        nodes += [helper.make_node("Mul", ["qk", "scale"], ["scores"]), *bias_chain,
                  *(_const(name, np.array([at], np.int64))
                    for name, at in (("at0", 0), ("at_half", half), ("at_end", tokens), ("ax3", 3))),
                  helper.make_node("Slice", ["bias", "at0", "at_half", "ax3"], ["bias_front"]),
                  helper.make_node("Slice", ["bias", "at_half", "at_end", "ax3"], ["bias_back"]),
                  helper.make_node("Concat", ["bias_front", "bias_back"], ["bias_joined"], axis=3),
                  helper.make_node("Add", ["scores", "bias_joined"], ["masked"])]
    elif mask == "lookup":
        table = np.stack([np.full(heads, neg), rng.uniform(-2.0, 2.0, heads)]).astype(np.float32)
        nodes += [helper.make_node("Mul", ["qk", "scale"], ["scores"]), _const("lookup_table", table),
                  helper.make_node("Unsqueeze", ["attention_mask", "ax1"], ["index"]),
                  helper.make_node("Gather", ["lookup_table", "index"], ["looked_up"]),
                  helper.make_node("Transpose", ["looked_up"], ["bias"], perm=[0, 3, 1, 2]),
                  helper.make_node("Add", ["scores", "bias"], ["masked"])]
    elif mask == "scaled_after":
        nodes += [*bias_chain, helper.make_node("Add", ["qk", "bias"], ["unscaled"]),
                  helper.make_node("Mul", ["unscaled", "scale"], ["masked"])]
    else:
        nodes += [helper.make_node("Mul", ["qk", "scale"], ["scores"]),
                  helper.make_node("Unsqueeze", ["attention_mask", "ax1"], ["m3"]),
                  helper.make_node("Unsqueeze", ["m3", "ax2"], ["m4"]),
                  helper.make_node("Cast", ["m4"], ["kept"], to=TensorProto.BOOL)]
        if mask == "where_bias":
            nodes += [helper.make_node("Where", ["kept", "zero", "neg"], ["bias"]),
                      helper.make_node("Add", ["scores", "bias"], ["masked"])]
        else:
            nodes += [helper.make_node("Not", ["kept"], ["dropped"]),
                      helper.make_node("Where", ["dropped", "neg", "scores"], ["masked"])]
    softmax_input = "masked_causal" if mask.startswith("causal") else "masked"
    nodes += [helper.make_node("Softmax", [softmax_input], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "v"], ["context"]),
              helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["context_t", "out_shape"], ["y"])]
    graph = helper.make_graph(
        nodes, f"masked_attention_{mask}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, tokens])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
