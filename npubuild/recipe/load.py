"""YAML → validated pydantic models, with errors that name file, line, column and field.

The YAML is composed once with PyYAML's safe loader (no tags that run code); node marks give
each value's position. A pydantic error's location is mapped back onto those marks.
"""

from __future__ import annotations

import reprlib
import stat as stat_mod
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from npubuild.errors import Location, UserError, did_you_mean

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


MAX_BYTES = 1 << 20  # a recipe or chip file is a few KiB; 1 MiB leaves room and bounds the rest
MAX_DEPTH = 64  # nesting, counted after aliases are expanded
MAX_VALUES = 10_000  # scalars, mappings and sequences, counted after aliases are expanded
MERGE_TAG = "tag:yaml.org,2002:merge"
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 6
_REPR.maxlevel = 3


def short(value: Any) -> str:
    """``repr`` bounded to a line: messages never carry a huge value (a 1 MB string, an
    expanded alias bomb) back to the user."""
    return _REPR.repr(value)


def read_yaml(path: Path, display: str | None = None) -> Marked:
    """Compose ``path`` with marks, within `MAX_BYTES`, `MAX_DEPTH` and `MAX_VALUES`.

    The limits are checked before anything walks the document: nesting on the flat event
    stream (libyaml's composer recurses in C), then the alias-expanded size and depth on the
    composed node graph (a billion-laughs file is 2 KiB of anchors), so neither marks, the
    constructor nor pydantic ever see an unbounded document."""
    display = display or str(path)
    text = _read_text(path, display)
    try:
        _check_nesting(text, display)
        loader = SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_expansion(node, display)
                marked = Marked(display, None)
                _record_marks(node, (), marked)
                marked.data = _construct(loader, node, marked)
            else:
                marked = Marked(display, None)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if mark and "nesting depth" in str(exc.problem):  # PyYAML >= 6.0.3 stops deep flow
            raise _too_deep(display, mark) from None   # collections itself, in its scanner
        where = Location(display, mark.line + 1, mark.column + 1) if mark else Location(display, 1, 1)
        raise UserError(f"YAML syntax error: {short(exc.problem or exc.context)[1:-1]}",
                        location=where) from None
    except yaml.YAMLError as exc:
        raise UserError(f"YAML error: {str(exc)[:300]}", location=Location(display, 1, 1)) from None
    return marked


# What PyYAML's constructors raise for a tagged scalar they cannot read (``!!int abc``,
# ``!!bool maybe``, ``!!timestamp 2020-13-01``) instead of a marked error.
CONSTRUCT_ERRORS = (ValueError, KeyError, TypeError, OverflowError)


def _construct(loader, node: yaml.Node, marked: Marked) -> Any:
    """The document's Python values; a tag that does not fit its value is the recipe's error
    at that value's line and column."""
    try:
        return loader.construct_document(node)
    except CONSTRUCT_ERRORS:
        raise _bad_tag(node, marked) from None


def _bad_tag(root: yaml.Node, marked: Marked) -> UserError:
    """The first scalar (in document order) whose tag cannot construct it, as a located
    error."""
    paths = {position: path for path, position in reversed(marked.values.items())}
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(reversed(_children(node)))
        if not isinstance(node, yaml.ScalarNode):
            continue
        try:
            yaml.constructor.SafeConstructor().construct_object(node, deep=True)
        except (*CONSTRUCT_ERRORS, yaml.YAMLError) as exc:
            position = (node.start_mark.line + 1, node.start_mark.column + 1)
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            return UserError(f"{short(node.value)} is not a valid {tag} value "
                             f"({type(exc).__name__}: {short(str(exc))[1:-1]})",
                             location=Location(marked.file, *position),
                             field=dotted(paths.get(position, ())) or None,
                             hint=f"remove the tag {tag} (npubuild reads plain YAML values) "
                                  "or give a value of that type")
    return UserError("a YAML tag cannot be applied to its value", location=marked.location(()))


def _read_text(path: Path, display: str) -> str:
    try:
        st = path.stat()
        if not stat_mod.S_ISREG(st.st_mode):
            raise UserError(f"{display} is not a regular file")
        if st.st_size > MAX_BYTES:
            raise UserError(f"{display} is {st.st_size:,} bytes; a recipe may have at most "
                            f"{MAX_BYTES:,}", location=Location(display, 1, 1))
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise UserError(f"{display} has more than {MAX_BYTES:,} bytes",
                            location=Location(display, 1, 1))
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"file not found: {display}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{display} is not UTF-8 text (byte {exc.start})",
                        location=Location(display, 1, 1)) from None
    except OSError as exc:
        raise UserError(f"cannot read {display}: {exc.strerror or exc}") from None


def _too_deep(display: str, mark) -> UserError:
    return UserError(f"the YAML nests deeper than {MAX_DEPTH} levels (aliases included)",
                     location=Location(display, mark.line + 1, mark.column + 1))


def _too_many(display: str, mark) -> UserError:
    return UserError(f"the YAML holds more than {MAX_VALUES:,} values (aliases expanded: an "
                     "alias copies what its anchor names)",
                     location=Location(display, mark.line + 1, mark.column + 1))


