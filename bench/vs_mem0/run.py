"""Memstore beside Mem0 OSS: the same LoCoMo chunk stream, the same fake model server, one run.

Memstore runs as `memstore up` (embedded Postgres + Redis, the API, one worker process) with the
`openai` writer in the `mem0` profile (and, fed the same stream again, a named writer of the same
model in the `simple` profile: one additive call per chunk, the shape of Mem0 2.2.1's add()) and the
`openai` embedder, both pointed at the fake model server (`tests/support/fake_llm.py`, a process of
its own). Mem0 OSS (`mem0ai==2.2.1`) runs in a virtual environment of its own (`.bench-venvs/mem0/`,
made here on first use; never a dependency of Memstore) with its `pgvector` store in a database of
its own on the SAME embedded Postgres, and its `openai` LLM and embedder pointed at the SAME fake
server. Both get the same vectors (the fake's hashing embedder over `/v1/embeddings`) and the same
decisions, each in its own protocol: what the user said is remembered, what an existing memory shown
already says is not. The fake server tells the callers apart by their bearer keys and counts each
one's calls and tokens.

Input: LoCoMo (`--data`, default `<repo>/../shared/data/locomo10.json`). Each speaker of each
conversation is a user; each session is cut into chunks of `--turns-per-chunk` turns (the user's as
`user`, the other speaker's as `assistant`); the stream takes users in turn, each user's chunks in
order, and keeps the first `--chunks`.

Measured, per system:

1. What the chat app waits for, at `--latencies` seconds per model call: `POST /v1/chunks` (Memstore
   acknowledges a durable chunk) against `Memory.add()` (Mem0 returns when the memories are
   written), `--threads` client threads, each user's chunks posted in order by one thread: adds/s,
   p50/p90 latency. Goal: Memstore >= 10x Mem0's add() throughput.
2. Applied throughput at equal model concurrency (Memstore: `MEMSTORE_WORKER_MAX_JOBS` =
   `MEMSTORE_WRITER_MAX_CONCURRENCY` = `--threads`, one worker process; Mem0: `--threads` threads):
   chunks applied per second, first post to last applied.
3. Model calls, embedding requests and tokens (the fake's estimate) per chunk.
4. Duplicates: 10 identical adds for one user at once; copies of the same text stored.
5. Overwrite and recovery: a fact, then an UPDATE decision replacing it; what each returns of the
   old text (Memstore: versions and a changeset revert; Mem0: `history()`).
6. kill -9 mid-stream: Memstore's worker (the supervisor restarts it) and Mem0's process; what was
   acknowledged and is not stored, what was in flight.
7. Peak RSS of each system's processes (Postgres, which both use, apart).

Exits 1 when either side errs or loses acknowledged data.

Usage: python bench/vs_mem0/run.py [--data PATH] [--chunks 600] [--threads 8] [--latencies 0.2,0]
                                   [--embedding-latency 0] [--turns-per-chunk 4] [--kill-chunks 160]
                                   [--mem0-venv .bench-venvs/mem0] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import asyncpg  # noqa: E402
import httpx  # noqa: E402
import psutil  # noqa: E402
from _stack import GONE, FakeModelServer, Stack, role_of, running_stack  # noqa: E402

MEM0_REQUIREMENTS = ["mem0ai==2.2.1", "psycopg[binary,pool]>=3.2"]
MEM0_SIDE = Path(__file__).resolve().parent / "mem0_side.py"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo10.json"
MODEL = "fake-memory-model"
EMBEDDING_MODEL = "fake-embedder"
DIMENSIONS = 384
# The bearer keys each system sends the fake server, by which it counts their calls apart.
MEMSTORE_CALLER = "memstore-bench"
# A named writer of the same model in the `simple` profile: one additive extraction call per chunk, the
# shape of Mem0 2.2.1's add(), so model calls per chunk are equal on both sides.
ONE_CALL_WRITER = "one-call"
MEM0_CALLER = "mem0-bench"
MEM0_DATABASE = "mem0_bench"
MEM0_TABLE = "mem0_memories"
GOAL_ACK_RATIO = 10.0
WAIT_S = 300.0

Chunk = dict[str, Any]


# --- input -----------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def locomo_stream(path: Path, turns_per_chunk: int, limit: int, prefix: str) -> list[Chunk]:
    """The first `limit` chunks of the stream: users in turn, each user's chunks in order."""
    by_user: dict[str, list[Chunk]] = {}
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key)
            for key, value in conversation.items()
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(value, list)
        )
        for speaker in (conversation["speaker_a"], conversation["speaker_b"]):
            user_id = f"{prefix}-{_slug(sample['sample_id'])}-{_slug(speaker)}"
            for _, key in sessions:
                turns = conversation[key]
                for start in range(0, len(turns), turns_per_chunk):
                    messages = [
                        {
                            "role": "user" if turn["speaker"] == speaker else "assistant",
                            "content": str(turn.get("text", ""))
                            + (
                                f" [shares a photo: {turn['blip_caption']}]"
                                if turn.get("blip_caption")
                                else ""
                            ),
                        }
                        for turn in turns[start : start + turns_per_chunk]
                    ]
                    by_user.setdefault(user_id, []).append({"user_id": user_id, "messages": messages})
    stream: list[Chunk] = []
    queues = [iter(chunks) for chunks in by_user.values()]
    while queues and len(stream) < limit:
        alive = []
        for queue in queues:
            chunk = next(queue, None)
            if chunk is not None and len(stream) < limit:
                stream.append(chunk)
                alive.append(queue)
        queues = alive
    return stream


