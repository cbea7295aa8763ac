"""Both ends of a service connection give up on a peer gone silent after `MEMSTORE_DB_KEEPALIVE_S`:
the service's socket carries TCP keepalive and a user timeout, and Postgres is asked for the same in
the startup packet (a lost worker's backends and advisory locks go in seconds, not hours). With 0,
neither: a pooler that refuses unknown startup parameters gets none."""

from __future__ import annotations

import socket

from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine
from tests.support.tcp_proxy import postgres_proxy


async def socket_and_startup(settings: Settings, keepalive_s: float) -> tuple[socket.socket, bytes]:
    """The options of a new engine connection's socket (over TCP, through a proxy) and what it sent
    to open it."""
    async with postgres_proxy(settings.database_url or "") as proxy:
        update = {"database_url": proxy.url(), "db_keepalive_s": keepalive_s}
        engine = create_engine(settings.model_copy(update=update), application_name="memstore-tests")
        try:
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT 1")) == 1
                raw = await conn.get_raw_connection()
                transport = raw.driver_connection._transport  # type: ignore[union-attr]
                options = transport.get_extra_info("socket")
                found = socket.socket(fileno=socket.dup(options.fileno()))
        finally:
            await engine.dispose()
        return found, b"".join(proxy.openings)


def tcp(sock: socket.socket, option: str) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, option))


async def test_a_connection_is_dropped_by_both_ends_when_its_peer_goes_silent(settings: Settings) -> None:
    sock, startup = await socket_and_startup(settings, 10.0)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert (tcp(sock, "TCP_KEEPIDLE"), tcp(sock, "TCP_KEEPINTVL"), tcp(sock, "TCP_KEEPCNT")) == (5, 2, 3)
        assert tcp(sock, "TCP_USER_TIMEOUT") == 10_000
    for name, value in (
        ("tcp_keepalives_idle", "5"),
        ("tcp_keepalives_interval", "2"),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", "10000"),
    ):
        assert f"\0{name}\0{value}\0".encode() in startup, (name, startup)


async def test_zero_leaves_the_systems_defaults_and_sends_postgres_nothing(settings: Settings) -> None:
    sock, startup = await socket_and_startup(settings, 0)
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        assert tcp(sock, "TCP_USER_TIMEOUT") == 0
    assert b"application_name" in startup
    assert b"tcp_" not in startup
