"""The library operations under the public façade (`npubuild.facade`): sessions, build, plan, show,
clean, caches, diff inputs, infer. The CLI, `dodo.py` and the façade call them; nothing here
prints or exits."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from npubuild.engine.session import BuildSession, StageResult, stage_list
from npubuild.engine.keys import read_manifest
from npubuild.engine.remote import is_url
from npubuild.engine.lock import build_lock
from npubuild.errors import BuildError, Location, UserError
from npubuild.recipe import LoadedRecipe, load_recipe
from npubuild.stages import PIPELINE, no_progress


def session_for(recipe: str | Path | LoadedRecipe, *, build_root: Path | None = None,
                cache: str | Path | None = None, progress: Callable[..., Any] = no_progress,
                on_event: Callable[[StageResult], None] = lambda r: None,
                remote: str | None = None, scheduler: str | None = None,
                force: Iterable[str] = ()) -> BuildSession:
    """A build session; ``cache`` is a local folder or, as a URL (``s3://…``), the remote
    level behind the default local cache (``remote`` names the remote explicitly);
    ``scheduler`` fans calibration and verify batches out on Dask; ``force`` names stages to
    run again even when current or cached (`forced_stages`)."""
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    if is_url(cache):
        cache, remote = None, remote or str(cache)
    session = BuildSession(loaded, build_root, cache, progress, on_event, remote_url=remote,
                           scheduler=scheduler, force=frozenset(force))
    _ = session.settings, session.trust  # bad settings or keys: a user error before doit runs
    return session


def build(session: BuildSession, stage: str | None = None, *, wait_seconds: float = 600.0,
          on_wait: Callable[[str], None] | None = None) -> dict:
    """Build up to ``stage`` (default: the whole pipeline); returns report.json's content.

    Raises the first stage error after writing the report, so callers map it to an exit code.
    """
    from npubuild.distributed import one_cluster
    from npubuild.engine.tasks import run_with_doit

    stages = stage_list(stage)
    for each in stages:  # a missing model or data file is a recipe error; doit would trace it
        each.external_files(session.loaded)
    with build_lock(session.paths.lock_file, wait_seconds=wait_seconds, on_wait=on_wait,
                    location=Location(str(session.loaded.path))), \
            one_cluster(session.scheduler):  # calibration and verify share the workers
        claim_build_dir(session)
        session.clear_orphans()
        code = run_with_doit(session, stages)
        try:
            report = session.finish(stages)
        except OSError:  # the report and lock cannot be written (a full disk): the stage's
            if session.error is None:  # own error, when there is one, says more
                raise
            report = {}
    if session.error is not None:
        raise session.error
    if code != 0:  # doit failed outside any stage: never report that as a success
        raise BuildError(f"doit stopped the build (exit code {code}); see the messages above")
    verdict = report.get("verify") if "verify" in {s.name for s in stages} else None
    if verdict and not verdict.get("passed", True):
        raise BuildError("; ".join(verdict.get("failures", [])), stage="verify",
                         hint=_bisection_hint(verdict.get("bisection"),
                                              verdict.get("unseen_values"),
                                              verdict.get("task_reading"), verdict.get("task")))
    return report


def claim_build_dir(session: BuildSession) -> None:
    """The build directory belongs to this recipe file, or another file with the same
    ``name:`` owns it and the command stops (`npubuild.engine.owner`)."""
    from npubuild.engine.owner import claim, shown

    loaded = session.loaded
    owner = claim(session.paths.root, session.paths.owner, loaded.path)
    if owner is not None:
        raise loaded.error(
            f"{session.paths.root}/ belongs to {shown(owner)}, which has the same name; "
            f"this recipe would overwrite its artifacts and report", "name",
            hint=f"give one of the two recipes another `name:`, or build {shown(loaded.path)} "
                 "elsewhere (--build-dir DIR)")


def _bisection_hint(bisection: dict | None, unseen: list[dict] | None = None,
                    reading: dict | None = None, task: dict | None = None) -> str:
    """What the failed verdict's report says to do, measured: the task the outputs look like
    judged on the same samples (`npubuild.verify.readings`), values calibration never saw,
    then the bisection's finding; with none of them, a task that judged nothing says what its
    data lack."""
    from npubuild.verify import readings
    from npubuild.verify.coverage import note

    first = note(unseen or [])
    finding = (bisection or {}).get("finding")
    if not finding:
        rest = first or (task or {}).get("note") or "see report.html for per-stage figures"
    else:
        figure = (f"largest error {1 - finding['cosine']:.1%} of its calibrated range"
                  if finding.get("measure") == "range" else f"cosine {finding['cosine']:.4f}")
        drop = (f"the drop starts in stage `{finding['stage']}` at tensor {finding['tensor']!r} "
                f"({figure}), introduced by {finding['introduced_by']}; {finding['suggestion']}")
        rest = f"{first}; then {drop}" if first else drop
    if not reading:
        return rest
    return readings.text(reading) + ("; otherwise " if reading["passed"] else "; ") + rest


ALL_STAGES = "all"


def forced_stages(names: Iterable[str], last: str | None = None) -> frozenset[str]:
    """``--force`` as stage names: ``all`` is every stage up to ``last`` (as `dvc repro -f`);
    an unknown name is a user error with "did you mean"."""
    from npubuild.errors import did_you_mean
    from npubuild.stages import STAGES

    out: set[str] = set()
    for name in names:
        if name == ALL_STAGES:
            out |= {s.name for s in stage_list(last)}
        elif name in STAGES:
            out.add(name)
        else:
            raise UserError(f"--force {name}: no such stage{did_you_mean(name, STAGES)}",
                            hint=f"stages: {', '.join(STAGES)}; --force alone forces them all")
    return frozenset(out)


def plan(session: BuildSession, stage: str | None = None) -> list[StageResult]:
    return session.plan(stage_list(stage))


def show(session: BuildSession) -> dict:
    """Per stage: state (current / stale / absent), its artifacts (with ``stale``: why they
    are not this recipe's), and the last report."""
    from npubuild.engine.staleness import why_not_current

    planned = {r.stage: r for r in session.plan(PIPELINE)}
    report = read_manifest(session.paths.report) or {}
    stages = {}
    for stage in PIPELINE:
        manifest = read_manifest(session.paths.manifest(stage.name))
        result = planned[stage.name]
        entry = {"state": result.status, "reason": result.reason,
                 "current": result.status == "current"}
        if manifest:
            entry["files"] = {rel: info["bytes"] for rel, info in manifest["files"].items()}
            entry["seconds"] = (report.get("stages", {}).get(stage.name) or {}).get("seconds")
            if not entry["current"]:  # the folder holds another build's artifacts
                entry["stale"] = why_not_current(session, stage, result)
        stages[stage.name] = entry
    return {"recipe": str(session.loaded.path), "build_dir": str(session.paths.root),
            "stages": stages, "report": report}


def clean(session: BuildSession) -> Path:
    """Delete the recipe's build directory (the shared cache is kept)."""
    with build_lock(session.paths.lock_file, wait_seconds=0,
                    location=Location(str(session.loaded.path))):
        claim_build_dir(session)  # never delete another recipe's build
        root = session.paths.root
        for child in root.iterdir() if root.exists() else []:
            if child.name != ".lock":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    shutil.rmtree(session.paths.root, ignore_errors=True)
    return session.paths.root


def cache_check(cache: Path | None = None) -> list:
    """Every entry of the content cache re-hashed, and its orphans (`npubuild cache verify`);
    without ``--cache`` or ``$NPUBUILD_CACHE``, the cache the settings above the current
    folder name (`npubuild.engine.settings`)."""
    from npubuild.engine.cache import Cache
    from npubuild.engine.paths import cache_dir
    from npubuild.engine.settings import find_settings

    return list(Cache(cache_dir(cache, find_settings(Path.cwd()).cache)).check_all())


def cache_gc(cache: Path | None = None) -> list:
    """Remove orphans (``.tmp-*`` of killed runs) and entries that fail their check
    (`npubuild cache gc`); returns every check, the removed ones being those with a problem."""
    from npubuild.engine.cache import remove

    checks = cache_check(cache)
    for item in checks:
        if item.problem:
            remove(item.path)
    return checks


@contextmanager
def recipe_at_revision(recipe: Path, rev: str) -> Iterator[Path]:
    """The recipe as git revision ``rev`` has it, as a temporary file beside the recipe (so its
    relative paths resolve the same); removed afterwards."""
    recipe = Path(recipe)
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=recipe.parent or ".",
                         capture_output=True, text=True)
    if top.returncode:
        raise UserError(f"{recipe} is not in a git work tree: {top.stderr.strip()}")
    rel = recipe.resolve().relative_to(Path(top.stdout.strip()).resolve())
    shown = subprocess.run(["git", "show", f"{rev}:{rel.as_posix()}"], cwd=top.stdout.strip(),
                           capture_output=True, text=True)
    if shown.returncode:
        raise UserError(f"git cannot show {rel} at {rev}: {shown.stderr.strip()}")
    fd, tmp = tempfile.mkstemp(prefix=f".{recipe.stem}@", suffix=".yaml", dir=recipe.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(shown.stdout)
    try:
        yield Path(tmp)
    finally:
        os.unlink(tmp)


def diff_inputs(recipes: list[Path], revs: list[str], stack) -> tuple[list[Path], tuple[str, str]]:
    """The two recipe files `npubuild diff` compares, and their labels: ``A.yaml B.yaml``, or one
    recipe: HEAD vs the working copy (as `git diff`), ``--rev REV`` vs the working copy,
    ``--rev A..B`` or ``--rev A --rev B`` (git revisions, checked out into temporary files that
    ``stack`` removes)."""
    revs = [part for rev in revs for part in _rev_range(rev)]
    if not revs and len(recipes) == 1:
        revs = ["HEAD"]
    if not revs:
        if len(recipes) != 2:
            raise UserError("give two recipes (A.yaml B.yaml), or one recipe (HEAD vs the working "
                            "copy, or --rev A..B)")
        return list(recipes), (str(recipes[0]), str(recipes[1]))
    if len(recipes) != 1 or len(revs) > 2:
        raise UserError("with --rev give one recipe and a revision (REV, A..B, or --rev twice)")
    recipe = recipes[0]
    paths = [stack.enter_context(recipe_at_revision(recipe, r)) for r in revs]
    labels = [f"{recipe}@{r}" for r in revs]
    if len(revs) == 1:
        paths.append(recipe)
        labels.append(f"{recipe} (working copy)")
    return paths, (labels[0], labels[1])


def _rev_range(rev: str) -> list[str]:
    if ".." not in rev:
        return [rev]
    first, _, second = rev.partition("..")
    if not first or not second or second.startswith("."):
        raise UserError(f"--rev {rev}: give a range as A..B (two revisions)")
    return [first, second]


VIEWABLE = {"import": "model.onnx", "surgery": "model.onnx", "fusion": "model.onnx",
            "split": "graph_{graph}.onnx", "quantize": "graph_{graph}.qdq.onnx"}


def model_file(session: BuildSession, stage: str = "fusion", graph: int | None = None) -> Path:
    """The ONNX model a stage wrote (a submodel for `split`, its QDQ model for `quantize`),
    built (or restored from the cache) first."""
    if stage not in VIEWABLE:
        raise UserError(f"stage {stage!r} writes no ONNX model to view",
                        hint=f"choose one of {', '.join(VIEWABLE)}")
    build(session, stage)
    directory = session.paths.stage_dir(stage)
    if "{graph}" not in VIEWABLE[stage]:
        return directory / VIEWABLE[stage]
    found = sorted(directory.glob(VIEWABLE[stage].format(graph="*")))
    if graph is None and found:
        return found[0]
    path = directory / VIEWABLE[stage].format(graph=graph)
    if not path.is_file():
        raise UserError(f"{stage} wrote no {path.name}",
                        hint="its models: " + (", ".join(p.name for p in found) or "none"))
    return path


def placements(session: BuildSession) -> list:
    """Per node of the fused model: NPU or CPU on the recipe's chip, and why (builds up to
    `fusion` first, from the cache when it can)."""
    from npubuild import onnx_io
    from npubuild.split import check_placement

    build(session, "fusion")
    model = onnx_io.load_model(session.paths.stage_dir("fusion") / "model.onnx")
    return check_placement(model, session.chip, session.loaded.recipe.split)


def load_inputs(session: BuildSession, files: list[str]) -> dict:
    """Model inputs from files: images (preprocessed as the recipe says), .npz (arrays by input
    name) or .npy; ``NAME=FILE`` gives a .npy to a named input. Builds up to `split` first."""
    import numpy as np

    from npubuild.quant import data, onnx_inputs
    from npubuild.quant.pipeline import SplitPipeline

    build(session, "split")
    pipeline = SplitPipeline(session.paths.stage_dir("split"))
    infos = onnx_inputs.input_infos(pipeline, session.loaded.recipe.model.inputs,
                                    session.paths.stage_dir("import"))
    renamed = {old: new for new, old in pipeline.source_names.items()}  # the recipe's name too
    feeds: dict[str, Any] = {}
    for item in files:
        name, _, file = item.rpartition("=")
        if name:
            try:
                feeds[renamed.get(name, name)] = np.load(file, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise UserError(f"cannot read {file}: {exc}", hint="give a .npy file") from None
        else:
            feeds.update(next(iter(data.load_samples([Path(file)], infos, 1))))
    return feeds


def infer(session: BuildSession, inputs: dict[str, Any], *, deployed: bool = True) -> dict:
    """Run the pipeline on ``inputs`` (by input name): deployed = NPU submodels in the simulator
    (builds up to `compile`), else every submodel in float ONNX Runtime (up to `split`).
    Writes its own report, build/<name>/infer.json; report.json keeps every current stage."""
    from npubuild.runtime import Runner

    from npubuild.atomic import write_json

    build(session, "compile" if deployed else "split")
    backends = None
    if deployed:
        from npubuild.backends import npu_runner

        backends = {"npu": npu_runner(session.paths.stage_dir("compile"))}
    outputs = Runner(session.paths.stage_dir("split"), backends=backends).run(inputs)
    write_json(session.paths.infer_report, {
        "pipeline": "deployed (NPU graphs in the simulator)" if deployed else "float",
        "inputs": array_summary(inputs), "outputs": array_summary(outputs)})
    return outputs


def array_summary(arrays: dict[str, Any]) -> dict[str, dict]:
    """Per array: shape, dtype, min, max, mean (what `infer` reports)."""
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype), "min": float(v.min()),
                "max": float(v.max()), "mean": float(v.mean())} for k, v in arrays.items()}
