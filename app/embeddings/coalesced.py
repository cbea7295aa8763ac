"""The one embedder a process's callers share: a cache of the vectors it made, and model runs that
take every text its callers wait for at that moment.

Every embedder `embedder_from_settings` builds is wrapped in a `CoalescedEmbedder`, so batching has
one owner whatever the model: the worker's candidate searches and applies, and the API's searches,
queue their texts; a runner task hands all that is queued (at most `MAX_BATCH` texts, each once) to
the model in one call, and each caller gets its own rows back. An in-process model (onnx, local)
pays its fixed cost per run once for many texts; an embeddings server (openai) gets one request
instead of one per caller. A model failure reaches every caller of that run; a caller that was
cancelled while it waited is skipped (and its texts are not embedded if the run had not started).

Vectors are deterministic for one embedder, so a text already embedded is answered from the cache,
exactly: the worker embeds a chunk's text for its candidate search, and the same text again when a
writer stores it as a memory (the `mem0` profile searches with the facts it then adds). The cache
belongs to one embedder (one name), holds at most `cache_size` texts, and drops the least recently
used first; vectors are kept as float64 arrays (3 KiB for 384 dimensions), the same floats the model
gave. Texts met while a run was under way are looked up again before the next run, so two callers
that ask for one text close together still cost one embedding.

The counters (`runs`, `texts`, `cache_hits`, and `counts` for a snapshot) are this object's, so a
test reads exactly what its own calls cost; the same counts go to Prometheus by embedder family, with
the runs that raised (`memstore_embedder_failures_total`).
"""

from __future__ import annotations

import asyncio
import contextvars
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from app.embeddings.base import QUERY_MARK, Embedder, family
from app.lib import metrics

# Most texts one model run takes; the rest go in the next (a bound on one run's memory). A single
# call with more texts runs alone.
MAX_BATCH = 512


@dataclass(frozen=True)
class EmbedderCounts:
    """What an embedder did so far: model runs, texts sent to the model, texts answered from its cache."""

    runs: int = 0
    texts: int = 0
    cache_hits: int = 0

    def __sub__(self, other: EmbedderCounts) -> EmbedderCounts:
        return EmbedderCounts(
            self.runs - other.runs, self.texts - other.texts, self.cache_hits - other.cache_hits
        )


@dataclass
class _Waiting:
    """One caller's texts that the cache did not hold, and where their vectors go."""

    texts: list[str]
    future: asyncio.Future[dict[str, array[float]]]
    # Those of `texts` that a run made while the caller was queued (looked up again before the next run)
    found: dict[str, array[float]] = field(default_factory=dict)


@dataclass
class CoalescedEmbedder:
    """`inner`, with a vector cache and concurrent calls coalesced into shared model runs."""

    inner: Embedder
    cache_size: int = 4096
    max_batch: int = MAX_BATCH
    name: str = field(init=False)  # the inner embedder's, recorded with the vectors
    dim: int = field(init=False)
    runs: int = field(default=0, init=False)  # calls of the inner embedder
    texts: int = field(default=0, init=False)  # texts those calls embedded
    cache_hits: int = field(default=0, init=False)  # texts answered without the model
    _cache: OrderedDict[str, array[float]] = field(default_factory=OrderedDict, init=False, repr=False)
    _queue: deque[_Waiting] = field(default_factory=deque, init=False, repr=False)
    _runner: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name, self.dim = self.inner.name, self.inner.dim
        family_ = family(self.name)
        self._runs_metric = metrics.EMBEDDER_RUNS.labels(family_)
        self._texts_metric = metrics.EMBEDDER_TEXTS.labels(family_)
        self._hits_metric = metrics.EMBEDDER_CACHE_HITS.labels(family_)
        self._failures_metric = metrics.EMBEDDER_FAILURES.labels(family_)

    @property
    def counts(self) -> EmbedderCounts:
        return EmbedderCounts(self.runs, self.texts, self.cache_hits)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        found = self._cached(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            loop = asyncio.get_running_loop()
            waiting = _Waiting(missing, loop.create_future())
            self._queue.append(waiting)
            runner = self._runner
            if runner is None or runner.done() or runner.get_loop() is not loop:
                # In a context of its own: a run serves many callers, not the one that started it.
                self._runner = loop.create_task(self._drain(), context=contextvars.Context())
            found |= await waiting.future
        return [found[t].tolist() for t in texts]

    async def embed_queries(self, texts: list[str]) -> list[list[float]]:
        """Vectors of search queries: an asymmetric model's query vectors (`base.QUERY_MARK`), the same
        as `embed` for every other model. Queries share the cache and the runs with other texts."""
        if not getattr(self.inner, "asymmetric", False):
            return await self.embed(texts)
        return await self.embed([QUERY_MARK + text for text in texts])

    async def aclose(self) -> None:
        """Stop the runner (its waiting callers get an error) and close the inner embedder."""
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done() and runner.get_loop() is asyncio.get_running_loop():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        await self.inner.aclose()

    def _cached(self, texts: list[str]) -> dict[str, array[float]]:
        """The vectors of `texts` that the cache holds (each now the most recently used)."""
        found: dict[str, array[float]] = {}
        for text in dict.fromkeys(texts):
            vector = self._cache.get(text)
            if vector is not None:
                self._cache.move_to_end(text)
                found[text] = vector
                self._hit()
        return found

    def _hit(self) -> None:
        self.cache_hits += 1
        self._hits_metric.inc()

    def _keep(self, text: str, vector: array[float]) -> None:
        if self.cache_size <= 0:
            return
        self._cache[text] = vector
        self._cache.move_to_end(text)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _next_batch(self) -> tuple[list[_Waiting], list[str]]:
        """The queued callers of the next run, and the texts it embeds (each once). A caller whose
        texts the cache now holds (the last run made them) is answered without a run."""
        batch: list[_Waiting] = []
        texts: dict[str, None] = {}
        while self._queue:
            waiting = self._queue[0]
            if waiting.future.done():  # cancelled while queued: nothing to embed for it
                self._queue.popleft()
                continue
            found = self._cached(waiting.texts)
            new = [t for t in waiting.texts if t not in found and t not in texts]
            if batch and len(texts) + len(new) > self.max_batch:
                break
            self._queue.popleft()
            if found:
                waiting.found = found
                waiting.texts = [t for t in waiting.texts if t not in found]
                if not waiting.texts:
                    waiting.future.set_result(found)
                    continue
            batch.append(waiting)
            texts.update(dict.fromkeys(new))
        return batch, list(texts)

    async def _drain(self) -> None:
        """Embed what is queued, a run at a time, until nothing is left."""
        while self._queue:
            batch, texts = self._next_batch()
            if not batch:
                continue
            self.runs += 1
            self.texts += len(texts)
            self._runs_metric.inc()
            self._texts_metric.inc(len(texts))
            try:
                rows = await self.inner.embed(texts)
                made = {text: array("d", row) for text, row in zip(texts, rows, strict=True)}
            except asyncio.CancelledError:
                error = RuntimeError("the embedder was closed while texts waited for it")
                for waiting in [*batch, *self._queue]:
                    if not waiting.future.done():
                        waiting.future.set_exception(error)
                self._queue.clear()
                raise
            except Exception as exc:  # noqa: BLE001  (handed to the callers, whose error it is)
                self._failures_metric.inc()
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(exc)
                continue
            for text, vector in made.items():
                self._keep(text, vector)
            for waiting in batch:
                if not waiting.future.done():  # a caller that gave up (cancelled) is skipped
                    waiting.future.set_result(waiting.found | {t: made[t] for t in waiting.texts})
