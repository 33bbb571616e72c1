"""A stage's cache key: its own recipe sections, its input artifacts, the chip when it uses one,
the external files it reads, npubuild's version and the digest of its code
(`npubuild.engine.code`) — and the reason a key changed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from npubuild.engine.hashing import HashCache, sha256_data
from npubuild.recipe.paths import spelled

if TYPE_CHECKING:
    from npubuild.recipe import LoadedRecipe
    from npubuild.stages import Stage


@dataclass
class KeyParts:
    stage: str
    version: str
    code: str
    sections: dict[str, str] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)
    chip: str | None = None
    files: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return sha256_data(asdict(self))

    def as_dict(self) -> dict:
        return asdict(self)


def section_value(recipe_data: dict, dotted: str):
    value = recipe_data
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def read_manifest(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def upstream_digest(manifest: dict | None) -> str:
    """The content of a stage's outputs (not its key): equal outputs give equal digests."""
    return sha256_data(manifest["files"]) if manifest else "missing"


def file_label(path: Path, base_dir: Path) -> str:
    """An input file's name in a key, the same on every machine where it can be
    (`paths.spelled`: inside the recipe's folder or an installed package); a file outside both
    keeps its absolute path, which names it wherever the recipe is copied to."""
    label = spelled(path, base_dir)
    return str(Path(path).resolve()) if label.startswith("../") else label


def key_parts(stage: "Stage", loaded: "LoadedRecipe", upstream: dict[str, dict | None],
              hashes: HashCache, chip_digest: str | None, version: str, code: str) -> KeyParts:
    """The parts of ``stage``'s key; ``upstream`` maps each needed stage to its manifest;
    ``code`` is the digest of npubuild's code (`npubuild.engine.code.code_digest`)."""
    data = loaded.recipe.model_dump(mode="json")
    return KeyParts(
        stage=stage.name, version=version, code=code,
        sections={s: sha256_data(section_value(data, s)) for s in stage.sections},
        upstream={u: upstream_digest(upstream.get(u)) for u in stage.needs},
        chip=chip_digest if stage.uses_chip else None,
        files={file_label(p, loaded.base_dir): hashes.any(p) for p in stage.external_files(loaded)})


def explain_change(old: dict | None, new: KeyParts) -> str:
    """Why a stage must run, in the words `npubuild plan` shows."""
    if old is None:
        return "never built"
    before = old.get("parts") or {}
    if before.get("version") != new.version:
        return f"npubuild version changed ({before.get('version')} -> {new.version})"
    if before.get("code") != new.code:
        return "npubuild's code changed (same version, other source)"
    changed = [s for s, d in new.sections.items() if before.get("sections", {}).get(s) != d]
    if changed:
        return "recipe section " + ", ".join(f"`{s}`" for s in changed) + " changed"
    changed = [u for u, d in new.upstream.items() if before.get("upstream", {}).get(u) != d]
    if changed:
        return "input artifacts from " + ", ".join(f"`{u}`" for u in changed) + " changed"
    if before.get("chip") != new.chip:
        return "target chip changed"
    changed = [f for f, d in new.files.items() if before.get("files", {}).get(f) != d]
    if changed or set(before.get("files", {})) != set(new.files):
        return "input file " + ", ".join(Path(f).name for f in changed or new.files) + " changed"
    return "artifacts missing or modified"
