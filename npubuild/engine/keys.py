"""A stage's cache key: its own recipe sections, its input artifacts, the chip when it uses one,
the external files it reads, npubuild's version, the digest of its code
(`npubuild.engine.code`) and the versions of the tools whose output lands in its artifacts —
and the reason a key changed.

Tool versions: every stage reads and writes ONNX and computes with numpy and ONNX Runtime (the
float reference every proof runs), so ``numpy``, ``onnx`` and ``onnxruntime`` are in every key.
Tools only some stages run are added by *tool-version hooks*: functions
``hook(stage, loaded) -> {tool name: version}`` named in `TOOL_VERSION_HOOKS` (or registered by a
plug-in under the ``npubuild.tool_versions`` entry-point group), asked for every stage's key.
A hook returns the tools that stage will run for this recipe (the import of a TensorFlow model:
tensorflow and tf2onnx; a vendor backend's compile: its toolchain's name and version) and
nothing for other stages, so an ONNX recipe's keys do not change with TensorFlow's version, and
machines without TensorFlow share them. Hooks must be cheap and deterministic: read versions
with `distribution_version` (package metadata, never an import of the tool) or from the
toolchain's own version file, and never raise for a tool that is absent ("absent" is a version).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from npubuild.engine.hashing import HashCache, sha256_data
from npubuild.recipe.paths import original, spelled

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
    tools: dict[str, str] = field(default_factory=dict)

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
    return str(original(path).resolve()) if label.startswith("../") else label


# The libraries behind every stage's artifacts, and the distributions that may provide each
# (the import name is what runs; one of these installed it)
ALWAYS: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "onnx": ("onnx", "onnx-weekly"),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino",
                    "onnxruntime-directml", "onnxruntime-training", "ort-nightly"),
}
TENSORFLOW: dict[str, tuple[str, ...]] = {
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                   "tf-nightly", "tf-nightly-cpu"),
    "tf2onnx": ("tf2onnx",),
}
TOOL_VERSION_HOOKS: tuple[str, ...] = ("npubuild.engine.keys:tensorflow_frontend",
                                        "npubuild.backends:toolchain_versions")
ENTRY_POINT_GROUP = "npubuild.tool_versions"
ToolVersionHook = Callable[["Stage", "LoadedRecipe"], Mapping[str, str]]


@cache
def distribution_version(*distributions: str) -> str:
    """``"<distribution> <version>"`` for the first of ``distributions`` installed, from its
    metadata (about 0.3 ms, no import), else ``"absent"``."""
    for name in distributions:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


def library_versions(libraries: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Each library's installed distribution and version (`distribution_version`)."""
    return {name: distribution_version(*dists) for name, dists in libraries.items()}


def tensorflow_frontend(stage: "Stage", loaded: "LoadedRecipe") -> dict[str, str]:
    """The import of a TensorFlow/TFLite model runs TensorFlow and tf2onnx (a hook)."""
    from npubuild.frontends import TF_FORMATS

    if stage.name == "import" and loaded.model_format in TF_FORMATS:
        return library_versions(TENSORFLOW)
    return {}


@cache
def tool_version_hooks() -> tuple[ToolVersionHook, ...]:
    """The hooks of `TOOL_VERSION_HOOKS`, then those plug-ins register as entry points."""
    from npubuild.registry import installed_entry_points

    hooks = []
    for entry in TOOL_VERSION_HOOKS:
        module, _, attr = entry.partition(":")
        hooks.append(getattr(import_module(module), attr))
    hooks += [ep.load() for ep in sorted(installed_entry_points(ENTRY_POINT_GROUP),
                                         key=lambda ep: ep.name)]
    return tuple(hooks)


def tool_versions(stage: "Stage", loaded: "LoadedRecipe") -> dict[str, str]:
    """Every tool whose output lands in ``stage``'s artifacts, with its version, sorted."""
    tools = library_versions(ALWAYS)
    for hook in tool_version_hooks():
        tools.update({str(k): str(v) for k, v in hook(stage, loaded).items()})
    return dict(sorted(tools.items()))


def key_parts(stage: "Stage", loaded: "LoadedRecipe", upstream: dict[str, dict | None],
              hashes: HashCache, chip_digest: str | None, version: str, code: str) -> KeyParts:
    """The parts of ``stage``'s key; ``upstream`` maps each needed stage to its manifest;
    ``code`` is the digest of npubuild's code (`npubuild.engine.code.code_digest`)."""
    data = loaded.dumped
    return KeyParts(
        stage=stage.name, version=version, code=code,
        sections={s: sha256_data(section_value(data, s)) for s in stage.sections},
        upstream={u: upstream_digest(upstream.get(u)) for u in stage.needs},
        chip=chip_digest if stage.uses_chip else None,
        files={file_label(p, loaded.base_dir): hashes.any(p) for p in stage.external_files(loaded)},
        tools=tool_versions(stage, loaded))


def explain_change(old: dict | None, new: KeyParts) -> str:
    """Why a stage must run, in the words `npubuild plan` shows."""
    if old is None:
        return "never built"
    before = old.get("parts") or {}
    if before.get("version") != new.version:
        return f"npubuild version changed ({before.get('version')} -> {new.version})"
    if before.get("code") != new.code:
        return "npubuild's code changed (same version, other source)"
    old_tools = before.get("tools") or {}
    changed = [f"{t} ({old_tools.get(t, 'absent')} -> {v})" for t, v in new.tools.items()
               if old_tools.get(t) != v]
    if changed:
        return "tool versions changed: " + ", ".join(changed)
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
