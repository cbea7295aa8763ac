"""Runs the service's processes as children and stops them in order on SIGINT / SIGTERM.

API and workers get SIGTERM first (the API drains requests, workers let in-flight jobs finish);
the embedded Postgres and Redis are stopped by the caller afterwards. Children live in their own
sessions so a terminal Ctrl-C reaches only the supervisor, which then decides the order.

A dead child is started again; so are the embedded servers, by the caller's `on_tick`. What cannot
be brought back stops the whole service with a non-zero exit: it never stays up half alive.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from app.lib import metrics

log = structlog.get_logger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: have the kernel SIGTERM this child if the supervisor itself is killed."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        log.info("supervisor.child_started", child=self.name, pid=self.proc.pid)


@dataclass
class Supervisor:
    """Start children, restart one that dies, and stop them all when told to.

    A child that dies more than `max_restarts` times within a minute is crashing, not unlucky:
    the supervisor then stops everything and exits non-zero.
    """

    children: list[Child] = field(default_factory=list)
    stop_timeout_s: float = 30.0
    max_restarts: int = 5
    _stopping: bool = False
    _code: int = 0

    def add(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.children.append(Child(name, args, env))

    def _on_signal(self, signum: int, _: object) -> None:
        if not self._stopping:
            log.info("supervisor.stopping", signal=signal.Signals(signum).name)
        self._stopping = True

    def abort(self, reason: str) -> None:
        """Stop everything and exit non-zero: something the service needs is gone for good."""
        log.error("supervisor.aborting", reason=reason)
        self._stopping, self._code = True, 1

    def run(self, on_tick: Callable[[], None] | None = None) -> int:
        """Block until a signal or a child's death; return the exit code for the supervisor."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in self.children:
                child.start()
            while not self._stopping:
                for child in self.children:
                    assert child.proc is not None
                    if child.proc.poll() is not None and not self._stopping:
                        log.error("supervisor.child_exited", child=child.name, code=child.proc.returncode)
                        metrics.process_exited(child.proc.pid)
                        now = time.monotonic()
                        child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                        if len(child.restarts) > self.max_restarts:
                            self.abort(f"{child.name} exited {len(child.restarts)} times within a minute")
                        else:
                            child.start()
                if on_tick is not None and not self._stopping:
                    on_tick()
                time.sleep(0.2)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._code

    def stop(self) -> None:
        running = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for child in running:
            assert child.proc is not None
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("supervisor.child_killed", child=child.name, pid=child.proc.pid)
                child.proc.kill()
                child.proc.wait(5)
        log.info("supervisor.stopped", children=len(running))


def child_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(overrides)
    return env
