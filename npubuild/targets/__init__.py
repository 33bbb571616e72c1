"""Target chips: built-in presets (YAML files beside this module) and user chip files."""

from __future__ import annotations

from pathlib import Path

from npubuild.errors import Location, UserError
from npubuild.targets.model import Chip

PRESET_DIR = Path(__file__).parent


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def chip_file(name_or_path: str, base_dir: Path | None = None) -> Path:
    """The YAML file behind a chip name (a preset) or path (relative to ``base_dir``)."""
    if name_or_path in preset_names():
        return PRESET_DIR / f"{name_or_path}.yaml"
    if name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        path = path if path.is_absolute() or base_dir is None else base_dir / path
        if path.is_file():
            return path
        raise UserError(f"chip file not found: {path}")
    raise UserError(f"unknown target {name_or_path!r}; built-in chips: {', '.join(preset_names())}",
                    hint="run `npubuild targets` to list chips, or give a path to a chip YAML")


def load_chip(name_or_path: str, base_dir: Path | None = None) -> Chip:
    """Load and validate a chip; errors carry the chip file's line and field."""
    from npubuild.recipe.load import load_yaml_model

    path = chip_file(name_or_path, base_dir)
    return load_yaml_model(path, Chip)


def describe(chip: Chip) -> dict:
    return {"name": chip.name, "lanes": chip.lanes, "lmem_bytes": chip.lmem_bytes,
            "lmem_bytes_per_lane": chip.lmem_bytes_per_lane, "clock_mhz": chip.clock_mhz,
            "tops_int8": round(2 * chip.lanes * chip.macs_per_cycle_per_lane * chip.clock_mhz / 1e6, 3),
            "ops": len(chip.ops), "description": chip.description}


__all__ = ["Chip", "Location", "chip_file", "describe", "load_chip", "preset_names"]
