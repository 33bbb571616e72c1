"""Fan-out on Dask: the same cells and artifacts as in one process, and clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from npubuild.distributed import dask_client, map_tasks, resolve_scheduler
from npubuild.errors import UserError
from npubuild.matrix import build_matrix
from npubuild.recipe import load_recipe

pytest.importorskip("distributed", reason="the Dask tests need distributed")


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.parent != root}


def no_sample_in_the_driver(monkeypatch) -> None:
    """Fail any verify sample run in this process (the workers are other processes)."""
    from npubuild.verify.samples import SampleRun

    def no_sample_here(self, feeds):
        raise AssertionError("a verify sample ran in the driver, not on a worker")

    monkeypatch.setattr(SampleRun, "__call__", no_sample_here)


def test_matrix_cells_on_a_local_dask_cluster_equal_the_in_process_build(tiny_recipe, tmp_path):
    loaded = load_recipe(tiny_recipe)
    targets = ["npu-16m", "npu-tiny"]
    serial = build_matrix(loaded, targets, "compile", build_root=tmp_path / "serial",
                          cache=tmp_path / "cache-serial", jobs=1)
    on_dask = build_matrix(loaded, targets, "compile", build_root=tmp_path / "dask",
                           cache=tmp_path / "cache-dask", scheduler="local:2")

    assert [c["target"] for c in on_dask] == targets and all(c["ok"] for c in on_dask)
    for a, b in zip(serial, on_dask):
        assert {s: v["key"] for s, v in a["report"]["stages"].items()} == \
               {s: v["key"] for s, v in b["report"]["stages"].items()}
    for target in targets:
        cell = f"tiny@{target}"
        assert digests(tmp_path / "dask" / cell) == digests(tmp_path / "serial" / cell)


def test_map_tasks_keeps_the_order_of_the_calls_on_dask():
    assert map_tasks(pow, [(2, k) for k in range(6)], scheduler="local:1") == [2 ** k for k in range(6)]


def test_a_scheduler_that_is_not_there_is_a_user_error_with_a_hint():
    with pytest.raises(UserError, match="cannot reach the Dask scheduler") as info:
        with dask_client("tcp://127.0.0.1:9"):
            pass
    assert "local:N" in info.value.hint


@pytest.mark.parametrize("address", ["local:0", "localhost"])
def test_a_malformed_scheduler_address_is_a_user_error(address):
    with pytest.raises(UserError):
        with dask_client(address):
            pass


def test_a_local_cluster_that_cannot_start_is_one_build_error_with_a_hint():
    from npubuild.distributed import _local_cluster
    from npubuild.errors import BuildError

    def no_nanny(**options):
        raise RuntimeError("Nanny failed to start.")

    with pytest.raises(BuildError, match="local Dask cluster did not start: RuntimeError") as info:
        _local_cluster(no_nanny, "local:2", 2)
    assert "__main__" in info.value.hint and "tcp://" in info.value.hint


def test_the_environment_names_the_scheduler_when_no_flag_does(monkeypatch):
    monkeypatch.setenv("NPUBUILD_SCHEDULER", "local:3")
    assert resolve_scheduler(None) == "local:3"
    assert resolve_scheduler("tcp://h:1") == "tcp://h:1"
    monkeypatch.delenv("NPUBUILD_SCHEDULER")
    assert resolve_scheduler(None) is None


WEIGHT_ROUNDINGS = {
    "nearest": "  weight_rounding: nearest\n",
    "gptq": "  weight_rounding: gptq\n",
    # unset, and int8 misses: the Gram matrices come from a second pass, on the workers too
    "measured": "  auto: false\nverify: {min_cosine: 0.999999}\n",
}


@pytest.mark.parametrize("rounding", sorted(WEIGHT_ROUNDINGS))
def test_calibration_batches_on_dask_give_byte_identical_quantize_artifacts(tmp_path, rounding):
    from npubuild import api
    from tests.conftest import TINY_RECIPE, write_recipe

    many = TINY_RECIPE.replace('"pkg:skimage/data/[a-c]*.png", samples: 2',
                               '"pkg:skimage/data/*.png", samples: 20, method: kl')
    assert many != TINY_RECIPE
    many += WEIGHT_ROUNDINGS[rounding]
    recipe = write_recipe(tmp_path, many)
    serial = api.session_for(recipe, build_root=tmp_path / "s", cache=tmp_path / "cs")
    api.build(serial, "quantize")
    fanned = api.session_for(recipe, build_root=tmp_path / "d", cache=tmp_path / "cd",
                             scheduler="local:2")
    api.build(fanned, "quantize")

    quantization = fanned.results["quantize"].report["quantization"]
    assert quantization["calibration_samples"] == 20
    assert ("weight_rounding_measured" in quantization) == (rounding == "measured")
    assert digests(tmp_path / "d" / "tiny" / "quantize") == digests(tmp_path / "s" / "tiny" / "quantize")


def test_verify_samples_on_dask_give_byte_identical_verify_artifacts(tmp_path, monkeypatch):
    """12 verify samples in two batches on two workers, which read the compiled program
    from the content cache (a copy: not the serial build's directory); in this process no
    sample may run."""
    import shutil

    from npubuild import api
    from tests.conftest import TINY_RECIPE, write_recipe

    recipe = write_recipe(tmp_path, TINY_RECIPE + 'verify: {data: "pkg:skimage/data/*.png", '
                                                  "samples: 12}\n")
    serial = api.session_for(recipe, build_root=tmp_path / "s", cache=tmp_path / "cs")
    api.build(serial, "compile")
    shutil.copytree(tmp_path / "cs", tmp_path / "cd")  # the upstream stages, restored below
    api.build(serial)

    no_sample_in_the_driver(monkeypatch)
    fanned = api.session_for(recipe, build_root=tmp_path / "d", cache=tmp_path / "cd",
                             scheduler="local:2")
    api.build(fanned)

    assert fanned.results["verify"].status == "built"
    assert fanned.results["compile"].status == "restored"
    assert fanned.results["verify"].report["accuracy"]["samples"] == 12
    fanned_files = digests(tmp_path / "d" / "tiny")
    assert {"verify/verify.json", "verify/manifest.json"} <= set(fanned_files)
    assert fanned_files == digests(tmp_path / "s" / "tiny")
    assert fanned.results["verify"].report == serial.results["verify"].report  # report.json's figures


def test_one_local_cluster_serves_calibration_and_verify_of_a_build(tmp_path, monkeypatch):
    """--scheduler local:2 on a whole build: the calibration batches and the verify samples run
    on the same cluster, started once (each fan-out used to start its own), and the artifacts
    are byte-identical to a build in one process."""
    from npubuild import api, distributed
    from tests.conftest import TINY_RECIPE, write_recipe

    started = []
    real = distributed._local_cluster

    def counted(*args):
        started.append(args[1])
        return real(*args)

    monkeypatch.setattr(distributed, "_local_cluster", counted)
    many = TINY_RECIPE.replace('"pkg:skimage/data/[a-c]*.png", samples: 2',
                               '"pkg:skimage/data/*.png", samples: 12')
    recipe = write_recipe(tmp_path, many + 'verify: {data: "pkg:skimage/data/*.png", samples: 12}\n')
    serial = api.session_for(recipe, build_root=tmp_path / "s", cache=tmp_path / "cs")
    api.build(serial)
    no_sample_in_the_driver(monkeypatch)
    fanned = api.session_for(recipe, build_root=tmp_path / "d", cache=tmp_path / "cd",
                             scheduler="local:2")
    api.build(fanned)

    assert started == ["local:2"]
    assert {fanned.results[s].status for s in ("quantize", "verify")} == {"built"}
    assert digests(tmp_path / "d" / "tiny") == digests(tmp_path / "s" / "tiny")


def test_outside_an_invocation_each_fan_out_has_its_own_client():
    from npubuild.distributed import one_cluster

    with one_cluster("local:1"):
        with dask_client("local:1") as first, dask_client("local:1") as second:
            assert first is second
    with dask_client("local:1") as third:
        assert third is not first


def test_the_precision_search_on_dask_writes_byte_identical_quantize_artifacts(tmp_path, monkeypatch):
    """A build whose int8 misses verify's bar, so the search scores choices: in one process,
    on one worker and on two, the quantize artifacts (search.json and the choice included)
    are byte-identical; with a scheduler no choice is scored and none confirmed on the
    integer reference in this process, and the build's one cluster serves calibration and
    every choice."""
    from npubuild import api, distributed
    from npubuild.quant.fakequant import FakeQuantPipeline
    from npubuild.quant.workflow import Workflow
    from tests.conftest import TINY_RECIPE, write_recipe

    started, judged = [], []
    real, deployed = distributed._local_cluster, Workflow.deployed_values
    monkeypatch.setattr(distributed, "_local_cluster",
                        lambda *args: started.append(args[1]) or real(*args))
    monkeypatch.setattr(Workflow, "deployed_values",
                        lambda *args: judged.append(1) or deployed(*args))

    searched = TINY_RECIPE.replace("quantization:\n", "quantization:\n  auto: {max_slowdown: 100000}\n")
    recipe = write_recipe(tmp_path, searched + 'verify: {data: "pkg:skimage/data/*.png", '
                                               "samples: 5, min_cosine: 0.9999}\n")
    serial = api.session_for(recipe, build_root=tmp_path / "s", cache=tmp_path / "cs")
    api.build(serial, "quantize")
    search = serial.results["quantize"].report["quantization"]["search"]
    assert search["evaluations"] > 1 and search["chosen"], search
    confirmations = len(json.loads((tmp_path / "s" / "tiny" / "quantize" / "search.json")
                                   .read_text())["confirmations"]) - 1  # the first: int8's
    in_driver, judged[:] = len(judged) - confirmations, []
    assert confirmations >= 1

    def no_score_here(self, samples, feeds, kept):
        raise AssertionError("a choice was scored in the driver, not on a worker")

    monkeypatch.setattr(FakeQuantPipeline, "run", no_score_here)
    for workers in (1, 2):
        fanned = api.session_for(recipe, build_root=tmp_path / f"d{workers}",
                                 cache=tmp_path / f"cd{workers}", scheduler=f"local:{workers}")
        api.build(fanned, "quantize")
        assert fanned.results["quantize"].report["quantization"]["search"] == search
        assert digests(tmp_path / f"d{workers}" / "tiny" / "quantize") == \
            digests(tmp_path / "s" / "tiny" / "quantize")
        assert len(judged) == in_driver  # int8's verdict and the final evaluation only
        judged[:] = []
    assert started == ["local:1", "local:2"]
