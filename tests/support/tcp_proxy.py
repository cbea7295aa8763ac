"""A TCP proxy in front of the test Postgres, which a test can cut: the service connects over TCP, as it
does in production (the embedded Postgres listens on a Unix socket only), and a cut closes every
connection through it and refuses new ones, as a database lost to its clients does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

_FIRST_BYTES = 4096  # what is kept of each connection's start: the SSL request and the startup packet


@dataclass
class PostgresProxy:
    """Listens on 127.0.0.1:`port` and relays each connection to the Postgres of `database_url`."""

    database_url: str
    port: int = 0
    # The first bytes each client sent (its startup packet: user, database, startup parameters).
    openings: list[bytes] = field(default_factory=list)
    cut_off: bool = False
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _relays: set[asyncio.Task[None]] = field(default_factory=set)

    def url(self) -> str:
        """`database_url`, reaching the server through this proxy."""
        url = make_url(self.database_url)
        query = {k: v for k, v in url.query.items() if k != "host"}
        return url.set(host="127.0.0.1", port=self.port, query=query).render_as_string(hide_password=False)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    def cut(self) -> None:
        """Every connection through the proxy closed; new ones are closed as they come."""
        self.cut_off = True
        for writer in list(self._writers):
            writer.close()

    def restore(self) -> None:
        self.cut_off = False

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        url = make_url(self.database_url)
        host = url.query.get("host") or url.host or "localhost"
        host = host if isinstance(host, str) else host[-1]
        port = url.port or 5432
        if host.startswith("/"):  # a socket directory
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        up_reader, up_writer = await self._open_upstream()
        self._writers |= {writer, up_writer}
        opening = bytearray()
        self.openings.append(b"")
        index = len(self.openings) - 1

        def keep(data: bytes) -> None:
            if len(opening) < _FIRST_BYTES:
                opening.extend(data[: _FIRST_BYTES - len(opening)])
                self.openings[index] = bytes(opening)

        relays = [
            asyncio.create_task(_relay(reader, up_writer, keep)),
            asyncio.create_task(_relay(up_reader, writer, None)),
        ]
        self._relays.update(relays)
        try:
            await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for relay in relays:
                relay.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            self._relays.difference_update(relays)
            for end in (writer, up_writer):
                self._writers.discard(end)
                end.close()


async def _relay(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, keep: Callable[[bytes], None] | None
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(65536):
            if keep is not None:
                keep(data)
            sink.write(data)
            await sink.drain()


@contextlib.asynccontextmanager
async def postgres_proxy(database_url: str) -> AsyncIterator[PostgresProxy]:
    """A running `PostgresProxy` to `database_url`'s server, stopped afterwards."""
    proxy = PostgresProxy(database_url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
