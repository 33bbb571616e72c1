"""Fixtures shared by the build engine's tests."""

import pytest

from npubuild.stages import importer


@pytest.fixture
def calls(monkeypatch):
    """Counts how often the import stage function really runs."""
    counter = {"import": 0}
    real = importer.run

    def counting(ctx):
        counter["import"] += 1
        return real(ctx)

    monkeypatch.setattr(importer, "run", counting)
    return counter


@pytest.fixture(scope="session")
def key_pair(tmp_path_factory):
    """A writer's key pair for the remote cache: (private key file, public key text)."""
    from npubuild.engine.signing import generate_key_pair

    path = tmp_path_factory.mktemp("keys") / "writer.key"
    return path, generate_key_pair(path)


@pytest.fixture
def signing_key(key_pair, monkeypatch):
    """This machine (and the commands it runs) signs remote entries with the writer's key,
    and so trusts them; no other key is trusted."""
    monkeypatch.setenv("NPUBUILD_SIGNING_KEY", str(key_pair[0]))
    monkeypatch.delenv("NPUBUILD_TRUSTED_KEYS", raising=False)
    return key_pair
