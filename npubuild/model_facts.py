"""What `npubuild validate` learns of an ONNX model, remembered in the content cache.

Checking an ONNX model against a recipe (`npubuild.stages.importer.check_signature`: ONNX's
checker, the input and output names, shape inference from the recipe's shapes, every tensor's
size) needs ONNX and numpy, which cost more CPU than the rest of `validate` together. What the
check learns is a pure function of the model file's bytes, the recipe's ``model:`` section and
the code that checks, so a passing check's findings (`ModelFacts`: names, shapes, node names
and op types) are stored as a cache entry under the hash of exactly those:

- the model's content hash (its sha256);
- the ``model:`` section as the recipe gives it (input names, shapes, dtypes, cut outputs);
- npubuild's code digest (`npubuild.engine.code`) and the installed onnx version.

Both digests are remembered too, keyed by the `hashing.stat_key` of the files they read (as the
build's hash cache and the no-op stamp trust them: a changed byte always changes a file's ctime),
so an unchanged model and package are not read again: reading 12 MB of YOLOv8n and 1.5 MB of
code costs more CPU than the rest of a remembered check.

A failing check raises its error each time (nothing is stored), a model with external data is
never remembered (its data files are checked on every run), and a cache that cannot be read or
written only costs the check. TensorFlow formats are not remembered (their signature is read
as import reads it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from npubuild.engine.cache import Cache, CacheCorrupt, open_inside
from npubuild.engine.hashing import sha256_data, sha256_file, stat_key
from npubuild.engine.paths import MANIFEST

FORMAT = "npubuild.model-facts/1"
FACTS_FILE = "facts.json"


@dataclass
class ModelFacts:
    """The model's input and output names and, for ONNX, its graph as the recipe's shapes make
    it: every graph input (weights included, as the skeleton lists them) with its shape and,
    for the model's real inputs, dtype; every node's name, op type and outputs."""

    inputs: list[str]
    outputs: list[str]
    graph_inputs: list[list] | None = None  # [name, shape, dtype or None] each
    nodes: list[list] = field(default_factory=list)  # [name, op type, outputs] each
    external_data: bool = False

    def as_dict(self) -> dict:
        return {"inputs": self.inputs, "outputs": self.outputs}

    @classmethod
    def of_signature(cls, signature) -> ModelFacts:
        """From `importer.Signature` (its shaped graph, when there is one)."""
        graph = signature.graph
        if graph is None:
            return cls(list(signature.inputs), list(signature.outputs))
        from npubuild import onnx_io

        inputs = [[v.name, onnx_io.value_shape(v),
                   str(onnx_io.value_dtype(v)) if v.name in signature.inputs else None]
                  for v in graph.graph.input]
        nodes = [[n.name, n.op_type, list(n.output)] for n in graph.graph.node]
        return cls(list(signature.inputs), list(signature.outputs), inputs, nodes,
                   signature.external_data)


def model_facts(loaded) -> ModelFacts:
    """`check_signature`'s findings for ``loaded``: remembered ones when the cache has them for
    this very model, ``model:`` section and code, else checked (and remembered when it passes)."""
    if loaded.model_format != "onnx" or not loaded.model_path.is_file():
        return _checked(loaded)
    cache = _cache(loaded)
    key = sha256_data({"format": FORMAT, "model": _model_digest(cache, loaded.model_path),
                       "section": _model_section(loaded), "code": _code_digest(cache),
                       "onnx": _onnx_version()})
    found = _read(cache, key)
    if found is not None:
        return found
    facts = _checked(loaded)
    if not facts.external_data:
        _write(cache, key, asdict(facts))
    return facts


def _checked(loaded) -> ModelFacts:
    from npubuild.stages import importer

    return ModelFacts.of_signature(importer.check_signature(loaded))


def _model_section(loaded) -> dict:
    return loaded.recipe.model.model_dump(mode="json", exclude={"path"})


def _code_digest(cache: Cache) -> str:
    """npubuild's code digest (`code.tree_digest`), remembered by its files' stat keys."""
    from npubuild.engine.code import running_code_files, running_package, tree_digest

    package = running_package()
    stats = [[str(path), stat_key(path.stat())] for path in running_code_files()]
    return _remembered(cache, {"code of": str(package), "stats": stats},
                       lambda: tree_digest(package))


def _onnx_version() -> str:
    from npubuild.engine.keys import distribution_version

    return distribution_version("onnx")


def _cache(loaded) -> Cache:
    from npubuild.engine.paths import cache_dir
    from npubuild.engine.settings import find_settings

    return Cache(cache_dir(None, find_settings(loaded.path.parent).cache))


def _model_digest(cache: Cache, path: Path) -> str:
    """The model's sha256, remembered by its path and stat key."""
    about = {"sha256 of": str(path.resolve()), "stat": stat_key(path.stat())}
    return _remembered(cache, about, lambda: sha256_file(path))


def _remembered(cache: Cache, about: dict, compute) -> str:
    """A digest stored under the hash of ``about`` (what it depends on), else ``compute()``d
    and stored."""
    memo = sha256_data({"format": FORMAT, **about})
    found = _read(cache, memo)
    if isinstance(found, dict) and isinstance(found.get("sha256"), str):
        return found["sha256"]
    digest = compute()
    _write(cache, memo, {"sha256": digest})
    return digest


def _read(cache: Cache, key: str):
    """The JSON an entry of ours holds (`ModelFacts` or a memo), or None: no entry, or one that
    does not check out (its file's hash, or its shape)."""
    try:
        manifest = cache.read_manifest(key)
        info = manifest["files"].get(FACTS_FILE)
        with os.fdopen(open_inside(cache.root, (key[:2], key, FACTS_FILE)), "rb") as fh:
            raw = fh.read()
        if manifest.get("format") != FORMAT or hashlib.sha256(raw).hexdigest() != info["sha256"]:
            return None
        data = json.loads(raw)
        if "sha256" in data:
            return data
        return ModelFacts(**data)
    except (CacheCorrupt, OSError, ValueError, TypeError, KeyError):
        return None


def _write(cache: Cache, key: str, data: dict) -> None:
    """Store ``data`` as the entry ``key`` (first writer wins); a cache that cannot be written
    is passed over: the memo only saves time."""
    staging = Path(tempfile.mkdtemp(prefix="npubuild-facts-"))
    try:
        raw = json.dumps(data, sort_keys=True).encode()
        (staging / FACTS_FILE).write_bytes(raw)
        manifest = {"key": key, "format": FORMAT,
                    "files": {FACTS_FILE: {"sha256": hashlib.sha256(raw).hexdigest()}}}
        (staging / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
        cache.store(staging, key)
    except OSError:  # ForeignFolder too: a folder that is not npubuild's cache
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
