"""What every stage's equivalence proof feeds a model, and how it compares the results.

**Proof inputs** are made here and nowhere else. Per model input, in this order:

1. the recipe's ``model.inputs[].proof``: ``values`` (e.g. a sample rate that must be 16000),
   ``data`` (a ``.npy``/``.npz`` file) or ``range`` (seeded random values in ``[low, high]``);
2. the first calibration sample, where the calibration data cover the input (real images give
   real activations; seeded noise drives a detector's output to all zeros);
3. seeded random values of the input's own dtype and shape: floats standard normal, integers
   small and non-negative (they are often indices or sizes), bools random.

The import stage makes them once and saves them next to its model (``proof_inputs.npz``);
surgery carries them through its rewrites (renamed or reshaped inputs) and saves the inputs of
its own model, and so on, so every later proof runs on the same values and the cache key of
every stage covers them.

**Equivalence** (`compare`) is judged against the scale of the values involved: a tensor's
largest difference is divided by the larger of its own largest magnitude and that of the values
its producing node read. Float arithmetic rounds relative to the operands, so exact algebra
(folding a BatchNormalization into a Conv) leaves errors of ~1e-7 of the logits; behind a
saturated Sigmoid whose output is all ~1e-5, the same error is 1e-2 of the output's own
magnitude. Judged against the logits' scale it is what it is: rounding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.errors import BuildError
from npubuild.metrics import Similarity, similarity
from npubuild.model_inputs import RecipeInputs
from npubuild.onnx_io import STANDARD_DOMAINS

if TYPE_CHECKING:
    from npubuild.recipe import LoadedRecipe

FILE_NAME = "proof_inputs.npz"
SEED = 0
log = logging.getLogger("npubuild")


# ---- proof inputs ----------------------------------------------------------------------------

def make_feeds(model: onnx.ModelProto, loaded: "LoadedRecipe | None" = None,
               sample: Mapping[str, np.ndarray] | None = None, seed: int = SEED
               ) -> dict[str, np.ndarray]:
    """One value per real input of ``model`` (see the module docstring for the order); recipe
    values that do not fit the input raise a `UserError` located at ``model.inputs[i].proof``."""
    rng = np.random.default_rng(seed)
    inputs = RecipeInputs(loaded.recipe.model.inputs if loaded is not None else ())
    feeds = {}
    for value in onnx_io.graph_inputs(model):
        shape, dtype = _fixed_shape(value), onnx_io.value_dtype(value)
        index = inputs.index(value.name)
        spec = inputs.specs[index].proof if index is not None else None
        if spec is not None:
            feeds[value.name] = _from_recipe(loaded, index, spec, value.name, shape, dtype, rng)
        elif sample is not None and np.size(sample.get(value.name, ())) == int(np.prod(shape)):
            feeds[value.name] = np.reshape(np.asarray(sample[value.name]), shape).astype(dtype)
        else:
            feeds[value.name] = _random(rng, shape, dtype)
    return feeds


def _fixed_shape(value: onnx.ValueInfoProto) -> list[int]:
    shape = onnx_io.value_shape(value)
    if any(not isinstance(d, int) for d in shape):
        raise BuildError(f"input {value.name!r} still has dynamic dims {shape}",
                         hint="fix them with model.inputs[].shape in the recipe")
    return shape


def _random(rng, shape: list[int], dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        return np.asarray(rng.integers(0, 4, size=shape)).astype(dtype)
    return np.asarray(rng.standard_normal(shape)).astype(dtype)


def _from_recipe(loaded, index: int, spec, name: str, shape: list[int], dtype: np.dtype, rng):
    where = ("model", "inputs", index, "proof")
    if spec.range is not None:
        low, high = spec.range
        if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            return np.asarray(rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1,
                                           size=shape)).astype(dtype)
        return np.asarray(rng.uniform(low, high, size=shape)).astype(dtype)
    if spec.values is not None:
        values, field = np.asarray(spec.values), "values"
    else:
        path = loaded.resolve(spec.data, *where, "data")
        values, field = _read_file(loaded, path, name, (*where, "data")), "data"
    return recipe_values(loaded, (*where, field), values, name, shape, dtype, f"proof {field}")


def recipe_values(loaded, where: tuple, values: np.ndarray, name: str, shape: list[int],
                  dtype: np.dtype, what: str) -> np.ndarray:
    """Values the recipe gives for input ``name`` (``what``, at ``where``), checked against its
    shape and dtype: one per element, or one for all."""
    size = int(np.prod(shape))
    if values.size not in (1, size):
        raise loaded.error(f"input {name!r} takes {size} value(s) (shape {shape}), the "
                           f"{what} give {values.size}", *where,
                           hint="give one value per element, or a single value to repeat")
    cast = values.astype(dtype)
    if not np.array_equal(cast.astype(np.float64), values.astype(np.float64)) and dtype.kind != "f":
        raise loaded.error(f"input {name!r} is {dtype}; the {what} are not all "
                           f"{dtype} values", *where)
    return np.broadcast_to(cast.reshape(shape) if cast.size == size else cast.reshape(()),
                           shape).copy()


def _read_file(loaded, path: Path, name: str, where: tuple) -> np.ndarray:
    if not path.is_file() or path.suffix.lower() not in (".npy", ".npz"):
        raise loaded.error(f"proof data {loaded.spelled(path)!r} is not a .npy or .npz file", *where)
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise loaded.error(f"cannot read proof data {path.name!r}: {exc}", *where) from None
    if isinstance(data, np.ndarray):
        return data
    with data:
        keys = list(data.files)
        key = name if name in keys else (keys[0] if len(keys) == 1 else None)
        if key is None:
            raise loaded.error(f"{path.name} has no array {name!r} (it has "
                               f"{', '.join(keys) or 'none'})", *where)
        return data[key]


def calibration_sample(loaded: "LoadedRecipe", model: onnx.ModelProto,
                       states: Mapping[str, np.ndarray] | None = None
                       ) -> dict[str, np.ndarray] | None:
    """The first calibration sample for the inputs without a recipe proof value, or None when
    there is no calibration data or it does not cover them (then those inputs are random).
    ``states``: a streaming model's state inputs by name, with their initial values, which the
    data need not hold (the sample then holds the initial values: a stream's first call)."""
    from npubuild.stages.files import proof_calibration_files

    files = proof_calibration_files(loaded)
    if not files:
        return None
    from npubuild.errors import UserError
    from npubuild.quant.data import InputInfo, State, load_samples

    inputs, states = RecipeInputs(loaded.recipe.model.inputs), dict(states or {})
    infos = [InputInfo(v.name, tuple(_fixed_shape(v)), str(onnx_io.value_dtype(v)),
                       getattr(inputs.spec(v.name), "layout", "any"),
                       getattr(inputs.spec(v.name), "preprocess", None),
                       state=State(states[v.name]) if states.get(v.name) is not None else None)
             for v in onnx_io.graph_inputs(model)
             if getattr(inputs.spec(v.name), "proof", None) is None]
    if not infos:
        return None
    try:
        return next(iter(load_samples(files, infos, 1)), None)
    except UserError as exc:
        log.info("proof inputs: the calibration data do not cover the inputs (%s); "
                 "seeded random values instead", exc.message)
        return None


def save(directory: Path, feeds: Mapping[str, np.ndarray]) -> Path:
    """Write the proof inputs of the model in ``directory`` (sorted, so the file is stable)."""
    from npubuild.atomic import atomic_path

    path = Path(directory) / FILE_NAME
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{k: np.asarray(feeds[k]) for k in sorted(feeds)})
    return path


