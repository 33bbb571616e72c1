"""`npubuild cache status|push|pull`: one recipe's stages between the local and remote caches.

In DVC's manner: `push` uploads what this build has (signed; a remote entry that does not
verify, or whose files are not the manifest's, is replaced), `pull` downloads what the remote
has for the recipe as it is now (the next `run` then restores instead of building), `status`
says per stage where its current key is.
"""

from __future__ import annotations

from npubuild.engine.session import BuildSession
from npubuild.engine.keys import read_manifest
from npubuild.engine.signing import KEYGEN_HINT, SIGNING_KEY_ENV, TRUSTED_KEYS_ENV
from npubuild.errors import NpubuildError, UserError
from npubuild.stages import PIPELINE


def _remote(session: BuildSession, *, writing: bool = False):
    """The session's remote, or a UserError saying what is missing to use it: its URL, the
    public keys to believe its entries, the private key to sign them (pushing)."""
    remote = session.remote
    if remote is None:
        raise UserError("no remote cache is configured",
                        hint="give --remote s3://bucket/prefix, set NPUBUILD_REMOTE, or set "
                             "`remote` in the project's npubuild.toml or [tool.npubuild]")
    if writing and remote.trust.signer is None:
        raise UserError(f"no signing key for the remote cache {remote.shown}: entries are "
                        f"pushed signed, and readers refuse unsigned ones",
                        field=SIGNING_KEY_ENV, hint=f"set {SIGNING_KEY_ENV} to the writer's "
                        f"private key file; {KEYGEN_HINT}")
    if not remote.trust.trusted:
        raise UserError(f"no trusted public key for the remote cache {remote.shown}: nothing "
                        "on it can be believed", field="trusted_keys",
                        hint=f"list the writers' public keys in the `trusted_keys` setting or "
                             f"{TRUSTED_KEYS_ENV}; {KEYGEN_HINT}")
    return remote


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
    remote = _remote(session, writing=True)
    done: dict[str, list[str]] = {"pushed": [], "failed": [], "not built": []}
    for stage in PIPELINE:
        manifest = read_manifest(session.paths.manifest(stage.name))
        if not manifest or session.current_manifest(stage, manifest.get("key", "")) is None:
            done["not built"].append(stage.name)
            continue
        key = manifest["key"]
        if session.cache.manifest(key) is None:
            try:  # pushes go from the local cache: the stage is stored there first
                session.cache.store(session.paths.stage_dir(stage.name), key)
            except OSError as exc:
                raise UserError(f"cannot store {stage.name} into the local cache: "
                                f"{exc.strerror or exc}",
                                hint="point --cache at a writable npubuild cache folder") from None
        pushed = remote.push(key, session.cache, thorough=True)  # re-hash what is there
        done["pushed" if pushed else "failed"].append(stage.name)
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
