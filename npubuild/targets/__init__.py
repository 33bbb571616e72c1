"""Target chips: built-in presets (YAML files shipped in this package, read through
`importlib.resources`) and user chip files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from npubuild.errors import Location, UserError, did_you_mean
from npubuild.targets.model import Chip

PRESETS = resources.files(__package__)


def preset_names() -> list[str]:
    return sorted(entry.name.removesuffix(".yaml") for entry in PRESETS.iterdir()
                  if entry.name.endswith(".yaml"))


def preset_file(name: str) -> Path:
    """The file of a built-in chip (a package resource on disk: setuptools installs the package
    unzipped, which `chip_file`'s callers rely on to hash and read it as a path)."""
    entry = PRESETS.joinpath(f"{name}.yaml")
    if not isinstance(entry, Path):
        raise UserError(f"npubuild's chip presets are not on disk ({entry}); install npubuild "
                        "unzipped (pip does by default)")
    return entry


def chip_file(name_or_path: str, base_dir: Path | None = None) -> Path:
    """The YAML file behind a chip name (a preset) or path (relative to ``base_dir``)."""
    if name_or_path in preset_names():
        return preset_file(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        path = path if path.is_absolute() or base_dir is None else base_dir / path
        if path.is_file():
            return path
        raise UserError(f"chip file not found: {path}")
    raise UserError(f"unknown target {name_or_path!r} (built-in chips: {', '.join(preset_names())})"
                    + did_you_mean(name_or_path, preset_names()),
                    hint="run `npubuild targets` to list chips, or give a path to a chip YAML")


def load_chip(name_or_path: str, base_dir: Path | None = None) -> Chip:
    """Load and validate a chip; errors carry the chip file's line and field."""
    from npubuild.recipe.load import load_yaml_model

    path = chip_file(name_or_path, base_dir)
    return load_yaml_model(path, Chip)


def describe(chip: Chip) -> dict:
    from npubuild import backends

    backend = backends.of(chip)
    return {"name": chip.name, "backend": chip.backend, "vendor": chip.vendor or "-",
            **_toolchain_state(backend.toolchain),
            "lanes": chip.lanes, "lmem_bytes": chip.lmem_bytes,
            "lmem_bytes_per_lane": chip.lmem_bytes_per_lane, "clock_mhz": chip.clock_mhz,
            "tops_int8": round(2 * chip.lanes * chip.macs_per_cycle_per_lane * chip.clock_mhz / 1e6, 3),
            "ops": len(chip.ops), "description": chip.description}


def _toolchain_state(name: str | None) -> dict:
    """The chip's toolchain and whether its environment is there (`npubuild targets`)."""
    if name is None:
        return {"toolchain": "-", "installed": True}
    from npubuild import toolchains
    from npubuild.toolchains.env import find

    chain = toolchains.get(name)
    return {"toolchain": f"{chain.name} {chain.version}", "installed": find(chain) is not None,
            "install": chain.install_command}


__all__ = ["Chip", "Location", "chip_file", "describe", "preset_file", "load_chip", "preset_names"]
