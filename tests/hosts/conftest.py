"""The fleet spread over hosts (`make test-hosts`): each role of the service in a Linux network namespace of
its own, with its own address on a bridge the rig makes, and the links between them cut on demand.

Opt-in, not part of `make test`: it runs only with MEMSTORE_TEST_HOSTS=1 (which `make test-hosts` sets),
as root (namespaces, a bridge and firewall rules need it) and with iproute2's `ip netns`; otherwise its
tests are skipped, saying why. Everything it makes is named `mshost-…` (namespaces, links, the firewall
table, data directories under the temporary directory); what a crashed run left is removed before a new
one starts, and everything is removed again when the session ends, however the tests ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.config import Settings
from app.lib.embedded import EmbeddedPostgres
from tests.support.waiting import wait_for_sync
from tests.support.workers import settings_env

OPT_IN = "MEMSTORE_TEST_HOSTS"
PREFIX = "mshost-"
BRIDGE = f"{PREFIX}br"
SUBNET = "10.213.0"  # a private /24 on a bridge only the rig uses; the bridge's own address is the client's
CLIENT = f"{SUBNET}.1"
CUT_TABLE = ("inet", "mshost_cut")  # in the cut host's namespace, gone with it
HOSTS = {"pg": 10, "redis": 11, "api1": 21, "api2": 22, "worker1": 31, "worker2": 32}
PG_PORT = 5432
REDIS_PORT = 6379
API_PORT = 8000
REPO = Path(__file__).resolve().parents[2]
START_WITHIN_S = 60


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    if os.environ.get(OPT_IN) != "1":
        reason = f"the tests over network namespaces run with `make test-hosts` ({OPT_IN}=1)"
    elif os.geteuid() != 0:
        reason = "network namespaces, a bridge and firewall rules need root"
    elif not netns_available():
        reason = "iproute2's `ip netns` is not available"
    if reason is None:
        return
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


def netns_available() -> bool:
    if shutil.which("ip") is None:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode == 0


def sh(*args: str, check: bool = True) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        msg = f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        raise RuntimeError(msg)
    return result.stdout


def in_host(host: str, *args: str, check: bool = True) -> str:
    return sh("ip", "netns", "exec", PREFIX + host, *args, check=check)


def address(host: str) -> str:
    return f"{SUBNET}.{HOSTS[host]}"


def remove_everything() -> None:
    """Whatever a run of the rig made, this run's or a crashed one's, found by its name: the processes in
    its namespaces (killed), the namespaces (their ends of the links go with them), the bridge and its
    links, the data directories."""
    for line in sh("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        for pid in sh("ip", "netns", "pids", name, check=False).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "del", name, check=False)
    for line in sh("ip", "-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link.startswith(PREFIX):
            sh("ip", "link", "del", link, check=False)
    for leftover in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def make_network() -> None:
    """The bridge (holding the client's address) and one namespace per host, linked to it by a veth pair.

    No namespace has a route beyond the /24 (no default route), the machine forwards nothing for them
    and nothing is NATed: traffic stays among the rig's hosts, the client and each host's loopback."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{CLIENT}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for host in HOSTS:
        ns = PREFIX + host
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", ns, "master", BRIDGE, "up")
        in_host(host, "ip", "link", "set", "lo", "up")
        in_host(host, "ip", "addr", "add", f"{address(host)}/24", "dev", "eth0")
        in_host(host, "ip", "link", "set", "eth0", "up")


def cut_method() -> str:
    """`nft` when nftables is installed (`make test-hosts` installs it): packets are dropped without a
    word, as in a real partition, so TCP retransmits and the service's own timeouts are what run out.
    Otherwise blackhole routes, which drop too but make the cut host's own sends fail at once."""
    return "nft" if shutil.which("nft") else "blackhole"


def cut(host: str, peer: str) -> None:
    """Nothing passes between `host` and `peer` any more, either way; set up in `host`'s namespace."""
    if cut_method() == "nft":
        in_host(host, "nft", "add", "table", *CUT_TABLE)
        for chain, hook, match in (("in", "input", "saddr"), ("out", "output", "daddr")):
            spec = f"{{ type filter hook {hook} priority 0; policy accept; }}"
            in_host(host, "nft", "add", "chain", *CUT_TABLE, chain, spec)
            in_host(host, "nft", "add", "rule", *CUT_TABLE, chain, "ip", match, address(peer), "drop")
    else:
        in_host(host, "ip", "route", "add", "blackhole", f"{address(peer)}/32")
        in_host(peer, "ip", "route", "add", "blackhole", f"{address(host)}/32")


def restore(host: str, peer: str) -> None:
    """Undo `cut` (nothing to undo: nothing done)."""
    if cut_method() == "nft":
        in_host(host, "nft", "delete", "table", *CUT_TABLE, check=False)
    else:
        in_host(host, "ip", "route", "del", "blackhole", f"{address(peer)}/32", check=False)
        in_host(peer, "ip", "route", "del", "blackhole", f"{address(host)}/32", check=False)


@dataclass
class Fleet:
    """The hosts' processes and how to reach them: the API by its hosts' addresses over the bridge, the
    database as its owner over Postgres's Unix socket (which no cut reaches: the tests' own view)."""

    data_dir: Path
    owner_url: str
    settings: Settings
    admin_key: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def api_url(self, host: str) -> str:
        return f"http://{address(host)}:{API_PORT}"

    def start(
        self, host: str, *args: str, env: dict[str, str] | None = None, user: str | None = None
    ) -> None:
        """`args` run in `host`'s namespace (as `user`), their output in `<data_dir>/<host>.log`."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
        with (self.data_dir / f"{host}.log").open("ab") as log:
            self.processes[host] = subprocess.Popen(
                ["ip", "netns", "exec", PREFIX + host, *as_user, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )

    def log_tail(self, host: str) -> str:
        return (self.data_dir / f"{host}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """API and workers first (they may still be finishing with the servers), then Redis and Postgres."""
        for host in ("api1", "api2", "worker1", "worker2", "redis", "pg"):
            proc = self.processes.pop(host, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGINT if host == "pg" else signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def start_postgres(fleet: Fleet, pg: EmbeddedPostgres) -> None:
    """The embedded Postgres's own binaries on the `pg` host, listening on its address (and on its Unix
    socket, for the tests' view); its clients on the /24 trusted as they are on the socket."""
    with (pg.data_dir / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {SUBNET}.0/24 trust\n")
    fleet.start(
        "pg",
        str(pg.bin_dir / "postgres"),
        "-D",
        str(pg.data_dir),
        "-k",
        str(pg.socket_dir),
        "-h",
        address("pg"),
        "-p",
        str(PG_PORT),
        "-c",
        "max_connections=300",
        "-c",
        "logging_collector=off",
        user="pgserver",
    )
    wait_for_sync(
        lambda: pg.psql("SELECT 1").strip() == "1",
        timeout_s=START_WITHIN_S,
        what="Postgres on the pg host",
        interval_s=0.1,
        ignore=(subprocess.CalledProcessError,),
    )


def create_admin_key(owner_url: str) -> str:
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.accounts.services import create_tenant

    async def create() -> str:
        engine = create_engine(Settings(database_url=owner_url), application_name="memstore-tests")
        try:
            async with create_sessionmaker(engine)() as session, session.begin():
                _, key = await create_tenant(session, f"hosts-{uuid.uuid4().hex[:8]}")
        finally:
            await engine.dispose()
        return key

    return asyncio.run(create())


def wait_until_serving(fleet: Fleet, host: str) -> None:
    def ready() -> int:
        assert fleet.processes[host].poll() is None, f"{host} exited:\n{fleet.log_tail(host)}"
        return httpx.get(f"{fleet.api_url(host)}/ready", timeout=2).status_code

    wait_for_sync(
        ready,
        lambda status: status == 200,
        timeout_s=START_WITHIN_S,
        what=f"{host}'s /ready to answer 200",
        interval_s=0.2,
        ignore=(httpx.HTTPError,),
    )


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    """Postgres, Redis, two API processes and two workers, each on a host of its own, ready to serve."""
    from app.db.migrate import upgrade

    remove_everything()
    data_dir = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        make_network()
        # Made, migrated and stopped as the embedded stack does it, on its Unix socket; then run on pg.
        pg = EmbeddedPostgres(data_dir / "pg")
        pg.start()
        owner_url = pg.url()
        upgrade(owner_url)
        pg.stop()
        settings = Settings(
            database_url=f"postgresql+asyncpg://memstore_service@{address('pg')}:{PG_PORT}/memstore",
            admin_database_url=f"postgresql+asyncpg://postgres@{address('pg')}:{PG_PORT}/memstore",
            redis_url=f"redis://{address('redis')}:{REDIS_PORT}/0",
            writer="offline",
            embedder="hashing",
            auth_cache_ttl_s=0.0,
            rate_limit_per_s=0.0,
            user_rate_limit_per_s=0.0,
            # Work a lost wake-up left in Postgres is found within seconds, not the default 25.
            sweep_interval_s=2,
            sweep_min_age_s=3.0,
            # A turn's lease is the writer's timeout + 30.5 s: a worker lost for good gives its turns
            # back after 35.5 s rather than 90.5 s (the offline writer answers in milliseconds).
            writer_timeout_s=5.0,
        )
        fleet = Fleet(data_dir, owner_url, settings)
        try:
            start_postgres(fleet, pg)
            fleet.start(
                "redis",
                "/usr/bin/redis-server",
                "--bind",
                address("redis"),
                "--port",
                str(REDIS_PORT),
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(data_dir),
            )
            env = settings_env(settings)
            for host in ("api1", "api2"):
                fleet.start(host, sys.executable, "-m", "app", "serve", "--host", address(host), env=env)
            for host in ("worker1", "worker2"):
                fleet.start(host, sys.executable, "-m", "app", "worker", env=env)
            fleet.admin_key = create_admin_key(owner_url)
            for host in ("api1", "api2"):
                wait_until_serving(fleet, host)
            yield fleet
        finally:
            fleet.stop()
    finally:
        remove_everything()
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass
class ChunkRow:
    id: str
    user_id: str
    seq: int
    status: str
    applied_at: object
    applies: int


class Database:
    """The tests' view of the bank: as the tables' owner, over the Unix socket."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def chunks(self, users: list[str]) -> list[ChunkRow]:
        rows = await self.conn.fetch(
            "SELECT c.id::text, c.user_id, c.seq, c.status, c.applied_at,"
            " (SELECT count(*) FROM changesets s WHERE s.chunk_id = c.id AND s.kind = 'writer') AS applies"
            " FROM chunks c WHERE c.user_id = ANY($1::text[]) ORDER BY c.user_id, c.seq",
            users,
        )
        return [ChunkRow(**dict(r)) for r in rows]

    async def unapplied(self, users: list[str]) -> list[tuple[str, int, str]]:
        """(user, seq, status) of the users' chunks not applied yet."""
        return [(c.user_id, c.seq, c.status) for c in await self.chunks(users) if c.status != "applied"]

    async def applied(self, users: list[str]) -> int:
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM chunks WHERE user_id = ANY($1::text[]) AND status = 'applied'", users
            )
        )

    async def written_by(self, host: str) -> list[str]:
        """The tables `host`'s open transactions have written so far (none: it is not inside a write)."""
        rows = await self.conn.fetch(
            "SELECT DISTINCT c.relname FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
            " JOIN pg_class c ON c.oid = l.relation"
            " WHERE a.client_addr = $1::inet AND l.mode = 'RowExclusiveLock' AND c.relkind = 'r'"
            " ORDER BY 1",
            address(host),
        )
        return [r[0] for r in rows]


@pytest.fixture
async def database(fleet: Fleet) -> AsyncIterator[Database]:
    pg = EmbeddedPostgres(fleet.data_dir / "pg")
    conn = await asyncpg.connect(host=str(pg.socket_dir), user="postgres", database="memstore")
    try:
        yield Database(conn)
    finally:
        await conn.close()


def seconds_since(start: float) -> float:
    return round(time.monotonic() - start, 2)
