"""What `npubuild validate` (and so the pre-commit hook) checks before any stage runs: what
`run` would refuse minutes later, as far as it can be known cheaply.

- the recipe, its chip, and the model file (`npubuild.stages.importer.check_signature`:
  ONNX's checker, input and output names, the input shapes against the model, every tensor's
  size), without TensorFlow for ONNX and TFLite models;
- every file a stage reads (the model, proof files, calibration and verify data: paths and
  globs match regular, readable files; calibration data is there, since every chip quantizes);
- quantization options the chip cannot honour (an int16 override or ``auto`` precision on a
  chip without int16: errors, as in `run`; ``int16_where_underflows`` there: a warning, since
  `run` ignores it);
- the names the recipe gives nodes and tensors (``split.force_cpu``/``force_npu``/
  ``placement``, ``quantization.overrides``, ``verify.slices``) against the imported graph,
  followed through the recipe's ``rename_tensors`` steps, with a "did you mean". A name found
  nowhere while other surgery steps or fusion rules may still make it is not an error: it is
  listed as not checked, as is everything about the graph of a TensorFlow model (converted
  only at import).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from npubuild.errors import UserError, did_you_mean
from npubuild.recipe import LoadedRecipe
from npubuild.recipe.load import dotted


@dataclass
class Validation:
    """A valid recipe's findings: what the model is, warnings, and what was not checked."""

    signature: object  # npubuild.model_facts.ModelFacts
    warnings: list[UserError] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)


def validate(loaded: LoadedRecipe) -> Validation:
    """Every check `run` would make before its first stage (see the module docstring); the
    first problem raises its located `UserError`."""
    from npubuild.model_facts import model_facts
    from npubuild.stages import PIPELINE

    chip = loaded.chip()
    result = Validation(model_facts(loaded))
    for stage in PIPELINE:  # as `run` does first: missing model, proof and data files
        stage.external_files(loaded)
    found = data_files(loaded)
    for where, paths in found:
        check_readable(loaded, paths, where)
    check_quantization(loaded, chip, result)
    graph = result.signature
    if graph.graph_inputs is not None:
        check_image_data(loaded, graph, result, found)
        check_names(loaded, GraphNames.of(graph, loaded.recipe), result)
    elif names_given(loaded.recipe):
        result.not_checked.append("node and tensor names (split, quantization.overrides, "
                                  "verify.slices): the model is converted to ONNX at import")
    return result


def data_files(loaded: LoadedRecipe) -> list[tuple[tuple, list]]:
    """(recipe field, the files it names) for every file a build reads (`npubuild.stages.files`)."""
    from npubuild.stages import files

    spec = loaded.recipe
    out = [(("model", "path"), [loaded.model_path] if loaded.model_path.is_file() else [])]
    for index, entry in enumerate(spec.model.inputs):
        if entry.proof is not None and entry.proof.data:
            where = ("model", "inputs", index, "proof", "data")
            out.append((where, [loaded.resolve(entry.proof.data, *where)]))
    out.append((files.CALIBRATION_FIELD, files.calibration_files(loaded)))
    if spec.verify.data:
        out.append((("verify", "data"), files.verify_files(loaded)))
    return out


def check_readable(loaded: LoadedRecipe, paths: Iterable, where: tuple) -> None:
    """Each file is one this process may read (globs match regular files only)."""
    for path in paths:
        if not os.access(path, os.R_OK):
            raise loaded.error(f"{path} cannot be read (permission denied)", *where,
                               hint="make the file readable, or point the recipe elsewhere")


def check_image_data(loaded: LoadedRecipe, graph, result: Validation,
                     found: list[tuple[tuple, list]]) -> None:
    """Images given as calibration or verify data fit the input they feed (one input; its
    layout, channels and ``preprocess.resize``), as the data loader will check them.
    ``graph``: the model's `ModelFacts`."""
    from npubuild.model_inputs import RecipeInputs
    from npubuild.quant.data import InputInfo, check_images

    inputs, infos = RecipeInputs(loaded.recipe.model.inputs), []
    for name, shape, dtype in graph.graph_inputs:
        if name not in graph.inputs:
            continue  # a weight the skeleton lists as an input
        if not all(isinstance(d, int) and d > 0 for d in shape):
            result.not_checked.append(f"images against input {name!r}: its shape "
                                      f"{shape} is not fixed")
            return
        spec = inputs.spec(name)
        infos.append(InputInfo(name, tuple(shape), dtype,
                               getattr(spec, "layout", "any"), getattr(spec, "preprocess", None)))
    for where, paths in found:  # `data_files`
        if where[-1] == "data" and where[0] in ("quantization", "verify"):
            with loaded.relocated(*where):
                check_images(paths, infos)


