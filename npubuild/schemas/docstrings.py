"""Attribute docstrings as JSON Schema descriptions, read only when a schema is generated.

A docstring under a model field is its description in ``schemas/*.schema.json`` (what editors
show). pydantic's ``use_attribute_docstrings`` would read every model's source while the class
is built, in every process (about 0.06 s of CPU of each `npubuild validate`, walking frames and
tokenizing the source of each of 36 classes); the models are built without it, and `describe` gives the
fields of a schema's models their docstrings (pydantic's own extractor, so the text is the
same) and rebuilds them, once per process, before the schema is generated.
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Any, Iterator

from pydantic import BaseModel


@cache
def describe(root: type[BaseModel]) -> None:
    """Every field of ``root`` and the models it contains, without a description, takes the
    docstring written under it (or under the base class field it inherits)."""
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    order = list(_models(root, set()))
    docs = cache(lambda owner: extract_docstrings_from_cls(owner, use_inspect=True))
    for model in order:
        for name, info in model.model_fields.items():
            owner = next((c for c in model.__mro__ if name in vars(c).get("__annotations__", {})),
                         None)
            if info.description is None and owner is not None and name in docs(owner):
                info.description = docs(owner)[name]
    for model in order:  # contained models first: a container embeds their rebuilt schemas
        model.model_rebuild(force=True)


def _models(annotation: Any, seen: set) -> Iterator[type[BaseModel]]:
    """The models an annotation refers to, each after the models its own fields contain."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in seen:
            seen.add(annotation)
            for info in annotation.model_fields.values():
                yield from _models(info.annotation, seen)
            yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models(arg, seen)
