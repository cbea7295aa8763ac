"""`memstore reembed`: move the stored vectors to the configured embedder (resumable, with progress), or
carry on one tenant's move to the embedder it chose (`--tenant`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from app.config import get_settings
from app.lib.logging import configure_logging


def register(cli: typer.Typer) -> None:
    cli.command()(reembed)


def reembed(
    batch_size: Annotated[int, typer.Option(help="Memories embedded and committed per batch.", min=1)] = 256,
    force: Annotated[
        bool, typer.Option(help="Re-embed even if the stored vectors already come from this embedder.")
    ] = False,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="Only this tenant (its name): carry on its move to the embedder it chose (PATCH "
            "/v1/admin/settings), here rather than in a worker, without waiting for the workers' caches."
        ),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """Re-embed every memory with MEMSTORE_EMBEDDER (tenants with an embedder of their own keep theirs);
    an interrupted run continues where it stopped."""
    if tenant is not None:
        _switch_tenant(tenant, batch_size, data_dir)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.search.reembed import ReembedError
    from app.domain.search.reembed import reembed as run_reembed
    from app.embeddings import embedder_from_settings
    from app.lib.embedded import database_only

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    embedder = embedder_from_settings(settings)

    async def run(database_url: str) -> None:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-reembed"
        )
        try:
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
            ) as bar:
                task = bar.add_task(f"re-embedding with {embedder.name}", total=None)

                def report(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                outcome = await run_reembed(
                    create_sessionmaker(engine), embedder, batch_size=batch_size, force=force, progress=report
                )
            if outcome.resumed_from and outcome.resumed_from < outcome.total:
                typer.echo(f"resumed after {outcome.resumed_from} memories done by an earlier run", err=True)
            typer.echo(f"{outcome.done} memories embedded by {outcome.embedder} (was {outcome.previous})")
        finally:
            await embedder.aclose()
            await engine.dispose()

    with database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url:
        try:
            asyncio.run(run(database_url))
        except ReembedError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from exc


def _switch_tenant(name: str, batch_size: int, data_dir: Path | None) -> None:
    """The tenant's move to the embedder it chose, run to the end here. Its workers must be stopped (or
    have read the move: MEMSTORE_EMBEDDER_SWITCH_SETTLE_S after it was asked for); it does not wait."""
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.accounts.services import tenant_by_name
    from app.domain.search.tenant_embedder import switch_tenant
    from app.embeddings import Embedders
    from app.lib.embedded import database_only
    from app.lib.errors import ApiError

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    embedders = Embedders(settings)

    async def run(database_url: str) -> None:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-reembed"
        )
        sessionmaker = create_sessionmaker(engine)
        try:
            async with sessionmaker() as session:
                tenant_id = (await tenant_by_name(session, name)).id
            outcome = await switch_tenant(
                sessionmaker, embedders, tenant_id, actor="cli", batch_size=batch_size, settle_s=0.0
            )
            if outcome.to is None:
                typer.echo(f"tenant {name}: no move to another embedder is under way")
            else:
                typer.echo(f"tenant {name}: {outcome.embedded} memories embedded by {outcome.to}")
        finally:
            await embedders.aclose()
            await engine.dispose()

    with database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url:
        try:
            asyncio.run(run(database_url))
        except ApiError as exc:
            typer.echo(exc.detail, err=True)
            raise typer.Exit(1) from exc
