"""An exception a stage did not expect, after every proof before it passed, is that stage's
failure naming where it happened (graph, node, tensor, sample) and what to do, never a
traceback or "likely a bug"."""

from __future__ import annotations

import pytest

from npubuild import api
from npubuild.errors import BuildError, unexpected, working_on
from npubuild.quant import reference


def test_the_innermost_place_wins_and_outer_ones_add_what_it_lacks():
    with pytest.raises(OverflowError) as err:
        with working_on(graph="graph_0", node="outer"):
            with working_on(node="/conv/Conv", tensor="y"):
                raise OverflowError("requantize: acc · multiplier leaves int64")
    assert err.value.npubuild_place == {"node": "/conv/Conv", "tensor": "y", "graph": "graph_0"}
    failure = unexpected(err.value, "quantize")
    assert str(failure).startswith("quantize: failed at graph 'graph_0', node '/conv/Conv', "
                                   "tensor 'y': OverflowError: requantize: acc · multiplier")
    assert "split.force_cpu: ['/conv/Conv']" in failure.hint
    assert "likely a bug" not in str(failure) and failure.__cause__ is err.value


def test_npubuild_errors_pass_through_unmarked():
    with pytest.raises(BuildError) as err:
        with working_on(node="n"):
            raise BuildError("a verdict")
    assert not hasattr(err.value, "npubuild_place")


def test_a_kernel_failing_in_quantize_names_the_stage_node_and_tensor(tiny_recipe, tmp_path,
                                                                     monkeypatch):
    real = reference.run_layer

    def overflowing(layer, inputs):
        if layer.kind == "conv":
            raise OverflowError("requantize: acc · multiplier leaves int64")
        return real(layer, inputs)

    monkeypatch.setattr(reference, "run_layer", overflowing)
    session = api.session_for(tiny_recipe, build_root=tmp_path / "b", cache=tmp_path / "c")
    with pytest.raises(BuildError) as err:
        api.build(session, "quantize")
    message = str(err.value)
    assert message.startswith("quantize: failed at graph 'graph_0', node ")
    assert "tensor '" in message and "OverflowError: requantize" in message
    assert "likely a bug" not in message and "the stages before quantize built" in err.value.hint


def test_running_out_of_memory_is_said_once_with_what_the_stage_holds_and_what_holds_less():
    """A MemoryError (a build under ``ulimit -v``, or numpy refusing an allocation) is the
    stage's one clear failure: out of memory, the peak the process reached, what the stage
    holds and the setting that makes it hold less, not "report it" as for a bug."""
    with pytest.raises(MemoryError) as err:
        with working_on(graph="graph_1"):
            raise MemoryError("Unable to allocate 128. MiB for an array with shape (16777216,)")
    failure = unexpected(err.value, "quantize")
    assert str(failure).startswith("quantize: ran out of memory at graph 'graph_1' (peak "
                                   "resident ")
    assert "Unable to allocate 128. MiB" in str(failure)
    assert "every verify sample" in failure.hint and "fewer verify.samples" in failure.hint
    assert "report it" not in failure.hint and failure.__cause__ is err.value
