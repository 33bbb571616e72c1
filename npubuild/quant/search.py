"""The precision search: the fewest tensors kept out of int8 (int16 on the NPU, or float on
the CPU) until verify's thresholds hold, judged on the verify samples as verify judges them.

Every choice is scored cheaply: each NPU graph is exported once as a fake-quant model whose
activation parameters are inputs (`npubuild.quant.fakequant`), so trying a choice is computing
its parameters (`Quantizer.tensor_params`, no layer rebuilt) and running ONNX Runtime on the
verify samples through the whole split pipeline, CPU submodels included; each choice is scored
once (cached). The caller confirms the final choice on the integer reference and calls
`PrecisionSearch.run` again with a wider margin when the two disagree.

The search, after int8 everywhere fails (read top to bottom):

1. **Reach**: the widest precision each candidate may take (int16 where the chip has it, else
   float; float where every tensor in int16 still fails and the chip may run layers on its
   CPU). Where nothing reaches the thresholds, the result says so with the best figure. Where
   float is needed and the chip has int16, the reach is mixed: float only on the fewest
   tensors that pass with int16 on every other candidate (phases 2-4 against that base), int16
   on the rest; the phases below then start from each tensor's own precision. The tensors
   whose quietest calibration sample int16 cannot hold where their loudest it can (a power
   spectrum, `Quantizer.quiet_in_int16`) are tried in float first: where they pass, only
   the drop pass runs over them (no ranking). Then those whose typical value int16 holds in
   a few steps on every sample, their range set by a few outlier channels (a transformer's
   residual stream, `Quantizer.coarse_in_int16`): the same, the costliest on the CPU
   dropped first (the ranking's blocks mix them with norms and matrix products that cost
   far more on the CPU and buy nothing).
2. **Rank** by measured gains (group testing): a block of candidates made wide (the rest
   int8) takes some error off the judged figures; errors from different tensors add (nearly:
   independent noise), so the most useful blocks are halved until single tensors or blocks
   too light to matter remain, or blocks whose halves buy less than half of what they buy
   together (errors that compound instead of adding). A gain is measured end to end, through the CPU segments after
   the tensor (a Log of a power spectrum, a recurrent cell), not over its own layer. An
   anchor detector's task is graded per anchor (`npubuild.verify.tasks.anchor_grades`), its
   agreement being too coarse to rank blocks. A gain counts up to what the caller's demanded
   cosine margin and channel span need (not verify's bars alone: int8 within the bars but
   short of the demand ranked every block as buying nothing), and blocks are scored on every
   sample where int8's worst samples meet the demanded margin that all of them miss.
3. **Cover**: the shortest prefix of that ranking whose predicted error leaves the
   thresholds a margin, then longer prefixes (doubling) until the choice passes, then the
   shortest passing prefix (bisection).
4. **Drop** the prefix's tensors the thresholds do not need, least important first, in blocks
   (a block that can go goes whole and the next is twice as long; one that cannot is halved).
5. **Demote** float choices to int16 where int16 is enough and no slower (int16 that pushes a
   layer off the integer kernels costs time like float).
6. **Budget**: a choice that makes the model slower than ``quantization.auto.max_slowdown``
   times int8's estimated time, priced as compile estimates it (`npubuild.quant.price`: the
   NPU graphs planned with the choice's int16 widths and float layers; each float part a run
   of ONNX Runtime plus its MACs at the host's rate), is not adopted: the most useful float
   blocks that fit are tried instead (then int16 on every other candidate whose int16 fits),
   then dropped and demoted, keeping the last of those passing steps that fits; where they
   miss, int8 stays and the result names the smallest doubled budget at which the same
   procedure passed.

Candidates are every quantized activation a layer rounds or a graph takes in, NPU inputs
arriving from CPU segments included; a tensor that only moves data shares its source's
precision. Each phase has a budget of evaluations (counts, not seconds: the choice is a
function of the stage's inputs); ``quantization.auto.seconds`` is an emergency stop, after
which the best choice found is kept and the report says so.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from npubuild.quant import fakequant, price, quantizer
from npubuild.quant.qgraph import DATA_MOVEMENT
from npubuild.quant.workflow import WIDE_WEIGHTS, OverrideSpec, resolve_overrides, tensor_names
from npubuild.split.cost import CPU_MACS_PER_SECOND, macs_per_node, model_macs

WIDE = ("int16", WIDE_WEIGHTS, "float")  # cheapest first: int16 activations, with int16
# weights too (W16A16: where int8 weights bound the model), float on the CPU
FIRST_BLOCKS = 8
COVER_HEADROOM = 0.75    # a prefix is first tried where its predicted load is this much
# Evaluation budgets per phase: counts, never seconds, so the choice is a function of the
# stage's inputs (byte-identical artifacts on any machine); about 60 scores at most, each one
# pass of ONNX Runtime over the verify samples (a few percent of quantizing in int8).
DROP_EVALUATIONS = 10    # the drop pass stops after this many evaluations
BUDGET_DOUBLINGS = 8     # over the slowdown budget: budgets doubled to find one that passes
DEMOTE_EVALUATIONS = 6
QUICK_SAMPLES = 2        # the ranking scores blocks on int8's worst samples
SPLIT_BELOW = 1.0 / 16   # blocks lighter than this share of the headroom are not halved
MAX_RANK_EVALUATIONS = 16  # halvings after the first blocks
# A block whose halves buy less than this share of what it buys whole is kept whole: its
# tensors' errors do not add but compound (a concat requantizing its inputs at their own
# coarse scale: the BlazePose detector's score concat gains nothing in int16 unless its inputs
# are too, nor they unless it is), so halving it would rank each half as useless.
TOGETHER = 0.5
ALTERNATIVE_METHODS = ("percentile", "mse", "kl")
# Where the recipe leaves the scheme unset, the other float-scale scheme is scored too: both
# round half to even, the fake-quant model takes either's parameters (weights are symmetric
# in both); asymmetric has the finer steps, but on a near-tie classifier either may win.
ALTERNATIVE_SCHEMES = {"asymmetric": "symmetric"}
METHOD_EVALUATIONS = 4
# The caller demands a cosine margin where the integer reference missed what fake quantization
# passed; at most this share of what every candidate at its widest precision reaches (the
# figures' ceiling: a cosine of 1 is a margin of 1 - bar), else nothing could ever pass.
MAX_DEMAND = 0.5


@dataclass(frozen=True)
class SearchSpec:
    """``quantization.auto`` as the library sees it."""

    enabled: bool = True
    seconds: float = 600.0
    precision: str | None = None      # the one wide precision allowed (default: any the chip has)
    max_overrides: int | None = None
    min_cosine: float | None = None   # an extra bar on every output (all samples, worst sample)
    max_slowdown: float = 10.0        # estimated time with the choice's float layers / int8's


@dataclass
class Scored:
    """One choice's verdict under fake quantization."""

    choice: tuple[tuple[str, str], ...]
    passed: bool
    margin: float          # lowest cosine above its bar (negative: misses)
    loads: np.ndarray      # per judged cosine: (1 - cosine) / (1 - its bar)
    failures: list[str]
    span_ratio: float = 1.0  # the channel closest to dying: deployed span / reference span
    slowdown: float | None = None  # estimated time with this choice / int8's (None: not priced)
    calibration: tuple = ()  # (method, per-tensor methods, scheme) it was scored under
    scales: np.ndarray | None = None  # per load, what a demand weighs on it (`load_scales`)

    @property
    def wide(self) -> dict[str, str]:
        return dict(self.choice)


class OutOfTime(Exception):
    pass


