"""Fusion rules written in the recipe, turned into a `Pattern` and applied like built-ins.

    fusion:
      - name: conv_relu                 # fused op ConvRelu
        pattern: [Conv, Relu]           # a chain: each op's first input is the previous op
        attributes: {Conv: {group: 1}}  # op type -> required attribute values
      - name: swish
        pattern:                        # the general form: ops with their inputs (edges)
          - {op: Sigmoid, inputs: [x]}
          - {op: Mul, inputs: [x, Sigmoid]}

An ``inputs`` entry is the id of an earlier op of the pattern (default id: the op type, or
``<op>_<position>`` when the type repeats), a variable name (the same name twice is the same
tensor; variables become the fused op's inputs), ``_`` for any tensor, or a number for a
constant of that value. Inputs an op has beyond those listed are free (fused op inputs too).
The last op is the root: its outputs are the fused op's. Attributes of the pattern's ops are
exposed on the fused node under their own names, or ``<id>_<name>`` where two ops share a name.
"""

from __future__ import annotations

from typing import Any

import lazy_loader as lazy

from npubuild.fusions import fused_op_name
from npubuild.fusions.pattern import Lit, Op, Pattern, Ref
from npubuild.fusions.rules import fuse_as_function

onnx = lazy.load("onnx")


def _items(rule) -> list[Any]:
    return [_Chained(item) if isinstance(item, str) else item for item in rule.pattern]


class _Chained:
    """A bare op type in a pattern list."""

    def __init__(self, op: str):
        self.op, self.id, self.inputs, self.attributes, self.domain = op, None, None, {}, ""


def _ids(items) -> list[str]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item.op] = counts.get(item.op, 0) + 1
    return [item.id or (item.op if counts[item.op] == 1 else f"{item.op}_{k}")
            for k, item in enumerate(items)]


def check_user_rule(rule) -> None:
    """Raise ValueError (shown with the recipe location) when the pattern is malformed."""
    items, ids = _items(rule), _ids(_items(rule))
    if len(set(ids)) != len(ids):
        raise ValueError(f"pattern ids repeat: {ids}; give the ops distinct `id`s")
    feeds: dict[str, set[str]] = {}
    for k, (item, op_id) in enumerate(zip(items, ids)):
        refs = _refs(item, k, ids)
        later = [r for r in refs if isinstance(r, str) and r in ids[k:]]
        if later:
            raise ValueError(f"op {op_id!r} reads {later[0]!r}, which is not an earlier op; "
                             "list producers first")
        feeds[op_id] = {r for r in refs if isinstance(r, str) and r in ids}
    reached, todo = set(), [ids[-1]]
    while todo:
        op_id = todo.pop()
        if op_id not in reached:
            reached.add(op_id)
            todo.extend(feeds[op_id])
    stray = [i for i in ids if i not in reached]
    if stray:
        raise ValueError(f"op {stray[0]!r} does not feed the last op {ids[-1]!r}; a pattern "
                         "is the ops that produce its last op's output")


def _refs(item, position: int, ids: list[str]) -> tuple[Ref, ...]:
    if item.inputs is None:
        return (ids[position - 1],) if position else ()
    refs: list[Ref] = []
    for k, entry in enumerate(item.inputs):
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            refs.append(Lit(float(entry)))
        elif entry == "_":
            refs.append(f"any_{ids[position]}_{k}")
        else:
            refs.append(str(entry))
    return tuple(refs)


def _prefixes(items, ids) -> dict[str, str]:
    names: dict[str, list[str]] = {}
    for item, op_id in zip(items, ids):
        for attr in _schema_attributes(item):
            names.setdefault(attr, []).append(op_id)
    shared = {op_id for owners in names.values() if len(owners) > 1 for op_id in owners}
    return {op_id: f"{op_id}_" if op_id in shared else "" for op_id in ids}


def _schema_attributes(item) -> list[str]:
    try:
        return list(onnx.defs.get_schema(item.op, item.domain or "").attributes)
    except Exception:  # an op without a schema keeps its attributes inside the body
        return []


def user_pattern(rule) -> Pattern:
    items = _items(rule)
    ids = _ids(items)
    prefixes = _prefixes(items, ids)
    ops = tuple(Op(item.op, _refs(item, k, ids), id=ids[k], domain=item.domain or "",
                   attrs={**rule.attributes.get(item.op, {}), **item.attributes},
                   expose=prefixes[ids[k]])
                for k, item in enumerate(items))
    return Pattern(ops)


def apply_user_rule(model, rule):
    """Apply a recipe's `UserFusionRule`: its matches become ``npubuild.fused.<Name>`` nodes."""
    return fuse_as_function(model, rule.name, [user_pattern(rule)], op_name=fused_op_name(rule.name))
