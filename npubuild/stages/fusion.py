"""Stage ``fusion``: the recipe's fusion rules, in order, each proven against the input model.

Reads ``<surgery>/model.onnx`` and the recipe's ``fusion:`` list (built-in rule names and
`UserFusionRule` patterns); writes

- ``model.onnx``: fused ops as model-local functions in domain ``npubuild.fused`` (ONNX Runtime
  runs their bodies), folds (``conv_bn``, ``pad_conv``) as plain Convs;
- ``log.json``: per rule how often it fired, the nodes it made, its numerical check, seconds,
  and the nearest candidates that did not match and why.

A rule that fired nowhere is a warning (log, report, logger); why its nearest candidate failed
is logged at INFO (``-v``). The proof: after every rule that fired, ONNX Runtime on the proof
inputs (``surgery/proof_inputs.npz``, `npubuild.proofs`) must give the input model's outputs,
and the values of every node the rule made or changed, within the rule's tolerance (default 1e-5; ``- conv_bn:
{tolerance: 1e-4}``) of the scale of the values involved, else a `BuildError` names the rule
and the tensor. An empty list copies the model unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import onnx

from npubuild.atomic import write_bytes, write_json
from npubuild.errors import BuildError
from npubuild.fusions import FUSED_DOMAIN, FusionReport, load_builtins
from npubuild import onnx_io, proofs
from npubuild.onnx_io import load_model, save_model
from npubuild.stages import no_progress

TOLERANCE = 1e-5
STAGE = "fusion"

Apply = Callable[[onnx.ModelProto], tuple[onnx.ModelProto, FusionReport]]


def run(ctx) -> dict:
    source = Path(ctx.upstream["surgery"]) / "model.onnx"
    items = list(ctx.recipe.fusion)
    if not items:
        write_bytes(ctx.out / "model.onnx", source.read_bytes())
        if (source.parent / proofs.FILE_NAME).is_file():
            write_bytes(ctx.out / proofs.FILE_NAME, (source.parent / proofs.FILE_NAME).read_bytes())
        write_json(ctx.out / "log.json", {"input": str(source), "rules": [],
                                          "note": "no fusion rules: the model is copied"})
        return {STAGE: {"rules": {}, "fused_ops": {}, "warnings": []}}
    model = load_model(source)
    feeds = proofs.load(source.parent, model)
    log = fuse(model, items, ctx.log, ctx.progress, feeds)
    save_model(log.pop("model"), ctx.out / "model.onnx")
    proofs.save(ctx.out, feeds)  # fusion keeps the model's inputs: the same proof inputs
    write_json(ctx.out / "log.json", {"input": str(source), **log})
    return {STAGE: _summary(log)}


def fuse(model: onnx.ModelProto, items: list, logger: logging.Logger | None = None,
         progress=no_progress, feeds: dict | None = None) -> dict[str, Any]:
    """Apply ``items`` in order, each proven on the proof inputs ``feeds`` (default:
    `proofs.make_feeds`); return the fused model and the log (raises on a bad proof)."""
    logger = logger or logging.getLogger("npubuild")
    proof = _Proof(model, feeds if feeds is not None else proofs.make_feeds(model))
    entries = []
    nodes_before = len(model.graph.node)
    for item in progress(items, total=len(items), description="fusion"):
        name, kind, apply, tolerance = _resolve(item)
        start = time.perf_counter()
        fused, report = apply(model)
        entry = {"rule": name, "kind": kind, "fired": report.fired}
        if report.fired:
            entry["check"] = proof.check(model, fused, name, tolerance)
            model = fused
        entry.update(_made(model, name, report), seconds=round(time.perf_counter() - start, 4),
                     near_misses=report.near_misses)
        _explain(logger, entry, [e["rule"] for e in entries if e["fired"]])
        entries.append(entry)
    _check_model(model)
    return {"model": model, "tolerance": TOLERANCE, "nodes_before": nodes_before,
            "nodes_after": len(model.graph.node), "rules": entries,
            "fused_ops": fused_op_counts(model),
            "warnings": [e["warning"] for e in entries if "warning" in e]}


def _resolve(item) -> tuple[str, str, Apply, float]:
    """(name, kind, apply, proof tolerance) of a fusion entry: a rule name, ``{rule:
    {tolerance}}`` or a recipe pattern rule."""
    if isinstance(item, str):
        return item, "builtin", load_builtins()[item].apply, TOLERANCE
    if isinstance(item, dict):
        (name, options), = item.items()
        tolerance = options.tolerance if options.tolerance is not None else TOLERANCE
        return name, "builtin", load_builtins()[name].apply, tolerance
    from npubuild.fusions.user import apply_user_rule

    tolerance = item.tolerance if item.tolerance is not None else TOLERANCE
    return item.name, "recipe", lambda model: apply_user_rule(model, item), tolerance


def _made(model: onnx.ModelProto, name: str, report: FusionReport) -> dict[str, Any]:
    made = set(report.fused_nodes)
    ops = Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}"
                  + (f":{n.overload}" if n.overload else "")
                  for n in model.graph.node if n.name in made)
    entry: dict[str, Any] = {"ops": dict(ops), "nodes": report.fused_nodes}
    if not report.fired:
        nearest = f"; nearest candidate: {report.near_misses[0]}" if report.near_misses else ""
        entry["warning"] = f"fusion rule {name!r} fired nowhere{nearest}"
    return entry


def _explain(logger, entry: dict, fired_before: list[str]) -> None:
    if entry["fired"]:
        logger.info("fusion rule %r fired %d times: %s", entry["rule"], entry["fired"],
                    ", ".join(f"{n}× {op}" for op, n in entry["ops"].items()))
        return
    logger.warning("fusion rule %r fired nowhere", entry["rule"])
    for miss in entry["near_misses"]:
        logger.info("  %s did not match: %s", entry["rule"], miss)
    if fired_before:
        logger.info("  %s saw the graph left by %s, which fused ops it might have matched; "
                    "rules apply in recipe order", entry["rule"], ", ".join(fired_before))


def fused_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node if n.domain == FUSED_DOMAIN))


def _summary(log: dict) -> dict:
    rules: dict[str, int] = {}
    for entry in log["rules"]:
        key, k = entry["rule"], 1
        while key in rules:
            k += 1
            key = f"{entry['rule']}#{k}"
        rules[key] = entry["fired"]
    return {"rules": rules, "fused_ops": log["fused_ops"], "nodes_before": log["nodes_before"],
            "nodes_after": log["nodes_after"], "warnings": log["warnings"]}


class _Proof:
    """The input model's values on the proof inputs, and the check of a rule against them:
    every model output and every output of a node the rule made or changed (where its algebra
    shows directly), each judged against the scale of the values it is computed from."""

    def __init__(self, model: onnx.ModelProto, feeds: dict):
        self.feeds = feeds
        self.reference = _all_values(model, feeds)

    def check(self, before: onnx.ModelProto, model: onnx.ModelProto, rule: str,
              tolerance: float) -> dict[str, Any]:
        try:
            actual = _all_values(model, self.feeds)
        except BuildError as exc:
            raise BuildError(f"after rule {rule!r}: {exc.message}", stage=STAGE) from None
        outputs = [o.name for o in before.graph.output]
        rewritten = [t for t in _rewritten_outputs(before, model)
                     if t in self.reference and t not in outputs]
        names = [*outputs, *rewritten]
        reference = {t: self.reference[t] for t in names}
        scales = proofs.input_scales(before, self.reference, names)
        for name, scale in proofs.products_scales(model, actual, rewritten).items():
            scales[name] = max(scales.get(name, 0.0), scale)
        sims, bad = proofs.compare(reference, actual, tolerance=tolerance, scales=scales)
        if bad:
            what = "outputs" if bad[0].tensor in outputs else "values"
            raise BuildError(f"rule {rule!r} changed the model's {what}: {bad[0]}", stage=STAGE,
                             hint=f"if the difference is rounding, give the rule a tolerance "
                                  f"(fusion: [{{{rule}: {{tolerance: ...}}}}]); else drop "
                                  f"{rule!r} from fusion: in the recipe")
        self.reference = _all_values(model, self.feeds)  # the next rule starts from this model
        return {"max_abs": max((s.max_abs for s in sims.values()), default=0.0),
                "max_rel": max((s.max_rel for s in sims.values()), default=0.0),
                "identical": all(s.identical for s in sims.values()),
                "tensors_compared": len(sims), "tolerance": tolerance}


def _rewritten_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> list[str]:
    """Outputs of the nodes a rule made or changed: where its algebra is checked directly."""
    kept = {n.SerializeToString() for n in before.graph.node}
    return [o for n in after.graph.node if n.SerializeToString() not in kept for o in n.output if o]


def _all_values(model: onnx.ModelProto, feeds: dict) -> dict[str, Any]:
    """Every tensor ``model`` computes (outputs first), by name, on ``feeds``."""
    outputs = [o.name for o in model.graph.output]
    names = list(dict.fromkeys([*outputs, *(o for n in model.graph.node for o in n.output if o)]))
    values = proofs.run(onnx_io.with_outputs(model, names), feeds, names)
    return {**values, **feeds}


def _check_model(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the fused model is not valid ONNX: {exc}", stage=STAGE) from None