def deal(chunks: list[Chunk], threads: int) -> list[list[int]]:
    """Chunk indexes per client thread: all of a user's chunks to one thread, in stream order (as
    mem0_side.py deals them)."""
    owner: dict[str, int] = {}
    lanes: list[list[int]] = [[] for _ in range(threads)]
    for i, chunk in enumerate(chunks):
        lanes[owner.setdefault(chunk["user_id"], len(owner) % threads)].append(i)
    return lanes


# --- figures ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_figures(seconds: list[float], window_s: float) -> dict[str, float]:
    return {
        "adds_per_s": len(seconds) / window_s if window_s > 0 else float("nan"),
        "p50_ms": 1000 * percentile(seconds, 0.5),
        "p90_ms": 1000 * percentile(seconds, 0.9),
        "mean_ms": 1000 * statistics.fmean(seconds) if seconds else float("nan"),
    }


@dataclass
class RssPeak:
    """Peak resident memory, sampled every 0.25 s, of the processes `groups()` names."""

    groups: Any
    peak_mb: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            for name, procs in self.groups().items():
                total = 0
                for proc in procs:
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), total / 2**20)
            self._stop.wait(0.25)

    def __enter__(self) -> RssPeak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def memstore_groups(stack: Stack) -> dict[str, list[psutil.Process]]:
    """Memstore's own processes (supervisor, API, worker, Redis), each role, and Postgres apart."""
    groups: dict[str, list[psutil.Process]] = {"memstore": [], "postgres": []}
    for proc in stack.family():
        role = role_of(proc)
        if role != GONE:
            groups["postgres" if role == "postgres" else "memstore"].append(proc)
            if role != "postgres":
                groups.setdefault(f"memstore {role}", []).append(proc)
    return groups


def tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


# --- the fake model server and the database --------------------------------------------------------


class Fake:
    def __init__(self, server: FakeModelServer) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{server.port}"

    def settings(self, latency_s: float, embedding_latency_s: float) -> None:
        httpx.post(
            f"{self.url}/fake/settings",
            json={"latency_s": latency_s, "embedding_latency_s": embedding_latency_s},
        ).raise_for_status()

    def take_usage(self) -> dict[str, dict[str, int]]:
        """Counts by caller since the last call, and a fresh count from now."""
        response = httpx.post(f"{self.url}/fake/usage")
        response.raise_for_status()
        return dict(response.json())

    def script(self, *contents: str) -> None:
        httpx.post(f"{self.url}/fake/script", json=[{"content": c} for c in contents]).raise_for_status()


def writers_file(workdir: Path) -> Path:
    """The writers file naming `ONE_CALL_WRITER` (unset keys take the MEMSTORE_WRITER_* settings)."""
    path = workdir / "writers.toml"
    path.write_text(f'[writers.{ONE_CALL_WRITER}]\nprofile = "simple"\n')
    return path


def per_chunk(usage: dict[str, int], chunks: int) -> dict[str, float]:
    return {name: round(usage.get(name, 0) / max(1, chunks), 2) for name in _USAGE_NAMES}


_USAGE_NAMES = ("calls", "prompt_tokens", "completion_tokens", "embedding_calls", "embedding_texts")


def sql(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def mem0_dsn(stack: Stack) -> str:
    """Mem0's database on the stack's Postgres, as the superuser (libpq URL over the Unix socket)."""
    return f"postgresql://postgres@/{MEM0_DATABASE}?host={stack.pg_socket_dir}"


# --- Memstore --------------------------------------------------------------------------------------


@dataclass
class Posted:
    """What the chat app saw of its posts: when each began and ended, and the chunk it got back."""

    start: list[float]
    end: list[float]
    chunk_ids: list[str | None]
    errors: list[str] = field(default_factory=list)


def memstore_post(stack: Stack, key: str, chunks: list[Chunk], threads: int) -> Posted:
    """Each thread posts its users' chunks one after another over one kept-alive connection.

    The client is the standard library's `http.client`: httpx's sync client spends about as much CPU
    per request as the API does (on two shared cores it halved the rate measured), and Mem0's add()
    is a function call that pays for no client at all.
    """
    posted = Posted([0.0] * len(chunks), [0.0] * len(chunks), [None] * len(chunks))
    address = urllib.parse.urlsplit(stack.base_url)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def lane(indexes: list[int]) -> None:
        conn = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=60)
        try:
            for i in indexes:
                posted.start[i] = time.time()
                try:
                    conn.request("POST", "/v1/chunks", body=json.dumps(chunks[i]), headers=headers)
                    response = conn.getresponse()
                    body = response.read()
                    posted.end[i] = time.time()
                    if response.status == 202:
                        posted.chunk_ids[i] = json.loads(body)["chunk_id"]
                    else:
                        posted.errors.append(f"{response.status} {body[:200]!r}")
                except (OSError, http.client.HTTPException) as exc:
                    posted.end[i] = time.time()
                    posted.errors.append(repr(exc))
                    conn.close()  # the next request opens a new connection
        finally:
            conn.close()

    workers = [threading.Thread(target=lane, args=(ix,)) for ix in deal(chunks, threads) if ix]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return posted


