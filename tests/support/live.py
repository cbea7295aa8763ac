"""The real API on a real socket, for clients that speak HTTP themselves (the SDK, a browser)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn

from app.config import Settings
from app.server.asgi import create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def live_api(settings: Settings) -> AsyncIterator[str]:
    """`create_app(settings)` served by uvicorn on 127.0.0.1 in this event loop; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, configure_logs=False),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # signals stay pytest's
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
