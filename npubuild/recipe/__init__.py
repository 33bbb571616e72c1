"""Recipes: load a YAML file into a validated `Recipe`, check the files it names."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from npubuild.errors import Location, UserError
from npubuild.recipe import paths
from npubuild.recipe.load import Marked, dotted, fill_input_names, read_yaml, validate

MODEL_SUFFIXES = paths.MODEL_SUFFIXES


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from, for paths and error locations."""

    recipe: "Recipe"  # noqa: F821 — imported lazily below
    path: Path
    marked: Marked
    overrides: dict[str, Any] = field(default_factory=dict)  # -S fields set on the recipe file
    _chip: Any = field(default=None, repr=False, compare=False)  # `chip`, read once

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def location(self, *field_path: str | int, key: bool = False) -> Location:
        return self.marked.location(tuple(field_path), key=key)

    def error(self, message: str, *field_path: str | int, hint: str | None = None) -> UserError:
        return UserError(message, location=self.location(*field_path),
                         field=dotted(tuple(field_path)) or None, hint=hint)

    @contextmanager
    def relocated(self, *field_path: str | int) -> Iterator[None]:
        """Move a model or data file's error to the recipe line that brought the file in:
        ``recipe.yaml:12:11: verify.data: img.png: cannot read ...``, the file named as the
        recipe would name it (`spelled`: relative, or ``pkg:``) (errors already located in a
        YAML file, e.g. a chip file, keep their place)."""
        try:
            yield
        except UserError as exc:
            if exc.location is not None and exc.location.line is not None:
                raise
            message = exc.message
            if exc.location is not None:  # the file as the recipe names it, never site-packages
                file = self.spelled(Path(exc.location.file))
                message = f"{file}: " + message.replace(exc.location.file, file)
            path = _field_path(exc.field) if exc.field else field_path
            raise UserError(message, location=self.location(*path),
                            field=exc.field or dotted(field_path) or None, hint=exc.hint) from None

    def located(self, items: Iterator, *field_path: str | int) -> Iterator:
        """``items`` (e.g. data samples) under `relocated`."""
        with self.relocated(*field_path):
            yield from items

    def resolve(self, spec: str, *field_path: str | int) -> Path:
        try:
            return paths.resolve(spec, self.base_dir)
        except UserError as exc:
            raise self.error(exc.message, *field_path, hint=exc.hint) from None

    def resolve_glob(self, specs: str | list[str], *field_path: str | int) -> list[Path]:
        """The files a data spec matches, globbed once per run (every stage key of a no-op
        run asks again)."""
        memo = self.__dict__.setdefault("_globbed", {})
        key = (specs if isinstance(specs, str) else tuple(specs), field_path)
        if key not in memo:
            try:
                memo[key] = paths.resolve_glob(specs, self.base_dir)
            except UserError as exc:
                raise self.error(exc.message, *field_path, hint=exc.hint) from None
        return list(memo[key])

    @cached_property
    def dumped(self) -> dict:
        """The recipe as JSON data (what stage keys hash, section by section)."""
        return self.recipe.model_dump(mode="json")

    def spelled(self, path: Path) -> str:
        """A file this recipe reads, named as on any machine (`paths.spelled`)."""
        return paths.spelled(path, self.base_dir)

    @cached_property
    def model_path(self) -> Path:
        """The model's file or folder; a member of a zip archive is copied out to a file
        (`paths.archive_member`)."""
        path = self.resolve(self.recipe.model.path, "model", "path")
        try:
            return paths.archive_member(self.recipe.model.path, path) or path
        except UserError as exc:
            raise self.error(exc.message, "model", "path", hint=exc.hint) from None

    @property
    def model_format(self) -> str:
        spec = self.recipe.model
        if spec.format != "keras":  # a Keras 3 file is a zip archive, whatever its name
            self._not_an_archive()
        if spec.format:
            return spec.format
        path = self.model_path
        if path.is_dir():
            return "saved_model"
        fmt = MODEL_SUFFIXES.get(path.suffix.lower())
        if fmt is None:
            raise self.error(f"cannot tell the model format from {path.name!r}", "model", "path",
                             hint="set model.format to one of onnx, tf_frozen, saved_model, keras, tflite")
        return fmt

    @cached_property
    def _archive_models(self) -> list[str] | None:
        """The model files inside the model's path when that is an archive (`paths.is_archive`:
        a zip or tar file not named like a model), else None."""
        path = self.model_path
        return paths.archive_models(path) if paths.is_archive(path) else None

    def _not_an_archive(self) -> None:
        models = self._archive_models
        if models is None:
            return
        raise self.error(f"{self.model_path.name!r} is an archive, not a model", "model", "path",
                         hint=(f"name the model inside it as a path through the archive: "
                               f"{self.recipe.model.path}/{models[-1]}"
                               + (f" (its model files: {', '.join(models)})"
                                  if len(models) > 1 else "")
                               if models else "it holds no .onnx, .pb, .keras, .h5, .hdf5 or "
                               ".tflite file"))

    def for_target(self, target: str) -> "LoadedRecipe":
        """This recipe built for another chip: build/<name>@<chip>/ (a matrix build's cell)."""
        return self.variant({"target": target}, apart=True)

    def with_(self, overrides: dict[str, Any], *, check_files: bool = True) -> "LoadedRecipe":
        """This recipe with fields set by dotted path (`npubuild.recipe.overrides`), validated
        as the file is: a bad value is a UserError at the recipe's line for that field, naming
        the override."""
        from npubuild.recipe import overrides as ov
        from npubuild.recipe.model import recipe_model_for

        if not overrides:
            return self
        merged = {**self.overrides, **overrides}
        marked = ov.apply(self.marked, overrides)
        try:
            loaded = LoadedRecipe(validate(fill_input_names(marked), recipe_model_for(marked.data)),
                                  self.path, marked, merged)
            if check_files:
                check_recipe_files(loaded)
        except UserError as exc:
            raise ov.located(exc, overrides) from None
        return loaded

    def variant(self, overrides: dict[str, Any], *, apart: bool = False) -> "LoadedRecipe":
        """`with_` built apart: the name (so the build directory) becomes
        ``<name>@<label>`` (`npubuild.recipe.overrides.variant_label`); overrides that leave the
        recipe as it is give the recipe itself, unless ``apart`` (every cell of a matrix has
        its own directory)."""
        from npubuild.recipe.overrides import variant_label

        changed = self.with_(overrides)
        if not overrides or (changed.recipe == self.recipe and not apart):
            return self
        label = variant_label(changed.overrides)
        base = self.recipe.name.split("@", 1)[0]
        recipe = changed.recipe.model_copy(update={"name": f"{base}@{label}"})
        return LoadedRecipe(recipe, changed.path, changed.marked, changed.overrides)

    def chip(self):
        """The recipe's target chip, read once for this loaded recipe (a run, its stage keys
        and `validate` each ask for it)."""
        from npubuild.targets import load_chip

        if self._chip is None:
            try:
                self._chip = load_chip(self.recipe.target, self.base_dir)
            except UserError as exc:
                if exc.location is not None:  # the chip file itself is bad
                    raise
                raise self.error(exc.message, "target", hint=exc.hint) from None
        return self._chip


