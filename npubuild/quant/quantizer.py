"""Float layer graph + calibration statistics + recipe choices → ``QGraph``.

1. placement: ``float`` layers (no integer kernel, or a float override) run on the CPU;
2. tensor types: a tensor only CPU layers touch stays float32; int16 where overridden; else int8;
3. tensor parameters from the calibrated range (``calibrators``; an int16 tensor's reaches past
   it by the calibration samples' spread, `calibrators.wide_range`, up to what its layer can
   produce) under the scheme (``schemes.choose_params``). The graph's outputs keep their
   observed min/max whatever the method: they go to CPU post-processing or the user, and an
   output that concatenates unlike things (YOLO's boxes in pixels beside scores in [0, 1]) is
   exactly what a clipping method (percentile, kl, mse) must not clip. Concat inputs used only
   by the concat take its parameters (one rounding instead of two); data-movement layers
   (maxpool, reshape, transpose, slice, split, pad, nearest resize) pass their input's
   parameters to their outputs unchanged;
4. integer weights, biases, requantization multipliers and tables, per layer kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Callable

import numpy as np

from npubuild.errors import working_on
from npubuild.quant import calibrators, rounding, schemes
from npubuild.quant.floatgraph import FLOAT_OVERRIDE, FLayer, FloatGraph
from npubuild.quant.qgraph import DATA_MOVEMENT, QGraph, QLayer, QTensor
from npubuild.quant.reference import window_counts
from npubuild.quant.schemes import QParams

PASS_THROUGH = set(DATA_MOVEMENT)
# A tensor whose calibrated mean |x| is below this many int8 steps underflows int8 (its typical
# value rounds to a step or two); with ``int16_underflow`` it becomes int16.
MIN_TYPICAL_STEPS = 2.0
# A tensor whose loudest calibration sample's typical value (median |x|) is under this many
# int16 steps has its range set by a few values thousands of times larger (a transformer's
# residual stream with outlier channels): int16 holds most of its values in 4 bits or fewer.
COARSE_TYPICAL_STEPS = 16.0
# A graph-output concat whose inputs' ranges differ by more than this factor would lose more
# than 4 bits of its smallest input on one shared scale (YOLO's boxes in pixels beside scores
# in [0, 1]): its inputs keep their own scales and the host joins them.
UNLIKE_RANGES = 16.0
# A lookup table whose int8 input steps alone cost its output more than this (estimated on the
# calibrated input histogram) reads int16 instead, with ``int16_underflow``: a sigmoid of
# logits around -10 turns an input step of 0.2 into a 20 % relative error.
MIN_LUT_SQNR_DB = 30.0
# A channel spanning at least this fraction of an int8 step is alive (verify's DEAD_SPAN of
# the tensor's range is a quarter of a 255-step int8 range).
DEAD_STEP_FRACTION = 0.25
SHARES_CONCAT_SCALE = {"conv", "lut", "add", "mul", "matmul", "layernorm", "lrn", "rescale",
                       "avgpool",
                       "concat"}


@dataclass(frozen=True)
class QuantConfig:
    scheme: str = "pow2_symmetric"
    granularity: str = "per_tensor"
    method: str = "minmax"
    percentile: float = 99.99
    bias: str = "int32"
    bias_correction: bool = True
    weight_rounding: str = "nearest"   # or "gptq": rounded to keep each layer's output close
    int16_tensors: frozenset[str] = frozenset()
    # W16A16: tensors (int16 themselves) whose weighted readers (conv, Gemm, MatMul by a
    # constant: ``conv`` layers) carry int16 weights and an int64 bias where int8 weights
    # bound the model (`weight_dtype`)
    int16_weight_inputs: frozenset[str] = frozenset()
    float_tensors: frozenset[str] = frozenset()
    int16_underflow: bool = False   # the chip has int16: tensors that underflow int8 use it
    tensor_methods: tuple[tuple[str, str], ...] = ()  # (tensor, method) where not ``method``
    # the chip's `fc_integer_ranks`: input ranks of an int8 fully connected layer (None: any);
    # a fully connected layer kept in float keeps its output in float there too
    fc_integer_ranks: tuple[int, ...] | None = None
    # the chip's `vendor_kernel`s: (op, int8 | float16) where its toolchain runs a node npubuild
    # has no integer kernel for on the NPU all the same, from the QDQ model it is handed
    vendor_kernels: tuple[tuple[str, str], ...] = ()

    @property
    def per_channel(self) -> bool:
        return self.granularity == "per_channel"

    def method_of(self, tensor: str) -> str:
        """The calibration method of one tensor: its own where chosen, else ``method``."""
        return self._own_methods.get(tensor, self.method)

    @cached_property
    def _own_methods(self) -> dict[str, str]:  # asked per tensor, per quantizer
        return dict(self.tensor_methods)


@dataclass
class TensorRecord:
    """What calibration.json says about one tensor."""

    stats: dict
    range: tuple[float, float] | None
    params: QParams | None
    source: str = "calibrated"

    def as_dict(self) -> dict:
        out = dict(self.stats)
        out["range"] = list(self.range) if self.range else None
        out["source"] = self.source
        if self.params is not None:
            out.update(dtype=self.params.dtype, scale=self.params.scale,
                       zero_point=self.params.zero_point, log2scale=self.params.log2scale)
        else:
            out["dtype"] = "float32"
        return out


# `schemes.choose_params` of a range, remembered: a pure function of its arguments that each
# quantizer asks per tensor (twice where int16_underflow checks it), and the precision search
# builds one quantizer per choice it scores or prices (GTCRN: 5,000 tensors, 1.2 M calls)
_chosen_params = lru_cache(maxsize=1 << 16)(schemes.choose_params)


#: Ops a fully connected layer is made of (`QuantConfig.fc_integer_ranks`).
FC_OPS = frozenset({"MatMul", "Gemm"})


def moved_by_float(layer: FLayer, float_tensors) -> bool:
    """Whether ``layer`` goes to the CPU because it reads or writes a tensor kept in float
    (a quantization override or the precision search's choice)."""
    return layer.kind != "float" and not float_tensors.isdisjoint([*layer.inputs, *layer.outputs])


def _reads_integers(layer: FLayer) -> bool:
    """Whether ``layer`` runs on integer tensors: an integer kernel, or a float one the chip's
    toolchain runs in its own int8 kernel (`QuantConfig.vendor_kernels`)."""
    return layer.kind != "float" or layer.attrs.get("vendor_kernel") == "int8"


@dataclass
class Quantizer:
    fg: FloatGraph
    stats: dict[str, calibrators.TensorStats]
    config: QuantConfig
    params: dict[str, QParams] = field(default_factory=dict)
    records: dict[str, TensorRecord] = field(default_factory=dict)
    const_values: dict[str, np.ndarray] = field(default_factory=dict)
    # (tensor, method, scheme, dtype) -> calibrated range: the precision search asks for the
    # same ranges under hundreds of choices (kl alone searches thresholds per tensor)
    ranges: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    # what the quantizers of one float graph and its statistics share besides ranges (the
    # precision search's, per graph): each layer's placement, each constant's integers, each
    # tensor's parameters, keyed by what they are computed from (a name of this graph and the
    # choices that bear on it), so a choice costs a look-up where it leaves a tensor alone
    # (GTCRN: 4,300 layers, 5,000 tensors, one quantizer per budget trial)
    memo: dict[tuple, object] = field(default_factory=dict)
    # the layers placed and their tensors' parameters chosen, once per quantizer (the
    # precision search asks a choice's `tensor_params` and then its `weighted` graph)
    _typed: list[FLayer] | None = field(default=None, init=False, repr=False)
    _names: list[str] | None = field(default=None, init=False, repr=False)

    def run(self, name: str) -> QGraph:
        return self._qgraph(name, lambda layer: True)

    def weighted(self, name: str) -> QGraph:
        """`run`'s graph with only its integer conv layers built (every tensor, every
        constant): the weights, biases and constants a choice of the precision search
        quantizes (`fakequant.choice_inputs`), without the tables the other layers take. Its
        layers are read, never changed: each is the one `memo` holds for what it is built
        from (its input's and output's parameters, its weights' dtype, the configuration's
        scheme, granularity, rounding and bias), so a choice builds only the conv layers
        whose tensors it changes (PP-OCRv5 rec's search built its 47 conv layers for each of
        44 choices: 4.1 of its 68 s of searched quantize under cProfile)."""
        return self._qgraph(name, lambda layer: layer.kind == "conv", self._kept_conv)

    def _kept_conv(self, layer: FLayer) -> QLayer:
        """`_build` of the conv ``layer``, once per what it is built from (see `weighted`)."""
        cfg = self.config
        table = self._table("conv layers", cfg.scheme, cfg.granularity, cfg.weight_rounding,
                            cfg.bias, cfg.bias_correction)
        key = (layer.name, self.p(layer.inputs[0]), self.p(layer.outputs[0]),
               self.weight_dtype(layer))
        found = table.get(key)
        if found is None:
            found = table[key] = self._build(layer)
        return found

    def _qgraph(self, name: str, built, build=None) -> QGraph:
        layers = self._typed_layers()
        qlayers = [(build or self._build)(layer) for layer in layers if built(layer)]
        tensors = {t: self._qtensor(t) for t in self._names}
        return QGraph(name, self.config.scheme, self.config.granularity, list(self.fg.inputs),
                      list(self.fg.outputs), tensors, qlayers, dict(self.const_values))

    def tensor_params(self) -> tuple[dict[str, QParams | None], set[str]]:
        """Every activation's parameters under this configuration (None: it stays float) and
        the layers it places on the CPU, without building a layer: what the precision search
        feeds its fake-quant model."""
        layers = self._typed_layers()
        return ({t: self.params.get(t) for t in self._names if t not in self.fg.constants},
                {layer.name for layer in layers
                 if (layer.kind == "float" and layer.attrs.get("vendor_kernel") != "int8")
                 or self.kernel_refusal(layer)})

    def weight_dtype(self, layer: FLayer) -> str:
        """The weights' dtype of a ``conv`` layer: int16 where its input is an int16 tensor
        chosen for W16A16 (`QuantConfig.int16_weight_inputs`), else int8."""
        x = layer.inputs[0]
        wide = (x in self.config.int16_weight_inputs and x in self.params
                and self.params[x].dtype == "int16")
        return "int16" if wide else "int8"

    def int16_weight_layers(self) -> frozenset[str]:
        """The integer ``conv`` layers that carry int16 weights under this configuration
        (after `tensor_params` or `run`): what the fake-quant model switches to its int16
        weights."""
        return frozenset(layer.name for layer in self.fg.layers
                         if layer.kind == "conv" and layer.inputs[0] in self.params
                         and self.weight_dtype(layer) == "int16")

    def kernel_refusal(self, layer: FLayer) -> str | None:
        """Why no integer kernel takes ``layer`` at its tensors' parameters (it then runs in
        float on the CPU), else None: a softmax's division must stay in int64. The builders
        and the precision search's placement both ask here."""
        if layer.kind == "softmax":
            length = self.fg.shapes[layer.inputs[0]][layer.attrs["axis"]]
            if softmax_arithmetic(length, self.p(layer.outputs[0]).scale) is None:
                return f"a row of {length} values at this output scale leaves int64 in the division"
        return None

    def _typed_layers(self) -> list[FLayer]:
        if self._typed is None:
            layers = self._placed_layers()
            self._names = self._tensor_names(layers)
            self._choose_params(layers, self._dtypes(layers))
            self._typed = layers
        return self._typed

    def _placed_layers(self) -> list[FLayer]:
        """Every layer placed; where the chip takes a fully connected layer kept in float only
        with a float output (`QuantConfig.fc_integer_ranks`), or runs a layer npubuild has no
        integer kernel for in float16 (`QuantConfig.vendor_kernels`), those outputs are kept
        in float too, and so on through the layers that read them."""
        floats = set(self.config.float_tensors)
        # a layer's placement reads of the float tensors only whether it touches one
        placed = self._table("placed", self.config.vendor_kernels, self.config.fc_integer_ranks)
        while True:
            layers = []
            for layer in self.fg.layers:
                key = (layer.name, not (floats.isdisjoint(layer.inputs)
                                        and floats.isdisjoint(layer.outputs)))
                found = placed.get(key)
                if found is None:
                    found = placed[key] = self._placed(layer, floats)
                layers.append(found)
            more = {t for layer in layers if self._float_output(layer) for t in layer.outputs} - floats
            if not more:
                return layers
            floats |= more

    def _float_output(self, layer: FLayer) -> bool:
        """Whether the chip's toolchain takes the float ``layer`` only with a float output: one
        its own kernel runs in float16, or a fully connected layer (or any MatMul, Gemm) on a
        chip with `fc_integer_ranks`; a layer its int8 kernel runs keeps its integer output."""
        if not layer.is_float:
            return False
        if "vendor_kernel" in layer.attrs:
            return layer.attrs["vendor_kernel"] == "float16"
        if self.config.fc_integer_ranks is None:
            return False
        return bool(layer.attrs.get("fc")) or not FC_OPS.isdisjoint(
            self._op_types.get(n) for n in layer.source_nodes)

    def _table(self, *key) -> dict:
        """One table of `memo` (what it holds and the choices its entries depend on)."""
        table = self.memo.get(key)
        if table is None:
            table = self.memo[key] = {}
        return table

    @property
    def _nodes(self) -> dict:
        table = self._table("nodes")
        if not table:
            table.update((n.name, n) for n in self.fg.model.graph.node)
        return table

    @property
    def _op_types(self) -> dict[str, str]:
        table = self._table("op types")
        if not table:
            table.update((name, n.op_type) for name, n in self._nodes.items())
        return table

    def _fc_rank_refused(self, layer: FLayer) -> int | None:
        """The input rank of a fully connected layer the chip takes in int8 only at other
        ranks, else None."""
        ranks = self.config.fc_integer_ranks
        if ranks is None or layer.is_float or not layer.attrs.get("fc"):
            return None
        rank = len(self.fg.shapes.get(layer.inputs[0]) or [])
        return rank if rank not in ranks else None

    def calibrated(self, t: str, dtype: str = "int8") -> tuple[float, float]:
        """``t``'s range for ``dtype``: graph outputs keep min/max, the others their method's;
        a decision's logit calibration saw on one side only, and its output, widened as
        `decisions` says."""
        key = self._range_key(t, dtype)
        if key not in self.ranges:
            stats = self.stats.get(t) or calibrators.TensorStats()
            method = key[1]
            lo, hi = calibrators.calibrated_range(
                stats, method, self.config.scheme,
                calibrators.CalibrationOptions(self.config.percentile, dtype))
            decision = self.decisions.get(t)
            if decision is not None and self._one_sided(decision[1]):
                bounds = decision[0]
                if bounds is None:  # the logit
                    lo, hi = -max(abs(lo), abs(hi)), max(abs(lo), abs(hi))
                else:
                    lo, hi = min(lo, bounds[0]), max(hi, bounds[1])
            self.ranges[key] = (lo, hi)
        return self.ranges[key]

    @property
    def decisions(self) -> dict[str, tuple]:
        """The graph outputs of one value per sample (`_one_value`) a point-symmetric saturating
        table computes (`decision_function`: a binary classifier's Sigmoid, a Tanh) and their
        inputs (the logits), each mapped to (the function's whole range, or None for a logit;
        the logit's name). Such an output is read where its logit crosses 0. Where calibration
        saw the logit on one side of 0 only (`_one_sided`: samples all of one class), the
        logit's range is made symmetric about 0 (the magnitude one class reaches is the one the
        other does) and the output's spans the function's range. Calibrated on their own,
        CapSpot's icon matcher's six pairs (scored 0.006 to 0.41) ended its logit's range at 0
        and its output's at 0.41: the three verify pairs it scores above 0.5 came out below
        (IoU above 0.5: 0). A logit calibration saw on both sides keeps its range."""
        table = self._table("decisions")
        if "" not in table:
            table[""] = None
            for layer in self.fg.layers:
                out = layer.outputs[0]
                bounds = (decision_function(layer.fn) if layer.kind == "lut"
                          and out in self.fg.outputs and self._one_value(out) else None)
                if bounds is not None:
                    table[layer.outputs[0]] = (bounds, layer.inputs[0])
                    table.setdefault(layer.inputs[0], (None, layer.inputs[0]))
        return table

    def _one_value(self, t: str) -> bool:
        """Whether ``t`` holds one value per sample (its shape's product is 1): a decision read
        as one number. A map of scores (anchors, pixels, frames) keeps its calibrated range:
        its many small values are what its cosine judges, and the function's whole range would
        round them away (a Sigmoid of logits around -14 in int8: every score 0)."""
        shape = self.fg.shapes.get(t)
        return shape is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) == 1

    def _one_sided(self, logit: str) -> bool:
        """Whether calibration saw ``logit`` on one side of 0 only."""
        stats = self.stats.get(logit)
        return bool(stats is not None and stats.count and (stats.min >= 0 or stats.max <= 0))

    def _range_key(self, t: str, dtype: str = "int8") -> tuple:
        """What ``t``'s calibrated range for ``dtype`` is computed from, beside its statistics."""
        method = "minmax" if t in self.fg.outputs else self.config.method_of(t)
        return (t, method, self.config.scheme, dtype, self.config.percentile)

    # ---- placement and types ----------------------------------------------------------

    def _vendor_kernel(self, layer: FLayer, float_tensors) -> str | None:
        """How the chip's toolchain runs ``layer`` on the NPU where npubuild has no integer
        kernel for it (`QuantConfig.vendor_kernels`) and every input is an activation (beside
        a float constant, the result's QuantizeLinear is what the toolkit stops on): int8, or
        float16 where the layer touches a tensor kept in float (its int8 kernel needs integer
        tensors on both sides); None: not such a layer (a quantization override keeps one in
        float as it says)."""
        if not layer.is_float or layer.reason == FLOAT_OVERRIDE or len(layer.source_nodes) != 1:
            return None
        node = self._nodes.get(layer.source_nodes[0])
        if node is None or not set(filter(None, node.input)) <= set(layer.inputs):
            return None
        kernel = dict(self.config.vendor_kernels).get(node.op_type)
        if kernel == "int8" and not float_tensors.isdisjoint([*layer.inputs, *layer.outputs]):
            return "float16"
        return kernel

    def _placed(self, layer: FLayer, float_tensors=None) -> FLayer:
        float_tensors = self.config.float_tensors if float_tensors is None else float_tensors
        if layer.kind == "matmul" and "MatMul" in dict(self.config.vendor_kernels):
            # the toolkit's own MatMul kernel was measured against its model (the chip file's
            # note); npubuild's integer one is for the chips it compiles itself
            layer = replace(layer, kind="float", reason="a MatMul of two activations")
        kernel = self._vendor_kernel(layer, float_tensors)
        if kernel is not None:
            how = ("in its own int8 kernel, from the Q/DQ around it" if kernel == "int8" else
                   "in float16, its output kept in float")
            return replace(layer, attrs={**layer.attrs, "vendor_kernel": kernel}, reason=(
                f"no integer kernel in npubuild ({layer.reason}): the chip's toolchain runs it "
                f"on the NPU {how}"))
        inputs = [t for t in layer.inputs if t not in self.fg.constants]
        rank = self._fc_rank_refused(layer)
        if rank is not None:
            ranks = " or ".join(map(str, self.config.fc_integer_ranks))
            return replace(layer, kind="float", inputs=inputs, reason=(
                f"the chip's toolchain takes a fully connected layer in int8 only on a {ranks}-D "
                f"input (this one is {rank}-D): it runs in float16, its output kept in float"))
        if moved_by_float(layer, float_tensors):
            return replace(layer, kind="float", inputs=inputs,
                           reason="touches a tensor kept in float by a quantization override")
        ratio = self._unlike_output_slices(layer)
        if ratio:
            return replace(layer, kind="float", reason=(
                f"output concat of slices whose ranges differ {ratio:.0f}x: each slice leaves "
                "the NPU at its own scale and the host joins them"))
        return layer

    def _unlike_output_slices(self, layer: FLayer) -> float | None:
        """The range ratio of a graph-output concat's inputs, when one scale cannot hold them."""
        if layer.kind != "concat" or not set(layer.outputs) & set(self.fg.outputs):
            return None
        spans = [self.stats[t].absmax for t in layer.inputs if t in self.stats]
        if len(spans) < 2 or min(spans) <= 0:
            return None
        ratio = max(spans) / min(spans)
        return ratio if ratio > UNLIKE_RANGES else None

    def _underflows(self, t: str) -> bool:
        """Whether int8 parameters from the calibrated range leave ``t``'s typical value (its
        median |x|, `TensorStats.typical_abs`) under ``MIN_TYPICAL_STEPS`` steps: tiny
        activations beside rare large ones. (The mean missed Sigmoid score maps: 1 % of
        scores near 0.9 lift the mean of 99 % near 0.001 above two steps.)"""
        stats = self.stats.get(t)
        if stats is None or not stats.count or stats.mean_abs == 0:
            return False
        lo, hi = self.calibrated(t)
        step = _chosen_params(self.config.scheme, lo, hi, "int8").scale
        return stats.typical_abs < MIN_TYPICAL_STEPS * step or (
            t in self.fg.outputs and self._kills_channels(stats, step))

    def quiet_in_int16(self, t: str) -> bool:
        """Whether int16 parameters from ``t``'s calibrated range leave the typical value of
        its quietest calibration sample (its median |x|) under ``MIN_TYPICAL_STEPS`` steps
        where its loudest sample's is not: a range across samples wider than int16 holds (a
        power spectrum 500 times quieter in amplitude is 250,000 times smaller; GTCRN's
        quietest verify frame had 79 % of its power bins under one int16 step, and a Sqrt or
        Log after it turns those into noise). Float is then the precision that holds both;
        the precision search tries it first (`npubuild.quant.search`)."""
        stats = self.stats.get(t)
        if stats is None or not stats.count or stats.sample_typical_high <= 0:
            return False
        lo, hi = self.calibrated(t, "int16")
        step = float(np.max(_chosen_params(self.config.scheme, lo, hi, "int16").scale))
        return stats.sample_typical_low < MIN_TYPICAL_STEPS * step <= stats.sample_typical_high

    def coarse_in_int16(self, t: str) -> bool:
        """Whether int16 parameters from ``t``'s calibrated range leave the typical value of
        even its loudest calibration sample (its median |x|) under ``COARSE_TYPICAL_STEPS``
        steps: a range set by a few values thousands of times the typical one. A transformer's
        residual stream is the case (LLM.int8's finding in T5, OPT, BLOOM: a few channels
        reach 1e5 where most values sit under 50; flan-t5's encoder, block 7: an int16 step of
        6 where the median |x| is 45), and the norm after it weighs the outlier channels down,
        so its output is made of what int16 held in a few bits: int16 on every tensor missed,
        float on the residual stream alone passed. Float is then the precision that holds it;
        the precision search tries it (`npubuild.quant.search`)."""
        stats = self.stats.get(t)
        if stats is None or not stats.count or stats.sample_typical_high <= 0:
            return False
        lo, hi = self.calibrated(t, "int16")
        step = float(np.max(_chosen_params(self.config.scheme, lo, hi, "int16").scale))
        return stats.sample_typical_high < COARSE_TYPICAL_STEPS * step

    @staticmethod
    def _kills_channels(stats, step: float) -> bool:
        """Whether an output has a channel that varies by more than a quarter of an int8 step
        but less than one: int8 hands it on as a constant (a dead channel, which verify fails
        always), judged on the calibration data's per-channel ranges."""
        span = stats.channel_span
        return span is not None and bool(np.any((span >= DEAD_STEP_FRACTION * step) & (span < step)))

    def _dtypes(self, layers: list[FLayer]) -> dict[str, str]:
        uses: dict[str, int] = {}
        read_as_integers: set[str] = set()
        producer: dict[str, FLayer] = {}
        for layer in layers:
            integer = _reads_integers(layer)
            for t in layer.inputs:
                uses[t] = uses.get(t, 0) + 1
                if integer:
                    read_as_integers.add(t)
            for t in layer.outputs:
                producer[t] = layer
        cfg, constants = self.config, self.fg.constants
        # each a function of the tensor's statistics and range key alone, asked per choice
        underflows = self._table("underflows")
        dtypes = {}
        for t in self._names:
            if t in constants:  # an operand: int16 where chosen, as an activation
                dtypes[t] = "int16" if t in cfg.int16_tensors else "int8"
                continue
            made_on_cpu = t not in producer or not _reads_integers(producer[t])
            if made_on_cpu and t not in read_as_integers:
                dtypes[t] = "float32"
                continue
            wide = t in cfg.int16_tensors or t in cfg.int16_weight_inputs
            if not wide and cfg.int16_underflow:
                key = self._range_key(t)
                wide = underflows.get(key)
                if wide is None:
                    wide = underflows[key] = self._underflows(t)
            dtypes[t] = "int16" if wide else "int8"
        if cfg.int16_underflow:
            sqnr = self._table("lut input sqnr")
            for layer in layers:
                if layer.kind != "lut":
                    continue
                key = (layer.name, self._range_key(layer.inputs[0]))
                db = sqnr.get(key)
                if db is None:
                    db = sqnr[key] = self._lut_input_sqnr_db(layer)
                if db < MIN_LUT_SQNR_DB:
                    dtypes[layer.inputs[0]] = "int16"
        for layer in reversed(layers):  # data movement keeps its input's type: int16 goes upstream
            if layer.kind == "float" or not any(dtypes.get(t) == "int16" for t in layer.outputs):
                continue
            if self._passes_through(layer):
                dtypes[layer.inputs[0]] = "int16"
            elif layer.kind == "concat":  # inputs written straight at the concat's type
                for t in layer.inputs:
                    src = producer.get(t)
                    if (src is not None and src.kind in SHARES_CONCAT_SCALE and uses.get(t) == 1
                            and t not in self.fg.outputs):
                        dtypes[t] = "int16"
        return dtypes

    def _lut_input_sqnr_db(self, layer: FLayer) -> float:
        """SQNR of a table's output caused by int8 input steps alone, over the calibrated input
        histogram (inf without one)."""
        stats = self.stats.get(layer.inputs[0])
        if stats is None or stats.hist is None or layer.fn is None or not stats.hist.any():
            return float("inf")
        half = calibrators.HIST_BINS // 2
        centers = (np.arange(calibrators.HIST_BINS) - half + 0.5) * (stats.range / half)
        keep = stats.hist > 0
        x, weight = centers[keep].astype(np.float32), stats.hist[keep].astype(np.float64)
        lo, hi = self.calibrated(layer.inputs[0])
        p = schemes.choose_params(self.config.scheme, lo, hi, "int8")
        xq = schemes.dequantize(schemes.quantize(x, p.scale, p.zero_point, p.dtype), p.scale,
                                p.zero_point)
        with np.errstate(all="ignore"):
            f = np.asarray(layer.fn(x), np.float64)
            fq = np.asarray(layer.fn(xq), np.float64)
        signal, noise = float(np.sum(weight * f * f)), float(np.sum(weight * (f - fq) ** 2))
        if not np.isfinite(signal + noise) or noise == 0:
            return float("inf")
        return 10.0 * np.log10(signal / noise) if signal > 0 else float("-inf")

    def _tensor_names(self, layers: list[FLayer]) -> list[str]:
        seen = dict.fromkeys(self.fg.inputs)
        for layer in layers:
            seen.update(dict.fromkeys([*layer.inputs, *layer.outputs]))
        return list(seen)

    # ---- parameters -------------------------------------------------------------------

    def _choose_params(self, layers: list[FLayer], dtypes: dict[str, str]) -> None:
        cfg = self.config
        producer = {t: layer for layer in layers for t in layer.outputs}
        constants = self._table("constants", cfg.scheme)
        chosen = self._table("params", cfg.method)
        fixed = self._integer_io_params(layers, dtypes)
        for t, dtype in dtypes.items():
            if t in fixed:
                stats = self.stats.get(t) or calibrators.TensorStats()
                self.params[t], why = fixed[t]
                self.records[t] = TensorRecord(stats.as_dict(), None, fixed[t][0], why)
                continue
            if t in self.fg.constants:
                found = constants.get((t, dtype))
                if found is None:
                    found = constants[(t, dtype)] = self._quantized_constant(t, dtype)
                self.params[t], self.const_values[t], self.records[t] = found
                continue
            if dtype == "float32":
                stats = self.stats.get(t) or calibrators.TensorStats()
                self.records[t] = TensorRecord(stats.as_dict(), None, None)
                continue
            # an int8 tensor's parameters read its range alone; a wider one's, what its
            # producer can output too (`_reachable`: its kind as placed, a table's input range)
            src = producer.get(t) if dtype != "int8" else None
            key = (self._range_key(t, dtype), None if src is None else (
                src.name, src.kind, self._range_key(src.inputs[0], dtypes.get(
                    src.inputs[0], "int8")) if src.kind == "lut" else None))
            found = chosen.get(key)
            if found is None:
                found = chosen[key] = self._chosen(t, dtype, src, dtypes)
            self.params[t], self.records[t] = found
        self._share_concat_params(layers)
        for layer in layers:
            if layer.kind == "float" or not self._passes_through(layer):
                continue
            src = self.params[layer.inputs[0]]
            for out in layer.outputs:
                self.params[out] = src
                record = self.records[out]
                self.records[out] = TensorRecord(record.stats, record.range, src,
                                                 f"shared with {layer.inputs[0]} ({layer.kind})")

    def _integer_io_params(self, layers: list[FLayer], dtypes: dict[str, str]
                           ) -> dict[str, tuple[QParams, str]]:
        """The parameters a model's integer I/O fixes (`ops.integer_io`): its int8 tensor
        holds integers (scale 1, zero point 0: the model's input fed as it is, its output
        read as it is). An input's float side takes the DequantizeLinear's own ``(s, z)``
        where the scheme has them (the conversion is then the identity on the integers), else
        its calibrated ones (it requantizes on the NPU). An output's float side keeps its
        calibrated parameters and the QuantizeLinear requantizes on the NPU, as the host did
        (taking the QuantizeLinear's own moved micro speech's worst cosine 0.99905 → 0.99875).
        Set at the tensor a chain of pass-through layers (a Reshape, a Transpose) starts
        from."""
        producer = {t: layer for layer in layers for t in layer.outputs}

        def root(t: str) -> str:
            while t in producer and self._passes_through(producer[t]):
                t = producer[t].inputs[0]
            return t

        fixed: dict[str, tuple[QParams, str]] = {}
        for layer in layers:
            side = layer.attrs.get("integer_io") if layer.kind == "rescale" else None
            if side is None:
                continue
            integer, real = ((root(layer.inputs[0]), layer.outputs[0]) if side == "input"
                             else (layer.outputs[0], root(layer.inputs[0])))
            if dtypes.get(integer, "float32") == "float32":
                continue
            fixed.setdefault(integer, (QParams(1.0, 0, 0 if self.pow2 else None, dtypes[integer]),
                                       f"the model's integer {side}"))
            own = _scheme_params(self.config.scheme, layer.attrs.get("divisor", layer.attrs["factor"]),
                                 layer.attrs.get("input_offset", layer.attrs.get("output_offset")))
            if side == "input" and own is not None and dtypes.get(real) == "int8" \
                    and real not in self.fg.outputs:
                fixed.setdefault(real, (own, f"the model's integer {side}'s own parameters"))
        return fixed

    def _chosen(self, t: str, dtype: str, producer: FLayer | None, dtypes: dict[str, str]
                ) -> tuple[QParams, TensorRecord]:
        """An integer activation's parameters and its record."""
        cfg = self.config
        stats = self.stats.get(t) or calibrators.TensorStats()
        lo, hi = self.calibrated(t, dtype)
        if dtype != "int8":
            lo, hi = self._reachable(producer, stats, lo, hi, dtypes)
        params = _chosen_params(cfg.scheme, lo, hi, dtype)
        source = ("graph output: min/max" if t in self.fg.outputs else "calibrated"
                  if cfg.method_of(t) == cfg.method else f"calibrated ({cfg.method_of(t)})")
        return params, TensorRecord(stats.as_dict(), (lo, hi), params, source)

    def _reachable(self, layer: FLayer | None, stats, lo: float, hi: float,
                   dtypes: dict[str, str]) -> tuple[float, float]:
        """``(lo, hi)`` within what ``layer`` can output, never inside what calibration saw:
        a table's function over its input's range (a Sigmoid's (0, 1)), a folded Clip's
        bounds. int16's headroom past the calibrated range (`calibrators.wide_range`) stops
        there: a value no input can produce is a waste of steps."""
        if layer is None or layer.kind == "float":
            return lo, hi
        bounds = None
        if layer.kind == "lut" and layer.fn is not None:
            x_lo, x_hi = self.calibrated(layer.inputs[0], dtypes.get(layer.inputs[0], "int8"))
            x = np.linspace(x_lo, x_hi, 4097, dtype=np.float32)
            with np.errstate(all="ignore"):
                y = np.asarray(layer.fn(x), np.float64)
            y = y[np.isfinite(y)]
            if y.size:
                bounds = (float(y.min()), float(y.max()))
        elif layer.activation[0] == "clip":
            _, a, b = layer.activation
            bounds = (-math.inf if a is None else float(a), math.inf if b is None else float(b))
        if bounds is None or not stats.count:
            return lo, hi
        return (max(lo, min(bounds[0], stats.min, 0.0)), min(hi, max(bounds[1], stats.max, 0.0)))

    def _share_concat_params(self, layers: list[FLayer]) -> None:
        """A concat input whose only consumer is the concat, made by a layer that rounds
        anyway, is written directly at the concat's scale: one rounding instead of two."""
        producer = {t: layer for layer in layers for t in layer.outputs}
        uses: dict[str, int] = {}
        for layer in layers:
            for t in layer.inputs:
                uses[t] = uses.get(t, 0) + 1
        for layer in reversed(layers):
            if layer.kind != "concat":
                continue
            out = self.params[layer.outputs[0]]
            for t in layer.inputs:
                src = producer.get(t)
                if (src is None or src.kind not in SHARES_CONCAT_SCALE or uses.get(t) != 1
                        or t in self.fg.outputs or self.params[t].dtype != out.dtype):
                    continue
                self.params[t] = out
                record = self.records[t]
                self.records[t] = TensorRecord(record.stats, record.range, out,
                                               f"shared with {layer.outputs[0]} (concat)")

    def _passes_through(self, layer: FLayer) -> bool:
        if layer.kind == "resize":
            return layer.attrs["mode"] == "nearest"
        return layer.kind in PASS_THROUGH

    def _quantized_constant(self, name: str, dtype: str = "int8"
                            ) -> tuple[QParams, np.ndarray, TensorRecord]:
        """A constant operand's parameters, integers and record (read only once made: the
        quantizers of one graph share them)."""
        value = np.asarray(self.fg.constants[name], np.float64)
        p = schemes.choose_params(self.config.scheme, float(value.min(initial=0)),
                                  float(value.max(initial=0)), dtype)
        values = schemes.quantize(value, p.scale, p.zero_point, p.dtype)
        if isinstance(values, np.ndarray):  # a 0-d constant quantizes to a numpy scalar
            values.flags.writeable = False
        return p, values, TensorRecord({"min": float(value.min(initial=0)),
                                        "max": float(value.max(initial=0)), "count": value.size},
                                       (float(value.min(initial=0)), float(value.max(initial=0))),
                                       p, "constant")

    def _qtensor(self, t: str) -> QTensor:
        shape = list(self.fg.shapes.get(t, []))
        p = self.params.get(t)
        if p is None:
            return QTensor(t, shape, "float32")
        return QTensor(t, shape, p.dtype, float(p.scale), int(p.zero_point), p.log2scale)

    # ---- layers -----------------------------------------------------------------------

    def _build(self, layer: FLayer) -> QLayer:
        builder = BUILDERS[layer.kind]
        with working_on(node=(layer.source_nodes or [layer.name])[0],
                        tensor=layer.outputs[0] if layer.outputs else None):
            q = builder(self, layer)
        q.source_nodes = list(layer.source_nodes)
        if requantizes(q):
            out = self.params[layer.outputs[0]]
            lo, hi = schemes.clamp_bounds(*layer.activation, out)
            q.params.update(output_zp=out.zero_point, output_dtype=out.dtype, qmin=lo, qmax=hi,
                            activation=layer.activation[0],
                            rounding=schemes.rounding_for(self.config.scheme))
            if "output_offset" in layer.attrs:  # a model output's QuantizeLinear: y / s + z
                q.params["output_zp"] += layer.attrs["output_offset"]
        return q

    def p(self, t: str) -> QParams:
        return self.params[t]

    @property
    def pow2(self) -> bool:
        return self.config.scheme == "pow2_symmetric"