def chunk_states(stack: Stack, chunk_ids: list[str]) -> asyncpg.Record:
    return sql(
        stack.dsn,
        "SELECT count(*) FILTER (WHERE status = 'applied') AS applied,"
        " count(*) FILTER (WHERE status = 'failed') AS failed,"
        " count(*) FILTER (WHERE status = 'processing') AS processing, count(*) AS stored,"
        " extract(epoch FROM max(applied_at)) AS last_applied"
        " FROM chunks WHERE id = ANY($1::uuid[])",
        chunk_ids,
    )[0]


def wait_finished(stack: Stack, chunk_ids: list[str], timeout_s: float = WAIT_S) -> asyncpg.Record:
    deadline = time.monotonic() + timeout_s
    while True:
        row = chunk_states(stack, chunk_ids)
        if row["applied"] + row["failed"] >= len(chunk_ids) or time.monotonic() > deadline:
            return row
        time.sleep(0.25)


def memstore_stream(stack: Stack, key: str, chunks: list[Chunk], threads: int) -> dict[str, Any]:
    with RssPeak(lambda: memstore_groups(stack)) as rss:
        posted = memstore_post(stack, key, chunks, threads)
        ids = [c for c in posted.chunk_ids if c]
        row = wait_finished(stack, ids)
    first, last_ack = min(posted.start), max(posted.end)
    applied_window = float(row["last_applied"] or "nan") - first
    prefix = chunks[0]["user_id"].split("-", 1)[0] + "-%"
    memories = sql(
        stack.dsn, "SELECT count(*) FROM memories WHERE user_id LIKE $1 AND status = 'active'", prefix
    )[0][0]
    return {
        "chunks": len(chunks),
        "acknowledged": len(ids),
        "post_errors": posted.errors[:5],
        "post_error_count": len(posted.errors),
        "ack": latency_figures(
            [e - s for s, e in zip(posted.start, posted.end, strict=True)], last_ack - first
        ),
        "applied": row["applied"],
        "failed": row["failed"],
        "unfinished": len(ids) - row["applied"] - row["failed"],
        "applied_per_s": row["applied"] / applied_window if applied_window > 0 else float("nan"),
        "first_post_to_last_applied_s": applied_window,
        "memories": memories,
        "rss_peak_mb": rss.peak_mb,
    }


def memstore_dups(stack: Stack, key: str, n: int, user: str = "dups-memstore") -> dict[str, Any]:
    chunk = {"user_id": user, "messages": [{"role": "user", "content": "I am allergic to peanuts."}]}
    gate = threading.Barrier(n)
    ids: list[str] = []

    def one() -> None:
        gate.wait()
        response = httpx.post(
            f"{stack.base_url}/v1/chunks", headers={"Authorization": f"Bearer {key}"}, json=chunk, timeout=60
        )
        if response.status_code == 202:
            ids.append(response.json()["chunk_id"])

    workers = [threading.Thread(target=one) for _ in range(n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    row = wait_finished(stack, ids)
    stored = [
        r[0]
        for r in sql(stack.dsn, "SELECT content FROM memories WHERE user_id = $1 AND status = 'active'", user)
    ]
    return {
        "adds": n,
        "acknowledged": len(ids),
        "applied": row["applied"],
        "failed": row["failed"],
        "stored": stored,
        "most_copies": max((stored.count(s) for s in stored), default=0),
    }


OLD_FACT = "My favourite colour is blue."
NEW_FACT = "My favourite colour is green."
NEW_MESSAGE = "Actually, my favourite colour is green now."


def memstore_overwrite(stack: Stack, fake: Fake, key: str) -> dict[str, Any]:
    user = "overwrite-memstore"
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=60) as client:

        def post(text: str) -> None:
            response = client.post(
                "/v1/chunks", json={"user_id": user, "messages": [{"role": "user", "content": text}]}
            )
            response.raise_for_status()
            wait_finished(stack, [response.json()["chunk_id"]])

        post(OLD_FACT)
        # The mem0 profile's two calls: extract, then the update decision on memory "0".
        update = {"memory": [{"id": "0", "text": NEW_FACT, "event": "UPDATE", "old_memory": OLD_FACT}]}
        fake.script(json.dumps({"facts": [NEW_FACT]}), json.dumps(update))
        post(NEW_MESSAGE)
        active = client.get("/v1/memories", params={"user_id": user}).json()["items"]
        memory_id = active[0]["id"]
        versions = client.get(f"/v1/memories/{memory_id}/history").json()["versions"]
        changeset = versions[-1]["changeset_id"]
        revert = httpx.post(
            f"{stack.base_url}/v1/admin/changesets/{changeset}/revert",
            headers=stack.admin_headers,
            json={"reason": "benchmark: undo the overwrite"},
            timeout=60,
        )
        after = client.get(f"/v1/memories/{memory_id}").json()
    return {
        "active_after_overwrite": [m["content"] for m in active],
        "versions": [{k: v[k] for k in ("version", "op", "content", "status")} for v in versions],
        "revert_status": revert.status_code,
        "content_after_revert": after.get("content"),
        "recovered": after.get("content") == OLD_FACT,
        "how": "GET /v1/memories/{id}/history lists every version; "
        "POST /v1/admin/changesets/{id}/revert restores the old text as a new version",
    }


def memstore_kill(stack: Stack, key: str, chunks: list[Chunk], threads: int) -> dict[str, Any]:
    """Post the stream; once a quarter is applied, kill -9 the worker; the supervisor restarts it."""
    result: dict[str, Any] = {}
    poster = threading.Thread(target=lambda: result.update(posted=memstore_post(stack, key, chunks, threads)))
    poster.start()
    killed: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while not killed and time.monotonic() < deadline:
        applied = sql(
            stack.dsn,
            "SELECT count(*) FROM chunks WHERE user_id LIKE $1 AND status = 'applied'",
            chunks[0]["user_id"].split("-", 1)[0] + "-%",
        )[0][0]
        if applied >= len(chunks) // 4:
            for proc in stack.processes("worker"):
                with contextlib.suppress(ProcessLookupError):  # it may have exited since it was listed
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc.pid)
            killed_at = time.time()
            in_progress = applied
        time.sleep(0.1)
    poster.join()
    posted: Posted = result["posted"]
    ids = [c for c in posted.chunk_ids if c]
    row = wait_finished(stack, ids)
    finished_at = time.time()
    restarted = [p.pid for p in stack.processes("worker") if p.pid not in killed]
    twice = sql(
        stack.dsn,
        "SELECT count(*) FROM (SELECT chunk_id FROM changesets WHERE chunk_id = ANY($1::uuid[])"
        " GROUP BY chunk_id HAVING count(*) > 1) AS twice",
        ids,
    )[0][0]
    return {
        "chunks": len(chunks),
        "acknowledged": len(ids),
        "applied_before_kill": in_progress if killed else None,
        "killed_worker_pids": killed,
        "worker_restarted": bool(restarted),
        "applied": row["applied"],
        "failed": row["failed"],
        "acknowledged_not_applied": len(ids) - row["applied"],
        "applied_twice": twice,
        "kill_to_all_applied_s": finished_at - killed_at if killed else None,
    }


