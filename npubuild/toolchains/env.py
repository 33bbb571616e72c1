"""Find, describe and make a toolchain's environment.

An environment npubuild made holds ``npubuild-toolchain.json`` (the toolchain, the exact
versions of its identity packages, the install's seconds and size), written last: a folder
without it is a half-made environment and is made again. An environment the user points at
(``NPUBUILD_TOOLCHAIN_<NAME>``) is asked for its versions once per process.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from npubuild.errors import BuildError, UserError
from npubuild.toolchains import Toolchain

log = logging.getLogger("npubuild")

MARKER = "npubuild-toolchain.json"
ROOT_VARIABLE = "NPUBUILD_TOOLCHAINS"
PYTHON_VARIABLE = "NPUBUILD_PYTHON{major}{minor}"  # e.g. NPUBUILD_PYTHON310
VERSIONS_SCRIPT = ("import importlib.metadata as m, json, sys\n"
                   "out = {}\n"
                   "for name in sys.argv[1:]:\n"
                   "    try: out[name] = m.version(name)\n"
                   "    except m.PackageNotFoundError: out[name] = None\n"
                   "print(json.dumps(out))\n")


def root() -> Path:
    """Where npubuild keeps toolchain environments (a user cache, never a build dir)."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "npubuild" / "toolchains"


@dataclass(frozen=True)
class Env:
    """A toolchain's environment: its interpreter, bin folder and exact versions."""

    toolchain: Toolchain
    python: Path
    versions: dict[str, str | None]
    user_given: bool = False

    @property
    def bin(self) -> Path:
        return self.python.parent

    def identity(self) -> dict[str, str | None]:
        """What the stage keys include: the toolchain's name and exact versions."""
        return {"toolchain": self.toolchain.name, **self.versions}


def folder(toolchain: Toolchain) -> Path:
    return root() / toolchain.folder


def user_override(toolchain: Toolchain) -> Path | None:
    """The interpreter of the environment the user named, if any (a venv folder or python)."""
    value = os.environ.get(toolchain.override_variable)
    if not value:
        return None
    path = Path(value).expanduser()
    python = path / "bin" / "python" if path.is_dir() else path
    if not python.exists():
        raise UserError(f"{toolchain.override_variable}={value}: no Python interpreter there",
                        hint="name a virtual environment's folder or its bin/python")
    return python


def find(toolchain: Toolchain) -> Env | None:
    """The toolchain's environment if it exists (the user's, else npubuild's), else None."""
    python = user_override(toolchain)
    if python is not None:
        return Env(toolchain, python, _asked_versions(str(python), toolchain.identity), True)
    marker = folder(toolchain) / MARKER
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text(encoding="utf-8"))
    python = folder(toolchain) / "bin" / "python"
    return Env(toolchain, python, data["versions"]) if python.exists() else None


def describe(toolchain: Toolchain) -> dict:
    """One row of `npubuild toolchain list`."""
    env = find(toolchain)
    marker = folder(toolchain) / MARKER
    info = json.loads(marker.read_text()) if env and not env.user_given else {}
    return {"name": toolchain.name, "package": f"{toolchain.package}=={toolchain.version}",
            "python": toolchain.python, "installed": env is not None,
            "where": str(env.python.parent.parent if env else folder(toolchain)),
            "user_given": bool(env and env.user_given),
            "versions": env.versions if env else {},
            "size_bytes": info.get("size_bytes"), "install_seconds": info.get("seconds"),
            "expected_size": toolchain.size, "install": toolchain.install_command}


def require(toolchain: Toolchain, install: bool = True) -> Env:
    """The environment, installed first when missing (with progress in the log) unless
    ``install`` is false; a missing or broken one is one message naming the install command."""
    env = find(toolchain)
    if env is not None:
        return env
    if not install:
        raise BuildError(f"toolchain {toolchain.name} ({toolchain.package}=={toolchain.version}) "
                         f"is not installed", hint=f"run `{toolchain.install_command}`")
    log.warning("toolchain %s is not installed: installing it into %s (once; later builds "
                "reuse it)", toolchain.name, folder(toolchain))
    return install_env(toolchain, say=log.warning)


