"""int8 quantization: calibration, the integer math, the integer reference, QDQ export.

The modules, in the order the quantize stage uses them:

- ``lower``, ``ops``, ``floatgraph``: an ONNX float submodel → layers of quantizable kinds;
- ``data``: calibration images / tensors → input samples;
- ``calibrate``, ``calibrators``: activation statistics (bounded histograms) → ranges
  (``CALIBRATORS``: minmax, percentile, kl, mse);
- ``schemes``: the integer arithmetic (one rounding mode), documented in one place;
- ``quantizer``: float layers + ranges → ``qgraph.QGraph`` (the format ``compile`` reads);
- ``reference``: exact integer kernels and ``run_reference``;
- ``qdq`` and ``check``: the QDQ model ONNX Runtime runs, and the comparisons;
- ``pipeline``, ``workflow``: the split pipeline end to end (used by ``stages/quantize.py``).
"""

from importlib import import_module

#: The package's names, imported on first use: a light module (``data``, which `validate`
#: uses to check images) does not pull in the integer reference with them.
_EXPORTS = {"QGraph": "qgraph", "QLayer": "qgraph", "QTensor": "qgraph",
            "quantize_inputs": "reference", "run_layer": "reference",
            "run_quantized": "reference", "run_reference": "reference"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"npubuild.quant.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'npubuild.quant' has no attribute {name!r}")