def decision_function(fn) -> tuple[float, float] | None:
    """``fn``'s range over every input where it saturates on both sides (the same values at
    ±64 as at ±10000) and is point-symmetric about 0 (f(x) + f(-x) = 2 f(0): Sigmoid, Tanh,
    HardSigmoid), else None."""
    if fn is None:
        return None
    x = np.linspace(0.0, 64.0, 257, dtype=np.float32)
    far = np.array([-1e4, -64.0, 64.0, 1e4], np.float32)
    with np.errstate(all="ignore"):
        try:
            ends = np.asarray(fn(far), np.float64)
            pos, neg = np.asarray(fn(x), np.float64), np.asarray(fn(-x), np.float64)
        except Exception:  # noqa: BLE001 - a table function of another shape: not a decision
            return None
    if ends.shape != far.shape or pos.shape != x.shape or not np.all(np.isfinite(ends)):
        return None
    span = abs(ends[3] - ends[0])
    if span == 0 or abs(ends[0] - ends[1]) > 1e-6 * span or abs(ends[3] - ends[2]) > 1e-6 * span:
        return None
    if np.max(np.abs(pos + neg - 2 * pos[0])) > 1e-5 * span:
        return None
    return float(min(ends[0], ends[3])), float(max(ends[0], ends[3]))


