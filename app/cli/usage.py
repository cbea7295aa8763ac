"""`memstore usage`: what every tenant's writes cost, for an operator, read from Postgres as the tables'
owner (MEMSTORE_ADMIN_DATABASE_URL, else the embedded stack's), never through the API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from app.config import get_settings


def register(cli: typer.Typer) -> None:
    cli.command()(usage)


def usage(
    since: Annotated[
        datetime | None, typer.Option(formats=["%Y-%m-%d"], help="First UTC day (default: 6 days ago).")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(formats=["%Y-%m-%d"], help="Last UTC day (default: today).")
    ] = None,
    by: Annotated[
        list[str] | None, typer.Option(help="Group by day, user and/or writer, besides the tenant (repeat).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="Most groups shown.")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per group, one a line.")] = False,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """Chunks applied, model calls, prompt and completion tokens and texts embedded, per tenant (and per
    day, user or writer with --by), most tokens first: summed from the writer changesets, exact."""
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.usage import services
    from app.domain.usage.repositories import UsageRepository
    from app.domain.usage.schemas import UsageRow
    from app.lib.embedded import database_only
    from app.lib.errors import ApiError

    settings = get_settings()
    try:
        first, last = services.window(since and since.date(), until and until.date())
        grouped = services.groups(by or [])
    except ApiError as exc:
        typer.echo(f"memstore usage: {exc.detail}", err=True)
        raise typer.Exit(2) from exc

    async def run(database_url: str) -> tuple[list[UsageRow], dict[str, str]]:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-cli"
        )
        try:
            async with create_sessionmaker(engine)() as session:
                rows = await UsageRepository(session).report(None, first, last, grouped, limit)
                names = await UsageRepository(session).tenant_names(
                    {r.tenant_id for r in rows if r.tenant_id}
                )
        finally:
            await engine.dispose()
        return rows, names

    with database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url:
        rows, names = asyncio.run(run(database_url))
    if as_json:
        for row in rows:
            out = msgspec.to_builtins(row) | {"tenant": names.get(str(row.tenant_id))}
            typer.echo(msgspec.json.encode({k: v for k, v in out.items() if v is not None}).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Writer usage {first} to {last} (UTC) — {datetime.now(UTC):%H:%M} UTC")
    columns = ["tenant", *grouped, "chunks", "calls", "prompt tok", "completion tok", "embedded"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("tenant", "day", "user", "writer") else "right")
    keys = {"day": "day", "user": "user_id", "writer": "writer"}
    for row in rows:
        table.add_row(
            names.get(str(row.tenant_id), str(row.tenant_id)),
            *(str(getattr(row, keys[g]) or "") for g in grouped),
            f"{row.chunks_applied:,}",
            f"{row.model_calls:,}",
            f"{row.prompt_tokens:,}",
            f"{row.completion_tokens:,}",
            f"{row.embedder_texts:,}",
        )
    Console().print(table)
