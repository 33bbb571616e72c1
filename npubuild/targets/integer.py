"""Whether npubuild's quantizer can express a node as integer layers.

The split asks the very lowering rules the quantize stage uses (``npubuild.quant.ops.RULES``,
each raising ``Unsupported(reason)``), on the node's inferred shapes and constants, so a node
the split places on the NPU is never silently kept in float on the CPU by quantize: one source
of truth for what runs where. ``conditions(op)`` reads the same rules' ``Unsupported`` texts for
``docs/SUPPORTED_OPS.md``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.targets.view import NodeView, is_static

NO_RULE = ""  # the reason alone says it: the op has no lowering rule at all
NO_RULE_DOC = "always (no lowering rule for the op)"


def lowering_failure(view: NodeView) -> str | None:
    """Why the quantizer would keep ``view``'s node in float (None when it lowers it)."""
    from npubuild.quant import ops
    from npubuild.quant.floatgraph import Unsupported
    from npubuild.quant.lower import Context

    node = view.node
    if node.domain not in STANDARD_DOMAINS:
        return None  # fused ops: their body nodes are checked one by one
    rule = ops.RULES.get(node.op_type)
    if rule is None:
        return NO_RULE
    names = [n for n in (*node.input, *node.output) if n]
    constants = {n: view.facts.value(n) for n in names if view.facts.is_const(n)}
    shapes = {n: list(view.shape(n)) for n in names if is_static(view.shape(n))}
    shapes.update({n: list(v.shape) for n, v in constants.items()})
    try:
        rule(node, Context(constants, shapes, _opset(view)))
    except Unsupported as exc:
        return str(exc)
    except KeyError as exc:  # a shape the rule needs is not static (static_shapes says so too)
        return f"the shape of {exc.args[0]!r} is not known"
    return None


def _opset(view: NodeView) -> int:
    return next((o.version for o in view.facts.opset_imports if o.domain in STANDARD_DOMAINS), 21)


def has_rule(op: str) -> bool:
    from npubuild.quant import ops

    return op in ops.RULES


@cache
def conditions(op: str) -> tuple[str, ...]:
    """The ``Unsupported`` texts ``op``'s lowering rule (and the helpers it calls) can raise,
    in source order; f-string fields shown as ``…``."""
    from npubuild.quant import ops

    rule = ops.RULES.get(op)
    if rule is None:
        return (NO_RULE_DOC,)
    found: list[str] = []
    _collect(rule, vars(ops), found, set())
    _collect(ops.LUT_FUNCTIONS.get(op), vars(ops), found, set())  # a table's own conditions
    return tuple(text for text in dict.fromkeys(found) if not _about_another_op(text, op))


def _about_another_op(text: str, op: str) -> bool:
    """A text a shared rule raises for one of its other ops ("Cast to …" under Identity)."""
    import onnx

    first = text.split(" ")[0]
    return first != op and onnx.defs.has(first)


def _collect(fn, namespace: dict, found: list[str], seen: set) -> None:
    if fn in seen or not inspect.isfunction(fn):
        return
    seen.add(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name == "Unsupported" and call.args:
            found.append(_text(call.args[0]))
        elif name in namespace:
            _collect(namespace[name], namespace, found, seen)


def _text(arg: ast.expr) -> str:
    if isinstance(arg, ast.Constant):
        return str(arg.value)
    if isinstance(arg, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "…" for v in arg.values)
    return "…"
