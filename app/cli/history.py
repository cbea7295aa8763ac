"""`memstore history | rollback | revert | restore | audit verify`: history and undo at a terminal.

These talk to the database directly (MEMSTORE_DATABASE_URL, else the embedded one under
MEMSTORE_DATA_DIR: the running `memstore up`'s if there is one), so they work while the API is
down; each command writes in one transaction (texts an undo brings back are embedded before it
begins, with nothing locked), attributed to `cli:<os user>` in the versions it writes and
in the audit log, exactly as the admin API would record it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import get_settings

T = TypeVar("T")

audit_cli = typer.Typer(help="Inspect the audit log.", no_args_is_help=True)

Tenant = Annotated[str, typer.Option("--tenant", help="Tenant name.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would change; change nothing.")]
Reason = Annotated[str | None, typer.Option(help="Why (kept with the new versions).")]


def _moment(value: str) -> datetime:
    """A time from the command line: RFC 3339; without a zone, UTC."""
    from app.lib.validation import parse_moment

    try:
        moment = datetime.fromisoformat(value)
        return parse_moment(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _run(
    work: Callable[[AsyncSession, uuid.UUID, async_sessionmaker[AsyncSession]], Awaitable[T]], tenant: str
) -> T:
    """Run `work` for the named tenant and commit what it wrote; API errors become a message and exit 1.

    `work` gets a session with no transaction open: the undo services embed texts before they begin
    the transaction that locks and writes (a transaction begun here would stay open over that call).
    """
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.accounts.repositories import TenantRepository
    from app.lib.embedded import EmbeddedError, database_only
    from app.lib.errors import ApiError

    settings = get_settings()

    async def run(database_url: str) -> T:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-cli"
        )
        try:
            sessionmaker = create_sessionmaker(engine)
            async with sessionmaker() as session:  # closing it rolls back whatever was not committed
                found = await TenantRepository(session).get_by_name(tenant)
                if found is None:
                    typer.echo(f"No tenant named {tenant!r}.", err=True)
                    raise typer.Exit(1)
                await session.commit()
                result = await work(session, found.id, sessionmaker)
                await session.commit()
                return result
        finally:
            await engine.dispose()

    try:
        with database_only(settings.data_dir, settings.owner_database_url) as database_url:
            return asyncio.run(run(database_url))
    except EmbeddedError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    except ApiError as exc:
        typer.echo(f"{exc.code}: {exc.detail}", err=True)
        for conflict in exc.details.get("conflicts", []):
            typer.echo(
                f"  conflict: memory {conflict['memory_id']} v{conflict['version']} "
                f"by changeset {conflict['changeset_id']} ({conflict['op']}, {conflict['actor']})",
                err=True,
            )
        raise typer.Exit(1) from exc


@contextlib.asynccontextmanager
async def _embedder(session: AsyncSession, tenant_id: uuid.UUID) -> AsyncIterator[Any]:
    """The tenant's embedder (an undo may embed a restored text again), closed afterwards: its own,
    else the deployment's; during a move to another, that one (as the API's writes do)."""
    from app.domain.search.tenant_embedder import read_choice
    from app.embeddings import embedder_from_settings

    choice = await read_choice(session, tenant_id)
    embedder = embedder_from_settings(get_settings(), choice.switching_to or choice.own)
    try:
        yield embedder
    finally:
        await embedder.aclose()


def _who(reason: str | None = None) -> Any:
    from app.domain.audit.services import Actor

    return Actor(f"cli:{getpass.getuser()}", None, reason)


def show_diff(result: Any) -> None:
    """A diff as a reviewer reads one: per memory, version and status, old and new content."""
    verb = "would change" if result.dry_run else "changed"
    typer.echo(f"{len(result.diff)} memories {verb}" + (" (dry run)" if result.dry_run else ""))
    for entry in result.diff:
        before, after = entry["before"], entry["after"]
        status = (
            before["status"]
            if before["status"] == after["status"]
            else f"{before['status']} -> {after['status']}"
        )
        typer.echo(f"~ {entry['memory_id']}  v{before['version']} -> v{after['version']}  {status}")
        if before["content"] != after["content"]:
            typer.echo(f"  - {before['content']}")
            typer.echo(f"  + {after['content']}")
    for conflict in result.conflicts:
        typer.echo(
            f"! forced over: memory {conflict['memory_id']} v{conflict['version']} "
            f"by changeset {conflict['changeset_id']}"
        )
    for changeset_id in result.changeset_ids:
        typer.echo(f"changeset {changeset_id}")


def register(cli: typer.Typer) -> None:
    """Add the history commands to the `memstore` command."""
    cli.add_typer(audit_cli, name="audit")

    @cli.command()
    def history(memory_id: uuid.UUID, tenant: Tenant = "default") -> None:
        """Every version of a memory with its provenance, oldest first."""
        from app.domain.memories.services import memory_history

        async def work(session: AsyncSession, tenant_id: uuid.UUID, _: Any) -> None:
            for v in await memory_history(session, tenant_id, memory_id):
                source = f"{v.writer}/{v.model or '-'}" if v.writer else "-"
                typer.echo(
                    f"v{v.version}  {v.created_at:%Y-%m-%d %H:%M:%S}  {v.op:<9} {v.status:<10} "
                    f"{v.actor}  writer={source}  changeset={v.changeset_id}"
                )
                typer.echo(f"    {v.content}")
                if v.reason:
                    typer.echo(f"    reason: {v.reason}")

        _run(work, tenant)

    @cli.command()
    def rollback(
        memory_id: uuid.UUID,
        to_version: Annotated[int, typer.Option("--to-version", min=1, help="The version to go back to.")],
        tenant: Tenant = "default",
        dry_run: DryRun = False,
        reason: Reason = None,
    ) -> None:
        """Roll a memory back to an earlier version (as a new version)."""
        from app.domain.history.services import rollback_memory

        async def work(session: AsyncSession, tenant_id: uuid.UUID, _: Any) -> Any:
            async with _embedder(session, tenant_id) as embedder:
                return await rollback_memory(
                    session,
                    tenant_id,
                    memory_id,
                    to_version=to_version,
                    who=_who(reason),
                    embedder=embedder,
                    dry_run=dry_run,
                )

        show_diff(_run(work, tenant))

    @cli.command()
    def revert(
        changeset_id: Annotated[uuid.UUID | None, typer.Argument(help="One changeset to revert.")] = None,
        since: Annotated[str | None, typer.Option(help="Bulk: writer changesets since (ISO time).")] = None,
        until: Annotated[str | None, typer.Option(help="Bulk: ... and before (ISO time).")] = None,
        writer: Annotated[str | None, typer.Option(help="Bulk: of this writer.")] = None,
        model: Annotated[str | None, typer.Option(help="Bulk: of this model.")] = None,
        user_id: Annotated[str | None, typer.Option("--user", help="Bulk: of this user.")] = None,
        force: Annotated[bool, typer.Option("--force", help="Revert over later changes.")] = False,
        tenant: Tenant = "default",
        dry_run: DryRun = False,
        reason: Reason = None,
    ) -> None:
        """Revert one changeset, or (with --since) every matching writer changeset, newest first."""
        from app.domain.history.services import bulk_revert, revert_changeset

        if (changeset_id is None) == (since is None):
            typer.echo("Give a changeset id, or --since (with --writer / --model / --user).", err=True)
            raise typer.Exit(2)

        async def work(session: AsyncSession, tenant_id: uuid.UUID, _: Any) -> Any:
            async with _embedder(session, tenant_id) as embedder:
                if changeset_id is not None:
                    return await revert_changeset(
                        session,
                        tenant_id,
                        changeset_id,
                        who=_who(reason),
                        embedder=embedder,
                        force=force,
                        dry_run=dry_run,
                    )
                assert since is not None
                return await bulk_revert(
                    session,
                    tenant_id,
                    since=_moment(since),
                    until=_moment(until) if until else None,
                    writer=writer,
                    model=model,
                    user_id=user_id,
                    who=_who(reason),
                    embedder=embedder,
                    force=force,
                    dry_run=dry_run,
                )

        show_diff(_run(work, tenant))

    @cli.command()
    def restore(
        user_id: str,
        as_of: Annotated[str, typer.Option("--as-of", help="ISO time the bank goes back to.")],
        tenant: Tenant = "default",
        dry_run: DryRun = False,
        reason: Reason = None,
    ) -> None:
        """Restore a user's bank to what it was at a time."""
        from app.domain.history.services import restore_user

        async def work(session: AsyncSession, tenant_id: uuid.UUID, _: Any) -> Any:
            async with _embedder(session, tenant_id) as embedder:
                return await restore_user(
                    session,
                    tenant_id,
                    user_id,
                    as_of=_moment(as_of),
                    who=_who(reason),
                    embedder=embedder,
                    dry_run=dry_run,
                )

        show_diff(_run(work, tenant))


@audit_cli.command("verify")
def audit_verify(tenant: Tenant = "default") -> None:
    """Seal pending events and verify the tenant's hash chain; exit 1 at the first broken link."""
    from app.domain.audit.services import ChainVerdict, seal_and_verify

    async def work(
        _: AsyncSession, tenant_id: uuid.UUID, sessionmaker: async_sessionmaker[AsyncSession]
    ) -> ChainVerdict:
        return await seal_and_verify(sessionmaker, tenant_id)

    verdict = _run(work, tenant)
    if verdict.ok:
        typer.echo(f"ok: {verdict.checked} events verified")
        return
    typer.echo(
        f"BROKEN at event {verdict.broken_at_seq}: {verdict.reason} ({verdict.checked} verified before it)"
    )
    raise typer.Exit(1)
