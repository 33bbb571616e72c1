"""Applying one rule to a model: match, build the replacements, splice, report.

`apply_rule` is the one driver every rule uses. A rule gives its patterns, an optional
``check(view, match)`` (a string refuses the match and becomes the explanation), and
``build(edit, match)`` returning the nodes that replace the match. `fuse_as_function` is the
``build`` of every function-making rule.
"""

from __future__ import annotations

from typing import Callable, Sequence

import lazy_loader as lazy

from npubuild.fusions import FUSED_DOMAIN, FusionReport, fused_op_name
from npubuild.fusions.functions import RULE_KEY, FunctionTable, fused_node
from npubuild.fusions.graph import GraphView, fresh_name, names_in, splice
from npubuild.fusions.pattern import Check, Match, Pattern, find_matches, nearest
from npubuild.onnx_io import clone

np = lazy.load("numpy")
onnx = lazy.load("onnx")

FUNCTION_IR_VERSION = 10  # NodeProto.overload and FunctionProto.overload arrived with IR 10


class Edit:
    """What ``build`` may use: the view, fresh names, new initializers, the function table."""

    def __init__(self, model: onnx.ModelProto, view: GraphView, rule: str):
        self.model, self.view, self.rule = model, view, rule
        self.taken = names_in(model)
        self.functions = FunctionTable(model)

    def initializer(self, value: np.ndarray, base: str) -> str:
        """A new constant (also listed as a graph input below IR 4, as those versions require)."""
        name = fresh_name(self.taken, base)
        tensor = onnx.numpy_helper.from_array(value, name)
        self.model.graph.initializer.append(tensor)
        if self.model.ir_version < 4:
            self.model.graph.input.append(
                onnx.helper.make_tensor_value_info(name, tensor.data_type, list(value.shape)))
        return name

    def node(self, index: int) -> onnx.NodeProto:
        return self.view.nodes[index]

    def fused(self, match: Match, op_name: str) -> onnx.NodeProto:
        return fused_node(self.view, match, op_name, self.rule, self.functions, self.taken)

    def finish(self) -> None:
        if self.functions.added:
            use_functions(self.model)


def use_functions(model: onnx.ModelProto) -> None:
    """Import the fused domain and raise the IR version to one with function overloads.

    Below IR 4 every initializer is also listed as a graph input; from IR 4 on such an input
    could be fed at run time, so those listings go: the weights stay constants.
    """
    if all(o.domain != FUSED_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(FUSED_DOMAIN, 1))
    if model.ir_version < 4:
        weights = {t.name for t in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
    model.ir_version = max(model.ir_version, FUNCTION_IR_VERSION)


Build = Callable[[Edit, Match], "list[onnx.NodeProto]"]


def apply_rule(model: onnx.ModelProto, rule: str, patterns: Sequence[Pattern], build: Build,
               check: Check | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    """Replace every match of ``patterns`` in a copy of ``model``; report what fired and why not."""
    model = clone(model)
    view = GraphView(model)
    matches, misses = find_matches(view, patterns, check)
    edit = Edit(model, view, rule)
    replaced = {m.root: build(edit, m) for m in matches}
    for nodes in replaced.values():
        for node in nodes:
            if all(p.key != RULE_KEY for p in node.metadata_props):
                entry = node.metadata_props.add()
                entry.key, entry.value = RULE_KEY, rule
    if matches:
        splice(model, view, replaced, {i for m in matches for i in m.nodes.values()})
        edit.finish()
    report = FusionReport(fired=len(matches),
                          fused_nodes=[n.name for nodes in replaced.values() for n in nodes],
                          near_misses=[str(m) for m in nearest(misses)])
    if not matches and not misses:
        roots = sorted({p.root.op for p in patterns})
        report.near_misses.append(f"the graph has no {' or '.join(roots)} node")
    return model, report


def fuse_as_function(model: onnx.ModelProto, rule: str, patterns: Sequence[Pattern],
                     check: Check | None = None,
                     op_name: str | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    """Replace each match by one ``npubuild.fused`` node whose function body is the match."""
    name = op_name or fused_op_name(rule)
    return apply_rule(model, rule, patterns, lambda edit, m: [edit.fused(m, name)], check)
