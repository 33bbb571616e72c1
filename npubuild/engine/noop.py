"""The no-op fast path: a run that finds everything as the last no-op run left it says what
that run said, without loading the recipe, npubuild's stages or their libraries.

`npubuild run` spends most of a no-op importing pydantic, numpy and ONNX to validate the recipe
and compute each stage's key. When a run finds every requested stage current it writes a
*stamp* (``<build root>/.noop/<digest of the command>.json``): the command line, the
``NPUBUILD_*`` environment, the interpreter, and the stat key (`hashing.stat_key`: size,
mtime, ctime, inode — what the hash cache trusts: a changed byte always changes ctime) of
everything the up-to-date check read:

- npubuild's code and shipped data (`code.code_files`), the recipe, its chip file and the
  settings files looked for (absent ones too: one appearing is a change);
- every stage's model, data and proof files, and the folder each data glob searched (a file
  added or removed there changes its mtime; a recursive ``**`` glob is never stamped);
- the build's artifacts: each stage's manifest and the files it lists, report.json,
  recipe.lock, report.html;
- what the tool-version hooks read (`npubuild.engine.keys.tool_versions`): every folder on
  ``sys.path`` (installing, upgrading or removing a package rewrites its folder's entries), and
  for a chip built through a vendor toolchain, npubuild's environment for it (installing one
  changes its marker file and the folder of environments); an environment the user names
  (``NPUBUILD_TOOLCHAIN_<NAME>``) is asked for its versions on every run, so it is never stamped.

The next run with the same command compares those keys (a few hundred ``stat`` calls) and, when
every one matches, prints the stamped output and exits 0. Anything else — one changed key, a
missing stamp, a warning in the stamped run — takes the ordinary path, which rebuilds what
changed and stamps again when it finds nothing to do. A run told to ``--force`` a stage, or
to build a matrix, is never replayed; an experiment (``-S``) is its own command.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from npubuild.engine.hashing import stat_key

FORMAT = "npubuild.noop/1"
MAGIC = set("*?[")


def command_key(args) -> dict:
    """What must be the same for a stamp to speak for this run."""
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith("NPUBUILD_") or k in ("NO_COLOR", "PYTHONPATH", "HOME",
                                                    "XDG_CACHE_HOME")}
    import npubuild

    return {"format": FORMAT, "cwd": os.getcwd(), "recipe": str(Path(args.recipe).resolve()),
            "stage": args.stage, "build_dir": str(args.build_dir), "cache": str(args.cache),
            "remote": args.remote, "scheduler": args.scheduler, "json": args.json,
            "quiet": getattr(args, "quiet", False), "verbose": getattr(args, "verbose", 0),
            "targets": args.target, "set": args.set, "force": args.force, "env": env, "python": sys.executable,
            "sys_path": sys.path, "npubuild": str(Path(npubuild.__file__).resolve().parent),
            "tty": [sys.stdout.isatty(), sys.stderr.isatty()]}


def stamp_path(args, key: dict) -> Path:
    from npubuild.engine.paths import DEFAULT_BUILD_ROOT

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(args.build_dir or DEFAULT_BUILD_ROOT) / ".noop" / f"{digest}.json"


def replay(args) -> bool:
    """Print the stamped output when everything is as stamped; False to take the normal path."""
    if args.force or args.target:  # run again / a matrix: always the ordinary path
        return False
    key = command_key(args)
    try:
        stamp = json.loads(stamp_path(args, key).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("key") != key or not _unchanged(stamp):
        return False
    sys.stderr.write(stamp["stderr"])
    sys.stdout.write(stamp["stdout"])
    return True


def _unchanged(stamp: dict) -> bool:
    for path, want in stamp.get("stats", {}).items():
        try:
            got = stat_key(os.stat(path))
        except OSError:
            got = None
        if got != want:
            return False
    return True


class _Tee(io.TextIOBase):
    """A stream that writes through and keeps a copy."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record) -> None:
        self.count += 1


