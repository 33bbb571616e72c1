"""What one compute step costs on the chip's MAC array: the estimate's compute side.

Without ``chip.mac_array`` every int8 MAC runs at the array's peak (``MACs ÷ (lanes × MACs per
cycle per lane)``). With it, the rules of Arm Vela's performance model for Ethos-U apply, with
the chip's own numbers — what makes a real array slower than its peak:

- the output is computed in *microblocks* (``[h, w, c]``, 2×2×8 on Ethos-U55-256): an output of
  7×7×20 costs 4×4×3 microblocks; every *step* covers all of them for one kernel element (or
  ``kernel_elements_per_step`` of them) and one chunk of input channels, in
  ``cycles_per_step × microblocks`` cycles but never fewer than ``min_cycles_per_step``;
- a dense conv reads its input in chunks of ``ifm_depth_per_step`` channels (3 input channels
  cost as much as 32), or part-kernel first (``kernel_elements_per_step`` elements of
  ``part_kernel_depth`` channels per step) when that uses the array better;
- a depthwise conv covers ``kernel_elements_per_step`` kernel elements per step, one channel
  each: a 3×3 depthwise conv uses a few percent of the array;
- a pool takes ``max(cycles_per_step, kernel elements)`` cycles per microblock;
- the output stage writes ``output_cycles_per_element`` (by op) or, for a lookup table,
  ``activation_cycles_per_element["lut"]``: element-wise ops cost that alone, a conv the larger
  of its MAC cycles and its output cycles;
- data movement (concat, split, pad, reshape) is free: the producers write into place;
- 16-bit operands slow the MACs (`mac_rate`): with int16 activations the array runs at the
  chip's ``int16_mac_rate`` of its int8 rate, with int16 weights too at ``w16a16_mac_rate``
  (without ``mac_array``: every operation of the layer; with it: the array's cycles of a conv,
  depthwise conv, pool or fully connected layer, as Vela doubles them for a 16-bit input; the
  output stage keeps its rate);
- an element-wise op streams a constant operand (more than one element: per-channel batch norm
  left after a concat, a normalisation) at the output's shape, once per output element, from
  the memory the weights live in, and each burst of that memory (``chip.weights_burst_bytes``)
  carries one block depth of it: the op's block is the largest of whole microblocks whose input
  fits ``elementwise_block_bytes`` (``elementwise_block``), so a shallow block wastes most of
  every burst (`constant_read_bytes`; the estimate puts those bytes on the weights' port).
"""

from __future__ import annotations

from math import ceil, prod

from npubuild.npu.layers import LayerSpec
from npubuild.targets.model import Chip, MacArray

FREE_OPS = frozenset({"concat", "split", "move", "pad", "reshape"})


