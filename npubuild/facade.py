"""The public Python API: load a recipe, vary it, build it, read the result.

    import npubuild

    recipe = npubuild.load("recipes/yolov8.yaml")
    for method in ("minmax", "percentile", "kl"):
        result = recipe.with_(**{"quantization.calibration.method": method}).build()
        print(method, result.passed, result.cosine, result.fps, result.report_html)

`Recipe.with_` validates exactly as the recipe file is validated (an unknown key or a bad value
is a `npubuild.errors.UserError` naming the recipe's file and line), and a varied recipe builds
into its own directory, ``build/<name>@exp-<hash>/``, as ``npubuild run R -S FIELD=VALUE``
does. `Recipe.build` returns a `Result` also when verify fails (``result.passed`` is False,
``result.failures`` says why); a bad recipe or bad input raises. The command line is a thin
layer over this module and `npubuild.api`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from npubuild.errors import BuildError, NpubuildError


def load(path: str | Path, *, check_files: bool = True) -> "Recipe":
    """Read and validate a recipe file (and, by default, that its model file and chip exist)."""
    from npubuild.recipe import load_recipe

    return Recipe(load_recipe(path, check_files=check_files))


@dataclass(frozen=True)
class BuildOptions:
    """Where a build writes and what it reports to: ``build_dir`` (default ``./build``),
    ``cache`` (a folder, or a URL for the remote level), ``remote``, ``scheduler`` (Dask:
    ``tcp://host:port`` or ``local:N``), ``progress`` (called as ``progress(items, total=,
    description=)`` around every long loop: it must yield the items), ``on_event`` (called
    with each stage's `StageResult` as it starts and ends) and ``force`` (stages to run again,
    re-measuring, as ``npubuild run --force STAGE``)."""

    build_dir: str | Path | None = None
    cache: str | Path | None = None
    remote: str | None = None
    scheduler: str | None = None
    progress: Callable[..., Any] | None = None
    on_event: Callable[[Any], None] | None = None
    force: tuple[str, ...] = ()  # stage names, or "all": run again even when current or cached


class Recipe:
    """A validated recipe (or a variant of one), ready to plan, build and run."""

    def __init__(self, loaded):
        self.loaded = loaded

    @property
    def name(self) -> str:
        """The build directory's name: ``yolov8n``, or ``yolov8n@exp-1a2b3c4d`` for a variant."""
        return self.loaded.recipe.name

    @property
    def path(self) -> Path:
        return self.loaded.path

    @property
    def overrides(self) -> dict[str, Any]:
        """The fields set on the recipe file (`with_`), by dotted path."""
        return dict(self.loaded.overrides)

    @property
    def data(self) -> dict:
        """The resolved recipe (every default filled in) as plain data."""
        return self.loaded.recipe.model_dump(mode="json")

    def get(self, field_path: str) -> Any:
        """The value at a dotted field path: ``recipe.get("quantization.scheme")``."""
        from npubuild.recipe.overrides import get

        return get(self.data, field_path)

    def with_(self, **fields: Any) -> "Recipe":
        """This recipe with fields set by dotted path, validated as the file is, built apart:
        ``recipe.with_(**{"quantization.scheme": "symmetric"})``; a keyword spelled with double
        underscores names the same path (``quantization__scheme="symmetric"``)."""
        overrides = {key.replace("__", "."): value for key, value in fields.items()}
        return Recipe(self.loaded.variant(overrides))

    def session(self, options: BuildOptions | None = None, stage: str | None = None):
        """A `BuildSession` on this recipe (`npubuild.api.session_for`)."""
        from npubuild import api
        from npubuild.stages import no_progress

        o = options or BuildOptions()
        force = (o.force,) if isinstance(o.force, str) else o.force
        return api.session_for(self.loaded, build_root=_path(o.build_dir), cache=o.cache,
                               remote=o.remote, scheduler=o.scheduler,
                               progress=o.progress or no_progress,
                               on_event=o.on_event or (lambda result: None),
                               force=api.forced_stages(force, stage))

    def plan(self, stage: str | None = None, **options: Any) -> list:
        """What `build` would do per stage, and why (`StageResult` with ``status``: current,
        will restore, will run; ``reason``), building nothing."""
        from npubuild import api

        return api.plan(self.session(BuildOptions(**options), stage), stage)

    def build(self, stage: str | None = None, *, wait_seconds: float = 600.0,
              on_wait: Callable[[str], None] | None = None, **options: Any) -> "Result":
        """Build up to ``stage`` (default: every stage). Returns the `Result` when a stage or
        verify fails too (``passed`` False, ``error`` set); raises `UserError` for bad input.
        ``options`` are `BuildOptions`' fields; ``on_wait`` hears about another run holding
        the build directory (waited for up to ``wait_seconds``)."""
        from npubuild import api
        from npubuild.matrix import record_experiment

        session = self.session(BuildOptions(**options), stage)
        record_experiment(session)
        try:
            report = api.build(session, stage, wait_seconds=wait_seconds, on_wait=on_wait)
            error = None
        except BuildError as exc:
            from npubuild.engine.keys import read_manifest

            report, error = read_manifest(session.paths.report) or {}, exc
        return Result(self, session.paths.root, report, error, dict(session.results),
                      session.paths.report_html)

    def infer(self, inputs: dict[str, Any] | list[str], *, deployed: bool = True,
              **options: Any) -> dict[str, Any]:
        """Run the pipeline on ``inputs`` (arrays by input name, or files as `npubuild infer
        --input` takes them): NPU graphs in the simulator (``deployed``), or every submodel
        in float. Builds what it needs first."""
        from npubuild import api

        session = self.session(BuildOptions(**options))
        feeds = api.load_inputs(session, inputs) if isinstance(inputs, list) else inputs
        return api.infer(session, feeds, deployed=deployed)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.loaded.overrides.items())
        return f"<Recipe {self.name} from {self.path}" + (f" with {shown}" if shown else "") + ">"


