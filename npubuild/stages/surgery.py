"""Stage `surgery`: the recipe's rewrites, in order, each proven against its input.

Reads ``import/model.onnx``; writes ``surgery/model.onnx`` and ``surgery/log.json``. After every
step: ``onnx.checker``, strict shape inference, and ONNX Runtime on the proof inputs
(``import/proof_inputs.npz``, carried through renamed or reshaped inputs; the final model's are
saved as ``surgery/proof_inputs.npz``) compared with the step's input — bit-identical for pure
data movement, else within the step's tolerance (default 1e-5 of the scale of the values
involved, `npubuild.proofs.compare`). Outputs a step renames, splits or moves are matched
through the origins it records; whatever cannot be matched is listed in the log as not
comparable. Bad arguments raise a located ``UserError``; a failed check a ``BuildError``. Nothing
is written unless every step passes.
"""

from __future__ import annotations

import time
from collections import Counter

import onnx

from npubuild import onnx_io, proofs
from npubuild.atomic import write_json
from npubuild.errors import BuildError, NpubuildError
from npubuild.model_inputs import RecipeInputs
from npubuild.stages import StageContext
from npubuild.surgery import SURGERY, SurgeryError, load_builtins
from npubuild.surgery import origins as org
from npubuild.surgery import proof
from npubuild.surgery.graph import node_label
from npubuild.timings import without_timings

DEFAULT_RTOL = 1e-5
MAX_NAMES = 20


def run(ctx: StageContext) -> dict:
    model = onnx_io.load_model(ctx.upstream["import"] / "model.onnx")
    steps = list(ctx.recipe.surgery)
    feeds = proofs.load(ctx.upstream["import"], model)
    model, entries, composed, feeds = apply_steps(ctx, model, steps, feeds)
    check_recipe_inputs(ctx.loaded, model, composed["inputs"])
    if composed["outputs"] or composed["inputs"]:
        org.write(model, composed, org.MODEL_KEY)
    onnx_io.save_model(model, ctx.out / "model.onnx")
    proofs.save(ctx.out, feeds)
    write_json(ctx.out / "log.json", {"steps": without_timings(entries)})  # timings: report.json
    return {"surgery": summary(entries, model)}


def check_recipe_inputs(loaded, model: onnx.ModelProto, renamed: dict[str, str]) -> None:
    """Every ``model.inputs`` entry that preprocesses data still stands for a graph input (by
    its name, or through a rename surgery recorded); an entry a step cut away (``extract``)
    would leave its preprocessing silently unused, so it is refused."""
    inputs = RecipeInputs(loaded.recipe.model.inputs, renamed)
    names = [v.name for v in onnx_io.graph_inputs(model)]
    for index in inputs.unmatched(names):
        if inputs.specs[index].preprocess is not None:
            raise loaded.error(
                f"input {inputs.specs[index].name!r} is no longer an input of the model after "
                f"surgery (its inputs: {', '.join(map(repr, names))}), so its preprocess would "
                "apply to nothing", "model", "inputs", index, "preprocess",
                hint="remove the preprocess, and give calibration and verify data for the new "
                     "inputs as .npz files keyed by their names")


def apply_steps(ctx: StageContext, model: onnx.ModelProto, steps: list, feeds: dict | None = None):
    """Apply and prove every step on the proof inputs ``feeds``; return the final model, the
    log entries, the origins and the final model's proof inputs."""
    load_builtins()
    composed = org.pop(model, org.MODEL_KEY)
    entries = []
    feeds = feeds if feeds is not None else proofs.make_feeds(model)
    for index, step in ctx.progress(enumerate(steps), total=len(steps), description="surgery"):
        name = next(iter(type(step).model_fields))
        args = getattr(step, name)
        model, entry, step_origins, feeds = apply_step(ctx, index, name, args, model, feeds)
        composed = org.compose(composed, step_origins)
        entries.append(entry)
    return model, entries, composed, feeds


