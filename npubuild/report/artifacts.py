"""Read-only view of one build directory for the report: JSON files, pictures and stage states.

Stages land at different times, so nothing here assumes a file exists: `json` returns ``None``
for a missing file, and `not_built` says, in the page, which stage would have written it.

Nothing stale: a stage's folder may hold an earlier build's artifacts (another target, another
recipe section, a run that crashed in the stage). A stage's files are read only when the stage
is *current*: report.json, written by the last run for this recipe and chip, says so (status
built, restored or current) and its key for the stage is the key of the artifacts in the folder
(the stage's manifest). Otherwise `json`, `glob` and `exists` find nothing there, and
`not_built` gives report.json's reason ("not built for this recipe: verify was built for target
npu-16m; the recipe now targets npu-tiny: run ...").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from npubuild.engine.paths import MANIFEST
from npubuild.engine.staleness import NOT_BUILT, is_current
from npubuild.report.html import esc, image
from npubuild.stages import STAGES

MIME = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


class UnreadableArtifact(ValueError):
    """A file is there but is not the JSON the report expects."""


def natural_key(path: Path) -> list:
    """``lmem_group_10`` after ``lmem_group_2``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.as_posix())]


@dataclass
class BuildArtifacts:
    """``root`` is ``build/<name>/``; ``stage_dirs`` maps a stage to another directory (the
    scratch directory a running stage writes before it is swapped into place)."""

    root: Path
    stage_dirs: dict[str, Path] = field(default_factory=dict)
    _json: dict[str, Any] = field(default_factory=dict, repr=False)

    def path(self, rel: str) -> Path:
        stage, _, rest = rel.partition("/")
        if stage in self.stage_dirs and rest:
            return self.stage_dirs[stage] / rest
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return self.readable(rel) and self.path(rel).is_file()

    def json(self, rel: str) -> Any:
        """The parsed file, or ``None`` when the stage has not written it for this recipe."""
        return self._read(rel) if self.readable(rel) else None

    def _read(self, rel: str) -> Any:
        if rel not in self._json:
            path = self.path(rel)
            try:
                self._json[rel] = json.loads(path.read_text()) if path.is_file() else None
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UnreadableArtifact(f"{rel}: {exc}") from exc
        return self._json[rel]

    def glob(self, pattern: str) -> list[Path]:
        """Files matching ``<stage>/<pattern>``, in natural order (none from a stage that is
        not current)."""
        stage, _, rest = pattern.partition("/")
        if not self.readable(pattern):
            return []
        base = self.stage_dirs.get(stage, self.root / stage)
        return sorted((p for p in base.glob(rest) if p.is_file()), key=natural_key)

    def readable(self, rel: str) -> bool:
        """Whether ``rel`` may be read: a file outside the stage folders, or in a current one."""
        stage, _, rest = rel.partition("/")
        return not rest or stage not in STAGES or self.current(stage)

    def current(self, stage: str) -> bool:
        """The stage's folder holds the artifacts report.json names for this recipe and chip
        (a folder given in ``stage_dirs`` is the running stage's own: current)."""
        if stage in self.stage_dirs:
            return True
        info = (self.report.get("stages") or {}).get(stage) or {}
        if not is_current(str(info.get("status"))) or not info.get("key"):
            return False
        try:
            manifest = self._read(f"{stage}/{MANIFEST}")
        except UnreadableArtifact:
            return False
        return isinstance(manifest, dict) and manifest.get("key") == info["key"]

    def rel(self, path: Path) -> str:
        """``path`` as ``<stage>/...``, the name the page shows and `json` takes."""
        for stage, base in self.stage_dirs.items():
            if path.is_relative_to(base):
                return f"{stage}/{path.relative_to(base).as_posix()}"
        return path.relative_to(self.root).as_posix()

    @cached_property
    def report(self) -> dict:
        return self.json("report.json") or {}

    @cached_property
    def lock(self) -> dict:
        return self.json("recipe.lock") or {}

    @property
    def recipe(self) -> dict:
        """The resolved recipe from ``recipe.lock`` (empty before the first run)."""
        return self.lock.get("resolved") or {}

    def stage_status(self, stage: str) -> str:
        info = (self.report.get("stages") or {}).get(stage) or {}
        return str(info.get("status") or "not built")

    def stale(self, stage: str) -> str:
        """Why the stage's folder holds artifacts that are not this recipe's ("" when it is
        current, or holds none): report.json's reason, or, from an older report.json, that its
        key differs."""
        if stage not in STAGES or self.current(stage):
            return ""
        info = (self.report.get("stages") or {}).get(stage) or {}
        reason = str(info.get("reason") or "")
        if reason.startswith(NOT_BUILT) or info.get("status") == "failed":
            return (reason if reason.startswith(NOT_BUILT)
                    else f"{NOT_BUILT}: {stage} stopped with an error: {reason}")
        try:
            held = self._read(f"{stage}/{MANIFEST}")
        except UnreadableArtifact:
            held = None
        return f"{NOT_BUILT}: its folder holds another build's artifacts" if held else ""

    def not_built(self, stage: str, rel: str) -> str:
        """The paragraph a section shows instead of its content."""
        stale = self.stale(stage)
        if stale:
            return f'<p class="not-built">{esc(stale)}.</p>'
        status = self.stage_status(stage)
        why = (status.partition(":")[2].strip() if status.startswith("not built")
               else f"report.json says {status}")
        said = f" ({why})" if why else ""
        return (f'<p class="not-built">not built: {esc(stage)} has not written '
                f"<code>{esc(rel)}</code>{esc(said)}.</p>")

    def picture(self, path: Path, alt: str) -> str:
        """The image at ``path`` inlined into the page."""
        mime = MIME.get(path.suffix.lower(), "application/octet-stream")
        return image(path.read_bytes(), mime, alt)
