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

from npubuild.quant.qgraph import QGraph, QLayer, QTensor
from npubuild.quant.reference import quantize_inputs, run_layer, run_quantized, run_reference

__all__ = ["QGraph", "QLayer", "QTensor", "quantize_inputs", "run_layer", "run_quantized",
           "run_reference"]