def check_quantization(loaded: LoadedRecipe, chip, result: Validation) -> None:
    """int16 asked of a chip without it: an error where `run` refuses it, else a warning."""
    spec = loaded.recipe.quantization
    if chip.int16:
        return
    for index, override in enumerate(spec.overrides):
        if override.precision in ("int16", "w16a16"):
            article = "an" if override.precision == "int16" else "a"
            raise loaded.error(f"the target chip {chip.name} has no int16 support, so {article} "
                               f"{override.precision} override cannot be honoured",
                               "quantization", "overrides", index,
                               "precision", hint="use precision: float, or a chip with int16")
    if spec.auto is not None and spec.auto.precision in ("int16", "w16a16"):
        raise loaded.error(f"the target chip {chip.name} has no int16 support, so auto cannot "
                           f"keep tensors in {spec.auto.precision}", "quantization", "auto",
                           "precision",
                           hint="use precision: float, or a chip with int16")
    if spec.int16_where_underflows:
        result.warnings.append(loaded.error(
            f"the target chip {chip.name} has no int16 support: int16_where_underflows is "
            "ignored", "quantization", "int16_where_underflows",
            hint="remove it, or target a chip with int16"))


@dataclass(frozen=True)
class GraphNames:
    """The node names, op types and tensor names a recipe may refer to, as far as they are
    known before any stage runs: the imported graph's, renamed as the recipe's
    ``rename_tensors`` steps rename them; ``uncertain`` when other steps may add names."""

    nodes: frozenset[str]
    op_types: frozenset[str]
    tensors: frozenset[str]
    uncertain: str  # "" when every later name is known, else which recipe steps may add some
    renamed: dict = field(default_factory=dict)  # an imported name -> (its new name, the step)

    @classmethod
    def of(cls, graph, recipe) -> GraphNames:
        """From the model's `ModelFacts` and the recipe."""
        from npubuild.fusions import fused_op_name

        tensors = {name for name, _, _ in graph.graph_inputs} | {o for _, _, outputs in graph.nodes
                                                                 for o in outputs if o}
        others, renamed = [], {}
        for index, step in enumerate(recipe.surgery):
            name = next(iter(type(step).model_fields))
            if name != "rename_tensors":
                others.append(f"surgery[{index}] ({name})")
                continue
            renames = getattr(step, name).names
            renamed.update({old: (new, f"surgery[{index}]") for old, new in renames.items()
                            if old in tensors})
            tensors = {renames.get(t, t) for t in tensors}
        rules = [rule if isinstance(rule, str) else getattr(rule, "name", "") for rule in recipe.fusion]
        if rules:
            others.append("fusion (" + ", ".join(r for r in rules if r) + ")")
        op_types = {op for _, op, _ in graph.nodes} | {fused_op_name(r) for r in rules if r}
        return cls(frozenset(name for name, _, _ in graph.nodes if name), frozenset(op_types),
                   frozenset(tensors), ", ".join(others), renamed)


def names_given(recipe) -> bool:
    """Whether the recipe names any node or tensor `check_names` would look up."""
    split = recipe.split
    return bool(split.force_cpu or split.force_npu or split.placement
                or recipe.quantization.overrides or recipe.verify.slices)


def check_names(loaded: LoadedRecipe, names: GraphNames, result: Validation) -> None:
    """split's selectors, quantization overrides and verify slices name something."""
    split = loaded.recipe.split
    selectable = names.nodes | names.op_types | names.tensors
    for field_name in ("force_cpu", "force_npu"):
        for index, pattern in enumerate(getattr(split, field_name)):
            _known(loaded, result, names, pattern, selectable,
                   "node name, op type or output tensor", ("split", field_name, index))
    for pattern in split.placement:
        _known(loaded, result, names, pattern, selectable,
               "node name, op type or output tensor", ("split", "placement", pattern))
    for index, override in enumerate(loaded.recipe.quantization.overrides):
        for j, name in enumerate(override.nodes):
            _known(loaded, result, names, name, names.nodes, "node",
                   ("quantization", "overrides", index, "nodes", j))
        for j, name in enumerate(override.tensors):
            _known(loaded, result, names, name, names.tensors, "tensor",
                   ("quantization", "overrides", index, "tensors", j))
    for index, check in enumerate(loaded.recipe.verify.slices):
        _known(loaded, result, names, check.tensor, names.tensors, "tensor",
               ("verify", "slices", index, "tensor"))


def _known(loaded: LoadedRecipe, result: Validation, names: GraphNames, pattern: str,
           known: frozenset[str], kind: str, where: tuple) -> None:
    """``pattern`` (a name or a glob) matches one of ``known``; else an error with the name
    surgery renamed it to or the closest name, or, when later steps may still make it, a note
    that it was not checked."""
    if any(ch in pattern for ch in "*?["):
        if any(fnmatch.fnmatchcase(name, pattern) for name in known):
            return
    elif pattern in known:
        return
    if pattern in names.renamed:
        new, step = names.renamed[pattern]
        raise loaded.error(f"{step} (rename_tensors) renames {pattern!r} to {new!r}; later "
                           "stages know it by its new name", *where, hint=f"write {new!r}")
    if names.uncertain:
        result.not_checked.append(f"{dotted(where)}: {pattern[:200]!r} is not in the imported "
                                  f"model; {names.uncertain} may make it")
        return
    raise loaded.error(f"no {kind} is called {pattern[:200]!r} in the model"
                       + did_you_mean(pattern, known), *where,
                       hint="`npubuild targets check RECIPE` lists every node, its op type "
                            "and its outputs")
