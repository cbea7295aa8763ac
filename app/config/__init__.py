"""The one settings object, read from ``MEMSTORE_*`` environment variables (and an optional file).

Each concern keeps its own settings in a module of this package (storage, api, workers, writers,
embeddings, search, answer, logs, webhooks); `Settings` is all of them at once, flat, so every one is
`MEMSTORE_<NAME>` and read as `settings.<name>`. `database_url` reads a Postgres URL in any usual
spelling, for the settings that check it and the engine (`app.db.engine`) that connects with it: the
database plumbing reads the settings, never the other way round.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Self

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.config.answer import ReaderSettings
from app.config.api import ApiSettings
from app.config.embeddings import EmbedderSettings
from app.config.logs import LogFormat, LogSettings
from app.config.search import SearchSettings
from app.config.storage import StorageSettings
from app.config.webhooks import WebhookSettings
from app.config.workers import WorkerSettings
from app.config.writers import DestructiveKind, WriterSettings
from app.lib.logging import register_secrets

__all__ = ["DestructiveKind", "LogFormat", "Settings", "get_settings"]


class Settings(  # the groups last to first, so that their fields are listed first to last
    WebhookSettings,
    LogSettings,
    ReaderSettings,
    SearchSettings,
    EmbedderSettings,
    WriterSettings,
    WorkerSettings,
    ApiSettings,
    StorageSettings,
    BaseSettings,
):
    """Every knob of the service; each has a default so an empty environment runs the embedded stack."""

    model_config = SettingsConfigDict(
        env_prefix="MEMSTORE_",
        env_file=os.environ.get("MEMSTORE_CONFIG_FILE", ".env"),
        env_file_encoding="utf-8",
        extra="ignore",
    )

    @model_validator(mode="after")
    def _secrets_never_logged(self) -> Self:
        """Whatever they look like, this process's own keys are redacted from its log lines."""
        register_secrets((self.admin_key, self.writer_api_key, self.embedder_api_key, self.reader_api_key))
        return self

    def as_owner(self) -> Settings:
        """These settings, connecting as the tables' owner (operator commands, which span tenants)."""
        return self.model_copy(update={"database_url": self.owner_database_url})


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
