"""fps after a cache restore and `run --force [STAGE]`: a build restored from a cache another
build filled keeps the NPU's fps (deterministic, in the artifacts) and says why the CPU part is
missing (timed only where compile runs); `--force compile` runs compile again and measures it;
the run's headline is pinned by a golden file."""

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import TINY_RECIPE, run_cli, write_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"
CPU_RECIPE = TINY_RECIPE + "split: {force_cpu: [relu]}\n"  # a CPU segment: a part to time


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Machine A builds into the shared cache; machine B (another build directory) restores."""
    root = tmp_path_factory.mktemp("restore")
    recipe = write_recipe(root, CPU_RECIPE)
    a = run_cli("run", str(recipe), "--build-dir", str(root / "a"), "--cache", str(root / "cache"))
    b = run_cli("run", str(recipe), "--build-dir", str(root / "b"), "--cache", str(root / "cache"))
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    return root, recipe, a, b


def test_the_headline_of_a_build_matches_its_golden_file(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"), "--cache",
                     str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    text = result.stdout.replace(str(tmp_path), "TMP")
    golden = GOLDEN / "headline_tiny.txt"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()


def test_a_restored_build_keeps_the_npu_fps_and_says_why_the_cpu_part_is_missing(machines):
    _, _, a, b = machines
    assert re.search(r"^[\d,]+ fps deployed, [\d.]+ µs per frame \(NPU alone [\d,]+ fps\)$",
                     a.stdout, re.M)
    line = next(x for x in b.stdout.splitlines() if "fps" in x)
    assert re.match(r"^[\d,]+ fps NPU alone; deployed fps unknown: CPU part not measured here: "
                    r"compile was restored from a cache, and its 1 CPU part \(graph_1\) is timed "
                    r"with ONNX Runtime only where compile runs; `npubuild run R --force compile` "
                    r"measures them$", line), line
    npu_a = re.search(r"NPU alone ([\d,]+) fps", a.stdout).group(1)
    assert line.startswith(f"{npu_a} fps NPU alone")  # the NPU's figure is the same everywhere


def test_force_compile_runs_it_again_and_measures_the_cpu_part(machines):
    root, recipe, _, _ = machines
    forced = run_cli("run", str(recipe), "--force", "compile", "--build-dir", str(root / "b"),
                     "--cache", str(root / "cache"))
    assert forced.returncode == 0, forced.stderr
    assert re.search(r"  compile   built .* \(forced \(--force\): run again, measurements taken "
                     r"again\)", forced.stderr)
    assert "  current: import, surgery, fusion, split, quantize, verify" in forced.stderr
    estimate = json.loads((root / "b" / "tiny" / "report.json").read_text())["estimate"]
    assert estimate["fps"] > 0 and estimate["cpu_seconds"] > 0
    assert re.search(r"^[\d,]+ fps deployed", forced.stdout, re.M)


def test_force_alone_runs_every_stage_and_an_unknown_stage_gets_did_you_mean(machines):
    root, recipe, _, _ = machines
    plan = run_cli("plan", str(recipe), "--build-dir", str(root / "b"), "--cache", str(root / "cache"))
    assert "will run" not in plan.stdout
    bad = run_cli("run", str(recipe), "--force", "compiel", "--build-dir", str(root / "b"),
                  "--cache", str(root / "cache"))
    assert bad.returncode == 2 and "--force compiel: no such stage; did you mean 'compile'?" in bad.stderr
    every = run_cli("run", str(recipe), "split", "--force", "--build-dir", str(root / "b"),
                    "--cache", str(root / "cache"))
    assert every.returncode == 0, every.stderr
    assert [line.split()[0] for line in every.stderr.splitlines() if " built " in line] == [
        "import", "surgery", "fusion", "split"]
