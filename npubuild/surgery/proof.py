"""The proof of one surgery step: the rewritten model is valid and computes what its input did.

``check_structure`` runs ``onnx.checker`` and strict shape inference. ``compare`` runs both
models in ONNX Runtime on the same proof inputs (`npubuild.proofs`) and matches the outputs,
each judged against the scale of the values it is computed from: by name; by the
origins the rewrite recorded (renamed, split or reshaped outputs, see ``origins``); or, for an
output placed at a tensor that existed before (``extract``), against that tensor's value in the
input model. New inputs at tensors of the input model are fed the values that model computed.
What cannot be matched is listed as not comparable, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import lazy_loader as lazy

from npubuild import onnx_io, proofs
from npubuild.surgery import origins as org
from npubuild.surgery.graph import infer_types, skeleton

np = lazy.load("numpy")
onnx = lazy.load("onnx")


@dataclass
class Comparison:
    """Per output of the input model: how it was matched and the numbers."""

    matched: dict[str, dict] = field(default_factory=dict)
    not_comparable: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    feeds: dict[str, np.ndarray] = field(default_factory=dict)  # the rewritten model's inputs

    @property
    def max_abs(self) -> float:
        return max((m["max_abs"] for m in self.matched.values()), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((m["max_rel"] for m in self.matched.values()), default=0.0)


def check_structure(model: onnx.ModelProto) -> str | None:
    """None when the model passes the checker and strict shape inference, else the reason."""
    try:
        onnx.checker.check_model(onnx_io.with_loadable_ir(model))
    except Exception as exc:
        return f"onnx.checker: {_first_line(exc)}"
    try:
        onnx.shape_inference.infer_shapes(skeleton(model), check_type=True, strict_mode=True,
                                          data_prop=True)
    except Exception as exc:
        return f"shape inference: {_first_line(exc)}"
    return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1][:400] if text else type(exc).__name__


def compare(before: onnx.ModelProto, after: onnx.ModelProto, step_origins: dict, *,
            exact: bool, rtol: float, feeds: dict[str, np.ndarray] | None = None) -> Comparison:
    """Run both models on the proof inputs ``feeds`` of ``before`` (default: `proofs.make_feeds`)
    and match every output (see the module docstring); ``result.feeds`` are ``after``'s."""
    result = Comparison()
    old_feeds = feeds if feeds is not None else proofs.make_feeds(before)
    old_types = infer_types(before)
    new_inputs = [i.name for i in onnx_io.graph_inputs(after)]
    renamed_inputs = step_origins.get("inputs", {})
    after_outputs = [o.name for o in after.graph.output]
    sources = [renamed_inputs.get(n, n) for n in new_inputs]
    compared = [o.name for o in before.graph.output] + after_outputs
    wanted = _internal(before, old_types, sources + after_outputs
                       + proofs.producer_inputs(before, compared))
    old_values = _run_with(before, old_feeds, wanted, old_types)
    scales = proofs.input_scales(before, old_values, compared)
    result.feeds, missing = _new_feeds(after, old_values, renamed_inputs)
    if missing:
        for name in (o.name for o in before.graph.output):
            result.not_comparable[name] = missing[0]
        return result
    new_values = onnx_io.run(after, result.feeds)
    specs = _output_specs(before, after_outputs, step_origins, old_values)
    for old_name, (spec, how) in specs.items():
        _match(result, old_name, old_values[old_name], spec, how, new_values, exact=exact,
               rtol=rtol, scale=scales.get(old_name, 0.0))
    for out in before.graph.output:
        if out.name not in specs:
            result.not_comparable[out.name] = "no longer an output, and no origin recorded"
    used = {leaf for spec, _ in specs.values() for leaf in org.leaves(spec)}
    for name in after_outputs:
        if name not in used:
            result.not_comparable[name] = "a new output with no counterpart in the step's input"
    return result


def _internal(model: onnx.ModelProto, types: dict, names: list[str]) -> list[str]:
    """Which of ``names`` are tensors of ``model`` besides its graph inputs and outputs."""
    present = {o for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    return [n for n in dict.fromkeys(names)
            if n in present and n not in outputs and types.get(n, (0,))[0]]


def _run_with(model: onnx.ModelProto, feeds: dict, extra: list[str], types: dict) -> dict:
    """Outputs of ``model`` plus the values of the internal tensors ``extra``."""
    probe = onnx_io.clone(model)
    for name in extra:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name][0], None))
    values = onnx_io.run(probe, feeds)
    values.update(feeds)
    return values


def _new_feeds(after, old_values, renamed) -> tuple[dict, list[str]]:
    """Feeds for the rewritten model from the input model's values; reasons for what lacks one."""
    feeds, missing = {}, []
    for value in onnx_io.graph_inputs(after):
        source = renamed.get(value.name, value.name)
        shape = onnx_io.value_shape(value)
        if source not in old_values:
            missing.append(f"the new input {value.name!r} has no counterpart in the step's input")
        elif np.size(old_values[source]) != int(np.prod(shape)):
            missing.append(f"input {value.name!r} changed size (shape {shape}, was "
                           f"{list(np.shape(old_values[source]))})")
        else:
            dtype = onnx_io.value_dtype(value)
            feeds[value.name] = np.reshape(old_values[source], shape).astype(dtype)
    return feeds, missing


def _output_specs(before, after_outputs, step_origins, old_values) -> dict[str, tuple]:
    """Old output (or old tensor now exposed) -> (spec over new outputs, how it is matched)."""
    specs = {}
    recorded = step_origins.get("outputs", {})
    for out in before.graph.output:
        if out.name in recorded:
            spec = recorded[out.name]
            how = "renamed" if isinstance(spec, str) else "recombined"
            specs[out.name] = (spec, how)
        elif out.name in after_outputs:
            specs[out.name] = (out.name, "same name")
    claimed = {leaf for spec, _ in specs.values() for leaf in org.leaves(spec)}
    for name in after_outputs:
        if name not in claimed and name not in specs and name in old_values:
            specs[name] = (name, "tensor of the step's input")
    return specs


def _match(result: Comparison, old_name: str, reference: np.ndarray, spec, how: str,
           new_values: dict, *, exact: bool, rtol: float, scale: float) -> None:
    try:
        actual = org.rebuild(spec, new_values)
    except (KeyError, ValueError) as exc:
        result.not_comparable[old_name] = f"cannot rebuild it from {org.leaves(spec)}: {exc}"
        return
    if np.shape(actual) != np.shape(reference) and np.size(actual) == np.size(reference):
        how += f", compared in order (shape {list(np.shape(reference))} -> {list(np.shape(actual))})"
        actual = np.reshape(actual, np.shape(reference))
    sims, bad = proofs.compare({old_name: reference}, {old_name: actual}, tolerance=rtol,
                               exact=exact, scales={old_name: scale})
    if old_name in sims:
        result.matched[old_name] = _entry(sims[old_name], how, spec)
    result.failures.extend(str(b) for b in bad)


def _entry(sim: proofs.Checked, how: str, spec) -> dict:
    entry = {"how": how, "max_abs": sim.max_abs, "max_rel": sim.max_rel, "identical": sim.identical,
             "cosine": sim.cosine}
    if not isinstance(spec, str) or how == "renamed":
        entry["from"] = spec
    return entry
