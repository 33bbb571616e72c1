"""The no-op fast path: a run that finds everything as the last no-op left it replays that
run's output without loading the recipe; any change to what the up-to-date check reads sends
the run down the ordinary path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.conftest import TINY_RECIPE, write_recipe

PROBE = ("import sys, runpy; sys.argv = ['npubuild', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('npubuild', run_name='__main__')\n"
         "except SystemExit as exc:\n    code = exc.code\n"
         "heavy = {m.split('.')[0] for m in sys.modules} & set(HEAVY)\n"
         "print(f'LOADED {sorted(heavy)}' if heavy or 'npubuild.recipe.model' in sys.modules"
         " else 'FAST', file=sys.stderr)\nsys.exit(code)\n")
#: What a replay never imports: the recipe model's libraries, the stages', the CLI's printing
#: and the servers of other commands (the parser of every command is built on each start).
HEAVY = {"numpy", "pydantic", "onnx", "yaml", "rich", "doit", "http", "webbrowser"}


def run(tmp: Path, recipe: Path, *extra: str, env: dict | None = None):
    return npubuild(tmp, "run", str(recipe), "import", "--build-dir", str(tmp / "build"),
                    "--cache", str(tmp / "cache"), *extra, env=env)


def validate(tmp: Path, *recipes: Path, returncode: int = 0):
    return npubuild(tmp, "validate", *map(str, recipes), returncode=returncode)


def npubuild(tmp: Path, *argv: str, env: dict | None = None, returncode: int = 0):
    """(stdout, stderr, replayed) of one npubuild command in ``tmp``."""
    import subprocess
    import sys

    probe = f"HEAVY = {sorted(HEAVY)!r}\n" + PROBE
    proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=tmp,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "TERM": "dumb", **(env or {})})
    assert proc.returncode == returncode, proc.stderr
    *printed, probe_line = proc.stderr.rstrip("\n").split("\n")
    return proc.stdout, "\n".join(printed), probe_line == "FAST"


def test_a_second_no_op_replays_the_first_without_loading_the_recipe(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    run(tmp_path, recipe)  # builds
    out1, _, fast1 = run(tmp_path, recipe)  # a no-op on the ordinary path: stamps
    out2, err2, fast2 = run(tmp_path, recipe)
    assert (fast1, fast2) == (False, True)
    assert out2 == out1 and "nothing to rebuild" in err2
    out3, _, fast3 = run(tmp_path, recipe, "--json")  # another command: its own stamp
    assert not fast3 and json.loads(out3)["stages"]["import"]["status"] == "current"


def test_any_change_the_up_to_date_check_reads_takes_the_ordinary_path(tmp_path):
    model = tmp_path / "tiny.onnx"
    shutil.copy(Path(TINY_RECIPE.split("path: ")[1].split("\n")[0]), model)
    recipe = write_recipe(tmp_path, TINY_RECIPE.replace(TINY_RECIPE.split("path: ")[1]
                                                        .split("\n")[0], str(model)))
    run(tmp_path, recipe)
    run(tmp_path, recipe)
    assert run(tmp_path, recipe)[2]

    recipe.write_text(recipe.read_text() + "# a comment\n")  # the recipe
    assert not run(tmp_path, recipe)[2]
    assert run(tmp_path, recipe)[2]

    artifact = tmp_path / "build" / "tiny" / "import" / "model.onnx"  # an artifact
    artifact.write_bytes(artifact.read_bytes())
    _, err, fast = run(tmp_path, recipe)
    assert not fast
    assert run(tmp_path, recipe)[2]

    model.write_bytes(model.read_bytes())  # the source model, rewritten (ctime changes)
    _, err, fast = run(tmp_path, recipe)
    assert not fast and "import" in err
    assert run(tmp_path, recipe)[2]

    assert not run(tmp_path, recipe, env={"NPUBUILD_REMOTE": str(tmp_path / "remote")})[2]


def test_a_recipe_saved_unchanged_replays_and_a_changed_byte_does_not(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    run(tmp_path, recipe)
    out, _, _ = run(tmp_path, recipe)
    recipe.write_bytes(recipe.read_bytes())  # an editor's save: new mtime and ctime, same bytes
    os.utime(recipe)
    again, _, fast = run(tmp_path, recipe)
    assert fast and again == out
    assert validate(tmp_path, recipe)[2] is False
    recipe.write_bytes(recipe.read_bytes())
    assert validate(tmp_path, recipe)[2]

    recipe.write_text(recipe.read_text().replace("name: tiny", "name: tinz"))  # one byte
    assert not run(tmp_path, recipe)[2] and not validate(tmp_path, recipe)[2]


def test_a_new_file_matching_a_data_glob_takes_the_ordinary_path(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    source = Path(__import__("skimage").__file__).parent / "data"
    for name in ("astronaut.png", "camera.png"):
        shutil.copy(source / name, data / name)
    body = TINY_RECIPE.replace('"pkg:skimage/data/[a-c]*.png"', f'"{data}/*.png"')
    assert body != TINY_RECIPE
    recipe = write_recipe(tmp_path, body)
    run(tmp_path, recipe)
    run(tmp_path, recipe)
    assert run(tmp_path, recipe)[2]
    shutil.copy(source / "coffee.png", data / "coffee.png")
    assert not run(tmp_path, recipe)[2]


def test_force_and_experiments_never_replay_another_commands_stamp(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    run(tmp_path, recipe)
    run(tmp_path, recipe)
    assert run(tmp_path, recipe)[2]

    out, err, fast = run(tmp_path, recipe, "--force", "import")  # runs import again
    assert not fast and "built" in out + err
    assert not run(tmp_path, recipe, "--force", "import")[2]  # never replayed, even twice
    run(tmp_path, recipe)  # the forced run rewrote the artifacts: the ordinary path stamps
    assert run(tmp_path, recipe)[2]

    experiment = ("-S", "quantization.calibration.samples=1")
    out, err, fast = run(tmp_path, recipe, *experiment)
    assert not fast and "experiment tiny@" in out + err
    run(tmp_path, recipe, *experiment)
    out_again, err_again, fast = run(tmp_path, recipe, *experiment)  # its own stamp and output
    assert fast and "experiment tiny@" in out_again + err_again
    assert run(tmp_path, recipe)[2]  # and the plain command keeps its own


def test_an_installed_or_removed_package_takes_the_ordinary_path(tmp_path):
    site = tmp_path / "site"  # a folder on sys.path, as site-packages is
    site.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    run(tmp_path, recipe, env=env)
    run(tmp_path, recipe, env=env)
    assert run(tmp_path, recipe, env=env)[2]
    (site / "onnx-99.0.dist-info").mkdir()  # what pip leaves when it upgrades a package
    assert not run(tmp_path, recipe, env=env)[2]  # onnx's version enters the keys: rebuilds
    run(tmp_path, recipe, env=env)
    assert run(tmp_path, recipe, env=env)[2]
    (site / "onnx-99.0.dist-info").rmdir()
    assert not run(tmp_path, recipe, env=env)[2]


def test_a_toolchain_installed_or_named_takes_the_ordinary_path(tmp_path):
    from npubuild import toolchains
    from npubuild.toolchains import env as toolchain_env

    root = tmp_path / "toolchains"
    env = {"NPUBUILD_TOOLCHAINS": str(root)}
    recipe = write_recipe(tmp_path, TINY_RECIPE + "target: ethos-u55-256\n")
    run(tmp_path, recipe, env=env)
    run(tmp_path, recipe, env=env)
    assert run(tmp_path, recipe, env=env)[2]

    vela = toolchains.get("vela")
    marker = root / vela.folder / toolchain_env.MARKER  # what `toolchain install vela` writes last
    marker.parent.mkdir(parents=True)
    assert not run(tmp_path, recipe, env=env)[2]
    run(tmp_path, recipe, env=env)
    assert run(tmp_path, recipe, env=env)[2]
    marker.write_text("{}")
    assert not run(tmp_path, recipe, env=env)[2]

    named = {**env, vela.override_variable: os.path.dirname(os.path.dirname(os.sys.executable))}
    run(tmp_path, recipe, env=named)
    run(tmp_path, recipe, env=named)
    assert not run(tmp_path, recipe, env=named)[2]  # the user's environment: asked every run


def test_a_second_validate_replays_the_first_without_loading_the_recipe(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    out1, err1, fast1 = validate(tmp_path, recipe)
    out2, err2, fast2 = validate(tmp_path, recipe)
    assert (fast1, fast2) == (False, True)
    assert "valid" in out1 and (out2, err2) == (out1, err1)
    assert not validate(tmp_path, recipe, recipe)[2]  # other arguments: their own stamp


def test_validate_checks_again_after_a_change_to_what_it_read(tmp_path):
    model = tmp_path / "tiny.onnx"
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(Path(TINY_RECIPE.split("path: ")[1].split("\n")[0]), model)
    source = Path(__import__("skimage").__file__).parent / "data"
    for name in ("astronaut.png", "camera.png"):
        shutil.copy(source / name, data / name)
    body = (TINY_RECIPE.replace(TINY_RECIPE.split("path: ")[1].split("\n")[0], str(model))
            .replace('"pkg:skimage/data/[a-c]*.png"', f'"{data}/*.png"'))
    recipe = write_recipe(tmp_path, body)
    validate(tmp_path, recipe)
    assert validate(tmp_path, recipe)[2]

    recipe.write_text(recipe.read_text() + "# a comment\n")  # the recipe
    assert not validate(tmp_path, recipe)[2]
    assert validate(tmp_path, recipe)[2]

    model.write_bytes(model.read_bytes())  # the model, rewritten
    assert not validate(tmp_path, recipe)[2]
    assert validate(tmp_path, recipe)[2]

    shutil.copy(source / "coffee.png", data / "coffee.png")  # a file the data glob matches
    assert not validate(tmp_path, recipe)[2]
    assert validate(tmp_path, recipe)[2]

    model.unlink()
    out, err, fast = validate(tmp_path, recipe, returncode=2)
    assert not fast and "tiny.onnx" in err
    assert not validate(tmp_path, recipe, returncode=2)[2]  # a failure is never stamped


def test_a_validate_that_warned_is_never_replayed(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    (tmp_path / "other").mkdir()
    other = write_recipe(tmp_path / "other", TINY_RECIPE)  # the same name: it owns build/tiny/
    run(tmp_path, other)
    _, err, fast = validate(tmp_path, recipe)
    assert not fast and "warning:" in err
    _, err, fast = validate(tmp_path, recipe)
    assert not fast and "warning:" in err
