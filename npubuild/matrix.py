"""Matrix builds: one recipe, several variants (fields set with ``-S``, chips with ``--target``
or ``targets:``), one comparison table.

Each variant gets its own build directory (``build/<name>@<label>/``, `npubuild.recipe.overrides`)
and an ``experiment.json`` there (`BuildPaths.experiment`) saying which recipe and overrides it is (what `npubuild exp
show` lists). The stages no override touches are built once first; every cell then restores them
from the content cache, and the cells themselves run in parallel worker processes (``--jobs``)
or as Dask tasks (``--scheduler``), which exchange artifacts only through the content cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npubuild.distributed import map_tasks
from npubuild.errors import NpubuildError
from npubuild.recipe import LoadedRecipe
from npubuild.recipe.overrides import field_path
from npubuild.stages import PIPELINE

def chip_variants(targets: list[str]) -> list[dict[str, Any]]:
    """``--target A --target B`` (or ``targets: [A, B]``) as variants: one override each."""
    return [{"target": t} for t in targets]


def combine(*axes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The product of variant lists (chips × ``-S`` sets); an empty axis is left out."""
    out: list[dict[str, Any]] = [{}]
    for axis in axes:
        if axis:
            out = [{**a, **b} for a in out for b in axis]
    return [] if out == [{}] else out


def shared_prefix(stage: str | None, variants: list[dict[str, Any]] | None = None) -> str | None:
    """The last stage, at or before ``stage``, that every variant builds alike: no override
    falls in its sections or those before it, and no chip differs when it uses one (without
    ``variants``: the chip-independent prefix)."""
    keys = {k for v in variants or [{"target": None}] for k in v}
    touched = [field_path(k) for k in keys if k != "target"]
    last = None
    for s in PIPELINE:
        sections = [tuple(sec.split(".")) for sec in s.sections]
        hit = any(t[:len(sec)] == sec or sec[:len(t)] == t for t in touched for sec in sections)
        if hit or (s.uses_chip and "target" in keys):
            break
        last = s.name
        if s.name == stage:
            break
    return last


def build_cell(recipe_path: str, overrides: dict[str, Any] | str, stage: str | None, build_root,
               cache, remote: str | None = None) -> dict:
    """Build one variant (in a worker process or a Dask worker); errors come back as data.
    ``overrides`` as a chip's name is ``{"target": name}``."""
    from npubuild import api
    from npubuild.recipe import load_recipe

    overrides = {"target": overrides} if isinstance(overrides, str) else overrides
    cell = {"name": None, "target": overrides.get("target"), "overrides": overrides}
    session = None
    try:  # the recipe too: it may have changed since the shared stages were built
        loaded = load_recipe(recipe_path).variant(overrides, apart=True)
        session = api.session_for(loaded, build_root=build_root, cache=cache, remote=remote)
        record_experiment(session)
        cell.update(name=loaded.recipe.name, target=loaded.recipe.target,
                    build_dir=str(session.paths.root))
        return {**cell, "ok": True, "report": api.build(session, stage)}
    except NpubuildError as exc:
        report = session.report(PIPELINE) if session is not None and session.results else {}
        return {**cell, "ok": False, "error": str(exc), "exit_code": exc.exit_code,
                "report": report}


def record_experiment(session) -> Path | None:
    """``experiment.json`` in a variant's build directory: the recipe (as the build names it)
    and its overrides; nothing for the recipe itself."""
    from npubuild.atomic import write_json

    loaded = session.loaded
    if not loaded.overrides:
        return None
    session.paths.root.mkdir(parents=True, exist_ok=True)
    return write_json(session.paths.experiment, {
        "recipe": str(loaded.path), "base": loaded.recipe.name.split("@", 1)[0],
        "overrides": loaded.overrides})


def build_matrix(loaded: LoadedRecipe, variants: list[dict[str, Any] | str], stage: str | None, *,
                 build_root: Path | None, cache: Path | None, jobs: int = 1,
                 scheduler: str | None = None, remote: str | None = None) -> list[dict]:
    """Build the shared stages once, then one cell per variant (``scheduler``: on Dask); a
    variant given as a chip's name is ``{"target": name}``."""
    from npubuild import api

    variants = [{"target": v} if isinstance(v, str) else v for v in variants]
    prefix = shared_prefix(stage, variants)
    if prefix:
        api.build(api.session_for(loaded.variant(variants[0], apart=True), build_root=build_root,
                                  cache=cache, remote=remote), prefix)
    calls = [(str(loaded.path), v, stage, build_root, cache, remote) for v in variants]
    return map_tasks(build_cell, calls, scheduler=scheduler, jobs=jobs)
