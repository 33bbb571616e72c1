"""The backend registry names its built-ins without importing them (a chip file's ``backend``
is checked by `npubuild validate` without vendor code, numpy or ONNX) and imports the one a
build asks for, which registers under the name it is listed by."""

from __future__ import annotations

import subprocess
import sys

from npubuild import backends
from tests.conftest import EXECUTED, REPO


def test_each_builtin_module_registers_the_backend_it_is_listed_as():
    for name in backends.BUILTIN_MODULES:
        assert backends.get(name).name == name
    assert backends.names()[:len(backends.BUILTIN_MODULES)] == list(backends.BUILTIN_MODULES)


def test_loading_a_chip_imports_no_backend_module():
    code = EXECUTED + ("from npubuild.targets import load_chip; load_chip('ethos-u55-256'); "
                       "print(sorted(m for m in sys.modules if m.startswith('npubuild.backends.')), "
                       "executed('numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["[]", "False"]
