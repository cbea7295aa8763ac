"""The writer path against a real (small) model: opt-in, run by `make test-real-model` alone.

Nothing here is collected unless MEMSTORE_REAL_MODEL_URL names a running OpenAI-compatible server
(`tests/real_model/run.py` starts llama-cpp-python's with SmolLM2-135M-Instruct and sets it), so
`make test` and CI never start a model.

Between the writers and the model sits a recording proxy: every request body and every answer is
kept (`exchanges`) and written to MEMSTORE_REAL_MODEL_OUT/<profile>-exchanges.jsonl, the evidence
to look at when a profile misbehaves. A request the server could not answer (unreachable, a 5xx, a
dropped connection) is recorded with what happened, and fails the profile's test (transport_failures).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from app.config import Settings

MODEL_URL = os.environ.get("MEMSTORE_REAL_MODEL_URL", "")
# How the writers ask for JSON. A 135M model cannot follow a protocol's prompt alone, so by default it
# is held to each call's schema by llama.cpp's grammar (the schema inside json_object); `auto` sends
# what each profile's reference sends (Hy-Memory and MemOS nothing, Mem0 json_object).
RESPONSE_FORMAT = os.environ.get("MEMSTORE_REAL_MODEL_RESPONSE_FORMAT", "json_object_schema")
# The cap on each call's budget (MEMSTORE_WRITER_MAX_TOKENS). The profiles ask the references' budgets
# (2,000 to 8,000 tokens), which a 135M model held to a grammar fills to the end at ~40 tokens/s on
# two cores; 1,024 keeps a profile's ten chunks within the run's time (a cut-off answer keeps its
# complete items).
MAX_TOKENS = int(os.environ.get("MEMSTORE_REAL_MODEL_MAX_TOKENS", "1024"))
OUT_DIR = Path(os.environ.get("MEMSTORE_REAL_MODEL_OUT", ".real-model/out"))
# How long a writer waits for one answer, and for a chunk's calls together. These catch a server that
# hangs, not a slow one: on two cores shared with other work a 1,024-token answer took 270 s, and a
# request the writer gives up on still holds the server (it answers one request at a time) while the
# retry waits behind it. An answer that comes after the writer gave up counts as a transport failure.
REQUEST_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_REQUEST_TIMEOUT_S", "600"))
CHUNK_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_CHUNK_TIMEOUT_S", "1800"))
# The model server's log (run.py sets it), whose last lines every transport failure shows.
SERVER_LOG = os.environ.get("MEMSTORE_REAL_MODEL_SERVER_LOG", "")

# The fewest of a profile's ten chunks that SmolLM2-135M-Instruct gets applied on this server (Q4_1,
# llama-cpp-python as pinned in setup_env.sh, json_object + schema, 1,024-token budget, temperature 0),
# a margin below what measured runs reached (tests/real_model/README.md). A profile below its minimum
# fails, with the model's own failures named. MEMSTORE_REAL_MODEL_MIN_APPLIED (JSON, e.g.
# '{"simple": 10}') replaces profiles' minimums, for another model or to see the assertion fail.
MIN_APPLIED: dict[str, int] = {"hy-memory": 8, "mem0": 4, "mem0-v3": 8, "memos": 6, "simple": 8}
MIN_APPLIED |= json.loads(os.environ.get("MEMSTORE_REAL_MODEL_MIN_APPLIED") or "{}")

# Not collected without a model server: `make test` must not try to reach one.
collect_ignore_glob = [] if MODEL_URL else ["test_*.py"]

# What each profile's test found, printed at the end of the session (see pytest_terminal_summary).
REPORTS: list[dict[str, Any]] = []


@dataclass
class RecordingProxy:
    """Forwards /v1/* to the model server and records each exchange, bodies included."""

    upstream: str
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        started = time.perf_counter()
        url = self.upstream.rstrip("/") + "/" + request.match_info["tail"]
        record: dict[str, Any] = {"path": request.path, "request": _json_or_text(body)}
        assert self._client is not None
        try:
            async with self._client.request(
                request.method, url, data=body, headers={"content-type": "application/json"}
            ) as answer:
                text = await answer.text()
                record |= {"status": answer.status, "response": _json_or_text(text.encode())}
                return web.Response(body=text.encode(), status=answer.status, content_type="application/json")
        except Exception as exc:  # noqa: BLE001  (no answer: the server is down or dropped the connection)
            error = f"{type(exc).__name__}: {exc}"
            record |= {"status": None, "error": error}
            # What the writer meets is a transport failure as with the server itself (it retries, then
            # fails the chunk), saying what the proxy met instead of aiohttp's bare 500.
            return web.Response(text=f"recording proxy: no answer from the model server: {error}", status=502)
        finally:
            record["elapsed_s"] = round(time.perf_counter() - started, 2)
            if record["elapsed_s"] > REQUEST_TIMEOUT_S:
                record["late"] = True  # the writer had given up on it (MEMSTORE_REAL_MODEL_REQUEST_TIMEOUT_S)
            self.exchanges.append(record)

    async def upstream_error(self) -> str | None:
        """Why the model server does not answer GET /models, or None when it does."""
        assert self._client is not None
        try:
            async with self._client.get(
                self.upstream.rstrip("/") + "/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as answer:
                return None if answer.status == 200 else f"GET /models answered HTTP {answer.status}"
        except Exception as exc:  # noqa: BLE001
            return f"GET /models: {type(exc).__name__}: {exc}"

    async def __aenter__(self) -> RecordingProxy:
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        await self._client.close()

    _client: aiohttp.ClientSession | None = None
    _runner: web.AppRunner = field(init=False)


def server_log_tail(lines: int = 30) -> str:
    """The model server's last log lines, indented, or why there are none."""
    if not SERVER_LOG:
        return "  (MEMSTORE_REAL_MODEL_SERVER_LOG is not set: run through tests/real_model/run.py)"
    try:
        text = Path(SERVER_LOG).read_text(errors="replace")
    except OSError as exc:
        return f"  (cannot read {SERVER_LOG}: {exc})"
    tail = text.splitlines()[-lines:]
    return f"  last {len(tail)} lines of {SERVER_LOG}:\n" + "\n".join(f"  | {line}" for line in tail)


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")


@pytest.fixture
async def model_proxy() -> AsyncIterator[RecordingProxy]:
    async with RecordingProxy(MODEL_URL) as proxy:
        yield proxy


@pytest.fixture
def writers_file(tmp_path: Path, model_proxy: RecordingProxy) -> Path:
    """One named writer per profile, all pointed (through the proxy) at the real model, asking for
    JSON as RESPONSE_FORMAT says."""
    from app.writers.profiles import PROFILES

    request_timeout = REQUEST_TIMEOUT_S
    path = tmp_path / "writers.toml"
    path.write_text(
        "\n".join(
            f'[writers.real-{profile}]\nprofile = "{profile}"\nbase_url = "{model_proxy.base_url}"\n'
            f'model = "hy-memory"\ntimeout_s = {request_timeout}\nmax_retries = 1\nmax_concurrency = 1\n'
            f'response_format = "{RESPONSE_FORMAT}"\nmax_tokens = {MAX_TOKENS}\n'
            for profile in sorted(PROFILES)
        )
    )
    return path


@pytest.fixture
def real_settings(settings: Settings, writers_file: Path) -> Settings:
    chunk_timeout = CHUNK_TIMEOUT_S
    return settings.model_copy(
        update={
            "writers_file": writers_file,
            "writer_timeout_s": chunk_timeout,
            "worker_shutdown_wait_s": int(chunk_timeout) + 15,
            "max_attempts": 2,
            "retry_backoff_s": 0.5,
            "retry_backoff_max_s": 2.0,
            "sweep_interval_s": 2,
            "sweep_min_age_s": 5.0,
        }
    )


@pytest.fixture
def api_settings(real_settings: Settings) -> Settings:
    return real_settings


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("what the small model did, per profile")
    for report in REPORTS:
        write(
            f"{report['profile']:<10} chunks applied {report['applied']} / failed {report['failed']}"
            f" | memories active {report['active_memories']} (versions {report['versions']})"
            f" | calls {report['calls']} prompt tokens {report['prompt_tokens']}"
            f" completion tokens {report['completion_tokens']} | {report['wall_s']:.0f} s"
            f" | minimum applied {report['min_applied']}"
        )
        write(f"           ops {report['ops']} | guards {report['guards'] or '{}'}")
        write(f"           response_format sent {report['response_formats']}")
        for memory in report["examples"]:
            write(f"           + {memory}")
        for kind, said in (("model's own", "model_failures"), ("TRANSPORT", "transport_failures"),
                           ("OTHER", "other_failures")):  # fmt: skip
            for failure in report[said]:
                write(f"           ! {kind}: {failure[:300]}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "report.json").write_text(json.dumps(REPORTS, indent=2, ensure_ascii=False))
    write(f"full report: {OUT_DIR / 'report.json'}; model exchanges: {OUT_DIR}/<profile>-exchanges.jsonl")
