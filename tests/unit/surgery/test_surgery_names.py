"""The surgery registry names its built-in rewrites without importing them, in the order its
modules register them, and imports a rewrite's module when it is asked for by name."""

from __future__ import annotations

from importlib import import_module

from npubuild import surgery


def test_each_builtin_rewrite_is_registered_by_the_module_it_is_listed_with():
    for name, module in surgery.BUILTIN_REWRITES.items():
        import_module(module)
        assert name in surgery.SURGERY, (name, module)
        assert surgery.SURGERY.get(name) is surgery.SURGERY[name]
    registered = surgery.load_builtins().names()
    assert registered[:len(surgery.BUILTIN_REWRITES)] == list(surgery.BUILTIN_REWRITES)
    assert surgery.SURGERY.known() == registered
    assert set(surgery.BUILTIN_REWRITES.values()) == set(surgery.BUILTIN_MODULES)
