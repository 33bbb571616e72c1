"""The files outside the build each stage reads (`Stage.file_inputs`): part of its cache key,
and what `run` and `validate` check exist before any stage runs. Kept apart from the stage
code, so `npubuild validate` checks them without importing the quantizer or the verifier.
"""

from __future__ import annotations

from pathlib import Path

CALIBRATION_FIELD = ("quantization", "calibration", "data")


def import_files(loaded) -> list[Path]:
    """The source model (a file, or a SavedModel directory) and what the proof inputs are made
    from (recipe proof files, the first calibration sample); a missing model is the recipe's
    error (plain `doit` reports it as the failing task)."""
    from npubuild.recipe import check_model_file

    return [check_model_file(loaded), *proof_data_files(loaded), *proof_calibration_files(loaded)]


def proof_data_files(loaded) -> list[Path]:
    """The ``model.inputs[].proof.data`` files (part of the import stage's key); a missing one
    is a recipe error located at its field."""
    files = []
    for index, spec in enumerate(loaded.recipe.model.inputs):
        if spec.proof is not None and spec.proof.data:
            where = ("model", "inputs", index, "proof", "data")
            path = loaded.resolve(spec.proof.data, *where)
            if not path.is_file():
                raise loaded.error(f"proof data file not found: {loaded.spelled(path)}", *where,
                                   hint="paths are relative to the recipe file")
            files.append(path)
    return files


def proof_calibration_files(loaded) -> list[Path]:
    """The calibration files the proof inputs' first sample is read from (part of the import
    stage's key; none without calibration data)."""
    spec = loaded.recipe.quantization.calibration
    if not spec.data:
        return []
    batch = max([s.shape[0] for s in loaded.recipe.model.inputs if s.shape] or [1])
    return loaded.resolve_glob(spec.data, "quantization", "calibration", "data")[:max(batch, 1)]


def calibration_files(loaded) -> list[Path]:
    """The calibration data; every chip quantizes, so a recipe without any is refused."""
    spec = loaded.recipe.quantization.calibration
    if not spec.data:
        raise loaded.error("quantization needs calibration data", *CALIBRATION_FIELD[:2],
                           hint="set quantization.calibration.data, e.g. "
                                "\"pkg:skimage/data/[a-m]*.png\"")
    return loaded.resolve_glob(spec.data, *CALIBRATION_FIELD)


def quantize_files(loaded) -> list[Path]:
    """Calibration and verify files (quantize reports per-layer accuracy on the verify data)."""
    files = calibration_files(loaded)
    verify = loaded.recipe.verify.data
    if verify:
        files += [f for f in loaded.resolve_glob(verify, "verify", "data") if f not in files]
    return files


def verify_files(loaded) -> list[Path]:
    """The verify data (or, without it, the calibration data)."""
    spec = loaded.recipe.verify
    if spec.data:
        return loaded.resolve_glob(spec.data, "verify", "data")
    calibration = loaded.recipe.quantization.calibration.data
    if calibration:
        return loaded.resolve_glob(calibration, *CALIBRATION_FIELD)
    raise loaded.error("verify needs data: set verify.data (or quantization.calibration.data)",
                       "verify")
