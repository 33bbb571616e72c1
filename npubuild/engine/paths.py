"""Where artifacts live: the only module that makes build paths.

    build/<recipe name>/<stage>/...        a stage's artifacts, swapped in whole by rename
    build/<recipe name>/<stage>/manifest.json   the stage's key, file hashes and report
    build/<recipe name>/report.json        what every run updates (ARCHITECTURE §6)
    build/<recipe name>/report.html        the same for people, with pictures (every run)
    build/<recipe name>/recipe.lock        the resolved recipe and every artifact's hash
    build/<recipe name>/infer.json         the last `npubuild infer` (never touches report.json's figures)
    build/<name>@<label>/experiment.json   a variant's recipe and its -S overrides (`npubuild exp show`)
    build/<recipe name>/.recipe            the recipe file the folder belongs to
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BUILD_ROOT = Path("build")
DEFAULT_CACHE_DIR = Path(".npubuild") / "cache"
CACHE_ENV = "NPUBUILD_CACHE"
MANIFEST = "manifest.json"


def cache_dir(override: str | Path | None = None, setting: Path | None = None) -> Path:
    """``--cache`` wins, then ``$NPUBUILD_CACHE``, then the project's ``cache`` setting
    (``npubuild.engine.settings``), then ``.npubuild/cache``; a URL in any of them names the
    remote level (``npubuild.engine.remote``), not this folder."""
    env = os.environ.get(CACHE_ENV)
    return Path(override or (env if env and "://" not in env else None) or setting
                or DEFAULT_CACHE_DIR)


@dataclass(frozen=True)
class BuildPaths:
    root: Path

    @classmethod
    def for_recipe(cls, name: str, build_root: str | Path | None = None) -> "BuildPaths":
        return cls(Path(build_root or DEFAULT_BUILD_ROOT) / name)

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def manifest(self, stage: str) -> Path:
        return self.stage_dir(stage) / MANIFEST

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def infer_report(self) -> Path:
        return self.root / "infer.json"

    @property
    def experiment(self) -> Path:
        return self.root / "experiment.json"

    @property
    def recipe_lock(self) -> Path:
        return self.root / "recipe.lock"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def owner(self) -> Path:
        """The recipe file this folder belongs to (`npubuild.engine.owner`)."""
        return self.root / ".recipe"

    @property
    def doit_db(self) -> Path:
        return self.root / ".doit.sqlite"

    @property
    def hash_cache(self) -> Path:
        return self.root / ".hashes.json"

    @property
    def logs(self) -> Path:
        """Where a failing vendor tool's logs are kept (its scratch folder is removed)."""
        return self.root / "logs"

    @property
    def scratch(self) -> Path:
        """Where stages write before their directory is swapped into place."""
        return self.root / ".tmp"