def _check_nesting(text: str, display: str) -> None:
    """Nesting and node count on the flat event stream, stopping at the first excess."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(display, event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, (yaml.CollectionStartEvent, yaml.ScalarEvent)):
            nodes += 1
            if nodes > MAX_VALUES:
                raise _too_many(display, event.start_mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, display: str) -> None:
    """Size and depth of the document as if every alias were copied out, without copying:
    each shared node is measured once (iteratively: no recursion on hostile input)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            kids = _children(node)
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            on_path.discard(id(node))
            mark = node.start_mark
            if size[id(node)] > MAX_VALUES:
                raise _too_many(display, mark)
            if depth[id(node)] > MAX_DEPTH:
                raise _too_deep(display, mark)
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            mark = node.start_mark
            raise UserError("recursive alias: an anchor is used inside itself",
                            location=Location(display, mark.line + 1, mark.column + 1))
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _record_marks(node: yaml.Node, path: FieldPath, marked: Marked) -> None:
    marked.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key, key_node, value_node in _mapping_pairs(node, marked.file, path):
            marked.keys[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _record_marks(value_node, path + (key,), marked)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_marks(item, path + (index,), marked)


def _mapping_pairs(node: yaml.MappingNode, file: str, path: FieldPath):
    """A mapping's effective (key, key node, value node) triples as YAML's merge key defines
    them: the mapping's own keys (each once), then merged keys it does not set itself, the
    first merged mapping winning."""
    own: dict[Any, tuple] = {}
    merged: list[yaml.Node] = []
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            continue
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
        if key in own:
            first_line = own[key][0].start_mark.line + 1
            raise UserError(f"duplicate key {short(key)} (first given on line {first_line})",
                            location=Location(file, key_node.start_mark.line + 1,
                                              key_node.start_mark.column + 1),
                            field=dotted(path + (key,)))
        own[key] = (key_node, value_node)
    out = {k: (kn, vn) for k, (kn, vn) in own.items()}
    for source in merged:
        if isinstance(source, yaml.MappingNode):
            for key, key_node, value_node in _mapping_pairs(source, file, path):
                out.setdefault(key, (key_node, value_node))
    return [(k, kn, vn) for k, (kn, vn) in out.items()]


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
    ancestors = {q[:n] for q, _ in located for n in range(len(q))}  # linear, not pairwise
    keep = [(p, e) for p, e in located if p not in ancestors]
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
                     hint="`npubuild schema recipe` prints the recipe schema"
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
        text = f"unknown key {short(path[-1])}" + did_you_mean(path[-1], allowed)
        text += f" (allowed: {', '.join(allowed)})" if allowed else ""
        return text, marked.location(path, key=True)
    if kind == "missing":
        text = f"missing required key {path[-1]!r}"
        if path[:2] == ("model", "inputs") and path[-1] == "name":
            names = _model_input_names(marked)
            if names:
                listed = len(marked.data["model"]["inputs"])
                text += f": the model's inputs are {', '.join(map(repr, names))}"
                text += (f" (names may be left out only where the recipe lists all {len(names)}; "
                         f"it lists {listed})" if listed != len(names) else "")
        return text, marked.location(path[:-1])
    if kind == "literal_error":
        allowed = ", ".join(a.strip(" '") for a in ctx["expected"].replace(" or ", ", ").split(","))
        if isinstance(value, (dict, list)):  # e.g. `task: {kind: classifier}` for `task: classifier`
            form = "a mapping" if isinstance(value, dict) else "a list"
            return (f"expected one of {allowed}, written as the name alone, got {form} "
                    f"{short(value)}", marked.location(path))
        return f"{short(value)} is not one of {allowed}", marked.location(path)
    if kind == "unknown_step":
        name = next(iter(value)) if isinstance(value, dict) and value else value
        known = ctx.get("known", "")
        if isinstance(value, dict) and len(value) == 1:
            return (f"unknown surgery step {short(name)} (known: {known})"
                    + did_you_mean(name, known.split(", ")), marked.location(path))
        return ("a surgery step is a mapping with exactly one key, the rewrite's name; known: "
                f"{known}", marked.location(path))
    message = err["msg"]
    if kind.endswith("_type") or kind.endswith("_parsing"):
        message += f", got {short(value)}"
    return message[0].lower() + message[1:], marked.location(path)


def fill_input_names(marked: Marked) -> Marked:
    """Name each recipe input written without ``name``: the model's inputs the recipe does not
    name, in the model's order, take the unnamed places in the recipe's order (so a recipe for a
    one-input model needs no name, as TPU-MLIR and RKNN take inputs by position). Only when
    the names can be read without a framework (`_model_input_names`) and every model input is
    listed; otherwise the inputs stay as written and validation says what is missing."""
    spec = marked.data.get("model") if isinstance(marked.data, dict) else None
    inputs = spec.get("inputs") if isinstance(spec, dict) else None
    if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
        return marked
    unnamed = [i for i in inputs if "name" not in i]
    if not unnamed:
        return marked
    names = _model_input_names(marked)
    if names is None or len(names) != len(inputs):
        return marked
    given = {i["name"] for i in inputs if "name" in i}
    remaining = [n for n in names if n not in given]
    if len(remaining) == len(unnamed):
        for spec_of_input, name in zip(unnamed, remaining):
            spec_of_input["name"] = name
    return marked


def _model_input_names(marked: Marked) -> list[str] | None:
    """The input names of the model the recipe names, where they can be read without a
    framework (ONNX, TFLite, a Keras ``.keras``/``.h5`` configuration); else None. Only for
    the message: any failure is None."""
    try:
        from npubuild.recipe import MODEL_SUFFIXES, paths

        spec = marked.data["model"]
        path = paths.resolve(spec["path"], Path(marked.file).parent)
        path = paths.archive_member(spec["path"], path) or path
        fmt = spec.get("format") or MODEL_SUFFIXES.get(path.suffix.lower())
        if fmt == "onnx":
            from npubuild import onnx_io

            return [v.name for v in onnx_io.graph_inputs(onnx_io.load_skeleton(path)[0])]
        if fmt == "tflite":
            from npubuild.frontends.tflite_check import signature

            found = signature(path)
            return [found.tensors[i][0] for i in found.inputs]
        if fmt == "keras":
            from npubuild.frontends.keras_legacy import input_names

            return input_names(path)
    except Exception:
        return None
    return None


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
