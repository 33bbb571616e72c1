"""Which entry of the recipe's ``model.inputs`` describes which graph input: one place.

The recipe names an input as the source model does (a TensorFlow tensor with or without its
``:0``). Surgery may rename a graph input (``rename_tensors``); it records the rename in the
model it writes (`npubuild.surgery.origins`, new name → old), and the split carries that record
onto its submodels. Every stage that reads the recipe's input entries goes through
`RecipeInputs`: the input's shape and dtype at import, its proof values, the preprocessing,
layout and ``.npz`` key of the calibration and verify data, the float original's feed in
verify. So an entry keyed by the old name follows the rename, and an entry no graph input
stands for any more (an input `extract` cut away) is reported instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


def same_input(recipe_name: str, graph_name: str) -> bool:
    """``x`` names the graph input ``x`` or ``x:0`` (a TensorFlow tensor), and the other way."""
    return recipe_name == graph_name or recipe_name.removesuffix(":0") == graph_name.removesuffix(":0")


@dataclass(frozen=True)
class RecipeInputs:
    """The recipe's input entries (``specs``: ``model.inputs``) against one graph's inputs,
    after the renames ``renamed`` (graph name → the source's name) surgery recorded."""

    specs: Sequence
    renamed: Mapping[str, str] = field(default_factory=dict)

    def source_name(self, graph_name: str) -> str:
        """The name the source model (and so the recipe) gives this graph input."""
        return self.renamed.get(graph_name, graph_name)

    def index(self, graph_name: str) -> int | None:
        """The position in ``model.inputs`` of the entry for this graph input, if any."""
        source = self.source_name(graph_name)
        return next((i for i, spec in enumerate(self.specs) if same_input(spec.name, source)),
                    None)

    def spec(self, graph_name: str):
        """The recipe's entry for this graph input (None: the recipe says nothing of it)."""
        index = self.index(graph_name)
        return None if index is None else self.specs[index]

    def unmatched(self, graph_names: Iterable[str]) -> list[int]:
        """Positions of the entries no graph input stands for."""
        matched = {self.index(name) for name in graph_names}
        return [i for i in range(len(self.specs)) if i not in matched]
