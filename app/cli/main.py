"""The `memstore` command: the operator's entry point.

`up` runs everything on one machine (embedded Postgres + Redis unless URLs are configured);
`serve`, `worker` and `migrate` run one part each, for production.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import httpx
import msgspec
import structlog
import typer

from app.cli import db, history, references, search, shadows, status, transfer, usage
from app.cli import eval as eval_cli
from app.config import Settings, get_settings
from app.lib.logging import configure_logging

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")

cli = typer.Typer(
    name="memstore",
    help="Memstore: a versioned memory store for AI agents.",
    no_args_is_help=True,
    add_completion=False,
)
tenants_cli = typer.Typer(help="Manage tenants.", no_args_is_help=True)
cli.add_typer(tenants_cli, name="tenants")

log = structlog.get_logger("app.cli")


def _require_urls(settings: Settings) -> tuple[str, str]:
    if settings.database_url is None or settings.redis_url is None:
        typer.echo(
            "MEMSTORE_DATABASE_URL and MEMSTORE_REDIS_URL must be set "
            "(or use `memstore up` for the embedded stack).",
            err=True,
        )
        raise typer.Exit(2)
    return settings.database_url, settings.redis_url


def _service_url(settings: Settings, embedded: str) -> str:
    """What the API and workers connect with: the service role's URL when both roles are configured,
    else the stack's (the embedded service role, or the one configured URL)."""
    if settings.admin_database_url and settings.database_url:
        return settings.database_url
    return embedded


async def _bootstrap(database_url: str, admin_key: str | None) -> str | None:
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.accounts.services import bootstrap_default_tenant

    settings = get_settings().model_copy(update={"database_url": database_url})
    engine = create_engine(settings, application_name="memstore-cli")
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            return await bootstrap_default_tenant(session, admin_key)
    finally:
        await engine.dispose()


@cli.command()
def up(
    host: Annotated[str, typer.Option(help="Address the API binds to.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the API binds to.")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where embedded Postgres and Redis keep data.")
    ] = None,
    workers: Annotated[int, typer.Option(min=0, help="Worker processes to start.")] = 1,
    api_processes: Annotated[int, typer.Option(min=1, help="API processes sharing the port.")] = 1,
    citus_workers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Run a Citus coordinator and this many workers instead of one Postgres, the schema "
            "distributed by tenant (needs `make citus`).",
        ),
    ] = 0,
) -> None:
    """Run everything: embedded Postgres + Redis (unless configured), migrations, the API and workers."""
    from app.db.migrate import upgrade
    from app.lib.embedded import EmbeddedError, EmbeddedStack
    from app.lib.supervisor import Supervisor, child_env

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="supervisor")
    started = time.monotonic()
    stack = EmbeddedStack(
        data_dir or settings.data_dir,
        settings.owner_database_url,
        settings.redis_url,
        citus_workers=citus_workers,
    )
    with _embedded_refusal():
        owner_url, redis_url = stack.start()
    code = 1
    try:
        upgrade(owner_url)
        if stack.cluster is not None:
            _distribute(owner_url)
        generated = asyncio.run(_bootstrap(owner_url, settings.admin_key))
        if generated:
            typer.echo(
                "\n  Admin API key of tenant 'default' (shown once, store it now):\n\n"
                f"    {generated}\n\n  Set MEMSTORE_ADMIN_KEY to choose your own.\n",
                err=True,
            )
        # The API and the workers connect as the service role, subject to row-level security.
        env = child_env(
            MEMSTORE_DATABASE_URL=_service_url(settings, stack.service_url),
            MEMSTORE_ADMIN_DATABASE_URL=owner_url,
            MEMSTORE_REDIS_URL=redis_url,
            PROMETHEUS_MULTIPROC_DIR=_metrics_dir(stack.data_dir / "metrics"),
        )
        supervisor = Supervisor(stop_timeout_s=settings.worker_shutdown_wait_s + 10)
        python = [sys.executable, "-m", "app"]
        supervisor.add(
            "api",
            [*python, "serve", "--host", host, "--port", str(port), "--processes", str(api_processes)],
            env,
        )
        for i in range(workers):
            supervisor.add(f"worker-{i + 1}", [*python, "worker"], env)

        url = f"http://{host}:{port}"
        announced = False

        def keep_serving() -> None:
            """Bring back an embedded server that stopped; stop everything if it cannot come back."""
            try:
                stack.revive()
            except EmbeddedError as exc:
                typer.echo(f"memstore up: {exc}; stopping (see {stack.data_dir}).", err=True)
                supervisor.abort(str(exc))
                return
            announce_when_ready()

        def announce_when_ready() -> None:
            nonlocal announced
            if announced:
                return
            try:
                ready = httpx.get(f"{url}/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return
            if ready:
                announced = True
                log.info(
                    "memstore.ready",
                    url=url,
                    docs=f"{url}/schema",
                    seconds=round(time.monotonic() - started, 2),
                )

        code = supervisor.run(on_tick=keep_serving)
    finally:
        stack.stop()
    raise typer.Exit(code)


def _distribute(owner_url: str) -> None:
    """The embedded cluster's schema distributed by tenant (`memstore db distribute`; once)."""
    from app.cli.db import distribute_database

    for step in asyncio.run(distribute_database(owner_url)):
        log.info("citus.distributed", step=step)
    typer.echo(f"memstore up: Citus coordinator at {owner_url}", err=True)


def _metrics_dir(default: Path) -> str:
    """Where this host's processes share their metrics (an operator's PROMETHEUS_MULTIPROC_DIR wins).

    Emptied at start: files of processes from an earlier run would otherwise be counted again.
    """
    import os
    import shutil

    path = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or default)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return str(path)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default MEMSTORE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default MEMSTORE_PORT).")] = None,
    processes: Annotated[int, typer.Option(min=1, help="API processes behind one socket.")] = 1,
) -> None:
    """Run the HTTP API against MEMSTORE_DATABASE_URL and MEMSTORE_REDIS_URL."""
    import os
    import tempfile

    import uvicorn

    settings = get_settings()
    _require_urls(settings)
    configure_logging(settings.log_level, settings.log_format, process="api")
    if processes > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Several processes behind one port: a scrape reaches one of them, so they pool their metrics.
        _metrics_dir(Path(tempfile.mkdtemp(prefix="memstore-metrics-")))
    uvicorn.run(
        "app.server.asgi:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        workers=processes,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        timeout_graceful_shutdown=10,
        server_header=False,
    )