def load(directory: Path | None, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The proof inputs an upstream stage saved for ``model``; seeded random values for inputs
    it has none for (a directory from before proof inputs were saved, or none given)."""
    path = Path(directory) / FILE_NAME if directory is not None else None
    saved: dict[str, np.ndarray] = {}
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as npz:
            saved = {k: npz[k] for k in npz.files}
    return make_feeds(model, sample=saved)


HINT = ("if an input needs particular values (a sample rate, token ids, a mask), give them: "
        "model.inputs[].proof: {values: [...]} | {data: file.npy} | {range: [low, high]}")


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """`onnx_io.run` for a proof: a model ONNX Runtime cannot run on the proof inputs is a
    `BuildError` that says so and how to give other inputs."""
    try:
        return onnx_io.run(model, feeds, list(outputs) if outputs is not None else None)
    except BuildError:
        raise
    except Exception as exc:  # onnxruntime's Fail/InvalidArgument/RuntimeException
        text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise BuildError(f"ONNX Runtime cannot run the model on the proof inputs: "
                         f"{text[:400]}", hint=HINT) from None


def run_with_scales(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                    tensors: Sequence[str], products: bool = False
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The values of ``tensors`` (outputs or internal tensors of ``model``) on ``feeds``, and
    each one's `input_scales` (with ``products``, raised to its `products_scales` where a
    Conv, Gemm or MatMul computes it), from one run."""
    extra = producer_inputs(model, tensors)
    names = list(dict.fromkeys([*tensors, *(t for t in extra if t not in feeds)]))
    values = dict(feeds)
    values.update(run(onnx_io.with_outputs(model, names), feeds, names))
    scales = input_scales(model, values, tensors)
    for name, scale in (products_scales(model, values, tensors) if products else {}).items():
        scales[name] = max(scales.get(name, 0.0), scale)
    return {t: values[t] for t in tensors}, scales


# ---- equivalence -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Checked:
    """One compared tensor: its similarity, the scale it was judged against, and the largest
    difference over that scale (``max_rel`` in the stages' logs)."""

    similarity: Similarity
    scale: float
    max_rel: float

    @property
    def max_abs(self) -> float:
        return self.similarity.max_abs

    @property
    def identical(self) -> bool:
        return self.similarity.identical

    @property
    def cosine(self) -> float:
        return self.similarity.cosine


@dataclass(frozen=True)
class Mismatch:
    tensor: str
    similarity: Similarity | None
    reason: str

    def __str__(self) -> str:
        return f"tensor {self.tensor!r}: {self.reason}"


def compare(reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray], *,
            tolerance: float | Mapping[str, float] = 1e-5, exact: bool = False,
            scales: Mapping[str, float] | None = None
            ) -> tuple[dict[str, Checked], list[Mismatch]]:
    """Compare every reference tensor: a mismatch is a missing tensor, a shape or dtype change,
    or (unless ``exact``, where any difference is one) a largest difference above
    ``tolerance`` (one for all, or per tensor, at least `precision_floor` of the tensor's float
    type) × the tensor's scale — the larger of its own largest magnitude and ``scales[name]``,
    the magnitude of the values it was computed from (`input_scales`)."""
    sims, bad = {}, []
    for name, ref in reference.items():
        if name not in actual:
            bad.append(Mismatch(name, None, "missing from the result"))
            continue
        got = actual[name]
        if np.shape(ref) != np.shape(got):
            bad.append(Mismatch(name, None, f"shape changed from {list(np.shape(ref))} to "
                                            f"{list(np.shape(got))}"))
            continue
        if np.asarray(ref).dtype != np.asarray(got).dtype:
            bad.append(Mismatch(name, None, f"dtype changed from {np.asarray(ref).dtype} to "
                                            f"{np.asarray(got).dtype}"))
            continue
        sim = similarity(ref, got)
        scale = judged_scale(ref, (scales or {}).get(name, 0.0))
        error = sim.max_abs / scale if scale else (0.0 if sim.max_abs == 0 else float("inf"))
        sims[name] = Checked(sim, scale, error)
        if exact:
            if not sim.identical:
                bad.append(Mismatch(name, sim, f"not bit-identical (max abs diff {sim.max_abs:.3g})"))
            continue
        allowed = tolerance.get(name, 0.0) if isinstance(tolerance, Mapping) else tolerance
        allowed = max(allowed, precision_floor(ref))
        if not error <= allowed:
            bad.append(Mismatch(name, sim, _excess(sim, ref, scale, error, allowed)))
    return sims, bad