# --- Mem0 ------------------------------------------------------------------------------------------


def ensure_mem0_venv(venv: Path) -> Path:
    """Mem0's own virtual environment with `mem0ai==2.2.1`, made (or completed) on first use."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m, psycopg_pool; print(m.version('mem0ai'))"]
    have = subprocess.run(check, capture_output=True, text=True, check=False) if python.exists() else None
    if have is None or have.returncode != 0 or have.stdout.strip() != MEM0_REQUIREMENTS[0].split("==")[1]:
        print(f"  installing {', '.join(MEM0_REQUIREMENTS)} into {venv} ...", flush=True)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *MEM0_REQUIREMENTS], check=True)
    return python


@dataclass
class Mem0Side:
    python: Path
    config_file: Path
    workdir: Path

    def start(self, command: str, job: dict[str, Any]) -> subprocess.Popen[str]:
        job_file = self.workdir / f"{command}-{time.monotonic_ns()}.json"
        job_file.write_text(json.dumps(job))
        env = {**os.environ, "MEM0_TELEMETRY": "False", "MEM0_DIR": str(self.workdir / "mem0-dir")}
        return subprocess.Popen(
            [str(self.python), str(MEM0_SIDE), str(self.config_file), command, str(job_file)],
            stdout=subprocess.PIPE,
            stderr=(self.workdir / "mem0.log").open("a"),
            text=True,
            env=env,
            cwd=self.workdir,
        )

    def lines(self, proc: subprocess.Popen[str]) -> Iterator[str]:
        assert proc.stdout is not None
        yield from proc.stdout

    def run(self, command: str, job: dict[str, Any]) -> dict[str, Any]:
        proc = self.start(command, job)
        result = None
        for line in self.lines(proc):
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        if proc.wait() != 0 or result is None:
            log = (self.workdir / "mem0.log").read_text(errors="replace")[-3000:]
            msg = f"mem0_side.py {command} exited with {proc.returncode}; its log ends:\n{log}"
            raise RuntimeError(msg)
        return dict(result)


def mem0_config(stack: Stack, fake: Fake, workdir: Path, threads: int) -> dict[str, Any]:
    return {
        "fake_url": fake.url,
        "memory": {
            "vector_store": {
                "provider": "pgvector",
                "config": {
                    "connection_string": mem0_dsn(stack),
                    "collection_name": MEM0_TABLE,
                    "embedding_model_dims": DIMENSIONS,
                    # Mem0's pool holds 5 connections by default; one per client thread, as Memstore's
                    # worker has what it needs, so neither waits on its pool.
                    "maxconn": threads + 2,
                },
            },
            "llm": {
                "provider": "openai",
                "config": {
                    "model": MODEL,
                    "api_key": MEM0_CALLER,
                    "openai_base_url": fake.server.base_url,
                    "temperature": 0,
                },
            },
            "embedder": {
                "provider": "openai",
                "config": {
                    "model": EMBEDDING_MODEL,
                    "api_key": MEM0_CALLER,
                    "openai_base_url": fake.server.base_url,
                    "embedding_dims": DIMENSIONS,
                },
            },
            "history_db_path": str(workdir / "mem0-history.db"),
        },
    }


def mem0_rows(stack: Stack, user_like: str) -> list[asyncpg.Record]:
    return sql(
        mem0_dsn(stack),
        f"SELECT id::text AS id, payload->>'data' AS text FROM {MEM0_TABLE}"
        " WHERE payload->>'user_id' LIKE $1",
        user_like,
    )


def mem0_stream(side: Mem0Side, stack: Stack, chunks: list[Chunk], threads: int) -> dict[str, Any]:
    proc = side.start("stream", {"threads": threads, "chunks": chunks})
    result = None
    with RssPeak(lambda: {"mem0": tree(proc.pid), "postgres": memstore_groups(stack)["postgres"]}) as rss:
        for line in side.lines(proc):
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        proc.wait()
    if result is None:
        msg = f"mem0_side.py stream exited with {proc.returncode} and no result"
        raise RuntimeError(msg)
    adds = result["adds"]
    ok = [a for a in adds if a and not a["error"]]
    first, last = min(a["start"] for a in adds), max(a["end"] for a in adds)
    ids = {i for a in ok for i in a["ids"]}
    stored = {r["id"] for r in mem0_rows(stack, chunks[0]["user_id"].split("-", 1)[0] + "-%")}
    return {
        "chunks": len(chunks),
        "acknowledged": len(ok),
        "errors": [a["error"] for a in adds if a and a["error"]][:5],
        "error_count": sum(1 for a in adds if a and a["error"]),
        "ack": latency_figures([a["end"] - a["start"] for a in ok], last - first),
        "applied": len(ok),
        "applied_per_s": len(ok) / (last - first),
        "first_post_to_last_applied_s": last - first,
        "memories": len(stored),
        "acknowledged_not_stored": len(ids - stored),
        "rss_peak_mb": rss.peak_mb,
    }


def mem0_kill(side: Mem0Side, stack: Stack, chunks: list[Chunk], threads: int) -> dict[str, Any]:
    """Run the stream with progress lines; kill -9 the process once a quarter is acknowledged."""
    proc = side.start("stream", {"threads": threads, "chunks": chunks, "progress": True})
    started: set[int] = set()
    acked: dict[int, list[str]] = {}
    for line in side.lines(proc):
        word, _, rest = line.strip().partition(" ")
        if word == "START":
            started.add(int(rest))
        elif word == "ACK":
            index, _, ids = rest.partition(" ")
            acked[int(index)] = json.loads(ids)
            if len(acked) >= len(chunks) // 4:
                os.kill(proc.pid, signal.SIGKILL)
                break
    proc.wait()
    stored = {r["id"] for r in mem0_rows(stack, chunks[0]["user_id"].split("-", 1)[0] + "-%")}
    acked_ids = {i for ids in acked.values() for i in ids}
    in_flight = started - set(acked)
    return {
        "chunks": len(chunks),
        "acknowledged": len(acked),
        "in_flight_at_kill": len(in_flight),
        "never_started": len(chunks) - len(started),
        "acknowledged_not_stored": len(acked_ids - stored),
        "stored_by_unacknowledged_adds": len(stored - acked_ids),
        "lost_in_flight": len(in_flight),
        "after_restart": "nothing resumes: add() holds its input in the caller's memory only, so the "
        "in-flight adds (and every chunk not yet sent) are gone unless the chat app kept and resends them",
    }


# --- the run ---------------------------------------------------------------------------------------


def create_mem0_database(stack: Stack) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(stack.dsn)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {MEM0_DATABASE}")
            await conn.execute(f"CREATE DATABASE {MEM0_DATABASE}")
        finally:
            await conn.close()
        conn = await asyncpg.connect(mem0_dsn(stack))
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        finally:
            await conn.close()

    asyncio.run(run())


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    python = ensure_mem0_venv(args.mem0_venv)
    latencies = [float(x) for x in args.latencies.split(",")]
    report: dict[str, Any] = {
        "mem0": "mem0ai==2.2.1 (own venv; pgvector store on the same Postgres; openai LLM + embedder)",
        "memstore": "memstore up --workers 1, openai writer in the mem0 profile, openai embedder",
        "memstore_one_call": (
            "the same stack, chunks naming the writer `one-call`: the `simple` profile, one additive call per"
            " chunk as Mem0 2.2.1's add() makes"
        ),
        "embeddings": f"both from the fake server's /v1/embeddings ({DIMENSIONS}-dim hashing vectors)",
        "data": str(args.data),
        "threads": args.threads,
        "chunks": args.chunks,
        "turns_per_chunk": args.turns_per_chunk,
        "embedding_latency_s": args.embedding_latency,
        "runs": [],
    }
    with FakeModelServer(latency_s=latencies[0]) as server:
        fake = Fake(server)
        env = {
            "MEMSTORE_WRITER": "openai",
            "MEMSTORE_WRITER_PROFILE": "mem0",
            "MEMSTORE_WRITER_BASE_URL": server.base_url,
            "MEMSTORE_WRITER_MODEL": MODEL,
            "MEMSTORE_WRITER_API_KEY": MEMSTORE_CALLER,
            "MEMSTORE_WRITER_MAX_CONCURRENCY": str(args.threads),
            "MEMSTORE_WORKER_MAX_JOBS": str(args.threads),
            "MEMSTORE_EMBEDDER": "openai",
            "MEMSTORE_EMBEDDER_BASE_URL": server.base_url,
            "MEMSTORE_EMBEDDER_MODEL": EMBEDDING_MODEL,
            "MEMSTORE_EMBEDDER_API_KEY": MEMSTORE_CALLER,
            # A stranded scope is found within seconds after the kill, not the default 10 + 15 s.
            "MEMSTORE_SWEEP_INTERVAL_S": "2",
            "MEMSTORE_SWEEP_MIN_AGE_S": "5",
            "MEMSTORE_WRITERS_FILE": str(writers_file(workdir)),
        }
        with running_stack(workers=1, log_level="WARNING", env_overrides=env) as stack:
            key = stack.create_key("bench-vs-mem0", ("ingest", "read"))
            create_mem0_database(stack)
            config_file = workdir / "mem0-config.json"
            config_file.write_text(json.dumps(mem0_config(stack, fake, workdir, args.threads)))
            side = Mem0Side(python, config_file, workdir)
            # Before anything is timed, a short stream each: Mem0 creates its table, Memstore's API and
            # writer open their connections, both fill their caches.
            fake.settings(0.0, args.embedding_latency)
            warm_up = locomo_stream(args.data, args.turns_per_chunk, args.warm_up, "warm")
            memstore_stream(stack, key, warm_up, args.threads)
            mem0_stream(side, stack, warm_up, args.threads)
            for latency in latencies:
                fake.settings(latency, args.embedding_latency)
                tag = f"l{round(latency * 1000)}"
                print(f"\n  model latency {latency:g} s", flush=True)
                fake.take_usage()
                ms = memstore_stream(
                    stack,
                    key,
                    locomo_stream(args.data, args.turns_per_chunk, args.chunks, f"ms{tag}"),
                    args.threads,
                )
                ms["model_per_chunk"] = per_chunk(fake.take_usage().get(MEMSTORE_CALLER, {}), ms["chunks"])
                print_stream("Memstore", ms)
                one_call = [
                    {**c, "writer": ONE_CALL_WRITER}
                    for c in locomo_stream(args.data, args.turns_per_chunk, args.chunks, f"mo{tag}")
                ]
                ms1 = memstore_stream(stack, key, one_call, args.threads)
                ms1["model_per_chunk"] = per_chunk(fake.take_usage().get(MEMSTORE_CALLER, {}), ms1["chunks"])
                print_stream("Memstore", ms1, "one call")
                m0 = mem0_stream(
                    side,
                    stack,
                    locomo_stream(args.data, args.turns_per_chunk, args.chunks, f"m0{tag}"),
                    args.threads,
                )
                m0["model_per_chunk"] = per_chunk(fake.take_usage().get(MEM0_CALLER, {}), m0["chunks"])
                print_stream("Mem0", m0)
                report["runs"].append(
                    {"latency_s": latency, "memstore": ms, "memstore_one_call": ms1, "mem0": m0}
                )

            fake.settings(latencies[0], args.embedding_latency)
            print(f"\n  at {latencies[0]:g} s per call:", flush=True)
            m0_dups = side.run(
                "dups", {"user_id": "dups-mem0", "messages": "I am allergic to peanuts.", "n": 10}
            )
            m0_dups["most_copies"] = max((m0_dups["stored"].count(s) for s in m0_dups["stored"]), default=0)
            report["duplicates"] = {"memstore": memstore_dups(stack, key, 10), "mem0": m0_dups}
            print_dups(report["duplicates"])

            m0_over = side.run(
                "overwrite",
                {
                    "user_id": "overwrite-mem0",
                    "first": OLD_FACT,
                    "second": NEW_MESSAGE,
                    "scripted": [json.dumps({"memory": [{"id": "0", "text": NEW_FACT}]})],
                    "scripted_text": NEW_FACT,
                },
            )
            m0_over["recovered"] = any(h.get("old_memory") == OLD_FACT for h in m0_over["history"])
            m0_over["how"] = (
                "add() can only ADD (2.x's additive extraction), so the new fact sits beside the old; "
                "Memory.update() overwrites in place and history() keeps the old text as old_memory; "
                "there is no revert: putting it back is another update() by the app"
            )
            report["overwrite"] = {"memstore": memstore_overwrite(stack, fake, key), "mem0": m0_over}
            print_overwrite(report["overwrite"])

            kill_chunks = locomo_stream(args.data, args.turns_per_chunk, args.kill_chunks, "killms")
            report["kill"] = {"memstore": memstore_kill(stack, key, kill_chunks, args.threads)}
            kill_chunks = locomo_stream(args.data, args.turns_per_chunk, args.kill_chunks, "killm0")
            report["kill"]["mem0"] = mem0_kill(side, stack, kill_chunks, args.threads)
            print_kill(report["kill"])
    return report


# --- output ----------------------------------------------------------------------------------------


def print_stream(name: str, r: dict[str, Any], variant: str = "") -> None:
    ack, model = r["ack"], r["model_per_chunk"]
    print(
        f"    {name + (f' ({variant})' if variant else ''):<8} ack {ack['adds_per_s']:8.1f} adds/s"
        f"  p50 {ack['p50_ms']:7.1f} ms  p90"
        f" {ack['p90_ms']:7.1f} ms | applied {r['applied_per_s']:6.1f}/s ({r['applied']}/{r['chunks']},"
        f" {r['first_post_to_last_applied_s']:.1f} s) | per chunk: {model['calls']:.2f} calls,"
        f" {model['prompt_tokens']:.0f}+{model['completion_tokens']:.0f} tokens,"
        f" {model['embedding_calls']:.2f} embedding calls | {r['memories']} memories |"
        f" RSS peak {', '.join(f'{k} {v:.0f} MB' for k, v in sorted(r['rss_peak_mb'].items()))}",
        flush=True,
    )


def print_dups(d: dict[str, Any]) -> None:
    for name in ("memstore", "mem0"):
        r = d[name]
        print(
            f"    {name:<8} 10 identical adds at once: {len(r['stored'])} stored,"
            f" {r['most_copies']} copies of one text"
        )


def print_overwrite(d: dict[str, Any]) -> None:
    ms, m0 = d["memstore"], d["mem0"]
    print(
        f"    memstore overwrite: versions {[v['op'] for v in ms['versions']]}, after revert"
        f" {ms['content_after_revert']!r} (recovered: {ms['recovered']})"
    )
    print(
        f"    mem0     after add(): active {m0['active_after_second_add']}; after update(): history"
        f" {[(h['event'], h['old_memory']) for h in m0['history']]} (old text readable: {m0['recovered']})"
    )


def print_kill(d: dict[str, Any]) -> None:
    ms, m0 = d["memstore"], d["mem0"]
    print(
        f"    memstore kill -9 worker: {ms['acknowledged']} acknowledged,"
        f" {ms['applied']} applied after restart,"
        f" {ms['acknowledged_not_applied']} lost, {ms['applied_twice']} applied twice"
        f" (restarted: {ms['worker_restarted']}, drained {ms['kill_to_all_applied_s']:.1f} s after the kill)"
    )
    print(
        f"    mem0     kill -9 process: {m0['acknowledged']} acknowledged, {m0['acknowledged_not_stored']} of"
        f" them not stored, {m0['in_flight_at_kill']} in flight lost, {m0['stored_by_unacknowledged_adds']}"
        " memories written by adds never acknowledged"
    )


def table(report: dict[str, Any]) -> str:
    """The markdown table of docs/benchmarks.md."""
    lines = [
        "| measure | Memstore, `mem0` profile (two calls) | Memstore, `simple` profile (one call)"
        " | Mem0 OSS 2.2.1 |",
        "| --- | --- | --- | --- |",
    ]

    def model(r: dict[str, Any]) -> str:
        m = r["model_per_chunk"]
        return (
            f"{m['calls']:.2f} / {m['prompt_tokens']:.0f} + {m['completion_tokens']:.0f}"
            f" / {m['embedding_calls']:.2f}"
        )

    for run in report["runs"]:
        ms, ms1, m0, lat = run["memstore"], run["memstore_one_call"], run["mem0"], run["latency_s"]
        lines += [
            f"| chat app's wait at {lat:g} s/call: adds/s ({report['threads']} threads) |"
            f" {ms['ack']['adds_per_s']:.0f} | {ms1['ack']['adds_per_s']:.0f}"
            f" | {m0['ack']['adds_per_s']:.1f} |",
            f"| ... p50 / p90 latency | {ms['ack']['p50_ms']:.1f} / {ms['ack']['p90_ms']:.1f} ms |"
            f" {ms1['ack']['p50_ms']:.1f} / {ms1['ack']['p90_ms']:.1f} ms |"
            f" {m0['ack']['p50_ms']:.0f} / {m0['ack']['p90_ms']:.0f} ms |",
            f"| applied chunks/s at {lat:g} s/call, first post to last applied |"
            f" {ms['applied_per_s']:.1f} | {ms1['applied_per_s']:.1f} | {m0['applied_per_s']:.1f} |",
            f"| model calls / prompt + completion tokens / embedding requests per chunk ({lat:g} s) |"
            f" {model(ms)} | {model(ms1)} | {model(m0)} |",
            f"| memories stored from {ms['chunks']} chunks ({lat:g} s) |"
            f" {ms['memories']} | {ms1['memories']} | {m0['memories']} |",
            f"| peak RSS, own processes ({lat:g} s) | {ms['rss_peak_mb']['memstore']:.0f} MB |"
            f" {ms1['rss_peak_mb']['memstore']:.0f} MB | {m0['rss_peak_mb']['mem0']:.0f} MB |",
        ]
    d, o, k = report["duplicates"], report["overwrite"], report["kill"]
    lines += [
        f"| 10 identical adds at once: copies stored |"
        f" {d['memstore']['most_copies']} | (the same stack) | {d['mem0']['most_copies']} |",
        f"| overwritten fact: old text back? | yes: history shows it, a revert restores it"
        f" ({o['memstore']['content_after_revert']!r}) | (the same) |"
        f" add() never overwrites (both kept); after update(), history() shows old_memory, no revert |",
        f"| kill -9 mid-stream: acknowledged but not stored | {k['memstore']['acknowledged_not_applied']}"
        f" of {k['memstore']['acknowledged']} | (the same stack) |"
        f" {k['mem0']['acknowledged_not_stored']} of {k['mem0']['acknowledged']} |",
        f"| kill -9 mid-stream: in flight and lost | 0 (queued in Postgres; drained"
        f" {k['memstore']['kill_to_all_applied_s']:.0f} s after the kill) | (the same stack) |"
        f" {k['mem0']['in_flight_at_kill']}"
        f" (+ {k['mem0']['never_started']} never sent) |",
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['latency_s']:g} s/call" for r in report["runs"]]
    xs = range(len(labels))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [
        ("what the chat app waits for: adds/s (log)", lambda r: r["ack"]["adds_per_s"], True),
        ("p90 latency of an add, ms (log)", lambda r: r["ack"]["p90_ms"], True),
        ("applied chunks/s, first post to last applied", lambda r: r["applied_per_s"], False),
    ]
    for ax, (title, value, log) in zip(axes, panels, strict=True):
        systems = (
            (-0.27, "memstore", "Memstore (mem0 profile)", "tab:blue"),
            (0.0, "memstore_one_call", "Memstore (simple profile)", "tab:cyan"),
            (0.27, "mem0", "Mem0 2.2.1", "tab:orange"),
        )
        for offset, name, label, colour in systems:
            heights = [value(r[name]) for r in report["runs"]]
            bars = ax.bar([x + offset for x in xs], heights, 0.27, label=label, color=colour)
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(list(xs), labels)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(
        f"Memstore vs Mem0 OSS 2.2.1: LoCoMo, {report['chunks']} chunks, {report['threads']} client threads,"
        " same fake model server"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def failures(report: dict[str, Any]) -> list[str]:
    found = []
    for run in report["runs"]:
        m0, lat = run["mem0"], run["latency_s"]
        for ms in (run["memstore"], run["memstore_one_call"]):
            if ms["post_error_count"] or ms["failed"] or ms["unfinished"]:
                found.append(
                    f"Memstore at {lat:g} s: {ms['post_error_count']} refused posts, {ms['failed']} failed,"
                    f" {ms['unfinished']} unfinished chunks"
                )
        if m0["error_count"] or m0["acknowledged_not_stored"]:
            found.append(
                f"Mem0 at {lat:g} s: {m0['error_count']} add() errors {m0['errors'][:1]},"
                f" {m0['acknowledged_not_stored']} acknowledged memories not stored"
            )
    if report["duplicates"]["memstore"]["failed"] or report["duplicates"]["mem0"]["errors"]:
        found.append("an error in the duplicates scenario")
    if not report["overwrite"]["memstore"]["recovered"]:
        found.append(f"Memstore did not recover the overwritten fact: {report['overwrite']['memstore']}")
    if "UPDATE" not in [v["op"] for v in report["overwrite"]["memstore"]["versions"]]:
        found.append("Memstore's overwrite scenario wrote no UPDATE (the scripted decision was not used)")
    ms_kill, m0_kill = report["kill"]["memstore"], report["kill"]["mem0"]
    if not ms_kill["killed_worker_pids"]:
        found.append("Memstore's worker was never killed")
    if ms_kill["acknowledged_not_applied"] or ms_kill["failed"] or ms_kill["applied_twice"]:
        found.append(f"Memstore lost or repeated chunks across kill -9: {ms_kill}")
    if m0_kill["acknowledged_not_stored"]:
        found.append(f"Mem0 lost acknowledged memories across kill -9: {m0_kill}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo's locomo10.json")
    parser.add_argument(
        "--chunks", type=int, default=600, help="chunks of the stream, per system and latency"
    )
    parser.add_argument("--warm-up", type=int, default=80, help="chunks each system gets before timing")
    parser.add_argument("--threads", type=int, default=8, help="client threads = model calls in flight")
    parser.add_argument("--latencies", default="0.2,0", help="seconds per model call, comma-separated")
    parser.add_argument(
        "--embedding-latency", type=float, default=0.0, help="seconds per embedding request (both systems)"
    )
    parser.add_argument("--turns-per-chunk", type=int, default=4)
    parser.add_argument("--kill-chunks", type=int, default=160, help="chunks of the kill -9 runs")
    parser.add_argument("--mem0-venv", type=Path, default=ROOT / ".bench-venvs" / "mem0")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, help="write a plot here (needs the bench extra)")
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"{args.data} not found: pass --data PATH to LoCoMo's locomo10.json")
    print(
        f"Memstore vs Mem0 OSS 2.2.1: {args.chunks} LoCoMo chunks ({args.turns_per_chunk} turns each),"
        f" {args.threads} client threads, model latency {args.latencies} s, embeddings"
        f" {args.embedding_latency:g} s",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vs-mem0-") as tmp:
        report = measure(args, Path(tmp))
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["table"] = table(report)
    print("\n" + report["table"])
    for run in report["runs"]:
        ratio = run["memstore"]["ack"]["adds_per_s"] / run["mem0"]["ack"]["adds_per_s"]
        run["ack_ratio"] = ratio
        verdict = "met" if ratio >= GOAL_ACK_RATIO else "NOT met"
        print(
            f"\n  at {run['latency_s']:g} s: Memstore acknowledges {ratio:.1f}x Mem0's add() rate"
            f" (goal >= 10x: {verdict})"
        )
    print(f"  wall time {report['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.plot:
        plot(report, args.plot)
    problems = failures(report)
    for problem in problems:
        print(f"  FAILED: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
