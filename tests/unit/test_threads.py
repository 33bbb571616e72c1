"""npubuild.threads: the one thread policy, applied where sessions open and stages run."""

import onnx
import pytest
from onnx import helper

from npubuild import onnx_io, threads


def _tiny() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _options(session):
    options = session.get_session_options()
    return options.intra_op_num_threads, options.get_session_config_entry(threads.SPINNING)


@pytest.mark.parametrize("cores", [1, 2, 64])
def test_build_sessions_have_the_same_threads_on_any_machine(monkeypatch, cores):
    """Another thread count gives other last bits (YOLOv8n-320's calibration ranges): a build's
    sessions must not follow the machine's cores, and never spin."""
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert _options(onnx_io.session(_tiny())) == (threads.SESSION_THREADS, "0")


def test_a_deployment_timing_spins_on_at_most_two_threads(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert _options(onnx_io.session(_tiny(), spinning=True)) == (1, "1")
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert _options(onnx_io.session(_tiny(), spinning=True)) == (threads.DEPLOYED_THREADS, "1")


def test_build_sessions_hold_no_arena_and_a_timed_one_does():
    """ONNX Runtime's CPU arena keeps a session's peak for its life, and a build holds many
    sessions (deepbrain's float pipeline kept 1.5 GB after one sample with arenas, 0.1 GB
    without); a session timed as a deployment runs keeps the default, as deployed."""
    assert onnx_io.session(_tiny()).get_session_options().enable_cpu_mem_arena is False
    assert onnx_io.session(_tiny(), spinning=True).get_session_options().enable_cpu_mem_arena