# Units in the last place a tensor's own float type may differ by where a proof reorders or
# regroups its arithmetic: each rounding is at most half a unit of the scale, and a rewrite adds
# or moves a few of them.
ROUNDING_ULPS = 4


def precision_floor(reference) -> float:
    """The least relative tolerance a tensor of ``reference``'s float type can be held to where
    that type is narrower than float32, whose rounding the proofs' tolerances are set for:
    `ROUNDING_ULPS` units in its last place (float16: 3.9e-3 of the scale). A float16 model
    computes each value to 1/1024 of its magnitude, so a rewrite that regroups it differs by
    such units, not by float32's. 0 for float32, float64 and every other type."""
    dtype = np.asarray(reference).dtype
    if dtype.kind != "f" or dtype.itemsize >= 4:
        return 0.0
    return ROUNDING_ULPS * float(np.finfo(dtype).eps)


def judged_scale(reference, input_scale: float = 0.0) -> float:
    """What `compare` divides a tensor's largest difference by: the larger of the reference's
    largest magnitude and ``input_scale`` (the magnitude of the values it is computed from)."""
    return max(_magnitude(reference), float(input_scale))


def _magnitude(value) -> float:
    value = np.asarray(value)
    if value.size == 0 or value.dtype.kind not in "biuf":
        return 0.0
    magnitudes = np.abs(value.astype(np.float64))
    finite = magnitudes[np.isfinite(magnitudes)]  # an infinity is compared as a value, not a scale
    return float(finite.max()) if finite.size else 0.0


