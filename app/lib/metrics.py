"""Prometheus metrics of this process.

Counters and histograms live here; numbers that Postgres already knows (queue depth, chunk lag)
are read from it when `/metrics` is scraped. When several processes share one host (`memstore up`,
or `memstore serve --processes N`), each writes its samples to `PROMETHEUS_MULTIPROC_DIR` and
`/metrics` adds them up, so a scrape of any API process sees the API and the workers together.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.registry import REGISTRY, Collector

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HTTP_REQUESTS = Counter(
    "memstore_http_requests_total", "HTTP requests answered.", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "memstore_http_request_duration_seconds",
    "Time to answer an HTTP request.",
    ["method", "route"],
    buckets=_LATENCY_BUCKETS,
)
_HTTP_SERIES: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def http_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count an answered request and observe its latency. The labelled series are looked up once per
    (method, route, status): `labels()` costs more than the update itself, on every request."""
    series = _HTTP_SERIES.get((method, route, status))
    if series is None:
        if len(_HTTP_SERIES) > 10_000:  # routes are templates and statuses few; a bound all the same
            _HTTP_SERIES.clear()
        series = (HTTP_REQUESTS.labels(method, route, str(status)), HTTP_LATENCY.labels(method, route))
        _HTTP_SERIES[(method, route, status)] = series
    series[0].inc()
    series[1].observe(seconds)


AUTH_LOOKUPS = Counter(
    "memstore_auth_lookups_total",
    "API keys resolved, by how: cached, queried, refused_cached (a known-bad key), refused_unchecked.",
    ["result"],
)
CHUNKS_ACCEPTED = Counter("memstore_chunks_accepted_total", "Chunks durably accepted by the API.")
RATE_LIMITED = Counter(
    "memstore_rate_limited_total", "Requests refused with 429: their API key is over its rate."
)
INGEST_REJECTED = Counter(
    "memstore_ingest_rejected_total", "Ingestion requests refused before being stored, by reason.", ["reason"]
)
CHUNKS_FINISHED = Counter(
    "memstore_chunks_finished_total", "Chunks whose processing ended, by outcome.", ["outcome", "writer"]
)
WRITER_LATENCY = Histogram(
    "memstore_writer_duration_seconds",
    "Time a writer took for one chunk.",
    ["writer", "outcome"],
    buckets=_LATENCY_BUCKETS,
)
WRITER_TOKENS = Counter(
    "memstore_writer_tokens_total", "Tokens reported by LLM writers.", ["writer", "model", "kind"]
)
WRITER_REQUESTS = Counter(
    "memstore_writer_requests_total",
    "HTTP requests to writer models, by outcome (ok, timeout, http_429, http_5xx ...).",
    ["writer", "outcome"],
)
APPLY_LATENCY = Histogram(
    "memstore_apply_duration_seconds",
    "Time from a chunk's writer result to its commit (in a transaction shared with other chunks).",
    buckets=_LATENCY_BUCKETS,
)
APPLY_BATCH = Histogram(
    "memstore_apply_batch_chunks",
    "Chunks applied together in one transaction by a worker (group commit).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
SCHEDULER_TURNS = Counter(
    "memstore_scheduler_turns_total",
    "Turns of the fair scheduler a worker ran: served (chunks handled), idle (nothing ready), paused"
    " (the tenant's daily token budget spent), faulted.",
    ["outcome"],
)
GUARDS_FIRED = Counter("memstore_guards_fired_total", "Writer ops dropped or changed by a guard.", ["guard"])
GRAPH_ROWS_INDEXED = Counter(
    "memstore_graph_rows_indexed_total",
    "Memories added to the vector graph by the workers' indexer (each written head joins it this way).",
)
EMBEDDER_RUNS = Counter(
    "memstore_embedder_runs_total",
    "Model runs (or embedding requests' batches) of the embedder; concurrent callers share one.",
    ["family"],
)
EMBEDDER_TEXTS = Counter("memstore_embedder_texts_total", "Texts the embedder's model embedded.", ["family"])
EMBEDDER_CACHE_HITS = Counter(
    "memstore_embedder_cache_hits_total",
    "Texts answered from the embedder's cache of vectors it made before, without the model.",
    ["family"],
)
EMBEDDER_FAILURES = Counter(
    "memstore_embedder_failures_total",
    "Model runs of the embedder that raised (each caller of the run got the error).",
    ["family"],
)


def multiprocess_dir() -> str | None:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return path if path and os.path.isdir(path) else None


def render(extra: Iterable[Collector] = ()) -> bytes:
    """The Prometheus text exposition of this host's processes (or this process), plus `extra`."""
    if (path := multiprocess_dir()) is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        base = generate_latest(registry)
    else:
        base = generate_latest(REGISTRY)
    scraped = CollectorRegistry(auto_describe=False)
    for collector in extra:
        scraped.register(collector)
    return base + generate_latest(scraped)


def serve_http(port: int, host: str = "0.0.0.0") -> None:  # noqa: S104  (scraped from outside the pod)
    """Serve this process's metrics (or the host's pooled ones) on `port`, from a daemon thread."""
    if (path := multiprocess_dir()) is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        start_http_server(port, addr=host, registry=registry)
    else:
        start_http_server(port, addr=host)


def process_exited(pid: int) -> None:
    """Let the multiprocess files of a dead process be merged into the totals correctly."""
    if (path := multiprocess_dir()) is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
