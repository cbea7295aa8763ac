"""Which writer handles a chunk: the chunk's `writer` field, else the tenant's default, else the
deployment's (`MEMSTORE_WRITER`). Names resolve to writer instances built once per process.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from app.config import Settings
from app.writers.base import Writer

DEFAULT = "default"


def _load(path: str) -> Callable[..., Writer]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        msg = f"writer plugin {path!r} must look like 'package.module:ClassName'"
        raise ValueError(msg)
    factory: Callable[..., Writer] = getattr(importlib.import_module(module_name), attr)
    return factory


class WriterRegistry:
    """Name -> writer. `default` is an alias for the deployment's configured writer."""

    def __init__(self, settings: Settings) -> None:
        self._factories: dict[str, Callable[[], Writer]] = {}
        self._instances: dict[str, Writer] = {}
        self.register("offline", _offline_factory)
        for name, path in settings.writer_plugins.items():
            self.register(name, functools.partial(_load(path), name=name))
        if settings.writer not in self._factories:
            # Fail at start-up rather than quietly run another writer than the one configured.
            available = ", ".join(sorted(self._factories))
            msg = f"MEMSTORE_WRITER={settings.writer!r} is not available here (available: {available})"
            raise ValueError(msg)
        self.default_name = settings.writer

    def register(self, name: str, factory: Callable[[], Writer]) -> None:
        self._factories[name] = factory
        self._instances.pop(name, None)

    def names(self) -> list[str]:
        return [DEFAULT, *sorted(self._factories)]

    def knows(self, name: str) -> bool:
        return name == DEFAULT or name in self._factories

    def resolve_name(self, requested: str | None, tenant_default: str | None = None) -> str:
        """The concrete writer name for a chunk (never `default`)."""
        for name in (requested, tenant_default):
            if name and name != DEFAULT and name in self._factories:
                return name
        return self.default_name

    def get(self, name: str) -> Writer:
        name = self.resolve_name(name)
        if name not in self._instances:
            self._instances[name] = self._factories[name]()
        return self._instances[name]


def _offline_factory() -> Writer:
    from app.writers.offline import OfflineWriter

    return OfflineWriter()
