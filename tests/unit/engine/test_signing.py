"""Remote cache entries are believed only when a trusted writer's ed25519 signature covers the
entry's key and its manifest's exact bytes; keys come from the environment and settings."""

from __future__ import annotations

import json
import os
import stat

import pytest

from npubuild.engine.cache import CacheCorrupt
from npubuild.engine.signing import (SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, Trust, generate_key_pair,
                                     load_trust, parse_public, public_text)
from npubuild.errors import UserError

KEY = "ab" * 32
MANIFEST = json.dumps({"key": KEY, "files": {"model.onnx": {"sha256": "0" * 64, "bytes": 3}},
                       "report": {"verify": {"passed": False}}}).encode()


@pytest.fixture
def writer(key_pair) -> Trust:
    return load_trust(environ={SIGNING_KEY_ENV: str(key_pair[0])})


def test_a_signed_manifest_verifies_for_a_reader_that_trusts_only_the_public_key(writer, key_pair):
    reader = load_trust((key_pair[1],), environ={})
    assert reader.signer is None
    reader.check(KEY, MANIFEST, writer.sign(KEY, MANIFEST))


@pytest.mark.parametrize("change, reason", [
    (lambda m, s, k: (m.replace(b'"passed": false', b'"passed": true'), s, k), "does not match"),
    (lambda m, s, k: (m.replace(b'"bytes": 3', b'"bytes": 4'), s, k), "does not match"),
    (lambda m, s, k: (m, s, "cd" * 32), "does not match"),
    (lambda m, s, k: (m, None, k), "unsigned"),
    (lambda m, s, k: (m, b"{not json", k), "not a signature"),
])
def test_a_flipped_verdict_size_key_or_missing_signature_is_rejected(writer, change, reason):
    manifest, signature, key = change(MANIFEST, writer.sign(KEY, MANIFEST), KEY)
    with pytest.raises(CacheCorrupt, match=reason):
        writer.check(key, manifest, signature)


def test_a_valid_signature_by_an_untrusted_key_is_rejected(writer, tmp_path):
    stranger = load_trust(environ={SIGNING_KEY_ENV: str(_new_key(tmp_path / "other.key"))})
    with pytest.raises(CacheCorrupt, match="does not trust"):
        writer.check(KEY, MANIFEST, stranger.sign(KEY, MANIFEST))


def _new_key(path):
    generate_key_pair(path)
    return path


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path):
    public = generate_key_pair(tmp_path / "ci.key")
    assert stat.S_IMODE(os.stat(tmp_path / "ci.key").st_mode) == 0o600
    assert (tmp_path / "ci.key.pub").read_text() == public + "\n"
    assert len(parse_public(public)) == 32
    before = (tmp_path / "ci.key").read_bytes()
    with pytest.raises(UserError, match="never overwritten"):
        generate_key_pair(tmp_path / "ci.key")
    assert (tmp_path / "ci.key").read_bytes() == before


def test_the_keygen_command_prints_the_setting_readers_add(cli, tmp_path):
    result = cli("cache", "keygen", str(tmp_path / "ci.key"))
    assert result.returncode == 0, result.stderr
    public = (tmp_path / "ci.key.pub").read_text().strip()
    assert f'trusted_keys = ["{public}"]' in result.stdout
    again = cli("cache", "keygen", str(tmp_path / "ci.key"))
    assert again.returncode == 2 and "never overwritten" in again.stderr


def test_the_environment_replaces_the_trusted_keys_setting(key_pair, tmp_path):
    other = generate_key_pair(tmp_path / "o.key")
    assert load_trust((key_pair[1],), environ={}).trusted == {parse_public(key_pair[1])}
    env = {TRUSTED_KEYS_ENV: f"{other}, "}
    assert load_trust((key_pair[1],), environ=env).trusted == {parse_public(other)}


def test_raw_and_openssh_private_keys_load(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    public = public_text(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                       serialization.PublicFormat.Raw))
    (tmp_path / "raw").write_bytes(raw)
    (tmp_path / "ssh").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    for name in ("raw", "ssh"):
        trust = load_trust(environ={SIGNING_KEY_ENV: str(tmp_path / name)})
        assert trust.trusted_texts() == (public,)


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the signing key"),
    (b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n", "not an unencrypted ed25519"),
    ("rsa", "RSAPrivateKey key; the cache signs with ed25519"),
    ("fifo", "not a regular file"),
])
def test_a_bad_signing_key_is_one_user_error_naming_the_variable(tmp_path, content, message):
    path = tmp_path / "key"
    if content == "rsa":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        content = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
    if content == "fifo":
        os.mkfifo(path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=message) as info:
        load_trust(environ={SIGNING_KEY_ENV: str(path)})
    assert info.value.field == SIGNING_KEY_ENV


@pytest.mark.parametrize("text, message", [
    ("ssh-ed25519 AAAA", "write ed25519:<base64>"),
    ("ed25519:***", "not valid base64"),
    ("ed25519:AAAA", "is 3 bytes"),
])
def test_a_bad_trusted_key_is_refused_in_the_environment(text, message):
    with pytest.raises(UserError, match=message) as info:
        load_trust(environ={TRUSTED_KEYS_ENV: text})
    assert info.value.field == TRUSTED_KEYS_ENV
