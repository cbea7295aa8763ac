"""`memstore db distribute`: the schema distributed by `tenant_id` on Citus (`app.db.distribution`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from app.config import get_settings
from app.lib.logging import configure_logging

db_cli = typer.Typer(help="The database's layout.", no_args_is_help=True)


def register(cli: typer.Typer) -> None:
    cli.add_typer(db_cli, name="db")


async def distribute_database(database_url: str, *, dry_run: bool = False) -> list[str]:
    """Distribute the schema on the Citus coordinator at `database_url` (the tables' owner); the steps
    done (with `dry_run`, to be done), none when it already was (`DistributionError` when it cannot be)."""
    from app.db.distribution import distribute
    from app.db.engine import create_engine

    settings = get_settings().model_copy(update={"database_url": database_url, "db_pool_size": 1})
    engine = create_engine(settings, application_name="memstore-cli", pre_ping=False)
    try:
        async with engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await distribute(autocommit, dry_run=dry_run)
    finally:
        await engine.dispose()


@db_cli.command("distribute")
def distribute_command(
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be done, rows included; change nothing.")
    ] = False,
) -> None:
    """Distribute the tables by tenant_id on a Citus cluster (reference tables: tenants, api_keys,
    embedding_config), moving the rows already there into the shards. Run as the tables' owner
    (MEMSTORE_ADMIN_DATABASE_URL, else the embedded stack's) after `memstore migrate`, on the
    coordinator; a second run changes nothing. Refuses on a Postgres without Citus, on a worker, and
    on a coordinator without workers."""
    from app.db.distribution import DistributionError
    from app.lib.embedded import EmbeddedError, database_only

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    try:
        with database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url:
            done = asyncio.run(distribute_database(database_url, dry_run=dry_run))
    except (DistributionError, EmbeddedError) as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not done:
        typer.echo("memstore: already distributed; nothing changed")
    for step in done:
        typer.echo(f"{'would distribute' if dry_run else 'distributed'}: {step}")
