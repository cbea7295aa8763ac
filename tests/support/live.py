"""The real API on a real socket, for clients that speak HTTP themselves (the SDK, a browser)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from litestar import Litestar

from app.config import Settings
from app.server.asgi import create_app
from app.server.lifespan import AppServices
from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LiveApp:
    url: str
    app: Litestar

    @property
    def services(self) -> AppServices:
        """What the running app built (its batcher, its subscriptions), for tests that wait on them."""
        services: AppServices = self.app.state.services
        return services


@contextlib.asynccontextmanager
async def live_api(settings: Settings) -> AsyncIterator[str]:
    """`create_app(settings)` served by uvicorn on 127.0.0.1 in this event loop; yields its base URL."""
    async with live_app(settings) as live:
        yield live.url


@contextlib.asynccontextmanager
async def live_app(settings: Settings) -> AsyncIterator[LiveApp]:
    """`live_api`, yielding the app beside its base URL."""
    port = free_port()
    app = create_app(settings, configure_logs=False)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        # A connection a client left open must not hold the test's teardown until pytest's timeout:
        # after this long uvicorn cancels what still runs and the app's lifespan ends as usual.
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # signals stay pytest's
    task = asyncio.create_task(server.serve())
    try:

        def started() -> bool:
            if task.done():
                task.result()  # it failed to start: its error
            return bool(server.started)

        await wait_for(started, timeout_s=60, what=f"the API listening on port {port}")
        yield LiveApp(f"http://127.0.0.1:{port}", app)
    finally:
        server.should_exit = True
        await task