def _excess(sim: Similarity, ref, scale: float, error: float, tolerance: float) -> str:
    own = _magnitude(ref)
    basis = ("of its magnitude" if scale == own
             else f"of {scale:.3g}, the magnitude of the values it is computed from")
    return (f"max abs diff {sim.max_abs:.3g} = {error:.3g} {basis}, above the tolerance "
            f"{tolerance:g}")


def input_scales(model: onnx.ModelProto, values: Mapping[str, np.ndarray],
                 tensors: Iterable[str]) -> dict[str, float]:
    """Per tensor: the largest magnitude among the computed values its producing node reads,
    an If's or a Loop's branches included (``values`` must hold them: run the model with
    `producer_inputs` as extra outputs)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    return {name: max((_magnitude(values[i]) for i in onnx_io.node_uses(producers[name]) if i in values),
                      default=0.0)
            for name in tensors if name in producers}


def rounding_floor(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                   values: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per float tensor of ``values`` (``model``'s results on ``feeds`` in the proofs'
    session): the largest absolute change of ONNX Runtime's own result when it runs the same
    model with its graph optimisations on (fused kernels, other summation orders). That is
    the float rounding this model amplifies on these inputs (a Log of small power-spectrum bins
    magnifies it 100-fold): another framework's result cannot be expected closer. Empty when
    the optimised session cannot run the model."""
    names = [n for n in values if np.asarray(values[n]).dtype.kind == "f"]
    try:
        other = onnx_io.run(onnx_io.session(onnx_io.with_outputs(model, names), optimized=True),
                            feeds, names)
    except Exception:  # noqa: BLE001 - an optimisation ONNX Runtime cannot apply: no floor
        return {}
    return {name: float(np.max(np.abs(np.asarray(values[name], np.float64) - other[name]),
                               initial=0.0)) for name in names}


LINEAR = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def products_scales(model: onnx.ModelProto, values: Mapping[str, np.ndarray],
                    tensors: Iterable[str]) -> dict[str, float]:
    """Per tensor a Conv, ConvTranspose, Gemm or MatMul of ``model`` computes: the largest
    sum of the magnitudes of the products it adds up, Σ|w||x| (the same node run on |x| and
    |w|). A dot product's float rounding is bounded relative to that sum, not to its result:
    folding a BatchNormalization scale into the weights moves the rounding by it."""
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for name in tensors:
        node = producers.get(name)
        if node is None or node.op_type not in LINEAR or node.domain not in STANDARD_DOMAINS:
            continue
        operands = {i: np.abs(values[i] if i in values else inits[i]) for i in node.input
                    if i and (i in values or i in inits)}
        if len(operands) < len([i for i in node.input if i]):
            continue
        out[name] = _magnitude(_run_node(model, node, operands)[0])
    return out


def _run_node(model: onnx.ModelProto, node: onnx.NodeProto, feeds: Mapping[str, np.ndarray]):
    single = onnx.NodeProto()
    single.CopyFrom(node)
    for attr in single.attribute:  # |alpha|, |beta|: every product counted positive
        if attr.name in ("alpha", "beta"):
            attr.f = abs(attr.f)
    graph = onnx.helper.make_graph(
        [single], "products",
        [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                            list(v.shape)) for k, v in feeds.items()],
        [onnx.ValueInfoProto(name=o) for o in node.output if o])
    probe = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                   ir_version=onnx_io.MAX_ORT_IR_VERSION)
    return list(onnx_io.run(probe, feeds).values())


