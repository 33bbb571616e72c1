"""tf2onnx in a child process, so that the same source converts to the same ONNX bytes.

tf2onnx's result depends on the process it runs in (onnx/tensorflow-onnx#1789, #2006): its
optimizers iterate over sets of node names (ordered by the string hash, seeded per process)
and sets of ``Node`` objects (ordered by memory address), and its generated names count up
across every conversion of the process. The same Keras EfficientNetB0 converted twice gave 322
to 327 nodes with other names each time, so an import artifact, and every stage after it,
differed between two clean builds. Here each conversion runs in a fresh interpreter with
``PYTHONHASHSEED=0`` whose ``Node`` objects hash by creation order: the same input gives the
same bytes in any process, directory or hash seed of the build.

``convert(request)`` is the parent side; ``python -m npubuild.frontends.tf2onnx_process REQUEST
OUT`` the child. A request is a JSON-able dict: ``kind`` (``graph_def``: a serialized GraphDef
file; ``tflite``: a flatbuffer file), ``path``, ``input_names``, ``output_names``, ``opset``,
and for graphs ``shape_override`` and ``tensors_to_rename``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from npubuild.errors import UserError
from npubuild.recipe.paths import package_roots

HASH_SEED = "0"


class ConversionError(RuntimeError):
    """tf2onnx failed in the child: ``kind`` is the type of the child's exception."""

    def __init__(self, message: str, kind: str = "RuntimeError"):
        super().__init__(message)
        self.kind = kind


def convert(request: dict) -> onnx.ModelProto:
    """Run one tf2onnx conversion in a child process and return its model."""
    with tempfile.TemporaryDirectory() as tmp:
        req, out, err = (Path(tmp) / name for name in ("request.json", "model.onnx", "error.json"))
        req.write_text(json.dumps(request))
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED, "TF_CPP_MIN_LOG_LEVEL": "3"}
        code = Path(__file__).resolve().parents[2]
        if not any(code.is_relative_to(root) for root in package_roots()):
            # a source tree on sys.path, not an install: the child imports this very npubuild
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-m", __name__, str(req), str(out), str(err)],
                              env=env, capture_output=True, text=True)
        if done.stderr.strip():
            logging.getLogger("npubuild").debug("tf2onnx (child process) wrote:\n%s",
                                                done.stderr.strip())
        if err.exists():
            raise _error(json.loads(err.read_text()))
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConversionError(f"the conversion process stopped (exit {done.returncode}): {tail}")
        return onnx.load_model_from_string(out.read_bytes())


def _error(found: dict) -> Exception:
    if found.get("user_error"):
        return UserError(found["message"], hint=found.get("hint"))
    return ConversionError(found["message"], found.get("kind", "RuntimeError"))


def _deterministic_nodes() -> None:
    """``Node`` objects hash by the order they were made in, not by their address."""
    from tf2onnx import graph

    made = iter(range(1, 1 << 62))
    init = graph.Node.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._creation = next(made)

    graph.Node.__init__ = __init__
    graph.Node.__hash__ = lambda self: self._creation


def _run(request: dict) -> onnx.ModelProto:
    from npubuild.frontends import tensorflow as tf_frontend, tf_loops

    tf = tf_frontend._tensorflow()  # quiet import; teaches the transpose optimizer
    _deterministic_nodes()
    from tf2onnx import convert as tf2onnx_convert

    if request["kind"] == "tflite":
        from npubuild.frontends import tflite_custom

        tflite_custom.register_handlers()
        model, _ = tf2onnx_convert.from_tflite(
            request["path"], input_names=request["input_names"],
            output_names=request["output_names"], opset=request["opset"])
        return model
    tf_loops.read_gru_cells_without_identities()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(Path(request["path"]).read_bytes())
    model, _ = tf2onnx_convert.from_graph_def(
        graph_def, input_names=request["input_names"], output_names=request["output_names"],
        opset=request["opset"], shape_override=request.get("shape_override") or None,
        tensors_to_rename=request.get("tensors_to_rename") or None)
    return model


def main(argv: list[str]) -> int:
    request_path, out_path, error_path = (Path(a) for a in argv)
    from npubuild.frontends import tensorflow as tf_frontend

    try:
        with tf_frontend._quiet():
            model = _run(json.loads(request_path.read_text()))
    except UserError as exc:
        error_path.write_text(json.dumps({"user_error": True, "message": exc.message,
                                          "hint": exc.hint}))
        return 1
    except Exception as exc:  # tf2onnx and TF raise anything from ValueError to KeyError
        error_path.write_text(json.dumps({"message": str(exc), "kind": type(exc).__name__}))
        return 1
    out_path.write_bytes(model.SerializeToString(deterministic=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