def _scheme_params(scheme: str, scale: float, zero_point: int) -> QParams | None:
    """int8 ``(scale, zero_point)`` as ``scheme`` writes them, or None where it has no such
    parameters (a zero point under a symmetric scheme, a scale no power of two under pow2)."""
    if scheme == "asymmetric":
        return QParams(float(scale), int(zero_point), None, "int8")
    if zero_point != 0:
        return None
    if scheme == "symmetric":
        return QParams(float(scale), 0, None, "int8")
    mantissa, exponent = math.frexp(float(scale))
    return QParams(float(scale), 0, 1 - exponent, "int8") if mantissa == 0.5 else None


def requantizes(layer: QLayer) -> bool:
    """Whether the layer rounds its result onto the output's scale (so has output_zp, qmin...)."""
    if layer.kind == "resize":
        return layer.attrs["mode"] == "linear"
    return layer.kind in ("conv", "add", "mul", "matmul", "layernorm", "lrn", "rescale",
                          "concat", "avgpool")


def _as_array(model) -> np.ndarray:
    """A layer's float ONNX model as the qgraph stores it (``arrays["model"]``: its bytes)."""
    return np.frombuffer(model.SerializeToString(), dtype=np.uint8)


def _qlayer(layer: FLayer, **kw) -> QLayer:
    return QLayer(layer.name, layer.kind, list(layer.inputs), list(layer.outputs), **kw)


