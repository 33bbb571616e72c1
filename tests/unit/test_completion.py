"""`npubuild completion bash|zsh` prints a script made from the parser: commands, options,
stages, chips and the recipe fields -S takes complete in a real bash."""

import shutil
import subprocess

import pytest

from tests.conftest import REPO, run_cli

BASH = shutil.which("bash")


def complete(script: str, *words: str) -> list[str]:
    probe = (script + '\nCOMP_WORDS=(' + " ".join(f"'{w}'" for w in words) + ')\n'
             'COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=(); _npubuild\n'
             'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run([BASH, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.fixture(scope="module")
def bash_script():
    result = run_cli("completion", "bash")
    assert result.returncode == 0 and "complete -o filenames -F _npubuild npubuild" in result.stdout
    return result.stdout


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("words, expected", [
    (("npubuild", "ex"), ["exp"]),
    (("npubuild", "run", "recipes/yolov8.yaml", "quan"), ["quantize"]),
    (("npubuild", "run", "--target", "npu-t"), ["npu-tiny"]),
    (("npubuild", "run", "-S", "verify.min_c"), ["verify.min_cosine=", "verify.min_channel_cosine="]),
    (("npubuild", "diff", "--fail-on", ""), ["regression", "fail"]),
    (("npubuild", "run", "recipes/yolov8-s"), ["recipes/yolov8-strict.yaml"]),
])
def test_bash_completes_commands_stages_chips_and_fields(bash_script, words, expected):
    assert sorted(complete(bash_script, *words)) == sorted(expected)


def test_zsh_gets_the_same_script_through_bashcompinit(bash_script):
    zsh = run_cli("completion", "zsh").stdout
    assert zsh.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert zsh.endswith(bash_script)