@dataclass
class Result:
    """What a build left: report.json's content and the figures a reviewer reads first."""

    recipe: Recipe
    build_dir: Path
    report: dict
    error: NpubuildError | None = None
    stages: dict = field(default_factory=dict, repr=False)  # stage -> StageResult of this run
    html: Path | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        """True when every stage built and verify (when it ran) passed."""
        verify = self.report.get("verify") or {}
        return self.error is None and verify.get("passed", True) is not False

    @property
    def failures(self) -> list[str]:
        """Why verify failed (one line per threshold missed), or the stage error."""
        found = list((self.report.get("verify") or {}).get("failures") or [])
        return found or ([str(self.error)] if self.error else [])

    @property
    def fps(self) -> float | None:
        """Frames per second of the deployment: NPU cycles plus the CPU parts as timed on this
        machine (None when compile was restored from a cache and has CPU parts: `npu_fps`)."""
        from npubuild.report.speed import speed

        return speed(self.report.get("estimate")).deployed_fps

    @property
    def npu_fps(self) -> float | None:
        """Frames per second of the NPU alone (from the compiled program's cycles)."""
        from npubuild.report.speed import speed

        return speed(self.report.get("estimate")).npu_fps

    @property
    def figures(self) -> list:
        """Every verify figure with its threshold (`npubuild.report.judged.Figure`)."""
        from npubuild.report.judged import all_figures

        return all_figures(self.report, self.recipe.data.get("verify"))

    @property
    def cosine(self) -> float | None:
        """The worst cosine a threshold judges (worst sample), else the outputs' worst."""
        from npubuild.report.judged import worst_cosine

        worst = worst_cosine(self.figures)
        return worst.value if worst else None

    @property
    def gmem_bytes(self) -> int | None:
        return (self.report.get("estimate") or {}).get("gmem_bytes")

    @property
    def report_html(self) -> Path | None:
        """``build/<name>/report.html`` (None when no run wrote it)."""
        return self.html if self.html is not None and self.html.is_file() else None

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        fps = f", {self.fps:,.0f} fps" if self.fps else ""
        cosine = f", worst cosine {self.cosine:.6f}" if self.cosine is not None else ""
        return f"<Result {self.recipe.name}: {verdict}{cosine}{fps}>"


def build(recipe: Recipe | str | Path, stage: str | None = None, **options: Any) -> Result:
    """`Recipe.build` of a recipe or a recipe file."""
    return _recipe(recipe).build(stage, **options)


def plan(recipe: Recipe | str | Path, stage: str | None = None, **options: Any) -> list:
    """`Recipe.plan` of a recipe or a recipe file."""
    return _recipe(recipe).plan(stage, **options)


def infer(recipe: Recipe | str | Path, inputs, **options: Any) -> dict[str, Any]:
    """`Recipe.infer` of a recipe or a recipe file."""
    return _recipe(recipe).infer(inputs, **options)


def _recipe(recipe: Recipe | str | Path) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else load(recipe)


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)
