"""Build one recipe: decide per stage current / restore / build, run it, swap its artifacts in.

`BuildSession` is what both the CLI's `npubuild run` and the top-level `dodo.py` use (through
`npubuild.engine.tasks`); doit orders the stages and skips the current ones, and this module
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
from npubuild.engine.cache import TMP_PREFIX, Cache, CacheCorrupt, remove
from npubuild.engine.code import remembered_code_digest
from npubuild.engine.fetch import StageArtifacts
from npubuild.engine.hashing import HashCache, sha256_data, sha256_file
from npubuild.engine.keys import KeyParts, explain_change, key_parts, read_manifest
from npubuild.engine.lock import quantization_choices
from npubuild.engine.paths import MANIFEST, BuildPaths, cache_dir
from npubuild.engine.remote import RemoteCache, resolve_remote_url
from npubuild.engine.settings import Settings, find_settings
from npubuild.engine.signing import Trust, load_trust
from npubuild.engine.staleness import is_current, why_not_current
from npubuild.errors import BuildError, NpubuildError, did_you_mean
from npubuild.recipe import LoadedRecipe
from npubuild.stages import PIPELINE, STAGES, Stage, StageContext, no_progress, upto
from npubuild.timings import MEASURED_ESTIMATE_KEYS, without_measurements

log = logging.getLogger("npubuild")

NOT_IMPLEMENTED = "not built: not implemented yet"
FORCED = "forced (--force): run again, measurements taken again"
# What `plan` says for each outcome of `run` (a test compares the two). One vocabulary in
# every command and report: built, restored (from a cache), current (nothing to do), will run.
PLANNED = {"current": "current", "restored": "will restore", "built": "will run"}


@dataclass
class StageResult:
    stage: str
    status: str  # built | restored | current | failed | skipped | not built: ...
    seconds: float = 0.0
    key: str | None = None
    reason: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """False when the stage ran but one of its checks says it did not pass (verify)."""
        return not any(isinstance(section, dict) and section.get("passed") is False
                       for section in self.report.values())

    def as_dict(self) -> dict:
        out = {"status": self.status, "current": is_current(self.status),
               "seconds": round(self.seconds, 3), "key": self.key}
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
    cache_off: str | None = None  # why the cache is not written this run (warned once)
    remote_url: str | None = field(default=None, repr=False)  # may hold credentials
    scheduler: str | None = None
    force: frozenset[str] = frozenset()  # stages to run even when current or cached (--force)

    @cached_property
    def remote(self) -> RemoteCache | None:
        """The shared second cache level (``--remote``/``$NPUBUILD_REMOTE``), if any, with
        this machine's keys (`npubuild.engine.signing`; a bad key file is a UserError)."""
        url = resolve_remote_url(self.remote_url, self.settings.remote)
        return RemoteCache(url, trust=self.trust) if url else None

    @cached_property
    def trust(self) -> Trust:
        """This machine's signing key and trusted public keys (a bad one is a UserError)."""
        return load_trust(self.settings.trusted_keys)

    @cached_property
    def paths(self) -> BuildPaths:
        return BuildPaths.for_recipe(self.loaded.recipe.name, self.build_root)

    @cached_property
    def cache(self) -> Cache:
        return Cache(cache_dir(self.cache_root, self.settings.cache))

    @cached_property
    def settings(self) -> Settings:
        """The project's ``cache``/``remote`` settings, found upward from the recipe."""
        return find_settings(self.loaded.path.parent)

    @cached_property
    def hashes(self) -> HashCache:
        return HashCache(self.paths.hash_cache)

    @cached_property
    def chip(self):
        return self.loaded.chip()

    @cached_property
    def code_digest(self) -> str:
        """npubuild's code digest, part of every stage key (`remembered_code_digest`)."""
        return remembered_code_digest(self.hashes)

    @cached_property
    def chip_digest(self) -> str:
        return sha256_data(self.chip.digest_data())

    # -- keys -------------------------------------------------------------------------------
    def parts(self, stage: Stage, upstream: dict[str, dict | None] | None = None) -> KeyParts:
        """``stage``'s key parts; upstream manifests default to what the build dir holds."""
        digest = self.chip_digest if stage.uses_chip else None
        if upstream is None:
            upstream = {u: read_manifest(self.paths.manifest(u)) for u in stage.needs}
        return key_parts(stage, self.loaded, upstream, self.hashes, digest, __version__,
                         self.code_digest)

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
            manifest = (self.current_manifest(stage, parts.key) or self.cache.manifest(parts.key)
                        or self.remote_manifest(parts.key))
            manifests[stage.name] = manifest
            out[stage.name] = (parts, manifest, "built" if manifest else "not built")
        return out

    def current_manifest(self, stage: Stage, key: str) -> dict | None:
        """The stage's manifest when its artifacts are there and were built for ``key``."""
        manifest = read_manifest(self.paths.manifest(stage.name))
        if not isinstance(manifest, dict) or manifest.get("key") != key:
            return None
        stage_dir = self.paths.stage_dir(stage.name)
        try:
            for rel, info in manifest["files"].items():
                path = stage_dir / rel
                if path.is_symlink() or not path.is_file() or self.hashes.file(path) != info["sha256"]:
                    return None
        except (OSError, KeyError, TypeError, AttributeError, NpubuildError):
            return None
        return manifest

    def is_current(self, stage: Stage) -> bool:
        """doit's up-to-date check: a current stage is reported as current and not run (a
        forced one never is)."""
        if stage.name in self.force:
            return False
        parts = self.parts(stage)
        manifest = self.current_manifest(stage, parts.key)
        if manifest is None:
            return False
        self._record_cached(stage, parts.key, manifest)
        return True

    def _record_cached(self, stage: Stage, key: str, manifest: dict) -> None:
        self._record(StageResult(stage.name, "current", 0.0, key, report=manifest.get("report", {})))

    def plan(self, stages: tuple[Stage, ...]) -> list[StageResult]:
        """What a run would do per stage, and why, without running anything.

        A stage's key follows from its upstream manifests: the build directory's when current,
        the cache's when it will be restored (the same content). Only downstream of a stage
        that will really be built is the key unknown until that stage has run."""
        out: list[StageResult] = []
        manifests: dict[str, dict | None] = {}
        statuses: dict[str, str] = {}
        for stage in stages:
            result, manifests[stage.name] = self._plan_one(stage, manifests, statuses)
            statuses[stage.name] = result.status
            out.append(result)
        return out

    def _plan_one(self, stage: Stage, manifests: dict[str, dict | None],
                  statuses: dict[str, str]) -> tuple[StageResult, dict | None]:
        if not stage.implemented:
            return StageResult(stage.name, NOT_IMPLEMENTED), None
        blocked = [u for u in stage.needs if statuses.get(u) not in PLANNED.values()]
        if blocked:
            return StageResult(stage.name, "cannot run",
                               reason=f"{', '.join(blocked)} cannot run"), None
        waits_for = [u for u in stage.needs if statuses.get(u) == "will run"]
        if waits_for:
            return StageResult(stage.name, "will run", reason=f"its input {waits_for[-1]!r} "
                               "will be built first"), None
        try:
            parts = self.parts(stage, {u: manifests.get(u) for u in stage.needs})
        except NpubuildError as exc:  # e.g. its data files are missing: say so, go on
            return StageResult(stage.name, "cannot run", reason=exc.message), None
        current = self.current_manifest(stage, parts.key)
        if stage.name in self.force:
            return StageResult(stage.name, "will run", key=parts.key, reason=FORCED), current
        if current is not None:
            return StageResult(stage.name, "current", key=parts.key), current
        reason = explain_change(read_manifest(self.paths.manifest(stage.name)), parts)
        cached = self.cache.manifest(parts.key)
        if cached is None and (cached := self.remote_manifest(parts.key)) is not None:
            reason = f"{reason} (from the remote cache)"
        return StageResult(stage.name, "will restore" if cached else "will run", key=parts.key,
                           reason=reason), cached

    # -- running one stage ----------------------------------------------------------------
    def execute(self, stage: Stage) -> None:
        """Bring one stage's artifacts up to date (doit calls this only when not current)."""
        started = time.perf_counter()
        parts = self.parts(stage)
        key = parts.key
        forced = stage.name in self.force
        current = None if forced else self.current_manifest(stage, key)
        if current is not None:  # doit reruns a task whose upstream manifest was rewritten
            self._record_cached(stage, key, current)  # even when its own key did not change
            return
        reason = FORCED if forced else explain_change(read_manifest(self.paths.manifest(stage.name)),
                                                      parts)
        self.on_event(StageResult(stage.name, "running", key=key, reason=reason))
        scratch = self.paths.scratch / f"{stage.name}-{uuid.uuid4().hex[:8]}"
        try:
            manifest, status = None if forced else self._restore(stage, key, scratch), "restored"
            if manifest is None:
                manifest, status = self._build(stage, parts, scratch), "built"
                self._store(scratch, key)
                if self.remote is not None:
                    self.remote.push(key, self.cache)
            self._swap_in(stage, scratch)
            self._remember_hashes(stage, manifest)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            self.hashes.save()
        self._record(StageResult(stage.name, status, time.perf_counter() - started, key,
                                 reason=reason, report=manifest.get("report", {})))

    def remote_manifest(self, key: str) -> dict | None:
        return self.remote.manifest(key) if self.remote is not None else None

    def _restore(self, stage: Stage, key: str, scratch: Path) -> dict | None:
        """The stage's artifacts from the cache (pulled from the remote first when only the
        remote has them), checked file by file; a corrupt entry is reported, evicted and
        rebuilt (never healed silently), an unreadable cache skipped."""
        if self.cache.manifest(key) is None and (self.remote is None
                                                 or not self.remote.pull(key, self.cache)):
            return None
        try:
            return self.cache.restore(key, scratch)
        except CacheCorrupt as exc:
            log.warning("cache entry %s for `%s` is corrupt (%s): evicted, the stage is rebuilt",
                        key[:12], stage.name, exc)
            self._evict(key)
        except OSError as exc:
            self._cache_unusable(exc)
        shutil.rmtree(scratch, ignore_errors=True)
        return None

    def _store(self, scratch: Path, key: str) -> None:
        if self.cache_off:
            return
        try:
            self.cache.store(scratch, key)
        except OSError as exc:
            self._cache_unusable(exc)

    def _evict(self, key: str) -> None:
        try:
            self.cache.evict(key)
        except OSError as exc:
            self._cache_unusable(exc)

    def _cache_unusable(self, exc: OSError) -> None:
        """The cache is an optimisation: one warning, then the build goes on without it."""
        if not self.cache_off:
            self.cache_off = f"{exc.strerror or exc}"
            log.warning("the cache %s cannot be used (%s); building without it",
                        self.cache.root, self.cache_off)

    def clear_orphans(self) -> None:
        """Remove what killed runs left in the build directory (scratch dirs, ``.tmp-*`` files);
        called under the build lock, so no live run owns them."""
        remove(self.paths.scratch)
        self.cache.remove_dead_orphans()  # a pull or store this host's killed runs left
        for path in self.paths.root.glob(f"{TMP_PREFIX}*"):
            remove(path)
        for stage in PIPELINE:
            for path in self.paths.stage_dir(stage.name).glob(f"{TMP_PREFIX}*"):
                remove(path)

    def _build(self, stage: Stage, parts: KeyParts, scratch: Path) -> dict:
        scratch.mkdir(parents=True)
        upstream = {u: self.paths.stage_dir(u) for u in stage.needs}
        ctx = StageContext(self.loaded, self.chip if stage.uses_chip else None, upstream,
                           scratch, self.progress, scheduler=self.scheduler,
                           sources=self._sources(stage) if self.scheduler else {},
                           logs=self.paths.logs)
        try:
            report = stage.function()(ctx) or {}
        except BuildError as exc:
            if exc.stage:
                raise
            raise BuildError(exc.message, stage=stage.name, location=exc.location,
                             field=exc.field, hint=exc.hint) from None  # say which stage failed
        files = {p.relative_to(scratch).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                 for p in sorted(scratch.rglob("*")) if p.is_file() and not p.is_symlink()}
        # the manifest is an artifact too: no timings in it (they go to report.json)
        manifest = {"stage": stage.name, "key": parts.key, "npubuild": __version__,
                    "target": self.chip.name if stage.uses_chip else None,  # for staleness
                    "files": files, "parts": parts.as_dict(), "report": without_measurements(report)}
        write_json(scratch / MANIFEST, manifest)
        return {**manifest, "report": report}

    def _remember_hashes(self, stage: Stage, manifest: dict) -> None:
        """The artifacts' hashes were just computed (built) or checked (restored): keep them
        for the next up-to-date check, which then re-reads only files changed since."""
        stage_dir = self.paths.stage_dir(stage.name)
        for rel, info in manifest["files"].items():
            self.hashes.remember(stage_dir / rel, info["sha256"])

    def _sources(self, stage: Stage) -> dict[str, StageArtifacts]:
        """The upstream stages by key, for workers that fetch them through the caches: those
        in the local cache or, when one is configured, the remote (a stage current in the
        build dir whose entry was removed from the cache is left out; its stage's fan-out
        then runs in this process, with a warning)."""
        remote = self.remote.url if self.remote is not None and self.remote.available else None
        trusted = self.remote.trust.trusted_texts() if remote else ()
        out = {}
        for name in stage.needs:
            manifest = read_manifest(self.paths.manifest(name))
            if manifest and (remote or self.cache.manifest(manifest["key"]) is not None):
                out[name] = StageArtifacts(name, manifest["key"], str(self.cache.root.resolve()),
                                           remote, trusted)
        return out

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
                still = self._still_current(stage)
                if still is not None:  # built by an earlier run and still current: keep its
                    self._record(still)  # figures (a partial build, e.g. infer's, drops none)
                    continue
                status = "not requested"
            else:
                status = "skipped" if blocked or self.error else "not built"
            blocked = blocked or not stage.implemented
            result = StageResult(stage.name, status)
            result.reason = why_not_current(self, stage, result)  # its folder may hold another
            self._record(result)                                # build's artifacts: say whose
        report, lock = self.report(PIPELINE), self.lock_data()
        self.paths.root.mkdir(parents=True, exist_ok=True)
        if (read_manifest(self.paths.report) == report and read_manifest(self.paths.recipe_lock)
                == lock and self.paths.report_html.is_file()):
            return report  # a no-op run: report.json, recipe.lock and report.html stand
        write_json(self.paths.report, report)
        write_json(self.paths.recipe_lock, lock)
        self.write_html()
        return report

    def _still_current(self, stage: Stage) -> StageResult | None:
        """A stage this run did not ask for, as "current" when its artifacts are."""
        try:
            parts = self.parts(stage)
        except NpubuildError:
            return None
        manifest = self.current_manifest(stage, parts.key)
        if manifest is None:
            return None
        return StageResult(stage.name, "current", 0.0, parts.key, report=manifest.get("report", {}))

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
        before = read_manifest(self.paths.report) or {}
        previous = before.get("stages") or {}
        for name, entry in report["stages"].items():
            entry["built_seconds"] = self._built_seconds(self.results[name], previous.get(name))
        for stage in stages:
            result = self.results.get(stage.name)
            if result and is_current(result.status):
                report.update(result.report)
        self._keep_measurements(report, before)
        if self.error is not None:
            report["error"] = str(self.error)
        return report

    def _keep_measurements(self, report: dict, before: dict) -> None:
        """A compile stage not built by this run has no measured CPU time in its manifest: the
        fps and CPU seconds come from the earlier report.json of the same compile key (or stay
        absent: restored from a cache another machine filled, nothing here measured them)."""
        compile_result = self.results.get("compile")
        estimate = report.get("estimate")
        if (compile_result is None or compile_result.status == "built"
                or not isinstance(estimate, dict)):
            return
        earlier = before.get("estimate") or {}
        same = ((before.get("stages") or {}).get("compile") or {}).get("key") == compile_result.key
        if same and compile_result.key:
            estimate.update({k: earlier[k] for k in MEASURED_ESTIMATE_KEYS if k in earlier})
            if isinstance(earlier.get("cpu"), dict):
                estimate["cpu"] = earlier["cpu"]

    def _built_seconds(self, result: StageResult, before: dict | None) -> float | None:
        """Seconds of the run that built the stage's current artifacts: this run's when it
        built them, else what an earlier report.json kept for the same key (or the manifest of a
        build older than timing-free manifests); None when no run on this machine timed them
        (restored from someone else's cache)."""
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
        resolved = self.loaded.recipe.model_dump(mode="json")
        if "quantize" in stages:  # what quantize chose where the recipe left it open
            manifest = read_manifest(self.paths.manifest("quantize")) or {}
            resolved["quantization"]["chosen"] = quantization_choices(
                self.paths.stage_dir("quantize"), manifest.get("report") or {})
        return {"recipe": str(self.loaded.path),
                "recipe_sha256": sha256_file(self.loaded.path),
                "npubuild": __version__,
                "resolved": resolved,
                "stages": stages}


def stage_list(target: str | None) -> tuple[Stage, ...]:
    if target is not None and target not in STAGES:
        raise BuildError(f"unknown stage {target!r}{did_you_mean(target, STAGES)}; stages: "
                         f"{', '.join(STAGES)}")
    return upto(target)
