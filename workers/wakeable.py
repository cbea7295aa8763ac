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

from app.domain.pipeline.jobs import run_turn
from app.lib.queue import WAKE_CHANNEL

log = structlog.get_logger(__name__)

# The shortest time between two looks at the queue, whatever the rate of wake-ups.
MIN_POLL_INTERVAL_S = 0.005
_RESUBSCRIBE_S = 1.0


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

    async def main(self) -> None:
        try:
            await super().main()
        finally:
            if self._listener is not None:
                self._listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._listener
                self._listener = None

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
        if scheduler is None or not self.allow_pick_jobs:
            return
        for turn in await scheduler.take(self.max_jobs - self.job_counter):
            await self.sem.acquire()  # free: the count above was of free slots, and only this loop takes
            self.job_counter += 1
            self._turns += 1
            task = asyncio.create_task(run_turn(self.ctx, turn))  # type: ignore[arg-type]
            task.add_done_callback(self._turn_over)
            self.tasks[f"turn:{self._turns}"] = task

    def _turn_over(self, _: asyncio.Task[Any]) -> None:
        self._release_sem_dec_counter_on_complete()
        self._woken.set()  # a slot is free: look again now

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
