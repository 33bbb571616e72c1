"""Matrix builds: one recipe against several chips, one comparison table.

Each chip gets its own build directory (``build/<name>@<chip>/``). The chip-independent
stages (import, surgery, fusion) are built once first; every cell then restores them from the
content cache, and the cells themselves run in parallel worker processes (``--jobs``) or as
Dask tasks (``--scheduler``), which exchange artifacts only through the content cache.
"""

from __future__ import annotations

from pathlib import Path

from npubuild.distributed import map_tasks
from npubuild.errors import NpubuildError
from npubuild.recipe import LoadedRecipe
from npubuild.stages import PIPELINE

COLUMNS = (  # (header, path in report.json)
    ("status", None), ("npu seg", ("split", "npu_segments")), ("cpu seg", ("split", "cpu_segments")),
    ("cosine", None), ("bit exact", ("simulator", "bit_exact")), ("cycles", ("estimate", "cycles")),
    ("fps", ("estimate", "fps")), ("GMEM bytes", ("estimate", "gmem_bytes")),
    ("no-group GMEM", ("estimate", "gmem_bytes_no_grouping")),
    ("LMEM peak", ("estimate", "lmem_peak_bytes")),
)


def shared_prefix(stage: str | None) -> str | None:
    """The last chip-independent stage at or before ``stage``."""
    last = None
    for s in PIPELINE:
        if s.uses_chip:
            break
        last = s.name
        if s.name == stage:
            break
    return last


def build_cell(recipe_path: str, target: str, stage: str | None, build_root, cache,
               remote: str | None = None) -> dict:
    """Build one chip's cell (in a worker process or a Dask worker); errors come back as data."""
    from npubuild import api
    from npubuild.recipe import load_recipe

    session = None
    try:  # the recipe too: it may have changed since the shared stages were built
        loaded = load_recipe(recipe_path).for_target(target)
        session = api.session_for(loaded, build_root=build_root, cache=cache, remote=remote)
        report = api.build(session, stage)
        return {"target": target, "ok": True, "report": report}
    except NpubuildError as exc:
        report = session.report(PIPELINE) if session is not None and session.results else {}
        return {"target": target, "ok": False, "error": str(exc), "exit_code": exc.exit_code,
                "report": report}


def build_matrix(loaded: LoadedRecipe, targets: list[str], stage: str | None, *,
                 build_root: Path | None, cache: Path | None, jobs: int = 1,
                 scheduler: str | None = None, remote: str | None = None) -> list[dict]:
    """Build the shared stages once, then one cell per chip (``scheduler``: on Dask)."""
    from npubuild import api

    prefix = shared_prefix(stage)
    if prefix:
        api.build(api.session_for(loaded.for_target(targets[0]), build_root=build_root,
                                  cache=cache, remote=remote), prefix)
    calls = [(str(loaded.path), t, stage, build_root, cache, remote) for t in targets]
    return map_tasks(build_cell, calls, scheduler=scheduler, jobs=jobs)


def table(cells: list[dict]) -> list[dict]:
    rows = []
    for cell in cells:
        report = cell.get("report") or {}
        row = {"target": cell["target"]}
        for header, path in COLUMNS:
            if header == "status":
                row[header] = "ok" if cell["ok"] else "failed"
            elif header == "cosine":
                outputs = (report.get("accuracy") or {}).get("outputs") or {}
                row[header] = min((m.get("cosine") for m in outputs.values()
                                   if m.get("cosine") is not None), default=None)
            else:
                value = report
                for part in path:
                    value = value.get(part) if isinstance(value, dict) else None
                row[header] = value
        rows.append(row)
    return rows
