"""Sophgo TPU-MLIR (BM1684X ...): ONNX -> bmodel, run on its cmodel simulator."""

from __future__ import annotations

from npubuild.backends import Backend, register


class TpuMlir(Backend):
    name = "tpu-mlir"
    description = "Sophgo TPU-MLIR: ONNX -> bmodel, proven on its cmodel simulator"
    toolchain = "tpu-mlir"
    runs_in = "TPU-MLIR's cmodel simulator (model_runner)"


register(TpuMlir())