def producer_inputs(model: onnx.ModelProto, tensors: Sequence[str]) -> list[str]:
    """The non-constant tensors the producers of ``tensors`` read (to run them as outputs)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name for t in model.graph.initializer}
    return list(dict.fromkeys(i for t in tensors if t in producers
                              for i in onnx_io.node_uses(producers[t]) if i not in inits))


# ---- op by op (a source whose every intermediate tensor is known) ------------------------------

FORCED_SUFFIX = "@source"
# The layouts a converter gives a source tensor: as it is, or channels moved first (tf2onnx
# turns TFLite's NHWC into ONNX's NCHW and keeps the tensor's name).
_LAYOUTS = {3: [None, (0, 2, 1)], 4: [None, (0, 3, 1, 2)], 5: [None, (0, 4, 1, 2, 3)]}


@dataclass(frozen=True)
class OpByOp:
    """The result of `compare_op_by_op`: each forced tensor's check, the mismatches, and
    per integer tensor the steps it may differ by (one per requantization since the forced
    tensors before it)."""

    checked: dict[str, Checked]
    bad: list[Mismatch]
    allowed_steps: dict[str, int]
    not_matched: int

    def summary(self) -> dict:
        steps = {name: int(c.max_abs) for name, c in self.checked.items()
                 if name in self.allowed_steps}
        return {"tensors": len(self.checked), "not_compared": self.not_matched,
                "identical": sum(c.identical for c in self.checked.values()),
                "max_steps": max(steps.values(), default=0)}


def compare_op_by_op(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                     reference: Mapping[str, np.ndarray], *, tolerance: float) -> OpByOp:
    """Prove ``model`` against a source whose every computed tensor is known (``reference``,
    by the source's names and in its layout): ONNX Runtime recomputes each tensor the two
    share from the source's own values of the shared tensors before it, so a rounding
    difference in one integer kernel is judged where it happens instead of growing through the
    network. An integer tensor may differ by one step per requantization (QuantizeLinear)
    between it and those forced inputs: ONNX Runtime rounds a requantized value half to even
    in float, TFLite in fixed point. A float tensor is judged by ``tolerance`` × its scale."""
    produced = {o: n for n in model.graph.node for o in n.output if o}
    shared = [name for name in reference if name in produced]
    free = run(onnx_io.with_outputs(model, shared), feeds, shared) if shared else {}
    layouts = {}
    for name in shared:
        layout = _layout(np.asarray(reference[name]), free[name])
        if layout is not False:
            layouts[name] = layout
    values = {name: np.ascontiguousarray(np.asarray(reference[name]) if p is None
                                         else np.asarray(reference[name]).transpose(p))
              for name, p in layouts.items()}
    forced = _forced(model, values)
    run_feeds = {**feeds, **{name + FORCED_SUFFIX: v for name, v in values.items()}}
    names = list(values)
    got = run(onnx_io.with_outputs(forced, names), run_feeds, names) if names else {}
    allowed = _requantizations(model, set(values))
    checked, bad = {}, []
    floats = {n: v for n, v in values.items() if v.dtype.kind == "f"}
    sims, float_bad = compare(floats, {n: got[n] for n in floats}, tolerance=tolerance)
    checked.update(sims)
    bad.extend(float_bad)
    steps = {}
    for name, ref in values.items():
        if ref.dtype.kind == "f":
            continue
        sim = similarity(ref, got[name])
        checked[name] = Checked(sim, 1.0, sim.max_abs)
        steps[name] = allowed.get(name, 0)
        if sim.max_abs > steps[name]:
            node = produced[name]
            bad.append(Mismatch(name, sim, (
                f"recomputed by ONNX {node.op_type} from the source's own inputs it is "
                f"{sim.max_abs:.0f} steps from the source's value (allowed: {steps[name]}, one "
                f"per requantization)")))
    return OpByOp(checked, bad, steps, len(reference) - len(values))


def _layout(reference: np.ndarray, free: np.ndarray):
    """The permutation that turns the source's tensor into the model's (None: as it is), the
    one nearest the model's own value where several fit; False when none fits."""
    best = False, np.inf
    for perm in _LAYOUTS.get(reference.ndim, [None]):
        value = reference if perm is None else reference.transpose(perm)
        if value.shape != free.shape or value.dtype != free.dtype:
            continue
        distance = float(np.abs(value.astype(np.float64) - free.astype(np.float64)).mean()) \
            if value.size else 0.0
        if distance < best[1]:
            best = perm, distance
    return best[0]


def _forced(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` whose nodes read each of ``values`` from a new input (``name@source``)
    instead of computing it; the tensors themselves are still computed, to be compared."""
    out = onnx_io.clone(model)
    for node in out.graph.node:
        for i, name in enumerate(node.input):
            if name in values:
                node.input[i] = name + FORCED_SUFFIX
    for name, value in values.items():
        out.graph.input.append(onnx.helper.make_tensor_value_info(
            name + FORCED_SUFFIX, onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
            list(value.shape)))
    return out


def _requantizations(model: onnx.ModelProto, forced: set[str]) -> dict[str, int]:
    """Per computed tensor: the most QuantizeLinear nodes on a path to it from a forced
    tensor, an input or a constant (the nodes are in topological order)."""
    count: dict[str, int] = {}
    for node in model.graph.node:
        before = max((count.get(i, 0) for i in node.input if i and i not in forced), default=0)
        here = before + (node.op_type == "QuantizeLinear")
        for out in node.output:
            if out:
                count[out] = here
    return count
