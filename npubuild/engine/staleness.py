"""Which stages are current for this recipe and chip, and why the others are not.

A stage is *current* when this run built, restored or found its artifacts for the key the
recipe gives it now (``CURRENT``). Every other stage's directory may still hold an earlier
build's artifacts (another target, another recipe section, a run that crashed in it): the
report must not show them as this recipe's. `why_not_current` words the reason report.json
records for such a stage, and what to run; the report reads a stage's files only when
report.json's key for the stage is the key of the artifacts in its directory
(`npubuild.report.artifacts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npubuild.engine.keys import explain_change, read_manifest
from npubuild.errors import NpubuildError

if TYPE_CHECKING:
    from npubuild.engine.session import BuildSession, StageResult
    from npubuild.stages import Stage

# "cached": what report.json called "current" before the status words were unified
CURRENT = ("built", "restored", "current", "cached")
NOT_BUILT = "not built for this recipe"


def is_current(status: str) -> bool:
    return status in CURRENT


def why_not_current(session: BuildSession, stage: Stage, result: StageResult) -> str:
    """``not built for this recipe: <why>: run `npubuild run R <stage>` `` for a stage this
    run did not bring up to date whose directory holds another build's artifacts; "" when it
    holds none (nothing stale to mark). A stage that failed keeps its error as its reason."""
    manifest = read_manifest(session.paths.manifest(stage.name))
    if not isinstance(manifest, dict):
        return ""
    if is_current(result.status):
        return ""
    run = f"run `npubuild run {session.loaded.path} {stage.name}`"
    return f"{NOT_BUILT}: {_difference(session, stage, manifest)}: {run}"


def _difference(session: BuildSession, stage: Stage, manifest: dict) -> str:
    """What differs between the build that made the artifacts and this recipe."""
    built_for, chip = manifest.get("target"), session.loaded.recipe.target
    if stage.uses_chip:
        try:
            chip = session.chip.name
        except NpubuildError:
            pass
        if built_for and built_for != chip:
            return f"{stage.name} was built for target {built_for}; the recipe now targets {chip}"
    try:
        parts = session.parts(stage)
    except NpubuildError as exc:
        return f"{stage.name} cannot be keyed now ({exc.message})"
    return f"{stage.name} was built before: {explain_change(manifest, parts)}"
