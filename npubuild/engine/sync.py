"""`npubuild cache status|push|pull`: one recipe's stages between the local and remote caches.

In DVC's manner: `push` uploads what this build has, `pull` downloads what the remote has for
the recipe as it is now (the next `run` then restores instead of building), `status` says per
stage where its current key is.
"""

from __future__ import annotations

from npubuild.engine.session import BuildSession
from npubuild.engine.keys import read_manifest
from npubuild.errors import NpubuildError, UserError
from npubuild.stages import PIPELINE


def _remote(session: BuildSession):
    if session.remote is None:
        raise UserError("no remote cache is configured",
                        hint="give --remote s3://bucket/prefix, set NPUBUILD_REMOTE, or set "
                             "`remote` in the project's npubuild.toml or [tool.npubuild]")
    return session.remote


def status(session: BuildSession) -> list[dict]:
    """Per stage: the key the recipe needs now (when its inputs are known), and whether the
    build directory, the local cache and the remote have it."""
    rows = []
    expected = session.expected()
    for stage in PIPELINE:
        parts, _, note = expected[stage.name]
        key = parts.key if parts else None
        rows.append({"stage": stage.name, "key": key, "note": "" if key else note,
                     "build": bool(key and session.current_manifest(stage, key)),
                     "local": bool(key and session.cache.manifest(key)),
                     "remote": bool(key and session.remote_manifest(key))})
    return rows


def push(session: BuildSession) -> dict[str, list[str]]:
    """Upload every stage this build directory holds (storing it locally first if needed)."""
    remote = _remote(session)
    done: dict[str, list[str]] = {"pushed": [], "failed": [], "not built": []}
    for stage in PIPELINE:
        manifest = read_manifest(session.paths.manifest(stage.name))
        if not manifest or session.current_manifest(stage, manifest.get("key", "")) is None:
            done["not built"].append(stage.name)
            continue
        key = manifest["key"]
        if session.cache.manifest(key) is None:
            session.cache.store(session.paths.stage_dir(stage.name), key)
        done["pushed" if remote.push(key, session.cache) else "failed"].append(stage.name)
    return done


def pull(session: BuildSession) -> dict[str, list[str]]:
    """Download, stage by stage, the entries the recipe needs now into the local cache; a
    stage's key follows from its upstream manifests, so the chain stops at the first miss."""
    remote = _remote(session)
    done: dict[str, list[str]] = {"pulled": [], "local": [], "missing": []}
    upstream: dict[str, dict | None] = {}
    for stage in PIPELINE:
        try:
            key = session.parts(stage, {u: upstream.get(u) for u in stage.needs}).key
        except NpubuildError:
            done["missing"].append(stage.name)
            upstream[stage.name] = None
            continue
        if session.cache.manifest(key) is not None:
            done["local"].append(stage.name)
        elif remote.pull(key, session.cache):
            done["pulled"].append(stage.name)
        else:
            done["missing"].append(stage.name)
        upstream[stage.name] = session.cache.manifest(key)
    return done