@cli.command()
def worker() -> None:
    """Run one arq worker process (concurrency: MEMSTORE_WORKER_MAX_JOBS)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    settings = get_settings()
    _require_urls(settings)
    configure_logging(settings.log_level, settings.log_format, process="worker")
    from workers.settings import WorkerSettings
    from workers.wakeable import WakeableWorker

    with contextlib.suppress(ImportError):  # uvloop (from uvicorn[standard]): a cheaper event loop per query
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Losing Redis stops arq's poll loop; start it again once Redis answers. Nothing is lost meanwhile:
    # chunks wait in Postgres and the sweeper re-enqueues them. Between two runs arq's signal handlers
    # no longer act (its event loop is not running), so a stop asked for then is caught here: it must
    # end the process, not be swallowed while a new worker starts and runs on.
    stop = threading.Event()
    while True:
        try:
            WakeableWorker(**WorkerSettings).run()
            return
        except (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError) as exc:
            log.warning("worker.redis_lost", error=type(exc).__name__)
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if stop.wait(1.0):
                log.info("worker.stopped_while_redis_lost")
                return
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@cli.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """Upgrade the schema (the embedded database when MEMSTORE_DATABASE_URL is unset)."""
    from app.db.migrate import upgrade
    from app.lib.embedded import database_only

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    with (
        _embedded_refusal(),
        database_only(
            data_dir or settings.data_dir, settings.owner_database_url, initialise=True
        ) as database_url,
    ):
        upgrade(database_url, revision)


@cli.command(name="exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option(help="Embedded data directory.")] = None,
) -> None:
    """Run a command with MEMSTORE_DATABASE_URL / MEMSTORE_ADMIN_DATABASE_URL / MEMSTORE_REDIS_URL pointing
    at the (embedded) stack: the one `memstore up` runs on the data directory, else one started for the
    command.

    Example: `memstore exec -- alembic check`.
    """
    import subprocess

    from app.lib.embedded import EmbeddedStack
    from app.lib.supervisor import child_env

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")
    if not ctx.args:
        typer.echo("usage: memstore exec -- COMMAND [ARGS...]", err=True)
        raise typer.Exit(2)
    stack = EmbeddedStack(data_dir or settings.data_dir, settings.owner_database_url, settings.redis_url)
    with _embedded_refusal():
        owner_url, redis_url = stack.start()
    try:
        env = child_env(
            MEMSTORE_DATABASE_URL=_service_url(settings, stack.service_url),
            MEMSTORE_ADMIN_DATABASE_URL=owner_url,
            MEMSTORE_REDIS_URL=redis_url,
        )
        code = subprocess.run(ctx.args, env=env, check=False).returncode
    finally:
        stack.stop()
    raise typer.Exit(code)


def _in_one_transaction(data_dir: Path | None, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """`work` in one transaction as the tables' owner (MEMSTORE_ADMIN_DATABASE_URL, else the embedded
    stack's); an error it answers (an `ApiError`) is its message and exit 1."""
    from app.db.engine import create_engine, create_sessionmaker
    from app.lib.embedded import database_only
    from app.lib.errors import ApiError

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="cli")

    async def run(database_url: str) -> T:
        engine = create_engine(
            settings.model_copy(update={"database_url": database_url}), application_name="memstore-cli"
        )
        try:
            async with create_sessionmaker(engine)() as session, session.begin():
                return await work(session)
        finally:
            await engine.dispose()

    try:
        with (
            _embedded_refusal(),
            database_only(data_dir or settings.data_dir, settings.owner_database_url) as database_url,
        ):
            return asyncio.run(run(database_url))
    except ApiError as exc:
        typer.echo(exc.detail, err=True)
        raise typer.Exit(1) from exc


