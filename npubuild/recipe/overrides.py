"""Experiments: a recipe with some fields set from outside (``npubuild run R -S key=value``,
``Recipe.with_(**{"key": value})``), validated exactly as the recipe file is, with errors at the
base recipe's file and line.

An override is a dotted field path (``quantization.calibration.method``, ``model.inputs[0].shape``,
``surgery[0].fold_constants.max_rounds``) and a value; on the command line the value is read as
a YAML scalar or flow collection (``0.99``, ``true``, ``kl``, ``[1, 3, 640, 640]``). The same key
given several times makes a matrix: one variant per value, the product over keys
(`variants`). Each variant builds into its own directory, ``build/<name>@<label>/``
(`variant_label`): the chip's name when only ``target`` is set (a matrix over chips), else
``exp-`` and 8 hex digits of the overrides' hash.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from typing import Any

import yaml

from npubuild.errors import UserError
from npubuild.recipe.load import FieldPath, Marked, dotted


TOKEN = re.compile(r"(?P<name>[^.\[\]]+)|\[(?P<index>[^\]]*)\]|(?P<dot>\.)")


def field_path(key: str) -> FieldPath:
    """``model.inputs[0].shape`` -> ("model", "inputs", 0, "shape"); a user error when it is not
    a dotted path."""
    parts: list[str | int] = []
    expect_name, position = True, 0
    for match in TOKEN.finditer(key):
        if match.start() != position:
            break
        position = match.end()
        if match["dot"] is not None:
            if expect_name:
                raise UserError(f"-S {key}: an empty field name", hint=SET_HINT)
            expect_name = True
        elif match["name"] is not None:
            if not expect_name:
                break
            parts.append(match["name"])
            expect_name = False
        else:
            if expect_name or not match["index"].isdigit():
                raise UserError(f"-S {key}: [{match['index']}] is not a list index", hint=SET_HINT)
            parts.append(int(match["index"]))
    if position != len(key) or expect_name:
        raise UserError(f"-S {key}: not a dotted field path", hint=SET_HINT)
    return tuple(parts)


SET_HINT = ("give -S FIELD=VALUE with FIELD a dotted path, e.g. -S quantization.scheme=symmetric "
            "or -S model.inputs[0].shape=[1,3,640,640]")


def parse_set(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is YAML (``0.99`` a float, ``kl`` a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"-S {text}: expected FIELD=VALUE", hint=SET_HINT)
    field_path(key)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise UserError(f"-S {text}: the value is not YAML: {str(exc).splitlines()[0]}",
                        hint="quote a string that YAML reads otherwise: -S 'name=\"a: b\"'") from None
    return dotted(field_path(key)), value


def variants(sets: list[str]) -> list[dict[str, Any]]:
    """The experiments ``-S`` asks for: values of one key are alternatives, different keys
    combine (``-S a=1 -S a=2 -S b=x`` -> {a: 1, b: x}, {a: 2, b: x}); [] without ``-S``."""
    by_key: dict[str, list[Any]] = {}
    for text in sets:
        key, value = parse_set(text)
        if value not in by_key.setdefault(key, []):
            by_key[key].append(value)
    keys = list(by_key)
    return [dict(zip(keys, combo)) for combo in itertools.product(*by_key.values())] if keys else []


def apply(marked: Marked, overrides: dict[str, Any]) -> Marked:
    """A copy of the recipe's YAML data with every override set (missing mappings created);
    positions stay the base recipe's, so an error points at the line the field (or the
    nearest enclosing one) has there."""
    data = copy.deepcopy(marked.data)
    for key, value in overrides.items():
        path = field_path(key)
        parent = data
        for i, part in enumerate(path[:-1]):
            parent = _child(parent, part, path[i + 1], key)
        _set(parent, path[-1], copy.deepcopy(value), key)
    return Marked(marked.file, data, marked.values, marked.keys)


def _child(node: Any, part: str | int, next_part: str | int, key: str) -> Any:
    if isinstance(part, int):
        _check_index(node, part, key)
        return node[part]
    if not isinstance(node, dict):
        raise UserError(f"-S {key}: cannot set {part!r} inside a {type(node).__name__}", hint=SET_HINT)
    if node.get(part) is None:
        node[part] = [] if isinstance(next_part, int) else {}
    return node[part]


def _set(node: Any, part: str | int, value: Any, key: str) -> None:
    if isinstance(part, int):
        _check_index(node, part, key)
    elif not isinstance(node, dict):
        raise UserError(f"-S {key}: cannot set {part!r} inside a {type(node).__name__}", hint=SET_HINT)
    node[part] = value


def _check_index(node: Any, index: int, key: str) -> None:
    if not isinstance(node, list):
        raise UserError(f"-S {key}: [{index}] indexes a {type(node).__name__}, not a list",
                        hint=SET_HINT)
    if index >= len(node):
        raise UserError(f"-S {key}: index {index} is past the end of a list of {len(node)}",
                        hint=SET_HINT)


def located(exc: UserError, overrides: dict[str, Any]) -> UserError:
    """A validation error of an overridden recipe, naming the override that caused it (the
    location stays the base recipe's line)."""
    field = field_path(exc.field) if exc.field else ()
    culprit = next((k for k in overrides
                    if field[:len(field_path(k))] == field_path(k) or
                    field_path(k)[:len(field)] == field and field), None)
    if culprit is None:
        return exc
    shown = json.dumps(overrides[culprit], ensure_ascii=False)
    where = "" if exc.field == culprit else f"{culprit} "
    return UserError(f"{where}overridden with {shown}: {exc.message}", location=exc.location,
                     field=exc.field, hint=exc.hint)


def variant_label(overrides: dict[str, Any]) -> str:
    """``npu-tiny`` for a chip alone (a matrix over chips), else ``exp-<8 hex digits>`` of the
    overrides (sorted keys, canonical JSON: the same set always names the same directory)."""
    if set(overrides) == {"target"} and isinstance(overrides["target"], str):
        target = overrides["target"]
        return target.rsplit("/", 1)[-1].rsplit(".", 1)[0] if target.endswith((".yaml", ".yml")) \
            else target
    canonical = json.dumps(overrides, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "exp-" + hashlib.sha256(canonical.encode()).hexdigest()[:8]


def get(data: Any, key: str) -> Any:
    """The value at a dotted field path of recipe data (None where it is not set)."""
    for part in field_path(key):
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and part < len(data) else None
        else:
            data = data.get(part) if isinstance(data, dict) else None
    return data
