"""arq's worker, woken by the API instead of waiting out its poll delay.

arq looks at its queue every `poll_delay` seconds, so a chunk acknowledged just after a look waits up to
that long before a worker takes it up. Here the wait between two looks ends as soon as a message
arrives on `WAKE_CHANNEL` (the API publishes one after each batch of jobs it enqueues): an idle worker
starts new work within milliseconds, and polls no more often when nothing happens. The poll stays as
the fallback, so a lost message (a listener reconnecting, Redis restarting) costs only the old delay.
Under load the looks are at most one per `MIN_POLL_INTERVAL_S`, however many messages arrive.

Each look also hands the worker's free slots to the fair scheduler (`app.domain.pipeline.scheduler`):
the scopes it gives are drained a turn each (`run_turn`) as tasks of this worker, counted among its
jobs, waited for on shutdown as its jobs are; a turn that ends starts the next look at once.

A turn that faults (`run_turn` answers `{"error": …}`: Postgres unreachable, mostly) stops the worker
taking turns until Postgres answers it again, probed on a connection of its own every
`DB_PROBE_EVERY_S`. A worker cut from Postgres but not from Redis would otherwise take every scope
whose turn comes up, fail it and hold it back from the workers that can serve it; paused, it leaves
them in the scheduler for the others. Once a probe has failed, its turns in flight are stopped and
their scopes given back within seconds, rather than each waiting for its statements to time out one
after another. (Its first fault comes from the connection: a silent peer fails a statement after
`MEMSTORE_DB_KEEPALIVE_S`, `app.db.engine`.)

A look costs one read of the queue and one batch of checks, not a transaction per job in it: arq keeps
a job in the queue while it runs and checks each id it reads (three Redis round trips) before starting
it. Here the ids this worker runs are never checked; the others are checked together in one round trip
(is it in progress?), and only those that are not go on to arq's check; an id found running in another
worker is not checked again for one poll delay. Skipping a check only ever postpones a start: arq's own
check still guards every job started.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from arq.constants import in_progress_key_prefix
from arq.worker import Worker
from redis.exceptions import RedisError

from app.db.engine import why_unreachable
from app.domain.pipeline.jobs import run_turn
from app.lib.queue import WAKE_CHANNEL

log = structlog.get_logger(__name__)

# The shortest time between two looks at the queue, whatever the rate of wake-ups.
MIN_POLL_INTERVAL_S = 0.005
_RESUBSCRIBE_S = 1.0
# While Postgres does not answer, it is probed this often (each probe a new connection).
DB_PROBE_EVERY_S = 1.0
# How long a turn given back may wait on Postgres before it is told to stop again.
STOP_GRACE_S = 1.0


class WakeableWorker(Worker):
    """An arq `Worker` whose wait between polls ends on a wake-up message (same options as arq's)."""

    def __init__(self, *args: Any, poll_delay: float = 0.5, **kwargs: Any) -> None:
        # arq's own loop runs without a pause: the wait is ours, in `_poll_iteration`.
        super().__init__(*args, poll_delay=0, **kwargs)
        self.wait_s = float(poll_delay)
        self._woken = asyncio.Event()
        # job id -> monotonic time until which it is taken to be running in another worker
        self._elsewhere: dict[bytes, float] = {}
        self._listener: asyncio.Task[None] | None = None
        self._turns = 0  # turns started, naming each among the worker's tasks
        # Set while no turn is taken: a turn faulted, and Postgres has not answered a probe since.
        self._db_check: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[Any]] = set()  # turns given back, until they have stopped

    async def main(self) -> None:
        try:
            await super().main()
        finally:
            for task in (self._listener, self._db_check):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._listener = self._db_check = None

    async def _poll_iteration(self) -> None:
        if self._listener is None:  # arq has made its connection pool by the first poll
            self._listener = asyncio.create_task(self._listen())
        self._woken.clear()  # a wake-up during this look is kept for the wait below
        started = time.monotonic()
        await super()._poll_iteration()
        await self._take_turns()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that arrives as the
        # wake-up does, and the worker asked to stop would poll on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.wait_s):
                await self._woken.wait()
        rest = MIN_POLL_INTERVAL_S - (time.monotonic() - started)
        if rest > 0:
            await asyncio.sleep(rest)

    async def _take_turns(self) -> None:
        """Fill the free slots with the scopes the scheduler gives this worker, one turn each."""
        scheduler = self.ctx.get("scheduler")
        if scheduler is None or not self.allow_pick_jobs or self._db_check is not None:
            return
        for turn in await scheduler.take(self.max_jobs - self.job_counter):
            await self.sem.acquire()  # free: the count above was of free slots, and only this loop takes
            self.job_counter += 1
            self._turns += 1
            task = asyncio.create_task(run_turn(self.ctx, turn))  # type: ignore[arg-type]
            task.add_done_callback(self._turn_over)
            self.tasks[f"turn:{self._turns}"] = task

    def _turn_over(self, turn: asyncio.Task[Any]) -> None:
        self._release_sem_dec_counter_on_complete()
        if self._db_check is None and _faulted(turn):
            self._db_check = asyncio.create_task(self._until_postgres_answers(), name="db-check")
        self._woken.set()  # a slot is free: look again now

    async def _until_postgres_answers(self) -> None:
        """Hold the turns back until Postgres answers a probe (at once, mostly: a turn's own fault).
        Once a probe has failed, the turns in flight are given back (`_give_turns_back`)."""
        settings = self.ctx["settings"]
        down_since: float | None = None
        try:
            while (
                error := await why_unreachable(settings, "memstore-worker", settings.db_connect_timeout_s)
            ) is not None:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("worker.db_unreachable", error=error, turns=len(self._turns_in_flight()))
                    await self._give_turns_back()
                await asyncio.sleep(DB_PROBE_EVERY_S)
            if down_since is not None:
                log.info("worker.db_reachable", paused_s=round(time.monotonic() - down_since, 1))
        finally:
            self._db_check = None
            self._woken.set()

    def _turns_in_flight(self) -> list[str]:
        return [name for name, task in self.tasks.items() if name.startswith("turn:") and not task.done()]

    async def _give_turns_back(self) -> None:
        """Stop the turns in flight: each gives its scope back as it stops (`run_turn`), ready for a
        worker that reaches Postgres, instead of keeping it while its statements wait to fail.

        A stopping turn first tries to return its chunk's claim, or waits for the batch holding its
        result to end (`pipeline.services`, `pipeline.applier`); still waiting STOP_GRACE_S later, it
        waits on a Postgres that does not answer, and is stopped again (what it waited for goes on by
        itself). The turns leave `tasks` at once (arq would take a stopped one's `result()` for the
        worker's own end); their slots free as they stop (`_turn_over`)."""
        stopping = {self.tasks.pop(name) for name in self._turns_in_flight()}
        self._stopping |= stopping  # tasks the loop holds only weakly
        while stopping:
            for task in stopping:
                task.cancel()
            _, stopping = await asyncio.wait(stopping, timeout=STOP_GRACE_S)
        self._stopping = {task for task in self._stopping if not task.done()}

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        now = time.monotonic()
        if len(self._elsewhere) > 4 * self.max_jobs:
            self._elsewhere = {j: t for j, t in self._elsewhere.items() if t > now}
        candidates = [
            job_id
            for job_id in job_ids
            if job_id.decode() not in self.tasks and self._elsewhere.get(job_id, 0.0) <= now
        ]
        if not candidates or self.job_counter >= self.max_jobs:
            return
        # One round trip says which of them run in another worker (arq's in-progress keys); arq's own
        # check, a transaction of three round trips, is left to those that may start.
        async with self.pool.pipeline(transaction=False) as pipe:
            for job_id in candidates:
                pipe.exists(in_progress_key_prefix + job_id.decode())
            running = await pipe.execute()
        for job_id, elsewhere in zip(candidates, running, strict=True):
            if self.job_counter >= self.max_jobs:
                return
            if not elsewhere:
                await super().start_jobs([job_id])
            if job_id.decode() not in self.tasks:  # running elsewhere, or finished meanwhile
                self._elsewhere[job_id] = now + self.wait_s

    async def _listen(self) -> None:
        """Subscribe to the wake-ups for as long as the worker runs, again after any Redis fault."""
        while True:
            pubsub = self.pool.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(WAKE_CHANNEL)
                self._woken.set()  # anything published while unsubscribed is looked for now
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self._woken.set()
            except (RedisError, OSError) as exc:
                log.info("worker.wake_listener_lost", error=type(exc).__name__)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(_RESUBSCRIBE_S)


def _faulted(turn: asyncio.Task[Any]) -> bool:
    """Whether a turn ended in a fault (`run_turn` says which; a cancelled turn was stopped)."""
    if turn.cancelled():
        return False
    if turn.exception() is not None:
        return True
    result = turn.result()
    return isinstance(result, dict) and "error" in result