def _field_path(dotted_field: str) -> tuple[str | int, ...]:
    """``model.inputs[0].shape`` -> ("model", "inputs", 0, "shape")."""
    parts: list[str | int] = []
    for piece in dotted_field.replace("]", "").split("."):
        name, *indices = piece.split("[")
        parts += ([name] if name else []) + [int(i) for i in indices if i.isdigit()]
    return tuple(parts)


def load_recipe(path: str | Path, *, check_files: bool = True) -> LoadedRecipe:
    """Read, validate and (by default) check that the model file and the target exist."""
    from npubuild.recipe.model import recipe_model_for

    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe file not found: {path}",
                        hint="give the path to a recipe YAML, e.g. recipes/yolov8.yaml")
    marked = read_yaml(path)
    loaded = LoadedRecipe(validate(fill_input_names(marked), recipe_model_for(marked.data)), path,
                          marked)
    if check_files:
        check_recipe_files(loaded)
    return loaded


def check_recipe_files(loaded: LoadedRecipe) -> None:
    check_model_file(loaded)
    loaded.model_format  # noqa: B018 — raises when the format cannot be told
    loaded.chip()


def check_model_file(loaded: LoadedRecipe) -> Path:
    """The model's path, or the recipe's error (file:line:col of `model.path`) when it is missing."""
    model_path = loaded.model_path
    if not model_path.exists():
        raise loaded.error(f"model file not found: {loaded.spelled(model_path)}", "model", "path",
                           hint="paths are relative to the recipe file; pkg:<package>/<path> "
                                "names a file inside an installed package")
    if not (model_path.is_file() or model_path.is_dir()):  # a FIFO or /dev/zero never ends
        raise loaded.error(f"{loaded.spelled(model_path)} is not a regular file or a SavedModel folder",
                           "model", "path")
    return model_path