class Recording:
    """What a run printed, to stamp when it turns out to have been a no-op."""

    def __init__(self, args):
        self.args, self.out, self.err, self.warnings = args, None, None, _Warnings()

    def stamp(self, loaded, paths, results: dict, requested: tuple) -> None:
        """Write the stamp when every requested stage was current (``results``: stage name ->
        `StageResult` of this run in the build folder ``paths``) and nothing warned."""
        if self.args.force or self.args.target or self.warnings.count or any(
                results.get(s.name) is None or results[s.name].status != "current"
                for s in requested):
            return
        stats = _stats(loaded, paths)
        if stats is None:
            return
        key = command_key(self.args)
        from npubuild.atomic import write_json

        try:
            write_json(stamp_path(self.args, key),
                       {"key": key, "stats": stats, "stdout": self.out.copy.getvalue(),
                        "stderr": self.err.copy.getvalue()})
        except OSError:  # a build root that takes no stamp only loses the speed-up
            pass


@contextmanager
def recording(args) -> Iterator[Recording]:
    """Copy what the run prints (stdout, stderr) and count its warnings."""
    rec = Recording(args)
    saved = sys.stdout, sys.stderr
    rec.out, rec.err = _Tee(saved[0]), _Tee(saved[1])
    sys.stdout, sys.stderr = rec.out, rec.err
    logging.getLogger().addHandler(rec.warnings)
    try:
        yield rec
    finally:
        logging.getLogger().removeHandler(rec.warnings)
        sys.stdout, sys.stderr = saved


def _stats(loaded, build) -> dict[str, list | None] | None:
    """Stat keys of everything the up-to-date check read; None when it cannot be stamped."""
    import npubuild
    from npubuild.engine.code import code_files
    from npubuild.engine.keys import read_manifest
    from npubuild.stages import PIPELINE
    from npubuild.targets import chip_file

    toolchain = _toolchain_files(loaded)
    if toolchain is None:
        return None
    paths = [*code_files(Path(npubuild.__file__).resolve().parent), loaded.path,
             chip_file(loaded.recipe.target, loaded.base_dir), *_settings_candidates(loaded),
             *[p for p in sys.path if p], *toolchain]
    for stage in PIPELINE:
        if stage.implemented:
            paths += stage.external_files(loaded)
        manifest_path = build.manifest(stage.name)
        paths.append(manifest_path)
        manifest = read_manifest(manifest_path)
        if manifest:
            paths += [build.stage_dir(stage.name) / rel for rel in manifest["files"]]
    for specs, _field in loaded.__dict__.get("_globbed", {}):
        for spec in [specs] if isinstance(specs, str) else specs:
            if "**" in spec:
                return None
            paths.append(_searched_folder(loaded, spec))
    paths += [build.report, build.recipe_lock, build.report_html]
    stats = {}
    for path in dict.fromkeys(str(Path(p)) for p in paths):
        try:
            stats[path] = stat_key(os.stat(path))
        except OSError:
            stats[path] = None
    return stats


def _toolchain_files(loaded) -> list[Path] | None:
    """What a vendor toolchain's versions are read from: npubuild's environment for it (its
    marker, absent until installed, and the folder of environments); None when the user names
    the environment (asked on every run: never stamped)."""
    from npubuild import backends, toolchains
    from npubuild.toolchains import env

    name = backends.of(loaded.chip()).toolchain
    if name is None:
        return []
    chain = toolchains.get(name)
    if os.environ.get(chain.override_variable):
        return None
    return [env.root(), env.folder(chain) / env.MARKER]


def _settings_candidates(loaded) -> list[Path]:
    from npubuild.engine.settings import SETTINGS_FILE

    start = loaded.base_dir.resolve()
    return [folder / name for folder in [start, *start.parents]
            for name in (SETTINGS_FILE, "pyproject.toml")]


def _searched_folder(loaded, spec: str) -> Path:
    """The folder a data glob lists: its path up to the first part with a wildcard."""
    path = loaded.resolve(spec)
    parts = path.parts
    static = next((i for i, part in enumerate(parts) if MAGIC & set(part)), len(parts))
    return Path(*parts[:static]) if static < len(parts) else path.parent
