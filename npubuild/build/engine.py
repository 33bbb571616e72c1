"""Build one recipe: decide per stage cached / restore / build, run it, swap its artifacts in.

`BuildSession` is what both the CLI's `npubuild run` and the top-level `dodo.py` use (through
`npubuild.build.tasks`); doit orders the stages and skips the current ones, and this module
does the work of one stage: key → restore from the content cache or run the stage function into
a scratch directory → manifest → cache → atomic swap into ``build/<name>/<stage>/``.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from npubuild import __version__
from npubuild.atomic import write_json
from npubuild.build.cache import Cache, CacheCorrupt
from npubuild.build.hashing import HashCache, sha256_data, sha256_file
from npubuild.build.keys import KeyParts, explain_change, key_parts, read_manifest
from npubuild.build.paths import MANIFEST, BuildPaths, cache_dir
from npubuild.errors import BuildError, NpubuildError
from npubuild.recipe import LoadedRecipe
from npubuild.stages import PIPELINE, STAGES, Stage, StageContext, no_progress, upto

NOT_IMPLEMENTED = "not built: not implemented yet"


@dataclass
class StageResult:
    stage: str
    status: str  # built | restored | cached | failed | skipped | not built: ...
    seconds: float = 0.0
    key: str | None = None
    reason: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"status": self.status, "seconds": round(self.seconds, 3), "key": self.key}
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class BuildSession:
    """One recipe's build: paths, cache, chip and the results of this run."""

    loaded: LoadedRecipe
    build_root: Path | None = None
    cache_root: Path | None = None
    progress: Callable[..., Any] = no_progress
    on_event: Callable[[StageResult], None] = lambda result: None
    results: dict[str, StageResult] = field(default_factory=dict)
    error: NpubuildError | None = None

    @cached_property
    def paths(self) -> BuildPaths:
        return BuildPaths.for_recipe(self.loaded.recipe.name, self.build_root)

    @cached_property
    def cache(self) -> Cache:
        return Cache(cache_dir(self.cache_root))

    @cached_property
    def hashes(self) -> HashCache:
        return HashCache(self.paths.hash_cache)

    @cached_property
    def chip(self):
        return self.loaded.chip()

    @cached_property
    def chip_digest(self) -> str:
        return sha256_data(self.chip.digest_data())

    # -- keys -------------------------------------------------------------------------------
    def parts(self, stage: Stage, upstream: dict[str, dict | None] | None = None) -> KeyParts:
        """``stage``'s key parts; upstream manifests default to what the build dir holds."""
        digest = self.chip_digest if stage.uses_chip else None
        if upstream is None:
            upstream = {u: read_manifest(self.paths.manifest(u)) for u in stage.needs}
        return key_parts(stage, self.loaded, upstream, self.hashes, digest, __version__)

    def expected(self) -> dict[str, tuple[KeyParts | None, dict | None, str]]:
        """Per stage, without building: its key parts, the manifest that key has (in the build
        dir or the cache, else None) and a note; upstream keys follow from those manifests."""
        manifests: dict[str, dict | None] = {}
        out: dict[str, tuple[KeyParts | None, dict | None, str]] = {}
        for stage in PIPELINE:
            if not stage.implemented:
                out[stage.name], manifests[stage.name] = (None, None, NOT_IMPLEMENTED), None
                continue
            try:
                parts = self.parts(stage, {u: manifests.get(u) for u in stage.needs})
            except NpubuildError as exc:
                out[stage.name], manifests[stage.name] = (None, None, exc.message), None
                continue
            manifest = self.current_manifest(stage, parts.key) or self.cache.manifest(parts.key)
            manifests[stage.name] = manifest
            out[stage.name] = (parts, manifest, "built" if manifest else "not built")
        return out

    def current_manifest(self, stage: Stage, key: str) -> dict | None:
        """The stage's manifest when its artifacts are there and were built for ``key``."""
        manifest = read_manifest(self.paths.manifest(stage.name))
        if not manifest or manifest.get("key") != key:
            return None
        stage_dir = self.paths.stage_dir(stage.name)
        for rel, info in manifest["files"].items():
            path = stage_dir / rel
            if not path.is_file() or path.stat().st_size != info["bytes"]:
                return None
        return manifest

    def is_current(self, stage: Stage) -> bool:
        """doit's up-to-date check: a current stage is reported as cached and not run."""
        parts = self.parts(stage)
        manifest = self.current_manifest(stage, parts.key)
        if manifest is None:
            return False
        self._record(StageResult(stage.name, "cached", 0.0, parts.key, report=manifest.get("report", {})))
        return True

    def plan(self, stages: tuple[Stage, ...]) -> list[StageResult]:
        """What a run would do per stage, and why, without running anything."""
        out, stale = [], False
        for stage in stages:
            if not stage.implemented:
                out.append(StageResult(stage.name, NOT_IMPLEMENTED))
                stale = True
                continue
            try:
                parts = self.parts(stage)
            except NpubuildError as exc:  # e.g. its data files are missing: say so, go on
                out.append(StageResult(stage.name, "cannot run", reason=exc.message))
                stale = True
                continue
            current = self.current_manifest(stage, parts.key)
            if current and not stale:
                out.append(StageResult(stage.name, "cached", key=parts.key))
            elif stale:
                out.append(StageResult(stage.name, "will run", key=None, reason="an input stage will run first"))
            else:
                stale = True
                old = read_manifest(self.paths.manifest(stage.name))
                reason = explain_change(old, parts)
                status = "will restore" if self.cache.manifest(parts.key) else "will run"
                out.append(StageResult(stage.name, status, key=parts.key, reason=reason))
        return out

    # -- running one stage ----------------------------------------------------------------
    def execute(self, stage: Stage) -> None:
        """Bring one stage's artifacts up to date (doit calls this only when not current)."""
        started = time.perf_counter()
        parts = self.parts(stage)
        key = parts.key
        reason = explain_change(read_manifest(self.paths.manifest(stage.name)), parts)
        self.on_event(StageResult(stage.name, "running", key=key, reason=reason))
        scratch = self.paths.scratch / f"{stage.name}-{uuid.uuid4().hex[:8]}"
        try:
            manifest, status = self._restore(key, scratch), "restored"
            if manifest is None:
                manifest, status = self._build(stage, parts, scratch), "built"
                self.cache.store(scratch, key)
            self._swap_in(stage, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            self.hashes.save()
        self._record(StageResult(stage.name, status, time.perf_counter() - started, key,
                                 reason=reason, report=manifest.get("report", {})))

    def _restore(self, key: str, scratch: Path) -> dict | None:
        if self.cache.manifest(key) is None:
            return None
        try:
            return self.cache.restore(key, scratch)
        except CacheCorrupt:
            self.cache.evict(key)
            shutil.rmtree(scratch, ignore_errors=True)
            return None

    def _build(self, stage: Stage, parts: KeyParts, scratch: Path) -> dict:
        scratch.mkdir(parents=True)
        upstream = {u: self.paths.stage_dir(u) for u in stage.needs}
        ctx = StageContext(self.loaded, self.chip if stage.uses_chip else None, upstream,
                           scratch, self.progress)
        started = time.perf_counter()
        try:
            report = stage.function()(ctx) or {}
        except BuildError as exc:
            if exc.stage:
                raise
            raise BuildError(exc.message, stage=stage.name, location=exc.location,
                             field=exc.field, hint=exc.hint) from None  # say which stage failed
        files = {str(p.relative_to(scratch)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                 for p in sorted(scratch.rglob("*")) if p.is_file()}
        manifest = {"stage": stage.name, "key": parts.key, "npubuild": __version__,
                    "seconds": round(time.perf_counter() - started, 3), "files": files,
                    "parts": parts.as_dict(), "report": report}
        write_json(scratch / MANIFEST, manifest)
        return manifest

    def _swap_in(self, stage: Stage, scratch: Path) -> None:
        """Replace the stage directory by ``scratch`` with two renames; a kill between them
        leaves no stage directory, which the next run rebuilds or restores."""
        final = self.paths.stage_dir(stage.name)
        old = self.paths.scratch / f"{stage.name}-old-{uuid.uuid4().hex[:8]}"
        if final.exists():
            final.rename(old)
        scratch.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def _record(self, result: StageResult) -> None:
        self.results[result.stage] = result
        self.on_event(result)

    # -- the run's outcome ----------------------------------------------------------------
    def finish(self, stages: tuple[Stage, ...]) -> dict:
        """Fill in stages that did not run, then write report.json and recipe.lock."""
        blocked = False
        for stage in PIPELINE:
            if stage.name in self.results:
                blocked = blocked or self.results[stage.name].status == "failed"
                continue
            if not stage.implemented:
                status = NOT_IMPLEMENTED
            elif stage not in stages:
                status = "not requested"
            else:
                status = "skipped" if blocked or self.error else "not built"
            blocked = blocked or not stage.implemented
            self._record(StageResult(stage.name, status))
        report = self.report(PIPELINE)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        write_json(self.paths.report, report)
        write_json(self.paths.recipe_lock, self.lock_data())
        self.write_html()
        return report

    def write_html(self) -> None:
        """report.html beside report.json, from this run's artifacts (a page that cannot be
        drawn is a warning, never a failed build)."""
        from npubuild.report import write_report

        try:
            write_report(self.paths.root, self.paths.report_html)
        except Exception as exc:  # the report must not hide the build's own outcome
            logging.getLogger("npubuild").warning("report.html not written: %s", exc)

    def report(self, stages: tuple[Stage, ...]) -> dict:
        chip_name = self.loaded.recipe.target
        report: dict[str, Any] = {"recipe": str(self.loaded.path), "target": chip_name,
                                  "npubuild": __version__,
                                  "stages": {s.name: self.results[s.name].as_dict() for s in stages
                                             if s.name in self.results}}
        previous = (read_manifest(self.paths.report) or {}).get("stages") or {}
        for name, entry in report["stages"].items():
            entry["built_seconds"] = self._built_seconds(self.results[name], previous.get(name))
        for stage in stages:
            result = self.results.get(stage.name)
            if result and result.status in ("built", "restored", "cached"):
                report.update(result.report)
        if self.error is not None:
            report["error"] = str(self.error)
        return report

    def _built_seconds(self, result: StageResult, before: dict | None) -> float | None:
        """Seconds of the run that built the stage's current artifacts: this run's when it
        built them, else what an earlier report.json (or the manifest) kept for the same key;
        None when no run on this machine timed them (restored from someone else's cache)."""
        if result.status == "built":
            return round(result.seconds, 3)
        if not result.key:
            return None
        if before and before.get("key") == result.key and before.get("built_seconds") is not None:
            return before["built_seconds"]
        manifest = read_manifest(self.paths.manifest(result.stage)) or {}
        seconds = manifest.get("seconds") if manifest.get("key") == result.key else None
        return seconds if isinstance(seconds, (int, float)) else None

    def lock_data(self) -> dict:
        stages = {}
        for stage in PIPELINE:
            manifest = read_manifest(self.paths.manifest(stage.name))
            if manifest:
                stages[stage.name] = {"key": manifest["key"],
                                      "files": {k: v["sha256"] for k, v in manifest["files"].items()}}
        return {"recipe": str(self.loaded.path),
                "recipe_sha256": sha256_file(self.loaded.path),
                "npubuild": __version__,
                "resolved": self.loaded.recipe.model_dump(mode="json"),
                "stages": stages}


def stage_list(target: str | None) -> tuple[Stage, ...]:
    if target is not None and target not in STAGES:
        raise BuildError(f"unknown stage {target!r}; stages: {', '.join(STAGES)}")
    return upto(target)
