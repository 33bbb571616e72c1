"""What a precision choice costs in time, priced as the compile stage will estimate it.

The precision search's ``quantization.auto.max_slowdown`` is judged on this figure, so it must
be compile's, not a cheaper story: pricing MACs alone plus a fixed hand-over per layer put
MediaPipe's hand landmark choice (58 int16 + 2 float tensors) at 5.1x int8's time where
compile's estimate of the built model said 2.9x, and a budget between the two refused a choice
the user would have taken.

- **NPU**: compile's own estimate (`npubuild.npu.from_qgraph.layers_from_qgraph` →
  `plan_qgraph` → `build_program` → `estimate`, the layer groups included) of each NPU graph's
  quantized graph with the choice applied: every tensor at the width the choice gives it (int16
  doubles its bytes: DMA, LMEM, slicing) and the layers the quantizer runs in float taken out
  as CPU steps between groups (their tensors cross GMEM). One plan per distinct graph choice,
  cached, and only for the choices a decision needs (`PrecisionSearch.slowdown`).
- **Host**: compile measures each float part (a CPU submodel, a float layer inside an NPU
  graph) with ONNX Runtime on the build machine, a figure that changes from run to run and so
  can never steer a search whose choice must be reproducible. Here each part costs what that
  measurement finds for it: `CPU_RUN_SECONDS` (one ONNX Runtime run: ~7 µs for a one-node
  model on the 2-core build machine, 7-9 µs for hand landmark's float layers in compile's
  report) plus its MACs at the host's rate (`npubuild.split.cost.CPU_MACS_PER_SECOND`, the
  split's one figure). A chip that runs float layers in float16 on its NPU runs them at that
  rate with no run of their own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from npubuild.quant.qgraph import QGraph
from npubuild.split.cost import CPU_MACS_PER_SECOND

CPU_RUN_SECONDS = 8e-6
"""One ONNX Runtime run of a float part on the host (its dispatch, whatever its MACs)."""


def host_seconds(macs: int, float_seconds_per_mac: float = 1.0 / CPU_MACS_PER_SECOND,
                 run_seconds: float = CPU_RUN_SECONDS) -> float:
    """One float part on the host: a run plus its MACs."""
    return run_seconds + macs * float_seconds_per_mac


def with_choice(qgraph: QGraph, dtypes: Mapping[str, str], cpu_layers: frozenset[str],
                int16_weights: frozenset[str] = frozenset()) -> QGraph:
    """``qgraph`` with each tensor of ``dtypes`` at that width, the ``cpu_layers`` run by the
    host and the ``int16_weights`` conv layers holding int16 weights (twice the weight bytes in
    GMEM, LMEM and DMA; a copy: the graph itself is not changed)."""
    tensors = {name: (replace(info, dtype=dtypes[name])
                      if name in dtypes and dtypes[name] != info.dtype else info)
               for name, info in qgraph.tensors.items()}
    layers = [replace(layer, device="cpu", kind="float")
              if layer.name in cpu_layers and layer.device != "cpu"
              else _wide_weights(layer) if layer.name in int16_weights and layer.kind == "conv"
              else layer for layer in qgraph.layers]
    return replace(qgraph, tensors=tensors, layers=layers)


def _wide_weights(layer):
    """A conv layer as W16A16 holds it, for its price: its weights int16 (the values stay
    int8's; the plan reads sizes)."""
    arrays = {**layer.arrays, "weight": layer.arrays["weight"].astype(np.int16)}
    return replace(layer, arrays=arrays)


def npu_seconds(qgraph: QGraph, chip, fits=None) -> float:
    """Compile's estimate of ``qgraph`` on ``chip``: its NPU cycles over the chip's clock
    (grouped as compile groups it; a group that does not fit LMEM runs its layer apart, as
    ``compile.on_no_fit: cpu`` would, so a price never fails). ``fits``: the
    `npubuild.npu.layer_group.GroupFits` of earlier prices on ``chip`` (choices of one graph
    share most of their groups)."""
    from npubuild.npu import build_program, estimate
    from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph

    program = build_program(plan_qgraph(layers_from_qgraph(qgraph), chip, on_no_fit="cpu",
                                        fits=fits))
    return estimate(program).cycles / (chip.clock_mhz * 1e6)


def group_fits(chip):
    """The `npubuild.npu.layer_group.GroupFits` that `npu_seconds` keeps across the prices
    of one search on ``chip`` (None without a chip)."""
    if chip is None:
        return None
    from npubuild.npu.layer_group import GroupFits

    return GroupFits(chip)


def dtypes_of(params: Mapping[str, object]) -> dict[str, str]:
    """Each tensor's width under the quantizer's parameters (None: kept in float)."""
    return {t: ("float32" if p is None else p.dtype) for t, p in params.items()}
