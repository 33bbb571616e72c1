"""`npubuild diff`: what changed between two recipe versions (every field, in full), which
stages that rebuilds and why, and — per chip, where the build directory or the content cache
has them — how the figures moved. Like `dvc params diff` + `dvc metrics diff`, per stage.

`diff_recipes` returns plain data (the ``--json`` document); `npubuild.diff.render` turns it
into text or a Markdown pull-request comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from npubuild.engine.session import BuildSession
from npubuild.engine.keys import section_value
from npubuild.diff.changes import Change, changes
from npubuild.diff.figures import compare, figures, merged_report
from npubuild.recipe import LoadedRecipe
from npubuild.stages import PIPELINE

SessionFor = Callable[[LoadedRecipe], BuildSession]


@dataclass
class StageDiff:
    stage: str
    same: bool
    reasons: list[str] = field(default_factory=list)


def diff_recipes(a: LoadedRecipe, b: LoadedRecipe, session_for: SessionFor,
                 labels: tuple[str, str] | None = None) -> dict:
    """The whole comparison: recipe ``changes``, per-stage ``stages`` on the primary chip, and
    per-chip ``chips`` figures (``session_for`` opens a session on a recipe without building)."""
    data_a, data_b = a.recipe.model_dump(mode="json"), b.recipe.model_dump(mode="json")
    found = changes(data_a, data_b)
    session_a, session_b = session_for(a), session_for(b)
    return {"a": labels[0] if labels else str(a.path), "b": labels[1] if labels else str(b.path),
            "changes": [c.as_dict() for c in found],
            "stages": [s.__dict__ for s in stage_diffs(session_a, session_b, data_a, data_b)],
            "chips": chip_figures(a, b, session_for, (session_a, session_b))}


def stage_diffs(a: BuildSession, b: BuildSession, data_a: dict, data_b: dict) -> list[StageDiff]:
    """Per stage: same key on both sides, or why not (field changes in its own sections, the
    chip, its input files or upstream artifacts, npubuild's version)."""
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
    """Per chip either version builds for: its figures before and after, and which side has
    none (neither built nor cached)."""
    out = []
    for chip in dict.fromkeys([*chips_of(a), *chips_of(b)]):
        sides = [_figures_on(r, chip, session_for, p) for r, p in zip((a, b), primary)]
        out.append({"chip": chip, "a": sides[0][0], "b": sides[1][0],
                    "figures": compare(sides[0][1], sides[1][1])})
    return out


def chips_of(loaded: LoadedRecipe) -> list[str]:
    return list(loaded.recipe.targets) or [loaded.recipe.target]


def _figures_on(loaded: LoadedRecipe, chip: str, session_for: SessionFor,
                primary: BuildSession) -> tuple[str, dict]:
    """(state, figures): state is ``built`` (every stage built or cached), ``partly built``,
    ``not built`` or ``not a target``."""
    if chip not in chips_of(loaded):
        return "not a target", {}
    session = primary if not loaded.recipe.targets else session_for(loaded.for_target(chip))
    expected = session.expected()
    have = [manifest is not None for parts, manifest, _ in expected.values() if parts is not None]
    state = "built" if have and all(have) else "partly built" if any(have) else "not built"
    return state, figures(merged_report(expected))


__all__ = ["Change", "StageDiff", "changes", "diff_recipes"]