def _conv(q: Quantizer, layer: FLayer) -> QLayer:
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    w = layer.weights["weight"]
    cout = w.shape[0]
    stats = q.stats.get(layer.inputs[0])
    w_dtype = q.weight_dtype(layer)
    wq, w_scale, w_ls, b = quantized_weights(layer, x, q.config, stats, w_dtype,
                                             q._table("weight integers"))
    acc_scale = x.scale * w_scale
    params = {"input_zp": x.zero_point, "weight_scale": w_scale.tolist()}
    bias = schemes.quantize_bias(b, acc_scale, schemes.BIAS_DTYPES[w_dtype])
    k = int(np.prod(w.shape[1:]))
    x_span = max(abs(x.qmin - x.zero_point), abs(x.qmax - x.zero_point))
    w_span = schemes.qrange(w_dtype)[1]
    bound = k * x_span * w_span + float(np.max(np.abs(bias.astype(np.float64)), initial=0))
    mult, shift = schemes.fixed_point_array(acc_scale / y.scale, bits=schemes.multiplier_bits(bound))
    arrays = {"weight": wq, "bias": bias, "multiplier": mult, "shift": shift}
    if q.pow2:
        w_ls = np.broadcast_to(w_ls, (cout,))
        params.update(input_log2scale=x.log2scale, weight_log2scale=w_ls.tolist(),
                      output_log2scale=y.log2scale, output_shift=shift.tolist())
        if q.config.bias == "int8_shift" and w_dtype == "int8":  # seed 004's form is int8's
            arrays["bias"], extra = _int8_bias(b, x.log2scale + w_ls)
            params.update(extra)
    return _qlayer(layer, attrs={k: v for k, v in layer.attrs.items()}, params=params, arrays=arrays)


