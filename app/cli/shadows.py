"""`memstore replay` and `memstore writers compare`: trying a writer on past traffic, at a terminal.

Both talk to the database directly (MEMSTORE_DATABASE_URL, else the embedded one under
MEMSTORE_DATA_DIR, shared with a running `memstore up`). A replay writes its bank in this process with
the writers this process is configured with (MEMSTORE_WRITERS_FILE ...), so no worker needs to know
the writer on trial; running workers may help and cannot write a chunk twice.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from app.config import get_settings
from app.lib.logging import configure_logging

writers_cli = typer.Typer(help="Writers on trial: compare banks.", no_args_is_help=True)

TenantName = Annotated[str, typer.Option("--tenant", help="Tenant name.")]


def _moment(value: str | None) -> datetime | None:
    """A time from the command line, as the history commands read one (RFC 3339; without a zone, UTC)."""
    from app.cli.history import _moment as moment

    return None if value is None else moment(value)


async def _with_tenant(database_url: str, tenant: str, work: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncSession

    from app.db.engine import create_engine
    from app.domain.accounts.repositories import TenantRepository

    settings = get_settings().model_copy(update={"database_url": database_url})
    engine = create_engine(settings, application_name="memstore-cli")
    try:
        async with AsyncSession(engine) as session:
            found = await TenantRepository(session).get_by_name(tenant)
        if found is None or found.shadow_of is not None:
            typer.echo(f"No tenant named {tenant!r}.", err=True)
            raise typer.Exit(1)
        return await work(engine, settings, found.id)
    finally:
        await engine.dispose()


def _on_database(tenant: str, work: Any) -> Any:
    from app.lib.embedded import EmbeddedError, database_only
    from app.lib.errors import ApiError

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    try:
        with database_only(settings.data_dir, settings.owner_database_url) as database_url:
            return asyncio.run(_with_tenant(database_url, tenant, work))
    except EmbeddedError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    except ApiError as exc:
        typer.echo(f"{exc.code}: {exc.detail}", err=True)
        raise typer.Exit(1) from exc


def replay(
    writer: Annotated[str, typer.Option(help="The writer to try (a configured name).")],
    user: Annotated[str | None, typer.Option(help="Only this user's chunks.")] = None,
    since: Annotated[str | None, typer.Option(help="Chunks received at or after (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option(help="Chunks received before (RFC 3339).")] = None,
    bank: Annotated[
        str | None, typer.Option(help="The bank's name (default: from writer and filter).")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Users written at once.")] = 16,
    tenant: TenantName = "default",
) -> None:
    """Run stored chunks again, in order per user, through WRITER into a shadow bank of its own.

    The same replay run again resumes: it adds nothing twice and goes on with what is left."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from sqlalchemy.ext.asyncio import AsyncSession

    from app.db.distribution import is_distributed
    from app.domain.pipeline.services import PipelineDeps
    from app.domain.shadows.replay import UnknownReplayWriterError, drain, feed_all, start_replay
    from app.embeddings import embedder_from_settings
    from app.writers.registry import WriterRegistry

    window = (_moment(since), _moment(until))

    async def work(engine: Any, settings: Any, tenant_id: uuid.UUID) -> None:
        registry = WriterRegistry(settings)
        try:
            async with AsyncSession(engine) as session, session.begin():
                target = await start_replay(
                    session,
                    tenant_id,
                    writer=writer,
                    writers=registry,
                    user_id=user,
                    since=window[0],
                    until=window[1],
                    name=bank,
                )
        except UnknownReplayWriterError as exc:
            await registry.aclose()
            typer.echo(f"memstore: {exc}", err=True)
            raise typer.Exit(1) from exc
        users = await feed_all(engine, target)
        deps = PipelineDeps(
            engine=engine,
            settings=settings,
            writers=registry,
            embedder=embedder_from_settings(settings),
            worker_name=f"replay@{socket.gethostname()}",
            distributed=await is_distributed(engine),
        )
        try:
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            ) as bar:
                task = bar.add_task(f"replaying through {writer} into {target.name}", total=None)
                done = await drain(
                    deps,
                    target,
                    concurrency=concurrency,
                    report=lambda p: bar.update(task, completed=p.applied + p.failed, total=p.total),
                )
        finally:
            await deps.aclose()
        typer.echo(
            f"bank {target.name}: {done.total} chunks ({len(users)} users given new chunks this run), "
            f"{done.applied} applied, {done.failed} failed, {done.pending} pending"
        )

    _on_database(tenant, work)


@writers_cli.command("compare")
def compare(
    b: Annotated[str, typer.Option("--b", help="A shadow bank's name.")],
    a: Annotated[
        str, typer.Option("--a", help="'primary' (the tenant's own bank) or a shadow bank.")
    ] = "primary",
    user: Annotated[str | None, typer.Option(help="Only this user.")] = None,
    threshold: Annotated[
        float | None, typer.Option(help="Cosine similarity at which memories match.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="Write it as markdown here.")
    ] = None,
    tenant: TenantName = "default",
) -> None:
    """Two banks side by side: op agreement per chunk, memories only in one or matched, memories per
    chunk, UPDATE / SUPERSEDE / DELETE rates, guards, failures, latency and tokens."""
    from sqlalchemy.ext.asyncio import AsyncSession

    from app.domain.shadows.compare import compare_banks, render_markdown

    async def work(engine: Any, settings: Any, tenant_id: uuid.UUID) -> dict[str, Any]:
        async with AsyncSession(engine) as session:
            return await compare_banks(
                session,
                tenant_id,
                a,
                b,
                user_id=user,
                threshold=threshold or settings.compare_match_threshold,
            )

    report = _on_database(tenant, work)
    text = render_markdown(report)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    if markdown_out is not None:
        markdown_out.write_text(text, encoding="utf-8")
    typer.echo(text)


def register(cli: typer.Typer) -> None:
    cli.command()(replay)
    cli.add_typer(writers_cli, name="writers")
