"""Recurrent layers (LSTM, GRU, RNN) unrolled over their steps at import
(`npubuild.frontends.recurrent`): the unrolled graph computes what ONNX Runtime's recurrent
kernels compute (the ONNX reference where ONNX Runtime has no kernel: ``layout`` 1), on random
weights, for every attribute the spec gives, and npu-16m places all of it on the NPU; what
stays whole says why."""

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.frontends.recurrent import GATES, unroll

ALL = tuple(itertools.product(["forward", "reverse", "bidirectional"], [0, 1],
                              ["none", "input", "constant"]))


def recurrent_model(op: str, direction: str = "forward", layout: int = 0, state: str = "input",
                    steps: int = 5, batch: int = 2, hidden: int = 4, opset: int = 14,
                    bias: bool = True, peepholes: bool = False, lengths: list | None = None,
                    outputs: tuple = (1, 1, 1), **attrs) -> onnx.ModelProto:
    """One ``op`` layer of input size 3 on random weights; ``state`` "none" (no initial
    state), "input" (graph inputs) or "constant" (initializers); ``outputs`` says which of
    Y, Y_h, Y_c it writes."""
    rng = np.random.default_rng(0)
    gates, dirs = GATES[op], 2 if direction == "bidirectional" else 1

    def const(name, shape, scale=1.0):
        value = rng.standard_normal(shape) * scale
        return numpy_helper.from_array(value.astype(np.float32), name)

    inits = [const("W", (dirs, gates * hidden, 3)), const("R", (dirs, gates * hidden, hidden), 0.5)]
    inputs = ["X", "W", "R", "B" if bias else "", "L" if lengths is not None else ""]
    inits += [const("B", (dirs, 2 * gates * hidden))] if bias else []
    if lengths is not None and lengths != "input":
        inits.append(numpy_helper.from_array(np.array(lengths, np.int32), "L"))
    x_shape = [batch, steps, 3] if layout else [steps, batch, 3]
    state_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if lengths == "input":
        graph_inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [batch]))
    for name in ["H0", "C0"][:2 if op == "LSTM" else 1]:
        inputs.append("" if state == "none" else name)
        if state == "input":
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_shape))
        elif state == "constant":
            inits.append(const(name, state_shape))
    if peepholes:
        inputs.append("P")
        inits.append(const("P", (dirs, 3 * hidden)))
    while not inputs[-1]:
        inputs.pop()
    names = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    names = [n if wanted else "" for n, wanted in zip(names, outputs)]
    attrs = {"hidden_size": hidden, "direction": direction, **attrs,
             **({"layout": 1} if layout else {})}
    graph = helper.make_graph(
        [helper.make_node(op, inputs, names, name="rnn", **attrs)], "g", graph_inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n], inits)
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8))


def feeds_of(model: onnx.ModelProto, lengths: list | None = None) -> dict:
    """Random floats; ``lengths`` for a sequence_lens input ``L`` (default: every length from
    1 to the steps over the batch)."""
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal(onnx_io.value_shape(v)).astype(np.float32)
             for v in model.graph.input if v.name != "L"}
    for v in model.graph.input:
        if v.name == "L":
            batch = onnx_io.value_shape(v)[0]
            steps = onnx_io.value_shape(model.graph.input[0])[0]
            feeds["L"] = np.array(lengths or np.linspace(1, steps, batch).round(), np.int32)
    return feeds


