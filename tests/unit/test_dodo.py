"""dodo.py exposes every recipe's stages to plain doit, through the same task builder."""

import subprocess
import sys

from tests.conftest import REPO


def test_doit_list_shows_every_recipe_stage():
    result = subprocess.run([sys.executable, "-m", "doit", "list", "--all"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    for recipe in ("yolov8n", "yolov8n-strict", "resnet50", "mobilenetv2-tf"):
        assert {f"{recipe}:import", f"{recipe}:split", f"{recipe}:verify"} <= names
