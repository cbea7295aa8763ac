"""Which writer handles a chunk: the chunk's `writer` field, else the tenant's default, else the
deployment's (`MEMSTORE_WRITER`). Names resolve to writer instances built once per process.

A name this process does not know is an error, never another writer in its place: the API accepted
it, so the configuration of the API and of this worker differ (a rollout under way, a worker left
behind), and the chunk must wait for a worker that knows it rather than be written by another model.

Writers come from four places: `offline` and `verbatim` (always there); `openai`, the endpoint the
`MEMSTORE_WRITER_*` settings describe; named writers in the TOML file `MEMSTORE_WRITERS_FILE`:

    [writers.hy-prod]
    profile = "hy-memory"              # hy-memory | mem0 | mem0-v3 | memos | simple
    base_url = "http://vllm:8000/v1"
    model = "hy-memory"
    api_key_env = "HY_MEMORY_KEY"      # the key is read from this variable, never from the file
    max_concurrency = 128
    extra_body = { top_k = 1 }

    [writers.rules]
    kind = "offline"

and writers plugged in by import path (`MEMSTORE_WRITER_PLUGINS`).
"""

from __future__ import annotations

import functools
import importlib
import os
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.config import Settings
from app.writers.base import DESTRUCTIVE_POLICIES, Writer
from app.writers.llm import LLMWriter, LLMWriterSpec

DEFAULT = "default"


class UnknownWriterError(LookupError):
    """A chunk or tenant names a writer this process is not configured with."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown writer {name!r} on this worker")
        self.name = name


_SPEC_KEYS = {f.name for f in fields(LLMWriterSpec)}


def _load(path: str) -> Callable[..., Writer]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        msg = f"writer plugin {path!r} must look like 'package.module:ClassName'"
        raise ValueError(msg)
    factory: Callable[..., Writer] = getattr(importlib.import_module(module_name), attr)
    return factory


def spec_from_settings(settings: Settings) -> LLMWriterSpec:
    """The `openai` writer: the endpoint and profile of the MEMSTORE_WRITER_* settings."""
    return LLMWriterSpec(
        profile=settings.writer_profile,
        base_url=settings.writer_base_url,
        model=settings.writer_model,
        api_key=settings.writer_api_key,
        timeout_s=settings.writer_request_timeout_s,
        max_retries=settings.writer_max_retries,
        max_concurrency=settings.writer_max_concurrency,
        max_tokens=settings.writer_max_tokens,
        response_format=settings.writer_response_format,
        extra_body=settings.writer_extra_body,
        prompts_dir=settings.writer_prompts_dir,
    )


def read_writers_file(
    path: Path, settings: Settings, policies: dict[str, str] | None = None
) -> dict[str, Callable[[str], Writer]]:
    """Name -> factory for each `[writers.NAME]` table; a mistake in the file fails start-up, by name.
    Each writer's own `destructive_ops` policy, where it has one, goes into `policies`."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        msg = f"cannot read writers file {path}: {exc}"
        raise ValueError(msg) from exc
    factories: dict[str, Callable[[str], Writer]] = {}
    for name, table in (document.get("writers") or {}).items():
        if not isinstance(table, dict):
            msg = f"writers file {path}: [writers.{name}] must be a table"
            raise ValueError(msg)
        options = dict(table)
        policy = _policy(name, options, path)
        factories[name] = _factory_for(name, options, settings, path)
        if policies is not None and policy is not None:
            policies[name] = policy
    return factories


def _policy(name: str, table: dict[str, Any], path: Path) -> str | None:
    """A writer's own `destructive_ops` policy (allow, review or deny), taken out of its table."""
    policy = table.pop("destructive_ops", None)
    if policy is not None and policy not in DESTRUCTIVE_POLICIES:
        allowed = list(DESTRUCTIVE_POLICIES)
        msg = f"{path}, [writers.{name}]: destructive_ops must be one of {allowed}, not {policy!r}"
        raise ValueError(msg)
    return None if policy is None else str(policy)


def _factory_for(name: str, table: dict[str, Any], settings: Settings, path: Path) -> Callable[[str], Writer]:
    where = f"writers file {path}, [writers.{name}]"
    kind = table.pop("kind", "openai")
    if kind == "offline":
        return _offline_factory
    if kind == "plugin":
        return _load(str(table.get("path", "")))
    if kind != "openai":
        msg = f"{where}: kind must be openai, offline or plugin, not {kind!r}"
        raise ValueError(msg)
    if env := table.pop("api_key_env", None):
        table["api_key"] = os.environ.get(str(env))
    if unknown := set(table) - _SPEC_KEYS:
        allowed = sorted(_SPEC_KEYS | {"kind", "api_key_env"})
        msg = f"{where}: unknown keys {sorted(unknown)} (allowed: {allowed})"
        raise ValueError(msg)
    defaults = spec_from_settings(settings)
    values = {f: getattr(defaults, f) for f in _SPEC_KEYS} | table
    if "prompts_dir" in table:
        values["prompts_dir"] = Path(table["prompts_dir"])
    spec = LLMWriterSpec(**values)
    LLMWriter(name, spec)  # validate now (profile name, prompt files), not at the first chunk
    return functools.partial(LLMWriter, spec=spec)


class WriterRegistry:
    """Name -> writer. `default` is an alias for the deployment's configured writer."""

    def __init__(self, settings: Settings) -> None:
        self._factories: dict[str, Callable[[], Writer]] = {}
        self._instances: dict[str, Writer] = {}
        self._policies: dict[str, str] = {}  # writer -> its destructive-ops policy (writers file)
        self.register("offline", _offline_factory)
        self.register("verbatim", _verbatim_factory)
        if settings.writer == "openai" or settings.model_fields_set & {"writer_base_url", "writer_model"}:
            spec = spec_from_settings(settings)
            LLMWriter("openai", spec)  # fail now on a bad profile or prompt directory
            self.register("openai", functools.partial(LLMWriter, "openai", spec))
        if settings.writers_file is not None:
            for name, factory in read_writers_file(settings.writers_file, settings, self._policies).items():
                self.register(name, functools.partial(factory, name))
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

    def policy(self, name: str) -> str | None:
        """The writer's own destructive-ops policy from the writers file, if it has one."""
        return self._policies.get(name)

    def knows(self, name: str) -> bool:
        return name == DEFAULT or name in self._factories

    def resolve_name(self, requested: str | None, tenant_default: str | None = None) -> str:
        """The concrete writer name for a chunk (never `default`): the first of `requested` and
        `tenant_default` that names one, else the deployment's. Raises `UnknownWriterError` for a name
        this process does not know."""
        for name in (requested, tenant_default):
            if not name or name == DEFAULT:
                continue
            if name not in self._factories:
                raise UnknownWriterError(name)
            return name
        return self.default_name

    def get(self, name: str | None, tenant_default: str | None = None) -> Writer:
        name = self.resolve_name(name, tenant_default)
        if name not in self._instances:
            self._instances[name] = self._factories[name]()
        return self._instances[name]

    async def aclose(self) -> None:
        for writer in self._instances.values():
            if (close := getattr(writer, "aclose", None)) is not None:
                await close()


def _offline_factory(name: str = "offline") -> Writer:
    from app.writers.offline import OfflineWriter

    return OfflineWriter(name=name)


def _verbatim_factory(name: str = "verbatim") -> Writer:
    from app.writers.verbatim import VerbatimWriter

    return VerbatimWriter(name=name)