# The search's work, in CPU seconds of the 2-core build machine, fitted to MediaPipe's iris
# landmark's whole search (170 layers, 1,015 fake-quant nodes, 55 MMAC a sample): 109.3 s in
# 1,116 plans, 4.1 s in fake-quant runs, 5.9 s placing its quantizers, 4.3 s quantizing
# their weights; these constants charge 123 s for that search's 131 s. MACs at the rate ONNX
# Runtime runs a large float graph here (CRAFT at 480x640, 109 GMAC: 1.5 s of CPU, 72 GMAC/s)
# with its fake-quant nodes' share; the integer reference at a third of that.
FAKE_QUANT_NODE_SECONDS = 20e-6
FAKE_QUANT_MACS_PER_SECOND = 50e9
GROUP_FIT_SECONDS = 2e-3
PLAN_LAYER_SECONDS = 7e-5
QUANTIZER_LAYER_SECONDS = 2e-5
WEIGHTS_LAYER_SECONDS = 3.4e-4
REFERENCE_LAYER_SECONDS = 2e-4
REFERENCE_MACS_PER_SECOND = 20e9


class WorkClock:
    """The precision search's clock (``quantization.auto.seconds``): the seconds its work is
    estimated to take on the build machine, charged per choice scored, plan priced, quantizer
    built and confirmation run, from the model's size. Not the wall clock: where a budget
    stops a search must not depend on the machine or its load, or the same recipe builds other
    artifacts elsewhere (iris landmark's search stopped at 600 s on a machine at load 6 and
    ran to its end at load 4, with another note and steps)."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def charge(self, seconds: float) -> None:
        self.seconds += seconds


@dataclass
class SearchResult:
    reached: bool
    chosen: dict[str, str]           # tensor -> int16 | float
    before: float                    # margin of int8 everywhere (fake quant)
    after: float
    evaluations: int
    seconds: float
    steps: list[dict] = field(default_factory=list)
    ranking: list[dict] = field(default_factory=list)
    note: str = ""
    best_reachable: dict = field(default_factory=dict)
    why: dict[str, dict] = field(default_factory=dict)  # chosen tensor -> what was measured

    members: dict[str, list[str]] = field(default_factory=dict)
    scheme: str | None = None                    # the activation scheme chosen (None: kept)
    method: str = "minmax"                       # calibration method of every other tensor
    tensor_methods: tuple[tuple[str, str], ...] = ()
    method_scores: dict[str, float] = field(default_factory=dict)

    def overrides(self) -> list[OverrideSpec]:
        """One override per tensor: each chosen tensor and those that move its data."""
        return [OverrideSpec(tensors=(t,), precision=p) for root, p in sorted(self.chosen.items())
                for t in self.members.get(root, [root])]


def held_exactly(qg, fg, t: str) -> bool:
    """Whether the quantized constant ``t``'s integers give each of its float values back (to
    float32's rounding of that value): a scalar such as a hard-swish's 3 and 6, a vector of
    equal steps. Wider buys nothing there (as candidates, PP-OCRv2's recognizer had 27 more
    that ran its search out of its time budget). Judged value by value, not against the
    largest: T5's decoder's causal mask folded into its position bias (finfo.min beside biases
    of -25 .. 17) read as held within 1e-6 of 3.4e38 while int8 rounded every bias to one
    level, so no choice could widen it and the weights-only figure blamed int8 weights."""
    info = qg.tensors[t]
    value = np.asarray(fg.constants[t], np.float64)
    got = (np.asarray(qg.constants[t], np.float64) - (info.zero_point or 0)) * info.scale
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.all(np.abs(got - value) <= 1e-6 * np.abs(value)))


class PrecisionSearch:
    """Scores choices with fake-quant sessions of ``workflow``'s NPU graphs on ``samples``;
    ``judge(gots)`` is verify's verdict on one list of per-sample values (model outputs and
    NPU hand-over tensors). ``fake_quant(split_dir, exported)`` runs the fake-quant pipeline:
    in this process (`fakequant.FakeQuantPipeline`) or on Dask workers
    (`npubuild.quant.fanout.FakeQuantOnDask`), the same values either way."""

    float_where = "in float on the CPU"  # where a float layer runs (the chip may say the NPU)

    def __init__(self, workflow, samples: Sequence[Mapping[str, np.ndarray]],
                 judge: Callable[[list[dict]], object], kept: Sequence[str], spec: SearchSpec,
                 *, chip_int16: bool, float_fallback: bool = True, choose_methods: bool = False,
                 choose_scheme: bool = False,
                 chip=None, npu_macs_per_second: float = float("inf"),
                 float_macs_per_second: float = CPU_MACS_PER_SECOND, float_on_npu: bool = False,
                 clock: Callable[[], float] | None = None,
                 on_score: Callable[[int], None] = lambda count: None,
                 fake_quant: Callable = fakequant.FakeQuantPipeline):
        self.workflow, self.samples, self.judge = workflow, list(samples), judge
        self.kept, self.spec = set(kept), spec
        self.clock = clock if clock is not None else WorkClock()  # a test's clock is its own
        self.on_score = on_score  # told the number of choices scored so far (progress)
        self.levels = [p for p in WIDE if (spec.precision in (None, p))
                       and (p == "float" or chip_int16) and (p != "float" or float_fallback)]
        self.started = self.clock()
        self.deadline = self.started + spec.seconds  # an emergency stop (the report says)
        self.choose_methods, self.choose_scheme = choose_methods, choose_scheme
        config = workflow.options.config
        self.recipe_choice = (config.method, config.tensor_methods, config.scheme)
        self.method, self.methods, self.scheme = self.recipe_choice
        self.states = {state.graph.index: state for state in workflow.states}
        config = workflow.options.config
        self.pipeline = fake_quant(workflow.pipeline.split_dir, fakequant.export_graphs(
            {i: (s.qgraph, s.fg, *([quantizer.wide_weight_values(
                s.fg, s.observer.stats, config, s.qgraph)] if chip_int16 else []))
             for i, s in self.states.items()}))  # int16 weights measured where the chip has them
        self.ranges: dict = {}
        self.memos: dict[int, dict] = {}  # per graph, what its quantizers share (`Quantizer.memo`)
        self.work = {i: layer_macs(s.fg) for i, s in self.states.items()}
        # the time model (`npubuild.quant.price`): compile's estimate of each NPU graph on
        # ``chip`` (without one, its MACs at ``npu_macs_per_second``); float parts on the host
        self.chip, self.npu_mac_seconds = chip, 1.0 / npu_macs_per_second
        self.qgraphs = {i: s.qgraph for i, s in self.states.items()}  # int8, before any adopt
        self.float_seconds = 1.0 / float_macs_per_second  # a float layer: CPU or NPU float16
        self.float_on_npu = float_on_npu
        self.float_where = "in float16 on the NPU" if float_on_npu else "in float on the CPU"
        cpu_graphs = [g.model for g in workflow.pipeline.graphs if not g.is_npu]
        cpu_graph_macs = [model_macs(model) for model in cpu_graphs]
        # a CPU part's kept Loops run their iterations whatever the choice, and so would the
        # whole model in float on the host
        self.loop_seconds = sum(price.loop_seconds(model.graph) for model in cpu_graphs)
        self.cpu_part_seconds = self.loop_seconds + sum(
            price.host_seconds(macs) for macs in cpu_graph_macs)
        self.model_macs = sum(cpu_graph_macs) + sum(sum(w.values()) for w in self.work.values())
        self.names = {i: tensor_names(s.graph.model) for i, s in self.states.items()}
        self.run_seconds = (  # one sample through the fake-quant pipeline
            FAKE_QUANT_NODE_SECONDS * sum(len(e.model.graph.node)
                                          for e in self.pipeline.exported.values())
            + self.model_macs / FAKE_QUANT_MACS_PER_SECOND)
        self.configs: dict[tuple, quantizer.QuantConfig] = {}  # (graph, own choice, ...) -> config
        self.feeds: dict[tuple, dict[str, np.ndarray]] = {}  # the same key -> its inputs
        self.placed: dict[tuple, frozenset[str]] = {}  # the same key -> its float layers
        self.widths: dict[tuple, dict[str, str]] = {}  # the same key -> its tensors' widths
        self.wide_weights: dict[tuple, frozenset[str]] = {}  # the same key -> W16A16 layers
        self.tables: dict[tuple, tuple] = {}  # the same key -> the tables built again for it
        self.plans: dict[tuple, float] = {}  # (graph, float layers, widths) -> seconds
        # per graph, the quantizer its newest key was placed with (key, quantizer): the
        # score that made the key builds its inputs from the same one (`_graph_feeds`)
        # instead of placing and typing every tensor again; one per graph at most
        self.last_quantizer: dict[int, tuple[tuple, quantizer.Quantizer]] = {}
        self.fits = price.group_fits(chip)  # the groups every choice's plan shares
        self.pricers: dict[int, price.GraphPricer] = {}  # per graph: prices what a choice changes
        self.spans: dict[int, price.TableSpans] = {}  # per graph: its tables' entries, built again
        self.cache: dict[tuple, Scored] = {}
        self.steps: list[dict] = []
        self.base: dict[str, str] = {}  # what every scored choice is made on (`score_all`)
        self.candidates = self._candidates()

    # ---- the budget's clock ---------------------------------------------------------------

    def _charge(self, seconds: float) -> None:
        """Counts ``seconds`` of estimated work on the search's `WorkClock` (a test's own
        clock counts what it counts)."""
        charge = getattr(self.clock, "charge", None)
        if charge is not None:
            charge(seconds)

    def charge_confirmation(self, samples: int) -> None:
        """Counts a run of the integer reference over ``samples`` (a choice confirmed)."""
        layers = sum(len(qg.layers) for qg in self.qgraphs.values())
        self._charge(samples * (REFERENCE_LAYER_SECONDS * layers
                                + self.model_macs / REFERENCE_MACS_PER_SECOND))

    # ---- scoring ------------------------------------------------------------------------

    def _params(self, choice: Mapping[str, str]) -> dict[int, dict[str, np.ndarray]]:
        """Each NPU graph's parameter inputs under ``choice`` (made the first time a score
        needs them: a price needs only the placement and the widths)."""
        params = {}
        for index, key in self._graph_keys(choice):
            if key not in self.feeds:
                self.feeds[key] = self._graph_feeds(index, key)
                self._charge(WEIGHTS_LAYER_SECONDS * len(self.qgraphs[index].layers))
            params[index] = self.feeds[key]
        return params

    def _graph_keys(self, choice: Mapping[str, str]):
        """Per NPU graph, the key of its own part of ``choice``; a graph whose own tensors the
        choice leaves as an earlier one did reuses that one's placement and widths (computed
        once per graph)."""
        overrides = self._expanded(choice)
        for index, state in self.states.items():
            own = tuple(sorted({(o.tensors[0], o.precision) for o in overrides
                                if o.tensors[0] in self.names[index]}))
            key = (index, own, self.method, self.methods, self.scheme)
            if key not in self.configs:
                self.configs[key] = self._graph_config(state, overrides)
                self._charge(QUANTIZER_LAYER_SECONDS * len(self.qgraphs[index].layers))
                q, params, cpu, wide = self._quantizer(index, self.configs[key])
                self.placed[key], self.widths[key] = frozenset(cpu), price.dtypes_of(params)
                self.wide_weights[key] = wide
                self.tables[key] = price.table_params(self.qgraphs[index], params)
                self.last_quantizer[index] = (key, q)
            yield index, key

    def _graph_config(self, state, overrides: list[OverrideSpec]) -> quantizer.QuantConfig:
        """The quantizer's configuration of one graph under a choice's ``overrides``."""
        # the recipe's own overrides, not the workflow's current ones: those include the last
        # choice the caller adopted to confirm it, which every later score would sit on top of
        base = list(self.workflow.base_overrides)
        resolved = resolve_overrides([*base, *overrides], state.graph.model)
        return replace(self.workflow.options.config,
                       float_tensors=frozenset(resolved.float_tensors),
                       int16_tensors=frozenset(resolved.int16),
                       int16_weight_inputs=frozenset(resolved.int16_weights), method=self.method,
                       tensor_methods=self.methods, scheme=self.scheme)

    def _quantizer(self, index: int, config: quantizer.QuantConfig):
        """The graph's quantizer under ``config``, its tensors' parameters, the layers it runs
        in float and the layers with int16 weights."""
        state = self.states[index]
        q = quantizer.Quantizer(state.fg, state.observer.stats, config, ranges=self.ranges,
                                memo=self.memos.setdefault(index, {}))
        params, cpu = q.tensor_params()
        return q, params, cpu, frozenset(q.int16_weight_layers() - set(cpu))

    def _graph_feeds(self, index: int, key: tuple) -> dict[str, np.ndarray]:
        """The graph's parameter inputs under its configuration ``key``, as adopting the
        choice builds them: from the quantizer `_graph_keys` placed that key with when it is
        still the graph's newest (a quantizer's placement and parameters are computed once
        and only read after: the same inputs as a fresh one's), else from a fresh one."""
        known_key, q = self.last_quantizer.pop(index, (None, None))
        if known_key != key:
            q = self._quantizer(index, self.configs[key])[0]
        return fakequant.quantizer_inputs(q, index, self.states[index].fg, self.pipeline)

    def _in_float(self, choice: Mapping[str, str]) -> frozenset[tuple[int, str]]:
        """The (graph, layer) pairs the quantizer runs in float under ``choice``: the layers
        a float tensor touches, and those an int16 tensor pushes off the integer kernels (a
        per-channel PRelu table or a softmax with an int16 input): one truth for placement."""
        return frozenset((index, name) for index, key in self._graph_keys(choice)
                         for name in self.placed[key])

    def slowdown(self, choice: Mapping[str, str]) -> float:
        """The model's estimated time with ``choice`` over its time in int8 (whose own float
        layers, the quantizer's placement, count in both), priced as compile estimates it
        (int8 everywhere is 1 without a plan)."""
        choice = {**getattr(self, "base", {}), **choice}
        if not choice:
            return 1.0
        plain = self._seconds({})
        chosen = self._seconds(choice)
        return chosen / plain if plain > 0 else (1.0 if chosen <= 0 else math.inf)

    def _seconds(self, choice: Mapping[str, str], npu: bool = True) -> float:
        """The model's estimated time under ``choice`` (`npubuild.quant.price`): each NPU
        graph as compile estimates it with the choice's widths and float layers, each float
        layer and CPU submodel a run of ONNX Runtime plus its MACs at the host's rate (a chip
        that runs float layers in float16 on its NPU: their MACs at that rate, no run).
        ``npu=False``: the float parts alone, no plan (never more than the whole)."""
        total = self.cpu_part_seconds
        run = 0.0 if self.float_on_npu else price.CPU_RUN_SECONDS
        for index, key in self._graph_keys(choice):
            floats = self.placed[key]
            total += (self._npu_seconds(index, floats, self.widths[key], self.wide_weights[key],
                                        self.tables[key])
                      if npu else 0.0) + sum(
                price.host_seconds(self.work[index].get(name, 0), self.float_seconds, run)
                for name in sorted(floats))
        return total

    def _over_budget(self, choice: Mapping[str, str], budget: float) -> bool:
        """Whether ``choice``'s slowdown exceeds ``budget``; where its float parts alone
        already do, without planning its NPU graphs (a plan per trial was most of a search
        that fits a budget: iris landmark's float blocks, each a few layers at ~8 µs a run
        against an int8 model of tens of µs)."""
        plain = self._seconds({})
        floats_alone = self._seconds({**self.base, **choice}, npu=False)
        if plain > 0 and floats_alone / plain > budget:
            return True
        return self.slowdown(choice) > budget

    def slower_than_the_cpu_alone(self, choice: Mapping[str, str]) -> str:
        """Where ``choice`` runs float layers on the host between NPU parts and is estimated
        slower than the whole model in float on the host (one ONNX Runtime run, all its
        MACs and its kept Loops' iterations), what the two cost and the setting that runs it
        there; "" otherwise. Silero VAD
        v4 passed with 76 float layers between its NPU parts: 0.66 ms a frame deployed, where
        all on the CPU it ran in 0.18 ms at float's accuracy."""
        floats = self._in_float(choice)
        if self.float_on_npu or not floats:
            return ""
        chosen = self._seconds(choice)
        alone = price.host_seconds(self.model_macs) + self.loop_seconds
        if chosen <= alone:
            return ""
        return (f"the chosen precision runs {len(floats)} layer(s) in float on the CPU between "
                f"NPU parts: an estimated {chosen * 1e6:,.0f} µs a frame, where the whole "
                f"model in float on the CPU is an estimated {alone * 1e6:,.0f} µs "
                f"(split.policy: cpu_only runs it there, at float's accuracy)")

    def _npu_seconds(self, index: int, floats: frozenset[str], widths: Mapping[str, str],
                     wide_weights: frozenset[str] = frozenset(), tables: tuple = ()) -> float:
        """One NPU graph's time under a choice (cached: one plan per distinct choice); its
        ``tables`` (`price.table_params`) at the entries they are built with."""
        key = (index, floats, tuple(sorted(widths.items())), wide_weights, tables)
        if key not in self.plans:
            if self.chip is None:  # no chip to plan for: the NPU's MACs at its rate
                self.plans[key] = self.npu_mac_seconds * sum(
                    macs for name, macs in self.work[index].items() if name not in floats)
            else:
                fitted = self.fits.computed
                if index not in self.pricers:
                    self.pricers[index] = price.GraphPricer(self.qgraphs[index], self.chip,
                                                            self.fits)
                    self.spans[index] = price.TableSpans(self.qgraphs[index])
                self.plans[key] = self.pricers[index].seconds(
                    widths, floats, wide_weights, self.spans[index](tables))
                self._charge(GROUP_FIT_SECONDS * (self.fits.computed - fitted)
                             + PLAN_LAYER_SECONDS * len(self.qgraphs[index].layers))
        return self.plans[key]

    def priced(self, scored: Scored) -> float:
        """``scored``'s slowdown, priced the first time a decision or a report needs it."""
        if scored.slowdown is None:
            scored.slowdown = self.slowdown(scored.wide)
        return scored.slowdown

    def score(self, choice: Mapping[str, str], step: str = "", quick: bool = False) -> Scored:
        """verify's verdict on ``choice`` (cached); ``quick``: on the plain choice's worst
        samples only (the ranking orders blocks with it; decisions use every sample)."""
        return self.score_all([(choice, step)], quick)[0]

    def score_all(self, choices: Sequence[tuple[Mapping[str, str], str]],
                  quick: bool = False) -> list[Scored]:
        """`score` of each (choice, step) in order, for choices the search makes regardless
        of each other's verdict: those not scored yet go through the fake-quant pipeline
        together (on Dask, every choice's sample batches in flight at once), then are judged
        and recorded one by one, exactly as one `score` after another."""
        base = getattr(self, "base", {})  # the choice every other is made on (usually none)
        choices = [({**base, **choice}, step) for choice, step in choices]
        keys = [(tuple(sorted(choice.items())), self.method, self.methods, self.scheme, quick)
                for choice, _ in choices]
        new = list({key: (choice, step) for key, (choice, step) in zip(keys, choices)
                    if key not in self.cache}.items())
        if new:
            if self.clock() > self.deadline:
                raise OutOfTime()
            samples, judge = (self.samples, self.judge) if not quick else self._quick()
            twins = {key: self._twin(key) for key, _ in new}
            runs = iter(self.pipeline.run_all(
                samples, [self._params(c) for key, (c, _) in new if twins[key] is None],
                self.kept))
            # charged as run all the same: the budget's clock counts what it always counted
            self._charge(self.run_seconds * len(samples) * len(new))
            for key, (choice, step) in new:
                if twins[key] is not None:
                    self._record_twin(key, step, twins[key])
                else:
                    self._record(key, choice, step, judge(next(runs)))
        return [self.cache[key] for key in keys]

    def _twin(self, key: tuple) -> Scored | None:
        """The score already judged of ``key``'s choice under the same calibration, quick
        where ``key`` is not or the reverse, where the quick set is every sample and its
        judge the search's (two verify samples: the ranking's choices, then the cover's, ran
        twice); None otherwise (a quick score on a subset judged other samples)."""
        if not hasattr(self, "_plain_verdict"):  # the quick set is not known yet
            return None
        samples, judge = self._quick()
        if samples is not self.samples or judge is not self.judge:
            return None
        return self.cache.get((*key[:-1], not key[-1]))

    def _record_twin(self, key: tuple, step: str, twin: Scored) -> None:
        """`_record` of ``key`` with its twin's verdict (`_twin`): the same figures, its own
        step and price."""
        scored = replace(twin, loads=twin.loads.copy(), failures=list(twin.failures),
                         slowdown=None,
                         scales=None if twin.scales is None else twin.scales.copy())
        self.cache[key] = scored
        self.steps.append({"step": step, "tensors": len(key[0]), "passed": scored.passed,
                           "margin": round(scored.margin, 6)})
        self.on_score(len(self.steps))

    def _record(self, key: tuple, choice: Mapping[str, str], step: str, verdict) -> None:
        if not choice and not key[-1] and not hasattr(self, "_plain_verdict"):
            self._plain_verdict = verdict
        scored = Scored(key[0], verdict.passed and self._extra_bar(verdict) >= 0,
                        min(verdict.margin(), self._extra_bar(verdict)), loads(verdict),
                        list(verdict.failures), span_ratio(verdict), None, key[1:4],
                        load_scales(verdict))
        self.cache[key] = scored
        self.steps.append({"step": step, "tensors": len(key[0]), "passed": scored.passed,
                           "margin": round(scored.margin, 6)})
        self.on_score(len(self.steps))

    def _quick(self):
        """The worst samples of int8 everywhere (at most ``QUICK_SAMPLES``) and their judge;
        every sample where int8 misses the task (its samples are not the cosines' worst: on
        BlazePose's detector the worst-cosine images kept no anchor, so every block ranked
        "passes" and the search kept 94 of 95 tensors)."""
        if getattr(self, "_quick_set", None) is None:
            worst = [m.get("worst_sample") for _, m, _ in self._plain_verdict.checks]
            picked = list(dict.fromkeys(i for i in worst if i is not None))[:QUICK_SAMPLES]
            subset = getattr(self.judge, "subset", None)
            task_missed = bool(getattr(self._plain_verdict, "task_shortfall", list)())
            if subset is None or not picked or len(self.samples) <= QUICK_SAMPLES or task_missed:
                self._quick_set = (self.samples, self.judge)
            else:
                self._quick_set = ([self.samples[i] for i in picked], subset(picked))
        return self._quick_set

    def _extra_bar(self, verdict) -> float:
        """``auto.min_cosine`` on every output (all samples and worst sample), as a margin."""
        if self.spec.min_cosine is None:
            return 1.0
        values = [v for m in verdict.outputs.values()
                  for v in (m["cosine"], m.get("min_sample_cosine")) if v is not None]
        return min(values, default=1.0) - self.spec.min_cosine

    # ---- candidates ---------------------------------------------------------------------

    def _candidates(self) -> list[str]:
        """Every quantized activation a layer rounds or a graph takes in, and every quantized
        constant operand an override can name whose int8 integers do not hold it (a window,
        a BatchNorm's per-channel scale and offset as Mul/Add constants: int16, or float with
        its readers on the CPU; the search scores it with the quantizer's own values,
        `fakequant.quantizer_inputs`), in pipeline order. A tensor that only moves data
        (reshape, transpose, slice, maxpool ...) shares its source's parameters: it goes with
        its source (``members``), whatever precision."""
        members: dict[str, list[str]] = {}
        constants: set[str] = set()
        for state in self.workflow.states:
            qg = state.qgraph
            source: dict[str, str] = {}
            for t in qg.inputs:
                source[t] = t
            named = self.names[state.graph.index]
            for layer in qg.layers:
                source.update((t, t) for t in layer.inputs if t in qg.constants and t in named
                              and not held_exactly(qg, state.fg, t))
            constants.update(t for t in source if t in qg.constants)
            for layer in qg.layers:
                moves = layer.kind in MOVES_DATA or (
                    layer.kind == "resize" and layer.attrs.get("mode") == "nearest")
                for t in layer.outputs:
                    source[t] = source.get(layer.inputs[0], layer.inputs[0]) if moves else t
            for t, root in source.items():
                info = qg.tensors.get(t)
                if info is None or info.is_float:
                    continue
                group = members.setdefault(root, [])
                if t not in group:
                    group.append(t)
        self.members, self.constants = members, frozenset(constants)
        return list(members)

    def _calibrated_candidates(self) -> list[str]:
        """The candidates a calibration method applies to: not the quantized constants, whose
        range is their value (a block of per-tensor methods that named them changed nothing
        and moved the blocks the method search tries: BirdNET's)."""
        return [t for t in self.candidates if t not in self.constants]

    def _expanded(self, choice: Mapping[str, str]) -> list[OverrideSpec]:
        return [OverrideSpec(tensors=(t,), precision=p) for root, p in sorted(choice.items())
                for t in self.members.get(root, [root])]

    # ---- the search ---------------------------------------------------------------------

    def run(self, margin: float = 0.0, span: float = 0.0, refuted: frozenset = frozenset()
            ) -> SearchResult:
        """The fewest wide tensors whose choice passes with at least ``margin`` of cosine and
        every judged channel keeping at least ``span`` of its reference's span (the caller
        raises both where the integer reference missed what fake quantization passed), other
        than the ``refuted`` ones: (choice, method, per-tensor methods, scheme) keys the
        integer reference failed."""
        self.margin, self.span, self.ranking = margin, span, []
        self.refuted = refuted
        # every run starts from the recipe's own calibration (an earlier run's choice would be
        # scored as "int8 everywhere" and then misnamed)
        self.method, self.methods, self.scheme = self.recipe_choice
        plain = self.score({}, "int8 everywhere")
        best = plain
        try:
            if margin > 0 and self.levels:  # never demand more than the widest choice gives
                widest = self.score({t: self.levels[-1] for t in self.candidates},
                                    f"every candidate {self.levels[-1]}")
                self.margin = min(margin, MAX_DEMAND * max(widest.margin, 0.0))
            if self.ok(plain):
                return self._result(plain, plain, {})
            if self.choose_methods or self.choose_scheme:
                best = self._choose_methods(plain)
                if self.ok(best):
                    return self._result(plain, best, {})
            level = self._reach()
            if level is None:
                return self._unreachable(plain)
            # float on every candidate passes where int16 does not: float only on the few
            # tensors int16 is not enough for, int16 on the rest (the mixed reach)
            wide = (self._mixed_reach() if level == "float" and "int16" in self.levels
                    else level)
            ranking = self.ranking = self._rank(wide)
            chosen = self._cover(ranking, wide)
            best = self.score(chosen)
            chosen = self._drop(chosen, ranking)
            if level in ("float", WIDE_WEIGHTS) and "int16" in self.levels:
                chosen = self._demote(chosen, level)
            best = self.score(chosen)
            if not self.affordable(best):
                within = self._within_budget(plain, best, ranking)
                # only where the budget path misses: it finds hand landmark's 3.0x choice,
                # float beside w16a16 one at 9.5x
                mixed = (self._float_beside_wide_weights(plain)
                         if level == "float" and not within.reached else None)
                return mixed or within
            return self._result(plain, best, chosen, ranking)
        except OutOfTime:
            # priced in order of preference, the first within budget kept (a price is a plan)
            # only scores on every sample decide: a quick one (int8's worst samples) ranks
            # blocks (GTCRN kept int16 everywhere at its quick +0.0076, -0.037 on every sample)
            decided = [s for key, s in self.cache.items() if not key[-1]]
            done = sorted((s for s in decided if self.ok(s)),
                          key=lambda s: (len(s.choice), -s.margin))
            best = next((s for s in done if self.affordable(s)), None) or next(
                (s for s in sorted(decided, key=lambda s: -s.margin)
                 if self.affordable(s)), plain)
            result = self._result(plain, best, best.wide, self.ranking)
            result.note = (f"the search stopped at its time budget (quantization.auto.seconds: "
                           f"{self.spec.seconds:g})") + _short_of(self, best)
            return result

    def ok(self, scored: Scored) -> bool:
        """Whether ``scored`` passes with the demanded margin and span, and was not refuted
        on the integer reference (fake quantization passed a choice the reference failed)."""
        return (scored.passed and scored.margin >= self.margin
                and scored.span_ratio >= getattr(self, "span", 0.0)
                and (scored.choice, *scored.calibration) not in getattr(self, "refuted", ()))

    def affordable(self, scored: Scored) -> bool:
        """Whether ``scored``'s float layers keep the model within the slowdown budget."""
        return self.priced(scored) <= self.spec.max_slowdown * (1 + 1e-9)

    def _choose_methods(self, plain: Scored) -> Scored:
        """Calibration methods by measurement (the recipe left ``calibration.method`` unset):
        every method on every tensor, the best kept; then blocks of tensors go back to
        min/max where that scores better (a clipping method helps a tensor with rare
        outliers and hurts one whose extremes carry the signal)."""
        best, scores = plain, {"minmax": plain}
        if self.choose_scheme and self.scheme in ALTERNATIVE_SCHEMES:
            first = self.scheme
            self.scheme = ALTERNATIVE_SCHEMES[first]
            scores[f"scheme {self.scheme}"] = trial = self.score({}, f"scheme {self.scheme}")
            if self._better(trial, best):
                best = trial
            else:
                self.scheme = first
            if self.ok(best) or not self.choose_methods:
                self.method_scores = {m: round(sc.margin, 6) for m, sc in scores.items()}
                return best
        for method in ALTERNATIVE_METHODS:
            self.method, self.methods = method, ()
            scores[method] = self.score({}, f"calibration {method} everywhere")
            if self._better(scores[method], best):
                best = scores[method]
        self.method = next((m for m, sc in scores.items() if sc is best and
                            m in ("minmax", *ALTERNATIVE_METHODS)), "minmax")
        self.methods = ()
        if self.method != "minmax":
            tensors = self._calibrated_candidates()
            start, block = 0, max(1, len(tensors) // 2)
            for _ in range(METHOD_EVALUATIONS):
                if start >= len(tensors) or self.ok(best):
                    break
                trial = (*self.methods, *((t, "minmax") for t in tensors[start:start + block]))
                previous, self.methods = self.methods, tuple(sorted(trial))
                scored = self.score({}, "calibration min/max on a block")
                if self._better(scored, best):
                    best, start, block = scored, start + block, block * 2
                else:
                    self.methods = previous
                    if block > 1:
                        block //= 2
                    else:
                        start += 1
        self.method_scores = {m: round(sc.margin, 6) for m, sc in scores.items()}
        return best

    def _better(self, scored: Scored, than: Scored) -> bool:
        """A choice that passes beats one that does not, whatever their cosine margins (a
        failure the margin does not show, such as a dead channel, is still a failure); then
        the higher margin."""
        return (self.ok(scored), scored.margin) > (self.ok(than), than.margin)

    def _reach(self) -> str | None:
        """The cheapest wide precision that passes with every candidate wide."""
        for level in self.levels:
            if self.ok(self.score({t: level for t in self.candidates}, f"every candidate {level}")):
                return level
        return None

    def _mixed_reach(self) -> dict[str, str]:
        """Each candidate's widest precision where int16 on every candidate misses and float
        on every candidate passes: float on the fewest tensors that pass with int16 on every
        other candidate (ranked by what float buys over that base, covered and dropped as the
        search does over int8), int16 on the rest. Float on every candidate made most of an
        unrolled recurrent cell float on the CPU (Silero VAD v6: 356 float layers, 609 → 172
        fps) where int16 misses on a handful of its tensors only."""
        base = {t: "int16" for t in self.candidates}
        # where calibration already names them: one score, then the drop pass over them, no
        # ranking. A quiet power spectrum's tensors: the latest in the graph dropped first; a
        # residual stream's (its typical value a few int16 steps): the costliest on the CPU
        # first (flan-t5's encoder: its 32 such tensors in float 29x int8's time, where its
        # 17 residual Adds alone pass at 2.3x)
        for name, why, costly_first in (
                (self._quiet_in_int16, "a quiet sample underflows int16", False),
                (self._coarse_in_int16, "the typical value is a few int16 steps", True)):
            named = name()
            if not (named and self.ok(self.score({**base, **{t: "float" for t in named}},
                                                 f"mixed reach: float where {why}"))):
                continue
            if costly_first:
                cost = self._float_costs(named)
                named = [t for _, _, t in sorted((cost[t], k, t) for k, t in enumerate(named))]
            self.base = base
            try:
                floats = self._drop({t: "float" for t in named},
                                    [{"tensors": (t,), "weight": 1.0} for t in named])
            finally:
                self.base = {}
            return {**base, **floats}
        self.base = base
        try:
            ranking = self._rank("float")
            floats = self._drop(self._cover(ranking, "float"), ranking)
        finally:
            self.base = {}
        reach = {**base, **floats}
        self.score(reach, "mixed reach: float where int16 is not enough")
        return reach

    def _quiet_in_int16(self) -> list[str]:
        """The candidates whose quietest calibration sample int16 cannot hold where their
        loudest it can (`Quantizer.quiet_in_int16`), in candidate order: measured from the
        calibration statistics, no score. GTCRN's power spectrum (its Sqrt's input, a verify
        frame 500 times quieter than calibration's loudest): int16 everywhere missed, float
        everywhere passed, and the ranking, cover and drop that found such tensors among
        3,443 candidates scored 28 choices of a 4,590-layer graph (124 s of the time budget's
        600 s of work)."""
        return self._named_by_calibration("quiet_in_int16")

    def _coarse_in_int16(self) -> list[str]:
        """The candidates whose loudest calibration sample's typical value int16 holds in a
        few steps (`Quantizer.coarse_in_int16`: a range set by a few outlier channels, as a
        transformer's residual stream), in candidate order; no score."""
        return self._named_by_calibration("coarse_in_int16")

    def _named_by_calibration(self, test: str) -> list[str]:
        """The candidates one of whose tensors the quantizer's ``test`` names from the
        calibration statistics, in candidate order."""
        named: set[str] = set()
        for state in self.states.values():
            q = quantizer.Quantizer(state.fg, state.observer.stats,
                                    replace(self.workflow.options.config, scheme=self.scheme),
                                    ranges=self.ranges)
            named.update(t for t in state.qgraph.tensors
                         if t not in state.qgraph.constants and getattr(q, test)(t))
        return [root for root in self.candidates
                if any(t in named for t in self.members.get(root, [root]))]

    def _float_costs(self, roots: Sequence[str]) -> dict[str, float]:
        """Per candidate, what float on it alone costs on the host, estimated from the graph
        without placing it (a placement per tensor is a quantizer per tensor: hundreds of
        named tensors on a graph of thousands of layers): a run plus the MACs of every layer
        that reads or writes it or a tensor moving its data (`quantizer.moved_by_float`)."""
        run = 0.0 if self.float_on_npu else price.CPU_RUN_SECONDS
        touching: dict[str, float] = {}
        for index, state in self.states.items():
            for layer in state.fg.layers:
                seconds = price.host_seconds(self.work[index].get(layer.name, 0),
                                             self.float_seconds, run)
                for t in dict.fromkeys([*layer.inputs, *layer.outputs]):
                    touching[t] = touching.get(t, 0.0) + seconds
        return {root: sum(touching.get(t, 0.0) for t in self.members.get(root, [root]))
                for root in roots}

    def _rank(self, wide: str | Mapping[str, str]) -> list[dict]:
        """Blocks of candidates (single tensors where it matters), most useful first, each
        with what it buys when it alone goes ``wide`` (one precision, or each tensor's own:
        the mixed reach; every other candidate int8): the load it
        takes off each judged figure. Where int8 weights are what fails, a tensor kept in float
        buys its layers' float weights too, so the gain is measured, never assumed. What a
        block buys counts up to what the demanded margin and span need, not verify's bars
        alone: int8 within the bars but short of the demand (the ISBN detector's, 0.005 above
        0.99) ranked every block as buying nothing, and the cover took 239 of 246 tensors."""
        quick = self.rank_quick = self._quick_ranks()
        plain_scored = self.score({}, "int8 everywhere, worst samples", quick=quick)
        plain = plain_scored.loads
        need = np.maximum(
            plain - COVER_HEADROOM * allowed_loads(plain_scored, self.margin, self.span), 0.0)
        total = float(need.sum()) or 1.0

        def measure(blocks: list[tuple[str, ...]]) -> list[dict]:
            scores = self.score_all([({t: _at(wide, t) for t in block}, f"rank {len(block)}")
                                     for block in blocks], quick=quick)
            out = []
            for block, scored in zip(blocks, scores):
                gain = np.maximum(plain - scored.loads, 0.0)
                weight = float(np.minimum(gain, need).sum()) / total
                out.append({"tensors": block, "gain": gain, "weight": weight})
            return out

        size = max(1, -(-len(self.candidates) // FIRST_BLOCKS))
        blocks = measure([tuple(self.candidates[i:i + size])
                          for i in range(0, len(self.candidates), size)])
        heap = [(-b["weight"], i, b) for i, b in enumerate(blocks)]
        heapq.heapify(heap)
        done, counter, spent = [], len(heap), 0
        while heap:
            weight, _, block = heapq.heappop(heap)
            if (len(block["tensors"]) == 1 or -weight < SPLIT_BELOW
                    or spent >= MAX_RANK_EVALUATIONS):
                done.append(block)
                continue
            half = len(block["tensors"]) // 2
            halves = measure([block["tensors"][:half], block["tensors"][half:]])
            spent += len(halves)
            if sum(h["weight"] for h in halves) < TOGETHER * block["weight"]:
                done.append(block)  # its gain needs its tensors together: it stays whole
                continue
            for measured in halves:
                heapq.heappush(heap, (-measured["weight"], counter, measured))
                counter += 1
        order = {t: i for i, t in enumerate(self.candidates)}
        return sorted(done, key=lambda b: (-b["weight"], order[b["tensors"][0]]))

    def _quick_ranks(self) -> bool:
        """Whether the ranking may score blocks on int8's worst samples (`_quick`): not where
        they meet the demanded cosine margin that every sample misses (the ISBN detector's
        two worst samples by min/max were not its worst under the calibration chosen, and
        within 0.005 of the bar; every block then ranked as buying nothing)."""
        full = self.score({}, "int8 everywhere")
        quick = self.score({}, "int8 everywhere, worst samples", quick=True)
        return quick.margin < self.margin or full.margin >= self.margin

    def _cover(self, ranking: list[dict], wide: str | Mapping[str, str]) -> dict[str, str]:
        """The shortest passing prefix of ``ranking``: first where the predicted load leaves
        headroom, then doubling, then bisection."""
        plain_scored = self.score({}, quick=getattr(self, "rank_quick", True))
        plain = plain_scored.loads
        headroom = COVER_HEADROOM * allowed_loads(plain_scored, self.margin, self.span)

        def prefix(k: int) -> dict[str, str]:
            return {t: _at(wide, t) for b in ranking[:k] for t in b["tensors"]}
        predicted = plain.copy()
        start = len(ranking)
        for k, block in enumerate(ranking):
            if float(np.max(predicted - headroom, initial=0.0)) <= 0.0:
                start = k
                break
            predicted = predicted - block["gain"]
        start = max(1, start)
        low, high = 0, None
        k = start
        while k <= len(ranking):
            if self.ok(self.score(prefix(k), "cover")):
                high = k
                break
            low, k = k, min(len(ranking), 2 * k) if k < len(ranking) else len(ranking) + 1
        if high is None:
            return prefix(len(ranking))
        while high - low > 1:
            mid = (low + high) // 2
            if self.ok(self.score(prefix(mid), "cover")):
                high = mid
            else:
                low = mid
        return self._capped(prefix(high), ranking)

    def _capped(self, chosen: dict[str, str], ranking: list[dict]) -> dict[str, str]:
        cap = self.spec.max_overrides
        if cap is None or len(chosen) <= cap:
            return chosen
        order = [t for b in ranking for t in b["tensors"] if t in chosen]
        return {t: chosen[t] for t in order[:cap]}

    def _drop(self, chosen: dict[str, str], ranking: list[dict]) -> dict[str, str]:
        """Drop what the thresholds do not need, least important first, in blocks."""
        weight = {t: (i, b["weight"]) for i, b in enumerate(ranking) for t in b["tensors"]}
        order = sorted(chosen, key=lambda t: (-weight[t][0], t))
        start, block = 0, max(1, len(order) // 2)
        for _ in range(DROP_EVALUATIONS):
            if start >= len(order):
                break
            dropped = set(order[start:start + block])
            rest = {t: p for t, p in chosen.items() if t not in dropped}
            if self.ok(self.score(rest, "drop")):
                chosen = rest
                start, block = start + len(dropped), block * 2
            elif block > 1:
                block //= 2
            else:
                start += 1
        return chosen

    def _demote(self, chosen: dict[str, str], source: str = "float") -> dict[str, str]:
        """``source`` choices (float, or W16A16) become int16 where that still passes (a
        float layer stays on the NPU; a W16A16 one keeps int8 weights) and is no slower:
        int16 that pushes a layer off the integer kernels costs time too."""
        floats = sorted(t for t, p in chosen.items() if p == source)
        start, block = 0, max(1, len(floats))
        current = self.slowdown(chosen)
        for _ in range(DEMOTE_EVALUATIONS):
            if start >= len(floats):
                break
            trial = {**chosen, **{t: "int16" for t in floats[start:start + block]}}
            cost = self.slowdown(trial)
            if (cost <= current * (1 + 1e-9)
                    and self.ok(self.score(trial, f"int16 instead of {source}"))):
                chosen, current, start, block = trial, cost, start + block, block * 2
            elif block > 1:
                block //= 2
            else:
                start += 1
        return chosen

    def _float_beside_wide_weights(self, plain: Scored) -> SearchResult | None:
        """Where float is what passes, its fewest tensors cost more than the budget and the
        budget path (`_within_budget`) misses too: the fewest float tensors on top of w16a16
        everywhere else (ranked, covered and dropped
        against that base, not against int8), then w16a16 demoted to int16 where that still
        passes; None where that misses or is over budget too. PP-OCRv2's recognizer: w16a16
        everywhere 0.9888 / 0.9384, 119 float tensors 516x int8's time; its first hard-swish
        block in float beside w16a16 0.9994."""
        if WIDE_WEIGHTS not in self.levels:
            return None
        base = {t: WIDE_WEIGHTS for t in self.candidates}
        self.base = base
        try:
            ranking = self._rank("float")
            floats = self._drop(self._cover(ranking, "float"), ranking)
            if not self.affordable(self.score(floats)):  # the most useful that fit instead
                floats = self._fitting({}, [b["tensors"] for b in ranking], "float",
                                       self.spec.max_slowdown)
        finally:
            self.base = {}
        chosen = {**base, **floats}
        best = self.score(chosen, f"float blocks beside {WIDE_WEIGHTS}")
        if not (self.ok(best) and self.affordable(best)):
            return None
        chosen = self._demote(chosen, WIDE_WEIGHTS)
        return self._result(plain, self.score(chosen), chosen, ranking)

    def _within_budget(self, plain: Scored, needed: Scored, ranking: list[dict]) -> SearchResult:
        """The fewest-tensor choice costs more time than the budget allows: the most useful
        float blocks that fit it (then int16, else w16a16, on every other candidate that fits),
        then the drop and demote passes; where that misses, int8 stays (a deployment slowed past the
        budget is not what the recipe asked for) and the note says what would pass: the same
        procedure at doubled budgets finds the smallest budget it measured passing, so the
        setting it names is one that passes, not the fewest-tensor choice's cost."""
        budget = self.spec.max_slowdown
        chosen, within = self._fit_budget(ranking, budget)
        if self.ok(within):
            steps = [chosen, self._drop(chosen, ranking)]
            if "int16" in self.levels:
                steps.append(self._demote(steps[-1]))
                if WIDE_WEIGHTS in steps[-1].values():
                    steps.append(self._demote(steps[-1], WIDE_WEIGHTS))
            # each step passes; the last that fits the budget is kept (fewer float tensors
            # can mean more CPU segments, each a hand-over), and the first fits by construction
            for step in reversed(steps):
                final = self.score(step)
                if self.affordable(final):
                    return self._result(plain, final, step, ranking)
        accept, cheapest = math.ceil(self.priced(needed) * 10) / 10, needed
        wider = budget
        for _ in range(BUDGET_DOUBLINGS):
            wider *= 2
            if wider >= self.priced(needed):
                break
            _, trial = self._fit_budget(ranking, wider)
            if self.ok(trial):
                accept, cheapest = wider, trial
                break
        result = self._result(plain, plain, {}, ranking)
        result.best_reachable = {
            "needed": self._reachable(needed, accept if cheapest is needed else None),
            **({} if cheapest is needed else {"cheapest": self._reachable(cheapest, accept)}),
            "within_budget": {"passes": False, "tensors": len(within.choice),
                              "slowdown": round(self.priced(within), 3),
                              "margin": round(within.margin, 6)}}
        cheaper = ("" if cheapest is needed else
                   f"; {self._wide_text(cheapest)} also pass, at an estimated "
                   f"{self.priced(cheapest):.3g}x, found within {accept:g}x")
        result.note = (
            f"verify's thresholds need {self._wide_text(needed)}, which makes the "
            f"model an estimated {self.priced(needed):.3g}x slower than in int8{cheaper} "
            f"(quantization.auto.max_slowdown: {budget:g}); the best choice within that misses "
            f"({self._shortfall(within)}), so int8 stays. To accept the cost, set "
            f"quantization.auto.max_slowdown: {accept:g}")
        return result

    def _fit_budget(self, ranking: list[dict], budget: float) -> tuple[dict[str, str], Scored]:
        """The most useful float blocks whose estimated time fits ``budget``, then (where
        that misses and the chip has int16) int16 on every other candidate that fits too, then
        (where that misses too) w16a16 instead; the choice and its score."""
        floats = (self._fitting({}, [b["tensors"] for b in ranking], "float", budget)
                  if "float" in self.levels else {})
        chosen = floats
        within = self.score(chosen, f"most useful float blocks within {budget:g}x")
        others = [t for t in self.candidates if t not in floats]
        for level in ("int16", WIDE_WEIGHTS):  # then int16 weights too, where int8's bound it
            if self.ok(within) or level not in self.levels:
                continue
            # int16 costs time too where it pushes a layer off the integer kernels
            chosen = self._fitting(floats, [others], level, budget)
            within = self.score(chosen, f"and {level} on every other candidate within {budget:g}x")
        return chosen, within

    def _reachable(self, scored: Scored, accept: float | None) -> dict:
        """A passing choice as best_reachable reports it."""
        return {"passes": True, "tensors": len(scored.choice),
                "float_tensors": sum(p == "float" for p in scored.wide.values()),
                "slowdown": round(self.priced(scored), 3), "margin": round(scored.margin, 6),
                **({"max_slowdown_to_accept": accept} if accept is not None else {})}

    def _wide_text(self, scored: Scored) -> str:
        """What ``scored`` keeps out of int8, in words."""
        floats = sum(p == "float" for p in scored.wide.values())
        if floats == len(scored.choice):
            return f"{floats} tensor(s) {self.float_where}"
        wide = sum(p == WIDE_WEIGHTS for p in scored.wide.values())
        weights = f"{wide} {WIDE_WEIGHTS}; " if wide else ""
        return (f"{len(scored.choice)} tensor(s) out of int8 ({floats} {self.float_where}; "
                f"{weights}int16 moves {self._moved_off(scored.wide)} layer(s) off the integer "
                f"kernels)")

    def _moved_off(self, choice: Mapping[str, str]) -> int:
        """How many layers ``choice``'s int16 tensors alone push into float."""
        int16 = {t: p for t, p in choice.items() if p in ("int16", WIDE_WEIGHTS)}
        return len(self._in_float(int16) - self._in_float({}))

    def _fitting(self, chosen: dict[str, str], blocks: list[list[str]], precision: str,
                 budget: float) -> dict[str, str]:
        """``chosen`` with every block of tensors at ``precision`` that keeps the estimated
        time within ``budget``, in order; a block that does not fit is halved (its cheap
        tensors may)."""
        budget = budget * (1 + 1e-9)
        blocks = [list(b) for b in blocks if b]
        while blocks:
            if self.clock() > self.deadline:  # a fit prices thousands of trials, scoring none
                raise OutOfTime()
            block = blocks.pop(0)
            trial = {**chosen, **{t: precision for t in block}}
            if not self._over_budget(trial, budget):
                chosen = trial
            elif len(block) > 1:
                blocks[:0] = [block[:len(block) // 2], block[len(block) // 2:]]
        return chosen

    def _shortfall(self, scored: Scored) -> str:
        """What keeps ``scored`` from `ok`, in words: verify's first failure, else the channel
        span or cosine margin the caller demanded."""
        if scored.failures:
            return scored.failures[0]
        if scored.span_ratio < self.span:
            return (f"a judged channel keeps {scored.span_ratio:.2f} of its reference's span, "
                    f"{self.span:.2f} demanded")
        return f"cosine margin {scored.margin:+.4f}, {self.margin:.4f} demanded"

    # ---- results ------------------------------------------------------------------------

    def _unreachable(self, plain: Scored) -> SearchResult:
        """Nothing allowed reaches the thresholds: int8 stays (a deployment moved to int16 or
        the CPU wholesale that still fails helps nobody), and the result says what each
        precision on every candidate reaches, measured even where the chip lacks it."""
        result = self._result(plain, self.score({}), {})
        reach = {}
        for level in WIDE:
            trial = self.score({t: level for t in self.candidates}, f"what {level} would reach")
            reach[level] = {"passes": trial.passed, "margin": round(trial.margin, 6)}
        result.best_reachable = reach
        parts = [f"{level} on every candidate tensor {'would pass' if r['passes'] else 'would still miss'}"
                 f" (cosine margin {r['margin']:+.4f})" for level, r in reach.items()]
        allowed_text = ", ".join(self.levels) or "nothing"
        result.note = (f"no choice the chip allows ({allowed_text}) reaches verify's thresholds; "
                       + "; ".join(parts))
        return result

    def _result(self, plain: Scored, best: Scored, chosen: dict[str, str],
                ranking: list[dict] | None = None) -> SearchResult:
        shown, why = [], {}
        for rank, block in enumerate(ranking or []):
            if rank < 12:
                shown.append({"tensors": list(block["tensors"][:8]), "count": len(block["tensors"]),
                              "share_of_needed_gain": round(block["weight"], 6)})
            for t in block["tensors"]:
                if t in chosen:
                    why[t] = {"rank": rank, "share_of_needed_gain": round(block["weight"], 6),
                              **({"measured_in_block_of": len(block["tensors"])}
                                 if len(block["tensors"]) > 1 else {})}
        return SearchResult(self.ok(best), dict(chosen), plain.margin, best.margin,
                            len(self.cache), round(self.clock() - self.started, 3),
                            list(self.steps), shown, why=why,
                            members={t: self.members[t] for t in chosen if t in self.members},
                            method=self.method, tensor_methods=self.methods, scheme=self.scheme,
                            method_scores=dict(getattr(self, "method_scores", {})))


def _at(wide: str | Mapping[str, str], tensor: str) -> str:
    """``tensor``'s precision under ``wide``: one precision for every tensor, or each its own."""
    return wide if isinstance(wide, str) else wide[tensor]


def layer_macs(fg) -> dict[str, int]:
    """Each layer's multiply-accumulates as the split counts a CPU submodel's
    (`npubuild.split.cost.node_macs` over the layer's source nodes: a fused node by its body),
    so a layer moved to the CPU costs what it would cost in a CPU submodel."""
    per_node = dict(macs_per_node(fg.model))
    return {layer.name: sum(per_node.get(node, 0) for node in layer.source_nodes)
            for layer in fg.layers}


MOVES_DATA = set(DATA_MOVEMENT)


def span_ratio(verdict) -> float:
    """The lowest ``min_channel_span_ratio`` of the checks that fail on dead channels."""
    values = [m.get("min_channel_span_ratio") for _, m, limits in verdict.checks
              if limits.dead_channels is not False]
    return min((v for v in values if v is not None), default=1.0)


def loads(verdict) -> np.ndarray:
    """What the ranking adds up, one entry per thing verify judges: per judged cosine (every
    check, all samples and worst sample) its error over the error its bar allows,
    ``(1 - cosine) / (1 - bar)`` (1 is at the bar; errors of independent roundings add); per
    check, its dead channels; the task's shortfall against ``min_task_agreement`` (an anchor
    task: every anchor's score and box load instead)."""
    return _load_entries(verdict)[0]


def load_scales(verdict) -> np.ndarray:
    """Per entry of `loads`, how a demand above verify's bars moves the load it allows: a
    judged cosine's ``1 / (1 - bar)`` (a cosine margin ``m`` allows ``1 - m / (1 - bar)``),
    ``SPAN_ENTRY`` for a check's dead-channel entry (a demanded span ``s`` allows ``1 - s``),
    0 for the task's entries (no demand above them)."""
    return _load_entries(verdict)[1]


SPAN_ENTRY = -1.0


def allowed_loads(scored: Scored, margin: float, span: float) -> np.ndarray:
    """Per entry of ``scored.loads``, the highest load that meets verify's bars with the
    demanded cosine ``margin`` and channel ``span`` (1 where ``scored`` does not say how its
    loads relate to a bar: the demand is then not weighed)."""
    if scored.scales is None or len(scored.scales) != len(scored.loads):
        return np.ones_like(scored.loads)
    scales = scored.scales
    return np.where(scales > 0, 1.0 - margin * scales,
                    np.where(scales == SPAN_ENTRY, 1.0 - span if span > 0 else 1.0, 1.0)
                    ).clip(0.0, 1.0)


def _load_entries(verdict) -> tuple[np.ndarray, np.ndarray]:
    """`loads` and `load_scales` of ``verdict``, entry for entry."""
    out, scales = [], []
    for _, metrics, limits in verdict.checks:
        bars = [limits.min_cosine, limits.sample_cosine]
        values = [metrics["cosine"], metrics.get("min_sample_cosine")]
        for bar, value in zip(bars, values):
            if bar is not None:
                value = -1.0 if value is None and values[0] is None else value
                if value is not None:
                    out.append((1.0 - value) / max(1e-9, 1.0 - bar))
                    scales.append(1.0 / max(1e-9, 1.0 - bar))
        if limits.dead_channels is not False:
            ratio = metrics.get("min_channel_span_ratio")
            out.append(2.0 * metrics.get("dead_channel_count", 0)
                       + (0.0 if ratio is None else max(0.0, 1.0 - ratio)))
            scales.append(SPAN_ENTRY)
    task, minimum = verdict.task or {}, verdict.task_minimum
    grades = getattr(verdict, "task_grades", None)
    if grades is not None and minimum is not None:
        # the anchor task graded per anchor (`tasks.anchor_grades`): its agreement moves in
        # steps of one anchor over a dozen, which ranks no block of tensors above another
        grades = np.asarray(grades, np.float64)
        return (np.concatenate([np.asarray(out, np.float64), grades]),
                np.concatenate([np.asarray(scales, np.float64), np.zeros(len(grades))]))
    if task.get("agreement") is not None and minimum is not None:
        out.append((1.0 - task["agreement"]) / max(1.0 - minimum, 0.5 / (task.get("samples") or 4)))
        scales.append(0.0)
    return np.asarray(out, np.float64), np.asarray(scales, np.float64)


def _short_of(search: PrecisionSearch, best: Scored) -> str:
    """What a choice kept at the time budget falls short of: nothing; the margin the search
    demands above verify's thresholds (the choice meets the thresholds themselves on the
    scored samples); or the thresholds."""
    if search.ok(best):
        return ""
    if best.passed and best.margin >= 0:
        return (f" before reaching the margin it demands above verify's thresholds "
                f"({best.margin:+.4f} of {search.margin:+.4f}; the thresholds themselves are met)")
    return " before reaching verify's thresholds"
