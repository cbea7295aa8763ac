"""Waiting for something to happen, with a deadline: the one way a test waits for an event (a worker to
finish, a row to appear, a server to start, a status to change) instead of sleeping a guessed time.

`wait_for` looks with `probe()` until `until(seen)` holds and returns what it saw; when the deadline
passes it fails saying what it was waiting for and what it last saw, so a timeout in CI reads as a
finding, not as "timed out". The probe may be a coroutine function (a query, a request) or a plain one
(a counter this process holds). A probe that raises one of `ignore` (a server not listening yet) counts
as not yet, and that error is what it last saw. `wait_for_sync` is the same for code off the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_NOTHING = object()


def _truthy(value: object) -> bool:
    return bool(value)


def _timed_out(what: str, timeout_s: float, last: object) -> AssertionError:
    seen = "nothing (the probe never answered)" if last is _NOTHING else repr(last)
    if len(seen) > 3000:
        seen = seen[:3000] + " ..."
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last saw: {seen}")


async def wait_for(
    probe: Callable[[], Awaitable[T]] | Callable[[], T],
    until: Callable[[T], bool] = _truthy,
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.02,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`probe()` every `interval_s` until `until` holds for its answer (by default: until it is true);
    returns that answer. It looks once more at the deadline, so a slow probe gets its last chance."""
    deadline = time.monotonic() + timeout_s
    last: Any = _NOTHING
    while True:
        out_of_time = time.monotonic() >= deadline
        try:
            seen = probe()
            if inspect.isawaitable(seen):
                seen = await seen
        except ignore as exc:
            last = exc
        else:
            if until(seen):  # type: ignore[arg-type]
                return seen  # type: ignore[return-value]
            last = seen
        if out_of_time:
            raise _timed_out(what, timeout_s, last)
        await asyncio.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


def wait_for_sync(
    probe: Callable[[], T],
    until: Callable[[T], bool] = _truthy,
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_for` for code that runs off the event loop (in a thread, or a synchronous test)."""
    deadline = time.monotonic() + timeout_s
    last: Any = _NOTHING
    while True:
        out_of_time = time.monotonic() >= deadline
        try:
            seen = probe()
        except ignore as exc:
            last = exc
        else:
            if until(seen):
                return seen
            last = seen
        if out_of_time:
            raise _timed_out(what, timeout_s, last)
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
