"""Project settings: where a project's caches are, kept out of its recipes.

Recipes are reviewed and shared, so they name no machine paths and no credentials. Where the
content cache and the shared remote live is a project's (or a machine's) business, in DVC's
manner (``dvc remote add -d`` writes ``.dvc/config``): the nearest ``npubuild.toml`` (top-level
keys) or ``pyproject.toml`` with a ``[tool.npubuild]`` table, found upward from the recipe's
folder, may say

    cache = ".npubuild/cache"          # a folder (relative to the settings file) or a URL
    remote = "s3://team-bucket/npubuild"
    trusted_keys = ["ed25519:…"]       # whose signatures the remote's readers believe

``--cache``/``--remote`` win over ``$NPUBUILD_CACHE``/``$NPUBUILD_REMOTE``, which win over
these, which win over the default (``$NPUBUILD_TRUSTED_KEYS`` replaces ``trusted_keys``).
Credentials never come from here: the endpoint and keys come from the usual fsspec/boto
environment, and the signing key from ``$NPUBUILD_SIGNING_KEY`` (`npubuild.engine.signing`);
a URL carrying a user or password is refused. Public keys are not secrets: they belong here,
reviewed with the project.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from npubuild.errors import Location, UserError

SETTINGS_FILE = "npubuild.toml"
KEYS = {"cache": "a cache folder (relative to this file) or an fsspec URL",
        "remote": "the shared remote cache's fsspec URL (s3://bucket/prefix, gs://…, file://…)",
        "trusted_keys": "the public keys (ed25519:<base64>) whose remote cache entries are "
                        "believed"}
CREDENTIALS_HINT = ("credentials come from the environment (AWS_ACCESS_KEY_ID, "
                    "AWS_ENDPOINT_URL, AWS_PROFILE, FSSPEC_S3_*, ...), never from a settings file")


@dataclass(frozen=True)
class Settings:
    """What the settings file says (None: it says nothing), and which file said it."""

    cache: Path | None = None
    remote: str | None = None
    source: Path | None = None
    trusted_keys: tuple[str, ...] = ()


def find_settings(start: Path) -> Settings:
    """The nearest settings at or above ``start``: ``npubuild.toml``, else a ``pyproject.toml``
    with a ``[tool.npubuild]`` table (a pyproject without one is passed over, as ruff does)."""
    for folder in [start.resolve(), *start.resolve().parents]:
        own = folder / SETTINGS_FILE
        if own.is_file():
            return parse(own, _load(own), ())
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            data = _load(pyproject)
            tool = data.get("tool")
            table = tool.get("npubuild") if isinstance(tool, dict) else None
            if table is not None:
                return parse(pyproject, table, ("tool", "npubuild"))
    return Settings()


def parse(path: Path, table: object, prefix: tuple[str, ...]) -> Settings:
    """Check one settings table: known keys only, strings, no credentials."""
    where = ".".join(prefix)
    if not isinstance(table, dict):
        raise UserError(f"[{where}] must be a table", location=Location(str(path)))
    text = path.read_text(encoding="utf-8", errors="replace")
    for key, value in table.items():
        field = ".".join((*prefix, key))
        at = Location(str(path), _line_of(text, key))
        if key not in KEYS:
            raise UserError(f"unknown setting {key!r}; settings: " + "; ".join(
                f"{k}: {v}" for k, v in KEYS.items()), location=at, field=field,
                hint=CREDENTIALS_HINT if _looks_secret(key) else None)
        if key == "trusted_keys":
            _check_public_keys(value, at, field)
            continue
        if not isinstance(value, str) or not value:
            raise UserError(f"must be a non-empty string, not {value!r}", location=at, field=field)
        if "://" in value and _has_credentials(value):
            raise UserError("a URL with a user or password in it: settings never hold "
                            "credentials", location=at, field=field, hint=CREDENTIALS_HINT)
    cache, remote = table.get("cache"), table.get("remote")
    if cache and "://" in cache:
        cache, remote = None, remote or cache
    return Settings(cache=(path.parent / cache) if cache else None, remote=remote, source=path,
                    trusted_keys=tuple(table.get("trusted_keys", ())))


def _check_public_keys(value: object, at: Location, field: str) -> None:
    from npubuild.engine.signing import KEYGEN_HINT, parse_public

    if not isinstance(value, list):
        raise UserError(f"must be a list of public keys, not {value!r:.80}", location=at,
                        field=field, hint=KEYGEN_HINT)
    for index, text in enumerate(value):
        try:
            parse_public(text)
        except ValueError as exc:
            raise UserError(str(exc), location=at, field=f"{field}[{index}]",
                            hint=KEYGEN_HINT) from None


def _load(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the settings file: {exc}",
                        location=Location(str(path))) from None
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        reason = str(exc)[:found.start()].strip() if found else str(exc)
        raise UserError(f"not valid TOML: {reason}",
                        location=Location(str(path), *(int(g) for g in found.groups()))
                        if found else Location(str(path))) from None


def _line_of(text: str, key: str) -> int | None:
    """The line of ``key = …`` (TOML parsers keep no positions; the first match will do)."""
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    return next((i for i, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None)


def _has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return bool(parts.username or parts.password)
    except ValueError:
        return False


def _looks_secret(key: str) -> bool:
    return any(word in key.lower() for word in ("key", "secret", "token", "password", "credential"))