def install_env(toolchain: Toolchain, force: bool = False,
                say: Callable[..., None] = log.info) -> Env:
    """Make the environment from the package registries: venv, pip steps, fixes, marker.
    ``say`` gets one line per step (pip's own lines go to the log, shown with -v)."""
    from npubuild.toolchains import fixes

    target = folder(toolchain)
    if force or not (target / MARKER).is_file():
        shutil.rmtree(target, ignore_errors=True)
    elif (env := find(toolchain)) is not None:
        return env
    start = time.perf_counter()
    base = base_python(toolchain)
    target.parent.mkdir(parents=True, exist_ok=True)
    _step(toolchain, [str(base), "-m", "venv", str(target)], "create the environment")
    python = target / "bin" / "python"
    for i, step in enumerate(toolchain.steps, 1):
        say("toolchain %s: pip step %d of %d: pip install %s", toolchain.name, i,
            len(toolchain.steps), " ".join(step))
        _step(toolchain, [str(python), "-m", "pip", "install", "--progress-bar", "off",
                          "--disable-pip-version-check", *step], f"pip step {i}")
    for name in toolchain.post_install:
        getattr(fixes, name)(target)
    versions = _asked_versions(str(python), toolchain.identity)
    missing = [p for p, v in versions.items() if v is None and p == toolchain.package]
    if missing:
        raise BuildError(f"toolchain {toolchain.name}: {missing[0]} is not importable after the "
                         "install", hint=f"run `{toolchain.install_command} --force`")
    seconds = round(time.perf_counter() - start, 1)
    size = _size(target)
    (target / MARKER).write_text(json.dumps(
        {"toolchain": toolchain.name, "versions": versions, "seconds": seconds,
         "size_bytes": size, "python": str(base)}, indent=2), encoding="utf-8")
    say("toolchain %s installed in %.0f s (%.2f GB) at %s", toolchain.name, seconds,
        size / 1e9, target)
    return Env(toolchain, python, versions)


def _step(toolchain: Toolchain, command: list[str], what: str) -> None:
    """Run one install command, streaming its lines to the log (the user's progress)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=_install_environment())
    tail: list[str] = []
    for line in process.stdout:
        line = line.rstrip()
        if line and "is ignored: it is neither a file nor a directory" not in line:
            tail = (tail + [line])[-20:]
            if line.startswith(("Collecting", "Installing collected", "Successfully",
                                "Downloading", "ERROR")):
                log.info("toolchain %s: %s", toolchain.name, line.strip()[:160])
    if process.wait() != 0:
        errors = [line for line in tail if "ERROR" in line or "error" in line] or tail[-3:]
        raise BuildError(f"toolchain {toolchain.name}: {what} failed: {errors[-1] if errors else ''}",
                         hint=f"retry with `{toolchain.install_command} --force`; pip's last "
                              "lines: " + " | ".join(tail[-3:]))


def _install_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # npubuild's own tree must not leak into the vendor's env
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def base_python(toolchain: Toolchain) -> Path:
    """The interpreter that makes the venv: npubuild's own, or the version the toolchain
    needs, found on PATH, then among pyenv's versions, or named by ``NPUBUILD_PYTHON3XX``."""
    if toolchain.python == "current":
        return Path(sys.executable)
    major, minor = toolchain.python.split(".")
    if f"{sys.version_info.major}.{sys.version_info.minor}" == toolchain.python:
        return Path(sys.executable)
    variable = PYTHON_VARIABLE.format(major=major, minor=minor)
    candidates = [os.environ.get(variable), shutil.which(f"python{toolchain.python}")]
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/{toolchain.python}.*/bin/"
                                   f"python{toolchain.python}"), reverse=True)
    for candidate in candidates:
        if candidate and Path(candidate).exists() and _real_python(candidate, toolchain.python):
            return Path(candidate)
    raise UserError(f"toolchain {toolchain.name} needs Python {toolchain.python}, and none was "
                    "found (not on PATH as python" + toolchain.python + ", not among pyenv's "
                    "versions)", hint=f"install Python {toolchain.python} (e.g. `pyenv install "
                    f"{toolchain.python}`) or name one: {variable}=/path/to/python{toolchain.python}")


def _real_python(path: str, version: str) -> bool:
    try:
        out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


@cache
def _asked_versions(python: str, packages: tuple[str, ...]) -> dict[str, str | None]:
    env = _install_environment()
    try:
        out = subprocess.run([python, "-c", VERSIONS_SCRIPT, *packages], capture_output=True,
                             text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"cannot run {python}: {exc}") from None
    if out.returncode != 0:
        raise BuildError(f"{python} does not run: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath) / name
            if not full.is_symlink():
                total += full.stat().st_size
    return total
