"""Whether a node fits the chip's local memory even alone: the compiler's own answer.

The split stage places a node on the NPU only when compile can run it. On a chip npubuild's own
compiler builds for (`Backend.plans_lmem`; a vendor compiler tiles for itself), besides the op
table, that means the layer fits LMEM in a group of its own under some slicing (N, H, and for
one layer C); `npubuild.npu.layer_group.fits_alone` answers with the very search compile runs, on the
layer as `npubuild.npu.from_onnx` sees the float node: int8 activations, and a conv's weights
as compile stores them (int8 weights per output channel plus its bias, multiplier and shift).
A layer that quantize later widens to int16 may still miss LMEM in compile, which
``compile.on_no_fit`` then handles.
"""

from __future__ import annotations

from dataclasses import replace

from npubuild.targets.model import Chip
from npubuild.targets.view import NodeView, is_static

LMEM_REASON = "Does not fit the NPU's local memory even alone (compile would refuse it)"


def lmem_reasons(view: NodeView, chip: Chip, act_bytes: int = 1) -> list[str]:
    """The compiler's reason when the node's layer fits LMEM in no slicing, else nothing;
    with ``act_bytes`` 2, when it would not fit with int16 activations (what the precision
    search may choose)."""
    from npubuild.npu.from_onnx import Unmodelled, node_layer
    from npubuild.npu.layer_group import fits_alone

    names = [n for n in (*view.node.input, *view.node.output) if n]
    shapes = {n: tuple(view.shape(n)) for n in names if is_static(view.shape(n))}
    consts = {n: view.facts.value(n) for n in names if view.facts.is_const(n)}
    try:
        layer = node_layer(view.node, shapes, consts)
    except (Unmodelled, KeyError, ValueError):  # not a layer the tiler models: nothing to fit
        return []
    failure = fits_alone(replace(_as_compiled(layer), act_bytes=act_bytes), chip)
    return [f"{LMEM_REASON}: {failure}"] if failure else []


def _as_compiled(layer):
    """A conv's weight bytes as compile's weight records hold them."""
    from npubuild.npu.from_qgraph import RECORD_PARAM_BYTES

    if layer.op not in ("conv", "dwconv"):
        return layer
    per_channel = layer.macs // max(1, layer.out_shapes[0][0] * layer.out_shapes[0][2]
                                    * layer.out_shapes[0][3] * layer.c_out)
    return replace(layer, weight_bytes=layer.c_out * (per_channel + RECORD_PARAM_BYTES))
