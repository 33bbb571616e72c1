"""`npubuild diff`: what changed between two recipe versions (every field, in full), which
stages that rebuilds and why, and — per chip, where the build directory or the content cache
has them — how the figures moved. Like `dvc params diff` + `dvc metrics diff`, per stage.

`diff_recipes` returns plain data (the ``--json`` document); `npubuild.diff.render` turns it
into text or a Markdown pull-request comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from npubuild.diff.changes import Change, changes

if TYPE_CHECKING:  # the engine and the figures load in the functions: `npubuild diff --fail-on`
    # reads FAIL_ON while the CLI builds its parser, on every command's start (the no-op too)
    from npubuild.engine.session import BuildSession
    from npubuild.recipe import LoadedRecipe

SessionFor = Callable[["LoadedRecipe", str], "BuildSession"]  # (recipe, side "a" or "b")
FAIL_ON = ("regression", "fail")


@dataclass
class StageDiff:
    stage: str
    same: bool
    reasons: list[str] = field(default_factory=list)


def diff_recipes(a: LoadedRecipe, b: LoadedRecipe, session_for: SessionFor,
                 labels: tuple[str, str] | None = None) -> dict:
    """The whole comparison: recipe ``changes``, per-stage ``stages`` on the primary chips, and
    per chip pair the figures of both sides (``session_for`` opens a session on a recipe
    without building; its second argument says which side, so each may have its own build
    directory)."""
    data_a, data_b = a.recipe.model_dump(mode="json"), b.recipe.model_dump(mode="json")
    found = changes(data_a, data_b)
    session_a, session_b = session_for(a, "a"), session_for(b, "b")
    chips = chip_figures(a, b, session_for, (session_a, session_b))
    return {"a": labels[0] if labels else str(a.path), "b": labels[1] if labels else str(b.path),
            "changes": [c.as_dict() for c in found],
            "stages": [s.__dict__ for s in stage_diffs(session_a, session_b, data_a, data_b)],
            "chips": chips,
            "regressions": [{"chips": c["chips"], **r} for c in chips for r in c["figures"]
                            if r["regression"]]}

def stage_diffs(a: BuildSession, b: BuildSession, data_a: dict, data_b: dict) -> list[StageDiff]:
    """Per stage: same key on both sides, or why not (field changes in its own sections, the
    chip, its input files or upstream artifacts, npubuild's version)."""
    from npubuild.engine.keys import section_value
    from npubuild.stages import PIPELINE

    expected_a, expected_b = a.expected(), b.expected()
    out, differing = [], set()
    for stage in PIPELINE:
        parts_a, _, note_a = expected_a[stage.name]
        parts_b, _, note_b = expected_b[stage.name]
        if parts_a is None or parts_b is None:
            out.append(StageDiff(stage.name, note_a == note_b, [note_a if parts_a is None else note_b]))
            continue
        unknown = [u for u in stage.needs if u in differing
                   and "missing" in (parts_a.upstream[u], parts_b.upstream[u])]
        if parts_a.key == parts_b.key and not unknown:
            out.append(StageDiff(stage.name, True))
            continue
        reasons = [c.line() for section in stage.sections
                   for c in changes(section_value(data_a, section), section_value(data_b, section),
                                    section)]
        if parts_a.chip != parts_b.chip:
            reasons.append(f"target chip: {a.loaded.recipe.target} -> {b.loaded.recipe.target}")
        if parts_a.files != parts_b.files:
            reasons.append("input files differ")
        unbuilt = [f"`{u}`" for u in unknown]
        if unbuilt:
            reasons.append(f"its input stage{'s' * (len(unbuilt) > 1)} {', '.join(unbuilt)} "
                           f"differ{'s' * (len(unbuilt) == 1)}")
        moved = [f"`{u}`" for u in stage.needs
                 if u not in unknown and parts_a.upstream[u] != parts_b.upstream[u]]
        if moved:
            reasons.append(f"input artifacts from {', '.join(moved)} differ")
        if parts_a.version != parts_b.version:
            reasons.append("npubuild version differs")
        out.append(StageDiff(stage.name, False, reasons))
        differing.add(stage.name)
    return out


def chip_figures(a: LoadedRecipe, b: LoadedRecipe, session_for: SessionFor,
                 primary: tuple[BuildSession, BuildSession]) -> list[dict]:
    """Per chip pair (`chip_pairs`): the state and figures of both sides on one table, the
    verdicts and b's (and a's) failure messages."""
    from npubuild.diff.figures import compare

    out = []
    for chip_a, chip_b in chip_pairs(chips_of(a), chips_of(b)):
        side_a = _side(a, chip_a, "a", session_for, primary[0])
        side_b = _side(b, chip_b, "b", session_for, primary[1])
        out.append({"chips": {"a": chip_a, "b": chip_b},
                    "state": {"a": side_a["state"], "b": side_b["state"]},
                    "verdict": {"a": side_a["verdict"], "b": side_b["verdict"]},
                    "failures": {"a": side_a["failures"], "b": side_b["failures"]},
                    "figures": compare(side_a["figures"], side_b["figures"],
                                       a_built=side_a["state"] != "not built")})
    return out


def chips_of(loaded: LoadedRecipe) -> list[str]:
    return list(loaded.recipe.targets) or [loaded.recipe.target]


def chip_pairs(a: list[str], b: list[str]) -> list[tuple[str | None, str | None]]:
    """Chips both versions build for, paired by name (a's order); the chips only one builds
    for, paired in order (``target: npu-16m`` -> ``target: npu-tiny`` is one pair, one
    table); what is left over has no partner."""
    common = [c for c in a if c in b]
    rest_a, rest_b = [c for c in a if c not in b], [c for c in b if c not in a]
    pairs: list[tuple[str | None, str | None]] = [(c, c) for c in common]
    pairs += list(zip(rest_a, rest_b))
    longer = rest_a[len(rest_b):] or rest_b[len(rest_a):]
    pairs += [(c, None) if rest_a[len(rest_b):] else (None, c) for c in longer]
    return pairs


def _side(loaded: LoadedRecipe, chip: str | None, side: str, session_for: SessionFor,
          primary: BuildSession) -> dict:
    """One side on one chip: ``state`` is ``built`` (every stage built or in a cache),
    ``partly built``, ``not built`` or ``not a target``; its figures, verdict and failures."""
    from npubuild.diff.figures import figures, merged_report, with_measurements
    from npubuild.engine.keys import read_manifest

    if chip is None:
        return {"state": "not a target", "figures": [], "verdict": None, "failures": []}
    session = primary if not loaded.recipe.targets else session_for(loaded.for_target(chip), side)
    expected = session.expected()
    have = [manifest is not None for parts, manifest, _ in expected.values() if parts is not None]
    state = "built" if have and all(have) else "partly built" if any(have) else "not built"
    report = with_measurements(merged_report(expected), expected,
                               read_manifest(session.paths.report) or {})
    verify = report.get("verify") or {}
    passed = verify.get("passed")
    return {"state": state, "figures": figures(report, loaded.recipe.verify.model_dump(mode="json")),
            "verdict": None if passed is None else "pass" if passed else "fail",
            "failures": list(verify.get("failures") or [])}


def gate(result: dict, fail_on: str | None) -> list[str]:
    """Why ``--fail-on`` fails the diff (empty: it passes). ``regression``: b fails a
    threshold a met, or verify went pass -> fail, on any chip pair; ``fail``: b fails verify
    (or has no verdict) on any of its chips."""
    if fail_on is None:
        return []
    reasons = []
    for chip in result["chips"]:
        where = _pair_name(chip["chips"])
        if fail_on == "fail" and chip["chips"]["b"] is not None and chip["verdict"]["b"] != "pass":
            why = "; ".join(chip["failures"]["b"]) if chip["verdict"]["b"] == "fail" else \
                f"no verify verdict ({chip['state']['b']}): build it first"
            reasons.append(f"{where}: b fails: {why}")
        if fail_on == "regression":
            reasons += [f"{where}: {r['label']} {_shown(r['a'])} -> {_shown(r['b'])}"
                        + (f" (limit {r['limit']!r})" if r["limit"] is not None else "")
                        for r in chip["figures"] if r["regression"]]
    return reasons


def _pair_name(chips: dict) -> str:
    a, b = chips["a"], chips["b"]
    return a if a == b else f"{a or '-'} -> {b or '-'}"


def _shown(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "pass" if value else "fail"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


__all__ = ["Change", "FAIL_ON", "StageDiff", "changes", "chip_pairs", "diff_recipes", "gate"]