def compute_cycles(layer: LayerSpec, out: tuple[int, int, int, int], macs: int,
                   chip: Chip) -> int:
    """Cycles of computing ``out`` = (batch, channels, rows, W) of ``layer``'s output
    (``macs`` of them)."""
    array, rate = chip.mac_array, mac_rate(layer, chip)
    if array is None:
        return ceil(macs / (chip.lanes * chip.macs_per_cycle_per_lane * rate))
    weights = layer.attr("weights")
    if layer.op in ("move", "fc") and weights is not None:  # a fully connected layer
        cout, depth = weights
        return ceil(fully_connected_cycles(array, prod(out) // max(1, cout), cout, depth) / rate)
    if layer.op in FREE_OPS:
        return 0
    elements = prod(out)
    output = ceil(elements * output_cycles_per_element(array, layer))
    if layer.op in ("conv", "dwconv", "pool"):
        return max(ceil(array_cycles(array, layer, out) / rate), output)
    return output


def mac_rate(layer: LayerSpec, chip: Chip) -> float:
    """The layer's MACs per cycle as a fraction of int8's: 1 for int8 operands, the chip's
    ``int16_mac_rate`` with 16-bit activations, ``w16a16_mac_rate`` with 16-bit weights too."""
    return {"int16": chip.int16_mac_rate, "w16a16": chip.w16a16_mac_rate}.get(layer.precision,
                                                                               1.0)


def array_cycles(array: MacArray, layer: LayerSpec, out: tuple[int, int, int, int]) -> int:
    """The MAC array's cycles for a conv, depthwise conv or pool output block."""
    n, c, h, w = out
    uh, uw, uc = array.microblock
    xy = n * ceil(h / uh) * ceil(w / uw)
    z = ceil(c / uc)
    kh, kw = layer.attr("kernel", (layer.kernel_h, 1))
    elements = kh * kw
    if layer.op == "pool":
        return max(array.cycles_per_step, elements) * xy * z
    per_step = max(array.min_cycles_per_step, array.cycles_per_step * xy)
    if layer.op == "dwconv":
        return per_step * ceil(elements / array.kernel_elements_per_step) * z
    depth = layer.in_shapes[0][1] // max(1, layer.attr("group", 1))
    return per_step * conv_steps(array, depth, elements) * z


def conv_steps(array: MacArray, depth: int, elements: int) -> int:
    """Steps of a dense conv per microblock set: depth first (every kernel element over each
    ``ifm_depth_per_step`` chunk) or part-kernel first, whichever uses the array better."""
    uc, kps = array.microblock[2], array.kernel_elements_per_step
    depth_first = elements * ceil(depth / array.ifm_depth_per_step)
    block = _round_up(min(depth, array.part_kernel_depth), uc)
    part_first = ceil(elements / kps) * ceil(block / uc) * ceil(depth / block)
    depth_use = depth / _round_up(depth, array.ifm_depth_per_step)
    part_use = depth * elements / (_round_up(depth, uc) * _round_up(elements, kps))
    return part_first if depth <= uc or part_use > depth_use else depth_first


def fully_connected_cycles(array: MacArray, vectors: int, cout: int, depth: int) -> int:
    """A fully connected layer: a 1×1 conv over ``vectors`` output positions."""
    uh, uw, uc = array.microblock
    xy = ceil(vectors / (uh * uw))
    per_step = max(array.min_cycles_per_step, array.cycles_per_step * xy)
    return per_step * ceil(depth / array.ifm_depth_per_step) * ceil(cout / uc)


def output_cycles_per_element(array: MacArray, layer: LayerSpec) -> float:
    rates = array.output_cycles_per_element
    key = {"dwconv": "depthwise", "add": "add", "lut": "lut", "softmax": "softmax"}.get(
        layer.op, layer.op)
    if layer.op == "pool" and "max" in (layer.attr("kind"), layer.attr("mode")):
        key = "maxpool" if layer.attr("kind") != "avgpool" else "pool"
    if layer.op == "eltwise" and layer.attr("kind", layer.attr("fn")) in ("mul",):
        key = "mul"
    rate = rates.get(key, rates.get("default", 0.0))
    if layer.op == "lut":
        rate = max(rate, array.activation_cycles_per_element.get("lut", 0.0))
    return rate


ELEMENTWISE_OPS = frozenset({"add", "eltwise"})


def constant_read_bytes(layer: LayerSpec, out: tuple[int, int, int, int], constants,
                        chip: Chip) -> tuple[int, float]:
    """(bytes read, bytes the weights' memory moves for them) of the constant operands an
    element-wise step computing ``out`` streams; ``constants``: the graph's constant tensors.
    (0, 0) where the chip does not describe its bursts and element-wise blocks."""
    array, burst = chip.mac_array, chip.weights_burst_bytes
    if (layer.op not in ELEMENTWISE_OPS or array is None or burst is None
            or array.elementwise_block_bytes is None):
        return 0, 0.0
    streamed = [shape for t, shape in zip(layer.inputs, layer.in_shapes)
                if t in constants and prod(shape) > 1]  # a scalar stays in a register
    if not streamed:
        return 0, 0.0
    read = len(streamed) * prod(out) * layer.act_bytes
    depth = elementwise_block(array, out, layer.act_bytes)[2] * layer.act_bytes
    return read, read * burst / min(burst, depth)


def elementwise_block(array: MacArray, out: tuple[int, int, int, int],
                      elem_bytes: int = 1) -> tuple[int, int, int]:
    """The output block (h, w, c) an element-wise op computing ``out`` runs in, as Vela's block
    search picks it: the largest volume of whole microblocks, within ``block_max`` and ``out``
    rounded up to microblocks, whose input block (rows of 8-byte-rounded depth) fits
    ``elementwise_block_bytes``; a block holding over half the output counts double; on a tie
    the shallower block stays."""
    n, c, h, w = out
    uh, uw, uc = array.microblock
    space_h, space_w, space_c = (_round_up(min(size, most), unit) for size, most, unit in
                                 zip((h, w, c), array.block_max, array.microblock))
    elements, capacity = n * c * h * w, array.elementwise_block_bytes
    best, best_cost = (uh, uw, uc), float("inf")
    for depth in range(uc, space_c + 1, uc):
        row_bytes = _round_up(depth * elem_bytes, 8)
        for bh in range(uh, space_h + 1, uh):
            bw = min(space_w, capacity // (bh * row_bytes) // uw * uw)  # the widest that fits
            if bw < uw:
                break
            volume = bh * bw * depth
            cost = max(elements / volume, 1) / (2 if elements < 2 * volume else 1)
            if cost < best_cost:
                best, best_cost = (bh, bw, depth), cost
    return best


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to
