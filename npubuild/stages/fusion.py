"""Stage ``fusion``: the recipe's fusion rules, in order, each proven against the input model.

Reads ``<surgery>/model.onnx`` and the recipe's ``fusion:`` list (built-in rule names and
`UserFusionRule` patterns); writes

- ``model.onnx``: fused ops as model-local functions in domain ``npubuild.fused`` (ONNX Runtime
  runs their bodies), folds (``conv_bn``, ``pad_conv``) as plain Convs;
- ``log.json``: per rule how often it fired, the nodes it made, its numerical check,
  and the nearest candidates that did not match and why.

A rule that fired nowhere is a warning (log, report, logger); why its nearest candidate failed
is logged at INFO (``-v``). The proof: after every rule that fired, ONNX Runtime on seeded
random inputs must give the input model's outputs within 1e-5 of their magnitude, else a
`BuildError` names the rule and the tensor. An empty list copies the model unchanged.
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
from npubuild.metrics import compare_outputs
from npubuild.onnx_io import load_model, random_feeds, run as run_model, save_model
from npubuild.stages import no_progress
from npubuild.timings import without_timings

SEED = 0
TOLERANCE = 1e-5
STAGE = "fusion"

Apply = Callable[[onnx.ModelProto], tuple[onnx.ModelProto, FusionReport]]


def run(ctx) -> dict:
    source = Path(ctx.upstream["surgery"]) / "model.onnx"
    items = list(ctx.recipe.fusion)
    if not items:
        write_bytes(ctx.out / "model.onnx", source.read_bytes())
        write_json(ctx.out / "log.json", {"input": "surgery/model.onnx", "rules": [],
                                          "note": "no fusion rules: the model is copied"})
        return {STAGE: {"rules": {}, "fused_ops": {}, "warnings": []}}
    model = load_model(source)
    log = fuse(model, items, ctx.log, ctx.progress)
    save_model(log.pop("model"), ctx.out / "model.onnx")
    # the input by its place in the build, not its path: artifacts name no directory
    write_json(ctx.out / "log.json", {"input": "surgery/model.onnx", **without_timings(log)})
    return {STAGE: _summary(log)}


def fuse(model: onnx.ModelProto, items: list, logger: logging.Logger | None = None,
         progress=no_progress) -> dict[str, Any]:
    """Apply ``items`` in order; return the fused model and the log (raises on a bad proof)."""
    logger = logger or logging.getLogger("npubuild")
    proof = _Proof(model)
    entries = []
    nodes_before = len(model.graph.node)
    for item in progress(items, total=len(items), description="fusion"):
        name, kind, apply = _resolve(item)
        start = time.perf_counter()
        fused, report = apply(model)
        entry = {"rule": name, "kind": kind, "fired": report.fired}
        if report.fired:
            entry["check"] = proof.check(fused, name)
            model = fused
        entry.update(_made(model, name, report), seconds=round(time.perf_counter() - start, 4),
                     near_misses=report.near_misses)
        _explain(logger, entry, [e["rule"] for e in entries if e["fired"]])
        entries.append(entry)
    _check_model(model)
    return {"model": model, "seed": SEED, "tolerance": TOLERANCE, "nodes_before": nodes_before,
            "nodes_after": len(model.graph.node), "rules": entries,
            "fused_ops": fused_op_counts(model),
            "warnings": [e["warning"] for e in entries if "warning" in e]}


def _resolve(item) -> tuple[str, str, Apply]:
    if isinstance(item, str):
        return item, "builtin", load_builtins()[item].apply
    from npubuild.fusions.user import apply_user_rule

    return item.name, "recipe", lambda model: apply_user_rule(model, item)


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
    """The input model's outputs on seeded random inputs, and the check against them."""

    def __init__(self, model: onnx.ModelProto):
        self.feeds = random_feeds(model, seed=SEED)
        self.reference = run_model(model, self.feeds)

    def check(self, model: onnx.ModelProto, rule: str) -> dict[str, Any]:
        try:
            actual = run_model(model, self.feeds)
        except BuildError as exc:
            raise BuildError(f"after rule {rule!r}: {exc.message}", stage=STAGE) from None
        sims, bad = compare_outputs(self.reference, actual, rtol=TOLERANCE)
        if bad:
            raise BuildError(f"rule {rule!r} changed the model's outputs: {bad[0]}", stage=STAGE,
                             hint=f"drop {rule!r} from fusion: in the recipe, or report the "
                                  "rule with this model")
        return {"max_abs": max((s.max_abs for s in sims.values()), default=0.0),
                "max_rel": max((s.max_rel for s in sims.values()), default=0.0),
                "identical": all(s.identical for s in sims.values())}


def _check_model(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"the fused model is not valid ONNX: {exc}", stage=STAGE) from None
