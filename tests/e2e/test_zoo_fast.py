"""CI's fast subset of the zoo (benchmarks/zoo.py builds the whole zoo on every chip): a few
small zoo recipes, each built end to end on npu-16m through the benchmark's own cell builder,
as tuned and as a user writes them, must pass verify bit-exact; the cache is the test run's
shared one."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO, shared_root

pytestmark = pytest.mark.slow

FAST_ZOO = ["speech-vad", "transformer-encoder", "light-squeezenet"]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def zoo_bench():
    """benchmarks/zoo.py as a module, with the hand-built zoo models written (seeded: every
    worker writes the same bytes, atomically)."""
    _load(REPO / "scripts" / "make_zoo_models.py", "make_zoo_models").main([])
    return _load(REPO / "benchmarks" / "zoo.py", "zoo_bench")


@pytest.mark.parametrize("kind", ["tuned", "written"])
@pytest.mark.parametrize("name", FAST_ZOO)
def test_zoo_recipe_passes_verify_on_npu_16m(name, kind, zoo_bench, tmp_path_factory, shared_cache):
    """As tuned, and as a user writes it (no per-model quantization setting, min_cosine 0.99)."""
    root = shared_root(tmp_path_factory) / "zoo-build"
    recipe = REPO / "recipes" / "zoo" / f"{name}.yaml"
    if kind == "written":
        recipe = zoo_bench.as_written(recipe, tmp_path_factory.mktemp("written"))
    [cell] = zoo_bench.build_recipe(str(recipe), ["npu-16m"], str(root), str(shared_cache))
    row = zoo_bench.row(cell)
    assert row["passed"], row["error"]
    assert row["reached"] == "verify" and row["bit_exact"] is True
    assert row["worst_cosine"] >= 0.95 and row["nodes"][0] > 0
    assert not row["unexplained"]


def test_zoo_cells_as_dask_tasks_build_the_same_bytes_as_one_process(zoo_bench, tmp_path):
    """`benchmarks/zoo.py --scheduler local:2`: every cell a Dask task (after its recipe's shared
    stages), the artifacts byte-identical to the cells built in one process."""
    import hashlib

    pytest.importorskip("distributed")
    recipe, chips = str(REPO / "recipes" / "zoo" / "speech-vad.yaml"), ["npu-16m", "npu-tiny"]
    serial = zoo_bench.build_recipe(recipe, chips, str(tmp_path / "serial"), str(tmp_path / "cs"))
    fanned = zoo_bench.cells_on_dask("local:2", [(recipe, chips, str(tmp_path / "dask"),
                                                  str(tmp_path / "cd"))])
    assert [c["target"] for c in fanned] == chips
    assert [zoo_bench.row(c)["passed"] for c in fanned] == [c["ok"] for c in serial]

    def digests(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file() and p.parent != root
                and p.name not in ("report.json", "report.html", ".doit.sqlite")}

    for chip in chips:
        cell = f"speech-vad@{chip}"
        assert digests(tmp_path / "dask" / cell) == digests(tmp_path / "serial" / cell)
