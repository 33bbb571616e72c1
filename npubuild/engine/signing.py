"""Who may write the shared remote cache: every entry is signed by its writer's ed25519 key.

A remote is storage other people (and other machines' bugs) can write to, so a reader believes
an entry only when its ``manifest.sig`` verifies against a public key it trusts. What is signed
is the entry's key and the hash of its manifest's exact bytes; the manifest lists every file's
sha256 and size and carries the stage's report (verify's verdict among it), so no file, size,
verdict or key can change without the signature failing.

Keys, as a build system hands them out (CI writes, every machine reads):

- the writer's private key is a machine's secret: ``$NPUBUILD_SIGNING_KEY`` names its file
  (PEM as `npubuild cache keygen` writes it, an OpenSSH ed25519 key, or 32 raw bytes); never a
  settings file, which is committed;
- the public keys readers trust are public: the project's ``trusted_keys`` setting (reviewed
  with the code, like a ``known_hosts`` file), or ``$NPUBUILD_TRUSTED_KEYS`` (which replaces
  it), each spelled ``ed25519:<base64 of the 32-byte key>``. The signing key's own public key is
  always trusted, so a machine reads back what it wrote.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from npubuild.engine.cache import CacheCorrupt
from npubuild.errors import UserError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SIGNING_KEY_ENV = "NPUBUILD_SIGNING_KEY"
TRUSTED_KEYS_ENV = "NPUBUILD_TRUSTED_KEYS"
SIGNATURE = "manifest.sig"
PUBLIC_PREFIX = "ed25519:"
FORMAT = "npubuild-signature-1"
DOMAIN = b"npubuild remote cache entry v1\n"  # a signature made for anything else never fits
MAX_SIGNATURE_BYTES = 4096
MAX_KEY_FILE_BYTES = 16384
KEYGEN_HINT = "`npubuild cache keygen KEYFILE` writes a key pair and says where each half goes"


def message(key: str, manifest: bytes) -> bytes:
    """What a writer signs for one entry: the entry's key and its manifest's sha256."""
    return DOMAIN + key.encode("ascii") + b"\n" + hashlib.sha256(manifest).digest()


def public_text(raw: bytes) -> str:
    """A public key as users write it: ``ed25519:`` and the base64 of its 32 bytes."""
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public(text: object) -> bytes:
    """The 32 raw bytes of an ``ed25519:<base64>`` public key; ValueError says what is wrong."""
    if not isinstance(text, str) or not text.startswith(PUBLIC_PREFIX):
        raise ValueError(f"{str(text)[:60]!r} is not a public key: write ed25519:<base64>")
    try:
        raw = base64.b64decode(text[len(PUBLIC_PREFIX):].strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{text[:60]!r} is not valid base64") from None
    if len(raw) != 32:
        raise ValueError(f"{text[:60]!r} is {len(raw)} bytes; an ed25519 public key is 32")
    return raw


@dataclass(frozen=True)
class Trust:
    """This machine's keys: the one it signs with (a writer) and those it believes (a reader)."""

    signer: "Ed25519PrivateKey | None" = None
    trusted: frozenset[bytes] = frozenset()

    @property
    def configured(self) -> bool:
        return self.signer is not None or bool(self.trusted)

    def trusted_texts(self) -> tuple[str, ...]:
        """Every trusted public key (the signer's included), sorted: for workers, which read."""
        return tuple(sorted(public_text(raw) for raw in self.trusted))

    def sign(self, key: str, manifest: bytes) -> bytes:
        """The ``manifest.sig`` content for an entry (the caller checks there is a signer)."""
        assert self.signer is not None
        signature = self.signer.sign(message(key, manifest))
        return json.dumps({"format": FORMAT, "public_key": public_text(_raw_public(self.signer)),
                           "signature": base64.b64encode(signature).decode("ascii")},
                          sort_keys=True).encode() + b"\n"

    def check(self, key: str, manifest: bytes, signature: bytes | None) -> None:
        """Raise CacheCorrupt unless ``signature`` is a trusted key's over this key and manifest."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if signature is None:
            raise CacheCorrupt("unsigned (no manifest.sig)")
        try:
            doc = json.loads(signature)
            public = parse_public(doc["public_key"])
            raw_signature = base64.b64decode(doc["signature"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise CacheCorrupt("manifest.sig is not a signature") from None
        if public not in self.trusted:
            raise CacheCorrupt(f"signed by a key this machine does not trust "
                               f"({public_text(public)[:20]}…)")
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(raw_signature, message(key, manifest))
        except InvalidSignature:
            raise CacheCorrupt("the signature does not match the manifest") from None


def load_trust(trusted_setting: tuple[str, ...] = (), environ=os.environ) -> Trust:
    """The machine's keys from ``$NPUBUILD_SIGNING_KEY`` and ``$NPUBUILD_TRUSTED_KEYS`` (which
    replaces the ``trusted_keys`` setting when set); a bad key is a UserError naming it."""
    signer = _load_signer(environ.get(SIGNING_KEY_ENV) or None)
    env = environ.get(TRUSTED_KEYS_ENV)
    texts = env.replace(",", " ").split() if env is not None else list(trusted_setting)
    trusted = set()
    for text in texts:
        try:
            trusted.add(parse_public(text))
        except ValueError as exc:
            raise UserError(str(exc), field=TRUSTED_KEYS_ENV if env is not None else "trusted_keys",
                            hint=KEYGEN_HINT) from None
    if signer is not None:
        trusted.add(_raw_public(signer))
    return Trust(signer, frozenset(trusted))


def _load_signer(path: str | None) -> "Ed25519PrivateKey | None":
    if path is None:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def bad(why: str) -> UserError:
        return UserError(f"{path}: {why}", field=SIGNING_KEY_ENV, hint=KEYGEN_HINT)

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the run
    except OSError as exc:
        raise bad(f"cannot read the signing key: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise bad("not a regular file")
        data = fh.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) == 32:
        return Ed25519PrivateKey.from_private_bytes(data)
    loaders = (serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data
               else serialization.load_pem_private_key)
    try:
        key = loaders(data, password=None)
    except (ValueError, TypeError):
        raise bad("not an unencrypted ed25519 private key (PEM, OpenSSH, or 32 raw bytes)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise bad(f"a {type(key).__name__.removeprefix('_')} key; the cache signs with ed25519")
    return key


def _raw_public(private: "Ed25519PrivateKey") -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)


def generate_key_pair(path: Path) -> str:
    """Write a new private key to ``path`` (PEM, mode 0600, never over an existing file) and its
    public key to ``path.pub``; returns the public key's text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public = public_text(_raw_public(key))
    pub_path = path.with_name(path.name + ".pub")
    for target in (path, pub_path):
        if os.path.lexists(target):
            raise UserError(f"{target} exists; a key file is never overwritten",
                            hint="choose another file name, or remove the old key pair first")
    _write_new(path, pem, 0o600)
    _write_new(pub_path, (public + "\n").encode(), 0o644)
    return public


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