def quantized_weights(layer: FLayer, x: QParams, config: QuantConfig, stats,
                      dtype: str = "int8", memo: dict | None = None):
    """A conv layer's integer weights of ``dtype``, their scales (and pow2 log2scales) and the
    float bias they are corrected to, beside the input ``x``: the one rule the quantizer and
    the fake-quant model's int16 weights share. int8 weights round as
    ``config.weight_rounding`` says (GPTQ or nearest), int16 ones to nearest (their steps are
    256 times finer); an int16 layer's bias is int64 (`schemes.BIAS_DTYPES`). ``memo``: the
    integers rounded to nearest, one read-only array per float weight array and scales
    (`_nearest`)."""
    w, b = layer.weights["weight"], layer.weights["bias"]
    cout = w.shape[0]
    w_scale, w_ls = schemes.weight_params(config.scheme, w, config.per_channel, axis=0,
                                          dtype=dtype)
    headroom = schemes.BIAS_HEADROOM if dtype == "int8" else schemes.BIAS_HEADROOM_INT64
    w_scale, w_ls = schemes.bias_fitting_weight_scales(w_scale, w_ls, b, x.scale, headroom)
    w_scale = np.broadcast_to(w_scale, (cout,)).astype(np.float64)
    if dtype == "int8":
        gram = (stats.patch_grams.get(rounding.Geometry.of(layer))
                if stats is not None and config.weight_rounding == "gptq" else None)
        wq = (_nearest(w, w_scale, dtype, memo) if gram is None
              else rounding.rounded_weights(layer, w, w_scale, gram))
    else:
        wq = _nearest(w, w_scale, dtype, memo)
    if config.bias_correction:
        b = b - _weight_error_bias(layer, w, wq, w_scale, stats)
    return wq, w_scale, w_ls, b


