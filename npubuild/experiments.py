"""`npubuild exp show R`: the variants of a recipe that were built, one row each — their
parameters (the overridden fields, one column per field, the recipe's own value on its row),
whether the build is still current, the verdict, the worst cosine, fps and GMEM — as
`dvc exp show` tabulates experiments. Also the table a matrix `npubuild run` ends with.

A variant is a build directory ``build/<name>@<label>/`` holding ``experiment.json``
(`npubuild.matrix.record_experiment`); the recipe's own build is ``build/<name>/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npubuild.engine.paths import BuildPaths
from npubuild.recipe import LoadedRecipe
from npubuild.recipe.overrides import get
from npubuild.report.judged import all_figures, worst_cosine
from npubuild.report.speed import speed

FIGURES = ("state", "verdict", "worst cosine", "fps", "NPU fps", "GMEM bytes", "seg NPU/CPU")


def built_variants(loaded: LoadedRecipe, build_root: Path | None) -> list[dict]:
    """The recipe's own build and every variant built from it under ``build_root``:
    ``{"name", "overrides", "build_dir"}``, the recipe first, then by name."""
    base = BuildPaths.for_recipe(loaded.recipe.name, build_root)
    found = [{"name": loaded.recipe.name, "overrides": {}, "build_dir": base.root}]
    for path in sorted(base.root.parent.glob(f"{loaded.recipe.name}@*/experiment.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("base") == loaded.recipe.name:
            found.append({"name": path.parent.name, "overrides": info.get("overrides") or {},
                          "build_dir": path.parent})
    return found


def state_of(loaded: LoadedRecipe, overrides: dict, session_for) -> str:
    """``current`` when every stage of the variant, as the recipe reads now, is built and
    current; ``stale: <stages> would rebuild``; ``invalid now: …`` when its overrides no longer
    validate against the recipe; ``not built``."""
    from npubuild.errors import NpubuildError

    from npubuild.stages import PIPELINE

    try:
        plan = session_for(loaded.variant(overrides, apart=True)).plan(PIPELINE)
    except NpubuildError as exc:
        return f"invalid now: {exc.message}"
    stale = [r for r in plan if r.status != "current"]
    if not stale:
        return "current"
    return f"stale: {', '.join(r.stage for r in stale)} ({stale[0].reason or stale[0].status})"


def row(name: str, overrides: dict, report: dict, base_data: dict, keys: list[str],
        state: str | None = None, verify_spec: dict | None = None) -> dict:
    """One table row: the variant, its parameters, and its figures from report.json."""
    out: dict[str, Any] = {"variant": name}
    for key in keys:
        out[key] = overrides[key] if key in overrides else get(base_data, key)
    verify = report.get("verify") or {}
    fps = speed(report.get("estimate"))
    split = report.get("split") or {}
    worst = worst_cosine(all_figures(report, verify_spec))
    out.update({
        "state": state,
        "verdict": None if verify.get("passed") is None else "pass" if verify["passed"] else "fail",
        "worst cosine": worst.value if worst else None,
        "fps": fps.deployed_fps, "NPU fps": fps.npu_fps,
        "GMEM bytes": (report.get("estimate") or {}).get("gmem_bytes"),
        "seg NPU/CPU": (f"{split['npu_segments']}/{split['cpu_segments']}"
                        if "npu_segments" in split else None)})
    return out


def parameter_keys(variants: list[dict]) -> list[str]:
    """Every overridden field, in order of first appearance."""
    return list(dict.fromkeys(k for v in variants for k in v["overrides"]))


def show(loaded: LoadedRecipe, build_root: Path | None, session_for) -> list[dict]:
    """The rows of `npubuild exp show`: every built variant (the recipe's own build when it
    has one), state checked against the recipe as it reads now."""
    from npubuild.engine.keys import read_manifest

    variants = [v for v in built_variants(loaded, build_root)
                if v["overrides"] or (v["build_dir"] / "report.json").is_file()]
    keys = parameter_keys(variants)
    data = loaded.recipe.model_dump(mode="json")
    rows = []
    for v in variants:
        lock = read_manifest(v["build_dir"] / "recipe.lock") or {}
        rows.append(row(v["name"], v["overrides"], read_manifest(v["build_dir"] / "report.json") or {},
                        data, keys, state_of(loaded, v["overrides"], session_for),
                        (lock.get("resolved") or {}).get("verify")))
    return rows