def expected(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime's recurrent kernel; the ONNX reference for ``layout`` 1, which ONNX
    Runtime refuses ("Batchwise recurrent operations (layout == 1) are not supported")."""
    if any(a.name == "layout" and a.i for a in model.graph.node[0].attribute):
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)
    return list(onnx_io.run(model, feeds).values())


def assert_unrolled_same_and_on_the_npu(source: onnx.ModelProto) -> onnx.ModelProto:
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    model, kept = unroll(source)
    assert not kept
    assert not {n.op_type for n in model.graph.node} & {"LSTM", "GRU", "RNN"}
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    dead = [n.name for n in model.graph.node if not set(n.output) & read]
    assert not dead  # a layer whose result goes nowhere fails compile's grouping
    assert not {"W", "R", "B", "P"} & {t.name for t in model.graph.initializer}  # no dead weights
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_of(source)
    got = list(onnx_io.run(model, feeds).values())
    for want, have in zip(expected(source, feeds), got, strict=True):
        assert want.shape == have.shape
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)
    placed = check_placement(model, load_chip("npu-16m"))
    assert {p.device for p in placed} == {"npu"}, [p.reasons for p in placed if p.device != "npu"]
    return model


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction, layout, state", ALL)
def test_a_recurrent_layer_unrolls_to_what_its_kernel_computes_on_the_npu(op, direction, layout,
                                                                          state):
    """nsnet2's two GRUs and silero-vad's LSTMs ran whole on the CPU: no chip has a recurrent
    kernel. Written out step by step the NPU runs every node."""
    assert_unrolled_same_and_on_the_npu(recurrent_model(op, direction, layout, state))


@pytest.mark.parametrize("direction, layout, state", ALL)
def test_a_gru_that_resets_after_its_product_unrolls_to_what_its_kernel_computes(direction, layout,
                                                                                 state):
    """linear_before_reset (PyTorch's GRU, nsnet2's): the reset gate scales the recurrent
    product with its bias, not the state before the product."""
    assert_unrolled_same_and_on_the_npu(recurrent_model("GRU", direction, layout, state,
                                                        linear_before_reset=1))


@pytest.mark.parametrize("op, kwargs", [
    ("LSTM", {"peepholes": True}),
    ("LSTM", {"peepholes": True, "state": "none"}),
    ("LSTM", {"peepholes": True, "direction": "bidirectional", "state": "constant"}),
    ("LSTM", {"clip": 0.5}), ("GRU", {"clip": 0.5}),
    ("GRU", {"clip": 0.5, "linear_before_reset": 1}),
    ("RNN", {"clip": 0.3, "direction": "reverse"}), ("LSTM", {"clip": 0.5, "opset": 9}),
    ("LSTM", {"lengths": [5, 5]}),
    ("LSTM", {"outputs": (0, 1, 0)}), ("LSTM", {"outputs": (0, 0, 1), "direction": "reverse"}),
    ("GRU", {"outputs": (0, 1)}), ("RNN", {"outputs": (1, 0)}),
    ("LSTM", {"opset": 11, "direction": "bidirectional"}),
    ("GRU", {"opset": 11, "linear_before_reset": 1}),
    ("RNN", {"opset": 9, "direction": "bidirectional"}),
    ("LSTM", {"bias": False}), ("GRU", {"bias": False, "linear_before_reset": 1}),
    ("LSTM", {"steps": 1}), ("GRU", {"steps": 1, "batch": 1}),
    ("RNN", {"steps": 1, "state": "none"}),
    ("RNN", {"activations": ["Relu"]}), ("RNN", {"activations": ["LeakyRelu"]}),
    ("RNN", {"activations": ["LeakyRelu"], "activation_alpha": [0.2]}),
    ("RNN", {"activations": ["HardSigmoid"], "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("RNN", {"activations": ["Affine"], "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [0.7], "activation_beta": [1.4]}),
    ("RNN", {"activations": ["Elu"], "activation_alpha": [0.5]}),
    ("RNN", {"activations": ["Softsign"]}), ("RNN", {"activations": ["Softplus"]}),
    ("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}),
    ("GRU", {"activations": ["HardSigmoid", "Tanh", "Sigmoid", "Relu"], "activation_alpha": [0.3],
             "activation_beta": [0.6], "direction": "bidirectional"}),
    ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "LeakyRelu", "Tanh"],
              "activation_alpha": [0.3, 0.1], "activation_beta": [0.6],
              "direction": "bidirectional"}),
])
def test_every_attribute_of_a_recurrent_layer_unrolls_as_its_kernel_computes_it(op, kwargs):
    """Peepholes, clip (the gates' inputs, not the LSTM cell's output activation), a full
    constant sequence_lens, any subset of the outputs, old opsets (Split, Slice and Unsqueeze
    by attributes), no bias, one step, and every activation of the spec with the alphas and
    betas consumed in order by the functions that take one."""
    names = {"Softsign", "Softplus", "ThresholdedRelu", "Elu"}
    model = assert_unrolled_same_and_on_the_npu if not names & set(kwargs.get("activations", [])) \
        else _unrolled_same
    model(recurrent_model(op, **kwargs))


def _unrolled_same(source: onnx.ModelProto) -> None:
    """As `assert_unrolled_same_and_on_the_npu` for activations npu-16m has no kernel for."""
    model, kept = unroll(source)
    assert not kept and not {n.op_type for n in model.graph.node} & {"LSTM", "GRU", "RNN"}
    feeds = feeds_of(source)
    for want, have in zip(expected(source, feeds), onnx_io.run(model, feeds).values(), strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, reason", [
    ({"lengths": [5, 0]}, "its sequence_lens [5, 0] is not one length per batch entry within 1..5"),
    ({"input_forget": 1}, "input_forget couples"),
    ({"activations": ["Sigmoid", "Tanh", "Swish"]},
     "activation Swish is not one of the ONNX spec's"),
    ({"steps": 600},
     "600 steps x 4 gates x 1 directions = 2400 is more than import unrolls (2048)"),
])
def test_a_recurrent_layer_import_cannot_unroll_stays_whole_and_split_says_why(kwargs, reason):
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    source = recurrent_model("LSTM", **kwargs)
    model, kept = unroll(source)
    assert model is source and reason in kept["rnn"]
    (placed,) = check_placement(model, load_chip("npu-16m"))
    assert placed.device == "cpu" and reason in placed.reasons[0], placed.reasons


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("state", ["none", "input", "constant"])
@pytest.mark.parametrize("lengths", ["input", [5, 3, 1]])
def test_a_masked_recurrent_layer_unrolls_to_what_its_kernel_computes(op, direction, state,
                                                                      lengths):
    """A Keras mask reaches ONNX as sequence_lens (computed from the input, or constant): each
    batch entry's state is frozen past its length and its output there is 0, as ONNX
    Runtime's kernel does; the steps, Split and masked, run on the NPU."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    reset = {"linear_before_reset": 1} if op == "GRU" else {}
    source = recurrent_model(op, direction, state=state, lengths=lengths, batch=3, **reset)
    model, kept = unroll(source)
    assert not kept and not {n.op_type for n in model.graph.node} & {"LSTM", "GRU", "RNN"}
    onnx.checker.check_model(model, full_check=True)
    for feeds in (feeds_of(source), feeds_of(source, [2, 5, 4])):
        for want, have in zip(expected(source, feeds), onnx_io.run(model, feeds).values(),
                              strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)
    placed = check_placement(model, load_chip("npu-16m"))
    on_cpu = {n.op_type for n, p in zip(model.graph.node, placed) if p.device == "cpu"}
    assert on_cpu <= {"Reshape", "Cast", "Less", "Sub", "Split"}, on_cpu  # the masks, once


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_every_step_reads_one_copy_of_the_recurrent_weights(op):
    """ddddocr's bidirectional LSTM (hidden 512, 32 steps) grew from 54 MB to 306 MB when each
    step had its own copy of the recurrent weights."""
    source = recurrent_model(op, "bidirectional", steps=40, hidden=16)
    model, _ = unroll(source)
    assert onnx_io.weight_bytes(model) < 1.1 * onnx_io.weight_bytes(source)


def test_an_output_nothing_reads_is_not_computed():
    """silero-vad-v5's LSTM names Y, which nothing reads: unrolled, its Unsqueeze and Identity
    were a layer whose result went nowhere, and compile's layer grouping failed on it (as on
    the forget gate of a first step without a cell state: ddddocr's)."""
    source = recurrent_model("LSTM", steps=1)
    del source.graph.output[0]  # Y stays named on the node, read by nothing
    model, _ = unroll(source)
    produced = {o for n in model.graph.node for o in n.output}
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    assert produced <= read and "Y" not in produced
