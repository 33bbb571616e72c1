"""Registries for npubuild's extension points: a dict keyed by the names users write in YAML.

Built-ins register at import time; third-party packages add entries through the entry-point
group given to the registry (for example ``npubuild.surgery``). A name can be registered once.
A registry may know its built-ins by name, each with the module that registers it, so that the
names are known without importing them and `Registry.get` imports only the module asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → item, with duplicate detection and entry-point plugins."""

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 builtins: Mapping[str, str] | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.builtins: dict[str, str] = dict(builtins or {})  # name -> module registering it
        self._items: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = item
        return item

    def load_plugins(self) -> None:
        """Import the entry points of this registry's group once; each registers itself."""
        if self._plugins_loaded or not self.entry_point_group:
            return
        self._plugins_loaded = True
        for ep in installed_entry_points(self.entry_point_group):
            ep.load()

    def known(self) -> list[str]:
        """Every name: the built-ins (not imported), then the plug-ins' (loaded)."""
        self.load_plugins()
        return [*self.builtins, *(name for name in self._items if name not in self.builtins)]

    def get(self, name: str) -> T:
        """The entry called ``name``, a built-in's module imported on first use."""
        if name in self.builtins:
            import_module(self.builtins[name])  # registers it (once: imports are cached)
        else:
            self.load_plugins()
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)

    def items(self):
        return self._items.items()


def installed_entry_points(group: str):
    """The installed entry points of ``group`` (`_every_entry_point`, read once per process)."""
    return _every_entry_point().select(group=group)


@cache
def _every_entry_point():
    """Every installed package's entry points, read once per process: each query reads every
    distribution's metadata (a few hundred packages where TensorFlow is installed)."""
    return entry_points()
