"""YAML → validated pydantic models, with errors that name file, line, column and field.

The YAML is composed once with PyYAML's safe loader (no tags that run code); node marks give
each value's position. A pydantic error's location is mapped back onto those marks.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from npubuild.errors import Location, UserError

M = TypeVar("M", bound=BaseModel)
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: same marks, faster
FieldPath = tuple[str | int, ...]


@dataclass
class Marked:
    """YAML data plus the (line, column) of every key and value, by field path."""

    file: str
    data: Any
    values: dict[FieldPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[FieldPath, tuple[int, int]] = field(default_factory=dict)

    def location(self, path: FieldPath, *, key: bool = False) -> Location:
        """The position of ``path``'s value (or key), else of its nearest ancestor."""
        table = self.keys if key else self.values
        while path and path not in table:
            path = path[:-1]
        line, col = table.get(path, self.values.get((), (1, 1)))
        return Location(self.file, line, col)


def read_yaml(path: Path, display: str | None = None) -> Marked:
    display = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"file not found: {display}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {display}: {exc}") from None
    loader = SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(display, mark.line + 1, mark.column + 1) if mark else Location(display)
        raise UserError(f"YAML syntax error: {exc.problem or exc.context}", location=where) from None
    except yaml.YAMLError as exc:
        raise UserError(f"YAML error: {exc}", location=Location(display)) from None
    finally:
        loader.dispose()
    marked = Marked(display, data)
    if node is not None:
        _record_marks(node, (), marked)
    return marked


def _record_marks(node: yaml.Node, path: FieldPath, marked: Marked) -> None:
    marked.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
            if path + (key,) in marked.keys:
                first_line = marked.keys[path + (key,)][0]
                raise UserError(f"duplicate key {key!r} (first given on line {first_line})",
                                location=Location(marked.file, key_node.start_mark.line + 1,
                                                  key_node.start_mark.column + 1),
                                field=dotted(path + (key,)))
            marked.keys[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _record_marks(value_node, path + (key,), marked)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_marks(item, path + (index,), marked)


def validate(marked: Marked, model: type[M]) -> M:
    """Validate YAML data against ``model``; the first problem becomes one located UserError."""
    if not isinstance(marked.data, dict):
        raise UserError(f"expected a mapping of {model.__name__} fields at the top level",
                        location=marked.location(()))
    try:
        return model.model_validate(marked.data)
    except ValidationError as exc:
        raise _located_error(exc, marked, model) from None


def load_yaml_model(path: Path, model: type[M], display: str | None = None) -> M:
    return validate(read_yaml(path, display), model)


def _data_path(loc: tuple, data: Any) -> FieldPath:
    """Drop the union tags pydantic inserts into ``loc``, keeping the keys that exist in data.

    A tagged union of single-key steps (``surgery: [{name: {args}}]``) repeats the tag as the
    field name right after the list index; the first of the two is the tag."""
    loc = tuple(part for i, part in enumerate(loc)
                if not (i >= 1 and isinstance(part, str) and i + 1 < len(loc)
                        and loc[i + 1] == part and isinstance(loc[i - 1], int)))
    path: list[str | int] = []
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        elif isinstance(data, dict) and not path_is_tag(part):
            path.append(part)  # a missing or unknown key: keep it for the message
            data = None
            continue
        else:
            continue
        path.append(part)
    return tuple(path)


def path_is_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part[:1].isupper())


def _pick_errors(errors: list[dict], marked: Marked) -> list[tuple[FieldPath, dict]]:
    """One error per field; an error at a union's root yields to one inside a branch."""
    located = [(_data_path(e["loc"], marked.data), e) for e in errors]
    keep = [(p, e) for p, e in located
            if not any(len(q) > len(p) and q[:len(p)] == p for q, _ in located)]
    seen, unique = set(), []
    for p, e in keep:
        if p not in seen:
            seen.add(p)
            unique.append((p, e))
    return unique


def _located_error(exc: ValidationError, marked: Marked, model: type[BaseModel]) -> UserError:
    picked = _pick_errors(exc.errors(include_url=False), marked)
    path, err = picked[0]
    message, location = _describe(err, path, marked, model)
    more = len(picked) - 1
    return UserError(message + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""),
                     location=location, field=dotted(path) or None,
                     hint="the recipe schema is schemas/recipe.schema.json"
                     if model.__name__ == "Recipe" else None)


def dotted(path: FieldPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(err: dict, path: FieldPath, marked: Marked, model: type[BaseModel]) -> tuple[str, Location]:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, err["loc"][:-1])
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        text = f"unknown key {path[-1]!r}"
        text += f"; did you mean {close[0]!r}?" if close else ""
        text += f" (allowed: {', '.join(allowed)})" if allowed else ""
        return text, marked.location(path, key=True)
    if kind == "missing":
        return f"missing required key {path[-1]!r}", marked.location(path[:-1])
    if kind == "literal_error":
        allowed = ", ".join(a.strip(" '") for a in ctx["expected"].replace(" or ", ", ").split(","))
        return f"{value!r} is not one of {allowed}", marked.location(path)
    if kind == "unknown_step":
        name = next(iter(value)) if isinstance(value, dict) and value else value
        text = (f"unknown surgery step {name!r}" if isinstance(value, dict) and len(value) == 1
                else "a surgery step is a mapping with exactly one key, the rewrite's name")
        return f"{text}; known: {ctx.get('known', '')}", marked.location(path)
    message = err["msg"]
    if kind.endswith("_type") or kind.endswith("_parsing"):
        message += f", got {value!r}"
    return message[0].lower() + message[1:], marked.location(path)


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model found at pydantic location ``loc`` (tags included)."""
    current: Any = model
    for part in loc:
        current = _step_into(current, part)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _step_into(tp: Any, part: Any) -> Any:
    candidates = _unwrap(tp)
    for candidate in candidates:  # in a union, a tag names a variant before any field does
        if (len(candidates) > 1 and _is_model(candidate)
                and part in (candidate.__name__, candidate.model_config.get("title"))):
            return candidate
    for candidate in candidates:
        if _is_model(candidate) and isinstance(part, str) and part in candidate.model_fields:
            return candidate.model_fields[part].annotation
        origin = typing.get_origin(candidate)
        if isinstance(part, int) and origin in (list, tuple):
            return typing.get_args(candidate)[0]
        if origin is dict and isinstance(part, str):
            return typing.get_args(candidate)[1]
    return None


def _unwrap(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return [leaf for arg in typing.get_args(tp) for leaf in _unwrap(arg)]
    return [tp]
