"""The project's ``cache``/``remote`` settings (npubuild.toml or [tool.npubuild] in
pyproject.toml, found upward from the recipe): precedence flag > environment > setting >
default, paths relative to the settings file, and never credentials."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from npubuild import api
from npubuild.engine.paths import DEFAULT_CACHE_DIR
from npubuild.engine.settings import Settings, find_settings
from npubuild.errors import UserError
from tests.conftest import TINY_RECIPE, run_cli, write_recipe


@pytest.fixture(autouse=True)
def no_cache_environment(monkeypatch):
    for name in ("NPUBUILD_CACHE", "NPUBUILD_REMOTE"):
        monkeypatch.delenv(name, raising=False)


def project(root: Path, settings: str, name: str = "npubuild.toml") -> Path:
    """A project with a settings file at ``root`` and the tiny recipe two folders below."""
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(textwrap.dedent(settings))
    (root / "deploy" / "recipes").mkdir(parents=True, exist_ok=True)
    return write_recipe(root / "deploy" / "recipes", TINY_RECIPE)


def test_the_nearest_npubuild_toml_names_the_cache_relative_to_itself(tmp_path):
    recipe = project(tmp_path, 'cache = "store"\nremote = "s3://team/npubuild"\n')
    session = api.session_for(recipe, build_root=tmp_path / "b")
    assert session.cache.root == tmp_path / "store"
    assert session.settings.remote == "s3://team/npubuild"


def test_pyproject_tool_npubuild_is_read_and_a_pyproject_without_it_is_passed_over(tmp_path):
    recipe = project(tmp_path, '[project]\nname = "x"\n\n[tool.npubuild]\ncache = "c"\n',
                     name="pyproject.toml")
    (tmp_path / "deploy" / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    assert find_settings(recipe.parent) == Settings(cache=tmp_path / "c",
                                                    source=tmp_path / "pyproject.toml")


def test_no_settings_file_leaves_the_default(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    assert api.session_for(recipe).cache.root == DEFAULT_CACHE_DIR


def test_a_url_as_the_cache_setting_is_the_remote_level(tmp_path):
    recipe = project(tmp_path, 'cache = "gs://bucket/prefix"\n')
    assert find_settings(recipe.parent) == Settings(remote="gs://bucket/prefix",
                                                    source=tmp_path / "npubuild.toml")


def test_the_flag_beats_the_environment_which_beats_the_setting(tmp_path, monkeypatch):
    recipe = project(tmp_path, 'cache = "from-setting"\nremote = "file:///from-setting"\n')
    assert api.session_for(recipe).cache.root == tmp_path / "from-setting"
    monkeypatch.setenv("NPUBUILD_CACHE", str(tmp_path / "from-env"))
    monkeypatch.setenv("NPUBUILD_REMOTE", "file:///from-env")
    session = api.session_for(recipe)
    assert session.cache.root == tmp_path / "from-env"
    assert session.remote.url == "file:///from-env"
    session = api.session_for(recipe, cache=tmp_path / "from-flag", remote="file:///from-flag")
    assert session.cache.root == tmp_path / "from-flag"
    assert session.remote.url == "file:///from-flag"


@pytest.mark.parametrize("settings, message, line", [
    ('cache = "c"\naws_secret_access_key = "abc"\n', "unknown setting 'aws_secret_access_key'", 2),
    ('remote = "s3://AKIA:secret@bucket/x"\n', "never hold credentials", 1),
    ('cache = 3\n', "must be a non-empty string", 1),
    ('cache = "c\n', "not valid TOML", 1),
    ('remote = "s3://b/p"\ntrusted_keys = ["ssh-ed25519 AAAA"]\n', "write ed25519:<base64>", 2),
    ('trusted_keys = "ed25519:AAAA"\n', "must be a list of public keys", 1),
])
def test_bad_settings_are_one_user_error_at_the_file_and_line(tmp_path, settings, message, line):
    recipe = project(tmp_path, settings)
    with pytest.raises(UserError, match=message) as info:
        api.session_for(recipe)
    assert info.value.location.file == str(tmp_path / "npubuild.toml")
    assert info.value.location.line == line


def test_the_cli_builds_into_the_settings_cache_and_pushes_to_its_remote(tmp_path, signing_key):
    recipe = project(tmp_path, f'cache = "store"\nremote = "file://{tmp_path}/remote"\n')
    result = run_cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "b"),
                     cwd=tmp_path / "deploy")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "store").glob("*/*/manifest.json"))
    assert list((tmp_path / "remote").glob("*/*/manifest.json"))


def test_the_cli_reports_a_secret_in_the_settings_with_exit_2(tmp_path):
    recipe = project(tmp_path, '[tool.npubuild]\nremote = "s3://b/p"\ntoken = "x"\n',
                     name="pyproject.toml")
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{tmp_path / 'pyproject.toml'}:3: tool.npubuild.token: unknown setting" in result.stderr
    assert "never from a settings file" in result.stderr and "Traceback" not in result.stderr


def test_the_readme_settings_example_is_valid(tmp_path):
    import re

    from tests.conftest import REPO

    [block] = re.findall(r"^ *```toml\n(.*?)^ *```$", (REPO / "README.md").read_text(), re.S | re.M)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(block))
    settings = find_settings(tmp_path)
    assert settings == Settings(cache=tmp_path / ".npubuild/cache",
                                remote="s3://team-bucket/npubuild",
                                source=tmp_path / "pyproject.toml",
                                trusted_keys=settings.trusted_keys)
    assert len(settings.trusted_keys) == 1
