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

The stamp also holds the sha256 of the recipe, its chip file and the settings files there are.
The next run with the same command compares those keys (a few hundred ``stat`` calls) and, when
every one matches — or differs only for one of those files, whose content is still the same (a
recipe saved or checked out unchanged, as doit re-hashes a touched file_dep) — prints the
stamped output and exits 0. Anything else — one changed key, a missing stamp, a warning in the
stamped run — takes the ordinary path, which rebuilds what changed and stamps again when it
finds nothing to do. A run told to ``--force`` a stage, or
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

from npubuild.engine.hashing import sha256_file, stat_key
from npubuild.errors import UserError

FORMAT = "npubuild.noop/1"
MAGIC = set("*?[")


def command_key(args) -> dict:
    """What must be the same for a stamp to speak for this run."""
    return {"format": FORMAT, "recipe": str(Path(args.recipe).resolve()),
            "stage": args.stage, "build_dir": str(args.build_dir), "cache": str(args.cache),
            "remote": args.remote, "scheduler": args.scheduler, "json": args.json,
            "quiet": getattr(args, "quiet", False), "verbose": getattr(args, "verbose", 0),
            "targets": args.target, "set": args.set, "force": args.force, **_process()}


def _process() -> dict:
    """The process a command runs in, which every stamp's key holds: its folder, the
    ``NPUBUILD_*`` environment (and what else changes paths or output), the interpreter, its
    import path and npubuild's own folder, and whether its output goes to a terminal."""
    import npubuild

    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith("NPUBUILD_") or k in ("NO_COLOR", "PYTHONPATH", "HOME",
                                                    "XDG_CACHE_HOME")}
    return {"cwd": os.getcwd(), "env": env, "python": sys.executable, "sys_path": sys.path,
            "npubuild": str(Path(npubuild.__file__).resolve().parent),
            "tty": [sys.stdout.isatty(), sys.stderr.isatty()]}


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def stamp_path(args, key: dict) -> Path:
    from npubuild.engine.paths import DEFAULT_BUILD_ROOT

    return Path(args.build_dir or DEFAULT_BUILD_ROOT) / ".noop" / f"{_digest(key)}.json"


def replay(args) -> bool:
    """Print the stamped output when everything is as stamped; False to take the normal path."""
    if args.force or args.target:  # run again / a matrix: always the ordinary path
        return False
    key = command_key(args)
    return _replayed(stamp_path(args, key), key)


def validate_key(args) -> dict:
    """What must be the same for a stamp to speak for this `npubuild validate`."""
    return {"format": FORMAT, "command": "validate",
            "recipes": [[str(p), str(Path(p).resolve())] for p in args.recipes],
            "json": args.json, **_process()}


def validate_stamp_path(key: dict) -> Path:
    """Beside the default cache (``.npubuild/``), where validate already remembers the model
    checks it passed: validate builds nothing, so it writes no build folder."""
    from npubuild.engine.paths import DEFAULT_CACHE_DIR

    return Path(DEFAULT_CACHE_DIR).parent / "noop" / f"{_digest(key)}.json"


def replay_validate(args) -> bool:
    """`npubuild validate`'s fast path: print what the last validate of these very recipes
    printed when nothing it read has changed since; False to check them again."""
    key = validate_key(args)
    return _replayed(validate_stamp_path(key), key)


def stamp_validate(args, recording: Recording, loaded: list) -> None:
    """Stamp a validate that found every recipe valid and warned of nothing: the stat keys of
    what `run`'s up-to-date check reads for each recipe (its code, recipe, chip, settings,
    model, proof and data files, data folders, installed packages) and the build folder's
    owner record, which validate reads too."""
    from npubuild.engine.paths import BuildPaths

    stats: dict = {}
    contents: dict = {}
    for one in loaded:
        build = BuildPaths.for_recipe(one.recipe.name)
        found = _stats(one, build)
        if found is None:
            return
        stats.update(found)
        contents.update(_contents(one))
        for path in (build.root, build.owner):
            stats[str(path)] = _stat_or_none(path)
    key = validate_key(args)
    _write(validate_stamp_path(key), key, stats, contents, recording)


def _replayed(path: Path, key: dict) -> bool:
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("key") != key or not _unchanged(stamp):
        return False
    sys.stderr.write(stamp["stderr"])
    sys.stdout.write(stamp["stdout"])
    return True


def _write(path: Path, key: dict, stats: dict, contents: dict, recording: Recording) -> None:
    from npubuild.atomic import write_json

    try:
        write_json(path, {"key": key, "stats": stats, "contents": contents,
                          "stdout": recording.out.copy.getvalue(),
                          "stderr": recording.err.copy.getvalue()})
    except OSError:  # a folder that takes no stamp only loses the speed-up
        pass


def _stat_or_none(path) -> list | None:
    try:
        return stat_key(os.stat(path))
    except OSError:
        return None


def _unchanged(stamp: dict) -> bool:
    """Every stat key as stamped; or, for a file whose content the stamp holds too (the recipe,
    its chip file, the settings files: `_contents`), the same content. A recipe saved or checked
    out unchanged (a new mtime and ctime, the same bytes) replays, as doit finds a touched
    file_dep current by its hash; any other changed key takes the ordinary path."""
    contents = stamp.get("contents") or {}
    return all(_stat_or_none(path) == want or _same_content(path, contents.get(path))
               for path, want in stamp.get("stats", {}).items())


def _same_content(path: str, digest: str | None) -> bool:
    if not isinstance(digest, str):
        return False
    try:
        return sha256_file(Path(path)) == digest
    except (OSError, UserError):  # gone, or no longer a regular file
        return False


def _contents(loaded) -> dict[str, str]:
    """The sha256 of the small files a user edits by hand and an editor or a checkout may
    rewrite unchanged: the recipe, its chip file and the settings files there are."""
    from npubuild.targets import chip_file

    paths = [loaded.path, chip_file(loaded.recipe.target, loaded.base_dir),
             *(p for p in _settings_candidates(loaded) if p.is_file())]
    return {str(Path(p)): sha256_file(Path(p)) for p in paths}


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
        _write(stamp_path(self.args, key), key, stats, _contents(loaded), self)


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
    from npubuild.engine.code import running_code_files
    from npubuild.engine.keys import read_manifest
    from npubuild.stages import PIPELINE
    from npubuild.targets import chip_file

    toolchain = _toolchain_files(loaded)
    if toolchain is None:
        return None
    paths = [*running_code_files(), loaded.path,
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
    return {path: _stat_or_none(path) for path in dict.fromkeys(str(Path(p)) for p in paths)}


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