def wide_weight_values(fg: FloatGraph, stats: dict, config: QuantConfig, qgraph: QGraph
                       ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each integer conv layer's int16 weights dequantized and the float bias they are
    corrected to (`quantized_weights` at int16): what the fake-quant model switches to where a
    choice gives the layer W16A16 (`npubuild.quant.fakequant`). Layers that read one weight
    array at the same scales share one dequantized array (read-only)."""
    out, integers, dequantized = {}, {}, {}
    for layer in fg.layers:
        x = qgraph.tensors.get(layer.inputs[0]) if layer.kind == "conv" else None
        if x is None or x.is_float:
            continue
        wq, w_scale, _, b = quantized_weights(layer, x.params, config, stats.get(x.name), "int16",
                                              integers)
        key = (id(wq), w_scale.tobytes())
        found = dequantized.get(key)
        if found is None or found[0] is not wq:
            shape = (-1,) + (1,) * (wq.ndim - 1)
            found = dequantized[key] = (wq, _read_only(wq * w_scale.reshape(shape)))
        out[layer.name] = (found[1], np.asarray(b, np.float64))
    return out


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _nearest(w: np.ndarray, w_scale: np.ndarray, dtype: str, memo: dict | None) -> np.ndarray:
    """``w`` rounded to nearest at ``w_scale`` (`rounding.nearest`), once per weight array,
    scales and dtype on ``memo`` (a read-only array): layers that read one weight (a shared
    encoder layer applied again, an unrolled recurrence) share its integers, and so do the
    precision search's choices where the weight's scales stay (an input's scale moves its
    bias, rarely its weights: rxnmap's search held a copy of every weight's integers, float
    values and fake-quant deltas per calibration method it scored, 1.4 GB each)."""
    if memo is None:
        return rounding.nearest(w, w_scale, dtype)
    key = (id(w), np.asarray(w_scale, np.float64).tobytes(), dtype)
    found = memo.get(key)
    if found is None or found[0] is not w:  # the entry holds ``w``: its id stays its own
        found = memo[key] = (w, _read_only(rounding.nearest(w, w_scale, dtype)))
    return found[1]


def _weight_error_bias(layer: FLayer, w: np.ndarray, wq: np.ndarray, w_scale: np.ndarray,
                       stats) -> np.ndarray:
    """Empirical bias correction (Nagel et al. 2019): the mean output shift the weight
    rounding causes, ``Σ (W_q - W) · E[x]`` per output channel, from the calibration means of
    the input channels (padding ignored). Zero when no means were observed."""
    mean = None if stats is None else stats.channel_mean
    cout, cin_g = w.shape[:2]
    if mean is None:
        return np.zeros(cout)
    group = layer.attrs["group"]
    out = np.empty(cout)
    for rows in rounding.row_blocks(w):
        dw = wq[rows] * w_scale[rows].reshape(-1, 1, 1, 1) - w[rows]
        groups = np.arange(cout)[rows] // (cout // group)
        src = groups[:, None] * cin_g + np.arange(cin_g)[None, :]  # input channel of each
        out[rows] = (dw.sum(axis=(2, 3)) * mean[src]).sum(axis=1)
    return out


def _int8_bias(b: np.ndarray, acc_ls: np.ndarray) -> tuple[np.ndarray, dict]:
    """Seed 004's bias form: int8 at ``bias_log2scale``, shifted left by ``bias_shift``."""
    bias_ls = min(schemes.log2scale_for(float(np.max(np.abs(b), initial=0)) or 1.0),
                  int(np.min(acc_ls)))
    b8 = schemes.quantize(b, 2.0 ** -bias_ls, 0, "int8")
    bias_shift = (acc_ls - bias_ls).astype(np.int64)
    return ((b8.astype(np.int64) << bias_shift).astype(np.int32),
            {"bias_int8": b8.tolist(), "bias_log2scale": bias_ls, "bias_shift": bias_shift.tolist()})


def _add(q: Quantizer, layer: FLayer) -> QLayer:
    a, b, y = (q.p(t) for t in (*layer.inputs, layer.outputs[0]))
    sign = -1.0 if layer.attrs.get("sub") else 1.0
    bound = _zero_centred_span(a) + _zero_centred_span(b)  # |acc| / max |M|
    mults, shift = schemes.shared_shift([a.scale / y.scale, sign * b.scale / y.scale],
                                        bits=schemes.multiplier_bits(bound))
    params = {"input_zps": [a.zero_point, b.zero_point], "multipliers": mults.tolist(),
              "shift": int(shift), "sub": bool(layer.attrs.get("sub"))}
    if q.pow2:
        params.update(input_log2scales=[a.log2scale, b.log2scale], output_log2scale=y.log2scale,
                      output_shift_bit=y.log2scale - max(a.log2scale, b.log2scale))
    return _qlayer(layer, params=params)


def _zero_centred_span(p: QParams) -> int:
    """Largest ``|q - zero_point|`` of a tensor: what one factor of a product can reach."""
    return max(abs(p.qmin - p.zero_point), abs(p.qmax - p.zero_point))


def _mul(q: Quantizer, layer: FLayer) -> QLayer:
    a, b, y = (q.p(t) for t in (*layer.inputs, layer.outputs[0]))
    span = _zero_centred_span(a) * _zero_centred_span(b)
    m, n = schemes.fixed_point(a.scale * b.scale / y.scale, bits=schemes.multiplier_bits(span))
    return _qlayer(layer, params={"input_zps": [a.zero_point, b.zero_point],
                                  "multiplier": m, "shift": n})


def _matmul(q: Quantizer, layer: FLayer) -> QLayer:
    """``(a - zp_a) @ (b - zp_b)`` at scale ``s_a · s_b`` (times a folded scalar ``factor``),
    requantized once: the multiplier keeps a whole row's sum of products inside int64."""
    a, b, y = (q.p(t) for t in (*layer.inputs, layer.outputs[0]))
    depth = q.fg.shapes[layer.inputs[0]][-1]
    span = depth * _zero_centred_span(a) * _zero_centred_span(b)
    m, n = schemes.fixed_point(layer.attrs.get("factor", 1.0) * a.scale * b.scale / y.scale,
                               bits=schemes.multiplier_bits(span))
    return _qlayer(layer, attrs=dict(layer.attrs), params={
        "input_zps": [a.zero_point, b.zero_point], "multiplier": m, "shift": n})


def _layernorm(q: Quantizer, layer: FLayer) -> QLayer:
    """Statistics of ``x - zp`` in exact integers over the normalized axes, the normalization
    in float64 (a chip's float unit), then ``scale / s_y`` and ``bias / s_y`` per element:
    ``epsilon`` is carried in the input's squared steps, so no input scale is needed at run
    time."""
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    model = q.fg.node_model(layer)
    return _qlayer(layer, attrs=dict(layer.attrs),
                   params={"input_zp": x.zero_point,
                           "epsilon_steps": layer.attrs["epsilon"] / (x.scale * x.scale)},
                   arrays={"gain": layer.weights["scale"] / y.scale,
                           "offset": layer.weights["bias"] / y.scale,
                           "model": _as_array(model)})


def _lrn(q: Quantizer, layer: FLayer) -> QLayer:
    """The channel window's sum of squares of ``x - zp`` in exact integers, the normalization
    ``(x - zp) · s_x / s_y / (bias + alpha / size · s_x² · sum)^beta`` in float64 (a chip's
    float unit): both scales are carried in two parameters."""
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    a = layer.attrs
    model = q.fg.node_model(layer)
    return _qlayer(layer, attrs=dict(a),
                   params={"input_zp": x.zero_point,
                           "alpha_steps": a["alpha"] / a["size"] * x.scale * x.scale,
                           "input_over_output": x.scale / y.scale},
                   arrays={"model": _as_array(model)})


def _rescale(q: Quantizer, layer: FLayer) -> QLayer:
    """``factor · x``; with ``negative_factor`` (PRelu, LeakyRelu) the negative side has its
    own multiplier and shift, one per index of ``attrs.axis`` for a per-channel slope."""
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    bits = schemes.multiplier_bits(_zero_centred_span(x))
    ratio = (x.scale / (layer.attrs["divisor"] * y.scale) if "divisor" in layer.attrs
             else layer.attrs["factor"] * x.scale / y.scale)
    m, n = schemes.fixed_point(ratio, bits=bits)
    input_zp = x.zero_point
    if "input_offset" in layer.attrs:  # a model input's DequantizeLinear: s · (x - z)
        if x.scale != 1.0:
            raise ValueError(f"integer input {layer.inputs[0]!r} is not at scale 1")
        input_zp += layer.attrs["input_offset"]
    arrays = {}
    if "negative_factor" in layer.attrs:
        negative = np.atleast_1d(np.asarray(layer.attrs["negative_factor"], np.float64))
        arrays["negative_multiplier"], arrays["negative_shift"] = schemes.fixed_point_array(
            negative * x.scale / y.scale, bits=bits)
    return _qlayer(layer, attrs=dict(layer.attrs), arrays=arrays,
                   params={"input_zp": input_zp, "multiplier": m, "shift": n})


def _concat(q: Quantizer, layer: FLayer) -> QLayer:
    y = q.p(layer.outputs[0])
    mults, shifts, zps = [], [], []
    for t in layer.inputs:
        x = q.p(t)
        m, n = (1, 0) if (x.scale, x.dtype) == (y.scale, y.dtype) else schemes.fixed_point(
            x.scale / y.scale, bits=schemes.multiplier_bits(_zero_centred_span(x)))
        mults.append(m), shifts.append(n), zps.append(x.zero_point)
    params = {"input_zps": zps, "multipliers": mults, "shifts": shifts}
    if q.pow2:
        params.update(input_log2scales=[q.p(t).log2scale for t in layer.inputs],
                      output_log2scale=y.log2scale)
    return _qlayer(layer, attrs=dict(layer.attrs), params=params)


def _avgpool(q: Quantizer, layer: FLayer) -> QLayer:
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    probe = QLayer(layer.name, "avgpool", [], [], attrs=layer.attrs)
    counts = window_counts(probe, q.fg.shapes[layer.inputs[0]][2:])
    bound = float(counts.max(initial=1)) * _zero_centred_span(x)  # a window's whole sum
    mult, shift = schemes.fixed_point_array(x.scale / (counts.astype(np.float64) * y.scale),
                                            round_up=q.pow2, bits=schemes.multiplier_bits(bound))
    params = {"input_zp": x.zero_point}
    if q.pow2:
        params["input_pre_ls"] = max(0, y.log2scale - x.log2scale)
    return _qlayer(layer, attrs=dict(layer.attrs), params=params,
                   arrays={"counts": counts.astype(np.int64), "multiplier": mult, "shift": shift})


def _resize(q: Quantizer, layer: FLayer) -> QLayer:
    if layer.attrs["mode"] == "nearest":
        return _qlayer(layer, attrs=dict(layer.attrs))
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    bound = 4.0 ** schemes.RESIZE_FRAC_BITS * _zero_centred_span(x)  # two taps per axis
    m, n = schemes.fixed_point(x.scale / (y.scale * 4.0 ** schemes.RESIZE_FRAC_BITS),
                               bits=schemes.multiplier_bits(bound))
    return _qlayer(layer, attrs=dict(layer.attrs), params={"input_zp": x.zero_point,
                                                          "multiplier": m, "shift": n})


def _lut(q: Quantizer, layer: FLayer) -> QLayer:
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    model = q.fg.node_model(layer)
    lo, table = schemes.trim_lut(schemes.build_lut(onnx_function(model), x, y), x.qmin)
    return _qlayer(layer, attrs=dict(layer.attrs), params={"table_lo": lo},
                   arrays={"table": table, "model": _as_array(model)})


SOFTMAX_EXP_BITS = 24  # fewest fraction bits of exp(-d · scale): ORT's float32 softmax agrees to ties
SOFTMAX_GUARD_BITS = 5  # the table's rounding, summed over a row, stays under 2^-5 output step


@dataclass(frozen=True)
class SoftmaxArithmetic:
    """The integer softmax's constants: ``exp_bits`` fraction bits of the exp table, and the
    output's ``1 / scale`` as ``multiplier · 2^-shift``."""
    exp_bits: int
    multiplier: int
    shift: int


def softmax_arithmetic(length: int, output_scale: float) -> SoftmaxArithmetic | None:
    """The exp table's fraction bits and the output multiplier for rows of ``length`` values,
    or None where int64 cannot hold them.

    Every table entry rounds by up to half a unit and a row's sum adds ``length`` of them,
    against a sum of at least ``2^exp_bits`` (the row's maximum is exactly 1): the output
    (``1 / output_scale`` steps per unit probability) moves by up to
    ``length / output_scale · 2^-(exp_bits+1)`` steps, kept under ``2^-SOFTMAX_GUARD_BITS``.
    A long confident row at a fine output scale needs more than ``SOFTMAX_EXP_BITS``: PP-OCRv5's
    18,385 classes at int16 drifted 10 steps from ONNX Runtime with 24 bits. The reference
    computes ``(2·e·multiplier + den) // (2·den)`` with ``den = sum(e) << shift``: both terms
    stay under 2^62, so the multiplier gives up bits to the table and the row (down to
    ``SOFTMAX_GUARD_BITS`` bits below one output step)."""
    needed = math.ceil(math.log2(length / output_scale)) + SOFTMAX_GUARD_BITS - 1
    exp_bits = max(SOFTMAX_EXP_BITS, needed)
    # 2·e·multiplier < 2^62 (e <= 2^exp_bits); 2·den < 2^62, den <= length · 2^(exp_bits + shift)
    # and shift = multiplier_bits - exponent of 1 / output_scale
    exponent = math.frexp(1.0 / output_scale)[1]
    multiplier_bits = min(schemes.MAX_MULTIPLIER_BITS, 61 - exp_bits,
                          60 - exp_bits - math.ceil(math.log2(length)) + exponent)
    if multiplier_bits < math.log2(1.0 / output_scale) + SOFTMAX_GUARD_BITS:
        return None
    multiplier, shift = schemes.fixed_point(1.0 / output_scale, bits=multiplier_bits)
    if shift < 0:  # a power-of-two scale: 1 / scale is an integer
        multiplier, shift = multiplier << -shift, 0
    if multiplier >= 2 ** (61 - exp_bits) or length * 2.0 ** (exp_bits + shift + 1) >= 2.0 ** 62:
        return None
    return SoftmaxArithmetic(exp_bits, multiplier, shift)


def _softmax(q: Quantizer, layer: FLayer) -> QLayer:
    reason = q.kernel_refusal(layer)
    if reason:
        return _float(q, replace(layer, reason=reason + ": runs in float on the CPU"))
    x, y = q.p(layer.inputs[0]), q.p(layer.outputs[0])
    model = q.fg.node_model(layer)
    length = q.fg.shapes[layer.inputs[0]][layer.attrs["axis"]]
    arithmetic = softmax_arithmetic(length, y.scale)
    exp_bits, multiplier, shift = arithmetic.exp_bits, arithmetic.multiplier, arithmetic.shift
    steps = np.arange(x.qmax - x.qmin + 1, dtype=np.float64)
    table = np.rint(np.exp(-steps * x.scale) * 2.0 ** exp_bits).astype(np.int64)
    if x.dtype != "int8":  # 65,536 steps: keep the entries up to the first 0, the kernel clamps
        zeros = np.flatnonzero(table == 0)
        table = table[:zeros[0] + 1] if zeros.size else table
    return _qlayer(layer, attrs=dict(layer.attrs),
                   params={"multiplier": multiplier, "shift": shift, "output_zp": y.zero_point,
                           "output_dtype": y.dtype},
                   arrays={"exp_table": table,
                           "model": _as_array(model)})


def onnx_function(model) -> Callable[[np.ndarray], np.ndarray]:
    """An element-wise fragment as a function, evaluated by ONNX Runtime: a table built from it
    holds exactly what the QDQ model computes (ORT's Sigmoid/Tanh kernels approximate to an
    absolute, not relative, error: an int16 table of tiny outputs would differ by hundreds of
    steps if NumPy computed it)."""
    from npubuild import onnx_io

    session = onnx_io.session(model)
    name = session.get_inputs()[0].name

    def fn(x: np.ndarray) -> np.ndarray:  # element-wise: any shape in, the same shape out
        x = np.asarray(x, np.float32)
        return np.asarray(session.run(None, {name: x})[0], np.float32).reshape(x.shape)
    return fn


def _pad(q: Quantizer, layer: FLayer) -> QLayer:
    x = q.p(layer.inputs[0])
    attrs = dict(layer.attrs)
    attrs["value"] = int(schemes.quantize(np.array(attrs["value_real"]), x.scale, x.zero_point,
                                          x.dtype))
    return _qlayer(layer, attrs=attrs)


def _data(q: Quantizer, layer: FLayer) -> QLayer:
    return _qlayer(layer, attrs=dict(layer.attrs))


def _float(q: Quantizer, layer: FLayer) -> QLayer:
    model = q.fg.node_model(layer)
    spec = [None if t not in q.params else [q.params[t].scale, q.params[t].zero_point,
                                               q.params[t].dtype] for t in layer.inputs]
    out_spec = [None if t not in q.params else [q.params[t].scale, q.params[t].zero_point,
                                                   q.params[t].dtype] for t in layer.outputs]
    # a layer the vendor's int8 kernel runs is an integer layer on the NPU; npubuild computes
    # it as its float op between the integer tensors (the same, up to rounding)
    device = "npu" if layer.attrs.get("vendor_kernel") == "int8" else "cpu"
    return QLayer(layer.name, "float", list(layer.inputs), list(layer.outputs), device=device,
                  attrs={"reason": layer.reason},
                  params={"onnx_inputs": list(layer.inputs), "input_params": spec,
                          "output_params": out_spec},
                  arrays={"model": _as_array(model)})


BUILDERS: dict[str, Callable[[Quantizer, FLayer], QLayer]] = {
    "conv": _conv, "add": _add, "mul": _mul, "matmul": _matmul, "layernorm": _layernorm,
    "lrn": _lrn, "rescale": _rescale,
    "concat": _concat,
    "avgpool": _avgpool, "resize": _resize, "lut": _lut, "softmax": _softmax, "pad": _pad,
    "float": _float,
    **{k: _data for k in ("maxpool", "reshape", "transpose", "depth_to_space", "slice", "split")},
}


def quantize_graph(fg: FloatGraph, stats: dict[str, calibrators.TensorStats],
                   config: QuantConfig, name: str, weight_integers: dict | None = None
                   ) -> tuple[QGraph, dict[str, TensorRecord]]:
    """``fg`` quantized under ``config``, and its tensors' records. ``weight_integers``: the
    table of weights rounded to nearest (`_nearest`) this call shares with others of the
    same float graph (the graphs a quantize stage keeps per configuration then hold each
    weight's integers once)."""
    memo = {} if weight_integers is None else {("weight integers",): weight_integers}
    quantizer = Quantizer(fg, stats, config, memo=memo)
    qgraph = quantizer.run(name)
    return qgraph, quantizer.records
