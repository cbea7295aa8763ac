"""Run Alembic programmatically: the CLI, `memstore up` and the tests all migrate through here."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(database_url: str | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations (works from a checkout or a wheel)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade the database to `revision` (blocking; call from a thread inside an event loop)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Downgrade the database to `revision`."""
    command.downgrade(alembic_config(database_url), revision)


def check(database_url: str) -> None:
    """Raise if the models and the migrated schema disagree (`alembic check`)."""
    command.check(alembic_config(database_url))


@functools.cache
def head_revision() -> str:
    """The newest migration this code ships (read once per process)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
