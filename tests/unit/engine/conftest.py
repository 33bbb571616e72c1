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