@tenants_cli.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="Unique tenant name.")],
    embedder: Annotated[
        str | None,
        typer.Option(help="Its own embedder, one of MEMSTORE_TENANT_EMBEDDERS (default: MEMSTORE_EMBEDDER)."),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """Create a tenant and print its first admin key (shown once)."""
    from app.domain.accounts.services import create_tenant
    from app.domain.search.tenant_embedder import allowed_embedders

    settings = get_settings()
    allowed = allowed_embedders(settings.embedder, settings.tenant_embedders)
    if embedder is not None and embedder not in allowed:
        raise typer.BadParameter(f"one of {', '.join(allowed)}", param_hint="--embedder")
    own = None if embedder == settings.embedder else embedder

    async def create(session: AsyncSession) -> str:
        tenant, secret = await create_tenant(session, name, actor="cli", embedder=own)
        typer.echo(f"tenant {tenant.name} ({tenant.id})", err=True)
        return secret

    typer.echo(_in_one_transaction(data_dir, create))


@tenants_cli.command("set")
def tenants_set(
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    write_weight: Annotated[
        float | None,
        typer.Option(
            min=0.001, max=1000, help="Its share of the writer fleet when others have work (1: equal)."
        ),
    ] = None,
    max_writer_concurrency: Annotated[
        int | None, typer.Option(min=0, help="Most writer calls in flight across the fleet (0: no cap).")
    ] = None,
    daily_token_budget: Annotated[
        int | None, typer.Option(min=-1, help="Writer tokens a UTC day (-1: no budget; 0: no writing).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """Set a tenant's writer share as its operator, past what its own admin may give it; prints its
    settings. A running fleet holds the new shares at once when MEMSTORE_REDIS_URL reaches its Redis,
    else from the tenant's next turn (a paused tenant: within a minute)."""
    from app.domain.accounts.schemas import TenantSettings
    from app.domain.accounts.services import set_tenant_options, tenant_by_name
    from app.domain.pipeline.scheduler import Shares, configure
    from app.lib.queue import create_redis

    changes: dict[str, object] = {}
    if write_weight is not None:
        changes["write_weight"] = None if write_weight == 1 else write_weight
    if max_writer_concurrency is not None:
        changes["max_writer_concurrency"] = max_writer_concurrency or None
    if daily_token_budget is not None:
        changes["daily_token_budget"] = None if daily_token_budget < 0 else daily_token_budget

    async def set_shares(session: AsyncSession) -> TenantSettings:
        tenant = await tenant_by_name(session, name)
        tenant = await set_tenant_options(
            session, tenant_id=tenant.id, changes=changes, known=lambda _: True, actor="cli"
        )
        return TenantSettings.of(tenant)

    out = _in_one_transaction(data_dir, set_shares)
    redis_url = get_settings().redis_url
    if redis_url and changes:  # a running fleet told at once

        async def tell() -> None:
            redis = create_redis(redis_url)
            try:
                shares = Shares(
                    weight=out.write_weight,
                    cap=out.max_writer_concurrency or 0,
                    budgeted=out.daily_token_budget is not None,
                )
                await configure(redis, out.tenant_id, shares)
            finally:
                await redis.aclose()

        asyncio.run(tell())
    typer.echo(msgspec.json.encode(out).decode())


@contextlib.contextmanager
def _embedded_refusal() -> Iterator[None]:
    """An embedded stack that cannot serve the command is a message and exit 1, not a traceback."""
    from app.lib.embedded import EmbeddedError

    try:
        yield
    except EmbeddedError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc


eval_cli.register(cli)
db.register(cli)
history.register(cli)
references.register(cli)
search.register(cli)
shadows.register(cli)
status.register(cli)
transfer.register(cli)
usage.register(cli)


def main() -> None:
    cli()