def apply_step(ctx: StageContext, index: int, name: str, args, before: onnx.ModelProto,
               feeds: dict):
    rw = SURGERY[name]
    where = f"step {index} ({name})"
    started = time.perf_counter()
    try:
        after = rw.apply(before, args)
    except SurgeryError as exc:
        raise SurgeryError(f"{where}: {exc.message}", location=ctx.loaded.location("surgery", index),
                           field=f"surgery[{index}].{name}", hint=exc.hint) from None
    except NpubuildError:
        raise
    except Exception as exc:  # a bug in the rewrite: name the step, not a traceback
        raise BuildError(f"{where} failed: {type(exc).__name__}: {exc}", stage="surgery") from exc
    step_origins = org.pop(after)
    problem = proof.check_structure(after)
    if problem:
        raise BuildError(f"{where} produced an invalid model: {problem}", stage="surgery")
    exact = rw.data_movement and args.tolerance is None
    rtol = args.tolerance if args.tolerance is not None else DEFAULT_RTOL
    try:
        comparison = proof.compare(before, after, step_origins, exact=exact, rtol=rtol,
                                   feeds=feeds)
    except NpubuildError:
        raise
    except Exception as exc:  # ONNX Runtime refused to run one of the two models
        raise BuildError(f"{where}: ONNX Runtime cannot run the models to compare them: "
                         f"{str(exc).strip().splitlines()[-1][:400]}", stage="surgery",
                         hint=proofs.HINT) from None
    expect_change = bool(getattr(args, "expect_change", False))
    if comparison.failures and not expect_change:
        also = " or set expect_change: true" if hasattr(args, "expect_change") else ""
        raise BuildError(f"{where}: the outputs changed: " + "; ".join(comparison.failures),
                         stage="surgery",
                         hint=f"if the change is intended, raise this step's tolerance{also}")
    entry = log_entry(index, name, args, before, after, comparison, exact=exact, rtol=rtol,
                      expect_change=expect_change)
    entry["seconds"] = round(time.perf_counter() - started, 4)
    for tensor, reason in comparison.not_comparable.items():
        ctx.log.warning("surgery %s: %r not compared: %s", where, tensor, reason)
    if step_origins["outputs"] or step_origins["inputs"]:
        entry["origins"] = step_origins
    return after, entry, step_origins, proofs.make_feeds(after, sample=comparison.feeds)


def log_entry(index, name, args, before, after, comparison: proof.Comparison, *, exact: bool,
              rtol: float, expect_change: bool) -> dict:
    added, removed, changed = node_diff(before, after)
    check = ("recorded only (expect_change)" if expect_change
             else "bit-identical" if exact else f"relative tolerance {rtol:g}")
    entry = {
        "index": index,
        "rewrite": name,
        "args": args.model_dump(exclude_defaults=True),
        "nodes_before": len(before.graph.node),
        "nodes_after": len(after.graph.node),
        "nodes_added": _bounded(added),
        "nodes_removed": _bounded(removed),
        "nodes_changed": _bounded(changed),
        "check": check,
        "max_abs": comparison.max_abs,
        "max_rel": comparison.max_rel,
        "outputs": comparison.matched,
        "not_comparable": comparison.not_comparable,
    }
    if expect_change and comparison.failures:
        entry["changes"] = comparison.failures
    return entry


def node_diff(before: onnx.ModelProto, after: onnx.ModelProto):
    """Nodes (by label) only in ``after``, only in ``before``, and in both but edited."""
    old = {node_label(n): n for n in before.graph.node}
    new = {node_label(n): n for n in after.graph.node}
    added = [(k, new[k].op_type) for k in new if k not in old]
    removed = [(k, old[k].op_type) for k in old if k not in new]
    changed = [(k, new[k].op_type) for k in new
               if k in old and new[k].SerializeToString() != old[k].SerializeToString()]
    return added, removed, changed


def _bounded(items: list[tuple[str, str]]) -> dict:
    out = {"count": len(items), "op_types": dict(Counter(op for _, op in items)),
           "names": [name for name, _ in items[:MAX_NAMES]]}
    if len(items) > MAX_NAMES:
        out["names_omitted"] = len(items) - MAX_NAMES
    return out


def summary(entries: list[dict], model: onnx.ModelProto) -> dict:
    return {
        "steps": len(entries),
        "nodes": len(model.graph.node),
        "op_types": dict(Counter(n.op_type for n in model.graph.node)),
        "max_rel": max((e["max_rel"] for e in entries), default=0.0),
        "not_comparable": sum(len(e["not_comparable"]) for e in entries),
        "seconds": round(sum(e["seconds"] for e in entries), 3),
    }
