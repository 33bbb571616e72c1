"""The fusion registry names its built-in rules without importing them (validating a recipe,
and its JSON Schema, need the names only) and in the order its modules register them."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

from npubuild import fusions
from tests.conftest import REPO


def test_each_builtin_rule_is_registered_by_the_module_it_is_listed_with():
    for name, module in fusions.BUILTIN_RULES.items():
        import_module(module)
        assert name in fusions.FUSIONS, (name, module)
    assert sorted(fusions.FUSIONS.known()) == sorted(fusions.load_builtins().names())


def test_a_fresh_process_registers_the_builtin_rules_in_their_listed_order():
    """In a fresh interpreter: in this one, another test may have imported a rule's module
    first (the ONNX frontend's layer norm does), which registers it earlier."""
    code = ("from npubuild import fusions; names = fusions.load_builtins().names(); "
            "print(names[:len(fusions.BUILTIN_RULES)] == list(fusions.BUILTIN_RULES), "
            "fusions.FUSIONS.known() == names)")
    assert fresh_python(code) == ["True", "True"]


def test_loading_a_recipe_imports_no_fusion_rule():
    code = ("import sys; from npubuild.recipe import load_recipe; "
            "loaded = load_recipe('recipes/yolov8.yaml'); print(loaded.recipe.fusion, "
            "sorted(m for m in sys.modules if m.startswith('npubuild.fusions.')))")
    assert fresh_python(code) == ["['conv_silu']", "[]"]


def fresh_python(code: str) -> list[str]:
    """The words ``code`` prints, run in a new interpreter of this tree."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return out.stdout.split()
