"""Field-by-field differences between two recipes: every changed leaf as a dotted path with its
old and new value, and list items (surgery steps, fusion rules, data files) as added, removed
or moved. Values are kept whole: a reviewer must see the step that was added, not its first
sixty characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

MISSING = object()  # a key one side does not have (distinct from an explicit null)


@dataclass(frozen=True)
class Change:
    """One difference: ``kind`` is changed, added, removed or moved (``path`` -> ``to``)."""

    path: str
    kind: str
    old: Any = None
    new: Any = None
    to: str | None = None

    def as_dict(self) -> dict:
        out = {"path": self.path, "kind": self.kind, "old": self.old, "new": self.new}
        return {**out, "to": self.to} if self.to else out

    def line(self) -> str:
        """``path: old -> new`` (or ``path: added VALUE``), values in full as JSON."""
        if self.kind == "changed":
            return f"{self.path}: {show(self.old)} -> {show(self.new)}"
        if self.kind == "moved":
            return f"{self.path} -> {self.to}: moved {show(self.old)}"
        return f"{self.path}: {self.kind} {show(self.old if self.kind == 'removed' else self.new)}"


def show(value: Any) -> str:
    """A value as compact JSON (nulls inside a mapping left out: they are the defaults)."""
    return json.dumps(_drop_nulls(value), separators=(", ", ": "), ensure_ascii=False)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def changes(a: Any, b: Any, path: str = "") -> list[Change]:
    """Every difference between ``a`` and ``b`` (JSON-like values), in document order."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [c for key in dict.fromkeys([*a, *b])
                for c in changes(a.get(key, MISSING), b.get(key, MISSING), _join(path, key))]
    if isinstance(a, list) and isinstance(b, list):
        return list_changes(a, b, path)
    if a is MISSING:
        return [Change(path, "added", new=b)]
    if b is MISSING:
        return [Change(path, "removed", old=a)]
    return [] if a == b else [Change(path, "changed", a, b)]


def list_changes(a: list, b: list, path: str) -> list[Change]:
    """Items aligned as `difflib` aligns lines, by identity (a rewrite step by its name): the
    same step with other arguments is compared field by field; an item removed at one place
    and found again at another is reported once, as moved; in a replaced run of equal length
    (``shape: [1, 3, 8, 8] -> [1, 3, 16, 16]``) items are compared pairwise; the rest are
    removed or added."""
    matcher = SequenceMatcher(None, [_identity(x) for x in a], [_identity(x) for x in b],
                              autojunk=False)
    out: list[Change] = []
    blocks = []  # (removed indices, added indices) of every non-equal run
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                out += changes(a[i], b[j], _index(path, i, j))
        else:
            blocks.append((list(range(i1, i2)), list(range(j1, j2))))
    moved = _moves(a, b, blocks)
    for removed, added in blocks:
        removed = [i for i in removed if i not in moved]
        added = [j for j in added if j not in moved.values()]
        if removed and len(removed) == len(added):
            for i, j in zip(removed, added):
                out += changes(a[i], b[j], _index(path, i, j))
            continue
        out += [Change(f"{path}[{i}]", "removed", old=a[i]) for i in removed]
        out += [Change(f"{path}[{j}]", "added", new=b[j]) for j in added]
    out += [Change(f"{path}[{i}]", "moved", a[i], a[i], f"{path}[{j}]") for i, j in moved.items()]
    return out


def _moves(a: list, b: list, blocks: list) -> dict[int, int]:
    """Removed index -> added index for items that appear unchanged on both sides."""
    free: dict[str, list[int]] = {}
    for _, added in blocks:
        for j in added:
            free.setdefault(_key(b[j]), []).append(j)
    return {i: free[_key(a[i])].pop(0) for removed, _ in blocks for i in removed
            if free.get(_key(a[i]))}


def _identity(value: Any) -> str:
    """What makes two list items "the same item": a one-key mapping (a rewrite step) by its
    key, a mapping with a ``name`` by that name, anything else by its whole value."""
    if isinstance(value, dict) and len(value) == 1:
        return "step:" + str(next(iter(value)))
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return "name:" + value["name"]
    return _key(value)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _index(path: str, i: int, j: int) -> str:
    return f"{path}[{j}]" if i == j else f"{path}[{i}→{j}]"
