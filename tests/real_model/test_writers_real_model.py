"""Each writer profile end to end with a real small model: API -> worker -> model -> guards -> memories.

A 135M-parameter model writes poor memories; what this proves is that each profile's write path
works against a server that is not ours, and that whatever the model answers, the service stays
sound. A profile's test fails when:

- the model server could not answer a request: unreachable, a 5xx, a dropped connection, no answer
  in time (a transport failure: it is the path that is broken, not the model) — naming the chunk
  and showing the server's last log lines;
- a chunk failed for any other reason that is not the model's own (a writer bug);
- fewer chunks were applied than the profile's stated minimum (conftest.MIN_APPLIED, measured on this
  model): the model's own failures — unparseable output after the repair request, an answer cut
  off at the token limit — are counted and named apart, and allowed up to that minimum;
- a chunk is left queued or processing, an applied chunk has no changeset or malformed guards, or a
  placeholder (a "..." copied from a prompt's example, a bare date) became a memory.

What the model did is printed per profile at the end of the session.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk, Memory, MemoryVersion
from app.writers.profiles import PROFILES
from app.writers.transport import FORMAT_REFUSAL
from tests.conftest import TenantKeys
from tests.real_model.conftest import MIN_APPLIED, OUT_DIR, REPORTS, RecordingProxy, server_log_tail
from tests.real_model.kinds import failure_kind
from tests.support.workers import chunk_counts, running_worker

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo10.json"
PROFILE_TIMEOUT_S = float(os.environ.get("MEMSTORE_REAL_MODEL_PROFILE_TIMEOUT_S", "2400"))
USER = "real-model-user"

# Explicit first-person facts, a day after the LoCoMo session; the last one changes the first.
FACTS = [
    ("I live in Lyon.", "2023-05-09T09:00:00Z"),
    ("I'm vegetarian.", "2023-05-09T09:05:00Z"),
    ("I mainly use Python at work.", "2023-05-09T09:10:00Z"),
    ("I moved to Seattle last month.", "2023-06-20T18:00:00Z"),
]

# A memory that is only a stand-in: dots, an ellipsis in place of the rest ("The user ..."), a template
# slot, a subject with nothing said about it ("The user"), a bare date or time. Independent of the
# service's own predicate (app.writers.base.is_placeholder), so that this checks the guard.
_PLACEHOLDER = re.compile(
    r"""^\W*$                                      # nothing but punctuation: "...", "…", "-"
      | (?:^|\s)[\[(<"']?(?:\.{2,}|…)[\])>"']?[\s.!?]*$   # "The user ...", "lives in [...]"
      | ^[<\[{][^<>\[\]{}]*[>\]}]$                   # "<memory>", "[content]"
      | ^\W*(?:the\s+)?(?:user|agent|assistant)(?:'s)?\W*$   # "The user", "User..."
      | ^\W*\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?\W*$
      | ^\W*\d{1,2}:\d{2}(?::\d{2})?\s*(?:[ap]\.?m\.?)?\W*$
      | ^\W*\d{1,2}(?:st|nd|rd|th)?\s+[a-z]+,?\s+\d{4}\W*$   # "8 May, 2023"
      | ^\W*[a-z]+\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}\W*$   # "May 8, 2023"
    """,
    re.IGNORECASE | re.VERBOSE,
)


def is_placeholder(content: str) -> bool:
    return bool(_PLACEHOLDER.search(content.strip()))


def test_placeholder_check_itself() -> None:
    for bad in ("...", " … ", "The user ...", "The user likes …", "lives in [...]", "<memory>", "The user",
                "The user...", "User", "2023-05-08", "2023-05-08 09:00", "2023-05-08T13:56:00Z", "1:56 pm",
                "8 May, 2023", "May 8, 2023", "-"):  # fmt: skip
        assert is_placeholder(bad), bad
    for good in ("The user lives in Lyon.", "The user went to a support group on 2023-05-07.", "Likes jazz",
                 "The user is thinking of moving to Berlin...", "Caroline"):  # fmt: skip
        assert not is_placeholder(good), good


def _locomo_time(text: str) -> str:
    return datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).isoformat()


def chunks_to_send() -> list[dict[str, Any]]:
    """Six LoCoMo turns of conversation 1 (Caroline as the user, Melanie's reply as the other side)
    when ../shared/data has it, then the explicit facts."""
    chunks: list[dict[str, Any]] = []
    if LOCOMO.is_file():
        conversation = json.loads(LOCOMO.read_text())[0]["conversation"]
        when = _locomo_time(conversation["session_1_date_time"])
        turns = conversation["session_1"]
        for i in range(2, 14, 2):  # D1:3 .. D1:14
            said, reply = turns[i], turns[i + 1]
            chunks.append(
                {
                    "messages": [
                        {
                            "role": "user",
                            "name": said["speaker"],
                            "content": said["text"],
                            "created_at": when,
                        },
                        {"role": "assistant", "name": reply["speaker"], "content": reply["text"]},
                    ]
                }
            )
    for text, when in FACTS:
        chunks.append(
            {
                "messages": [
                    {"role": "user", "content": text, "created_at": when},
                    {"role": "assistant", "content": "Noted."},
                ]
            }
        )
    return chunks


async def wait_finished(
    sm: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    expected: int,
    timeout_s: float,
    proxy: RecordingProxy | None = None,
) -> bool:
    """Until every chunk is applied or failed (True), or until a request through `proxy` got no answer
    from the model server (False: the test fails on it, there is no point waiting for the rest); on
    timeout, fail naming the chunks left unfinished."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = await chunk_counts(sm, tenant_id)
        if counts.get("applied", 0) + counts.get("failed", 0) >= expected:
            return True
        if proxy is not None and any(transport_exchange(e) for e in proxy.exchanges):
            return False
        await asyncio.sleep(0.5)
    async with sm() as session:
        stuck = (
            await session.execute(
                select(Chunk.seq, Chunk.status, Chunk.attempts, Chunk.last_error)
                .where(Chunk.tenant_id == tenant_id, Chunk.status.in_(("queued", "processing")))
                .order_by(Chunk.seq)
            )
        ).all()
    pytest.fail(f"chunks still unfinished after {timeout_s:g} s: {[tuple(r) for r in stuck]}")


def test_failure_kinds() -> None:
    model = [
        "writer error: unparseable extract output after one repair request: no JSON object",
        "writer error: reconcile output was cut off at the token limit before any item was complete",
    ]
    transport = [
        "writer error: the endpoint failed after 2 attempts (HTTP 500: Server got itself in trouble)",
        "writer error: the endpoint failed after 2 attempts (ClientConnectorError: Cannot connect)",
        "writer error: the endpoint answered 200 with a body that is not a chat completion",
        "writer timed out after 600 s",
    ]
    assert [failure_kind(e) for e in model] == ["model"] * len(model)
    assert [failure_kind(e) for e in transport] == ["transport"] * len(transport)
    assert failure_kind("writer raised KeyError: 'memory'") == "other"


def transport_exchange(exchange: dict[str, Any]) -> bool:
    """A request the server did not answer: no answer at all, none before the writer gave up on it, or
    a 5xx that is not its refusal of the response_format it was sent (which the writer answers by
    sending a weaker form, under `auto`)."""
    status = exchange.get("status")
    if status is None or exchange.get("late"):
        return True
    if status < 500:
        return False
    request = exchange.get("request")
    refused = isinstance(request, dict) and "response_format" in request
    return not (refused and FORMAT_REFUSAL.search(json.dumps(exchange.get("response"))))


def chunk_of(request: Any, chunks: list[tuple[int, str]]) -> str:
    """Which chunk a model request was for: the latest (seq, first message) whose text it contains —
    a request also carries earlier messages as context, never later ones."""
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        text = " ".join(str(m.get("content")) for m in request["messages"] if isinstance(m, dict))
    else:
        text = str(request)
    found = [
        seq
        for seq, said in chunks
        if said[:60] in text or json.dumps(said[:60], ensure_ascii=False)[1:-1] in text
    ]
    return f"chunk {max(found)}" if found else "a chunk not recognised in the request"


def _format_sent(request: Any) -> str:
    if not isinstance(request, dict):
        return "unparseable request"
    rf = request.get("response_format")
    if rf is None:
        return "none"
    kind = str(rf.get("type"))
    return f"{kind}+schema" if kind == "json_object" and "schema" in rf else kind


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.timeout(PROFILE_TIMEOUT_S + 300)
async def test_profile_with_a_real_model(
    profile: str,
    api: AsyncTestClient[Litestar],
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    real_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    model_proxy: RecordingProxy,
) -> None:
    writer = f"real-{profile}"
    chunks = chunks_to_send()
    if (why := await model_proxy.upstream_error()) is not None:
        pytest.fail(f"{profile}: the model server is unreachable ({why})\n{server_log_tail()}", pytrace=False)
    started = time.perf_counter()
    for chunk in chunks:
        response = await api.post(
            "/v1/chunks", json={"user_id": USER, "writer": writer, **chunk}, headers=ingest_headers
        )
        assert response.status_code == 202, response.text
    async with running_worker(real_settings):
        finished = await wait_finished(
            sessionmaker, tenant.tenant_id, len(chunks), PROFILE_TIMEOUT_S, model_proxy
        )
    wall_s = time.perf_counter() - started

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with (OUT_DIR / f"{profile}-exchanges.jsonl").open("w") as out:
        for exchange in model_proxy.exchanges:
            out.write(json.dumps(exchange, ensure_ascii=False) + "\n")

    async with sessionmaker() as session:
        rows = (
            await session.execute(
                select(Chunk).where(Chunk.tenant_id == tenant.tenant_id).order_by(Chunk.seq)
            )
        ).scalars()
        chunk_rows = list(rows)
        changesets = {
            c.id: c
            for c in (
                await session.execute(
                    select(Changeset).where(
                        Changeset.tenant_id == tenant.tenant_id, Changeset.kind == "writer"
                    )
                )
            ).scalars()
        }
        memories = list(
            (await session.execute(select(Memory).where(Memory.tenant_id == tenant.tenant_id))).scalars()
        )
        versions = await session.scalar(
            select(func.count()).select_from(MemoryVersion).where(MemoryVersion.tenant_id == tenant.tenant_id)
        )

    # Every chunk finished: applied with a changeset whose guards are a list, or failed with its error.
    statuses = Counter(c.status for c in chunk_rows)
    said = [(c.seq, str(sent["messages"][0]["content"])) for c, sent in zip(chunk_rows, chunks, strict=True)]
    assert not finished or set(statuses) <= {"applied", "failed"}, statuses
    guards: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    usage: Counter[str] = Counter()
    errors = []
    failures: dict[str, list[str]] = {"model": [], "transport": [], "other": []}
    details: list[dict[str, Any]] = []
    for c in chunk_rows:
        detail: dict[str, Any] = {"seq": c.seq, "status": c.status, "attempts": c.attempts}
        details.append(detail)
        if c.status not in ("applied", "failed"):
            continue  # left unfinished when the server stopped answering: that failure is reported below
        if c.status == "failed":
            detail["error"] = c.last_error
            assert c.last_error, f"chunk {c.seq} failed with no error recorded"
            errors.append(f"chunk {c.seq} failed after {c.attempts} attempt(s): {c.last_error[:300]}")
            detail["kind"] = failure_kind(c.last_error)
            failures[detail["kind"]].append(f"chunk {c.seq}: {c.last_error[:400]}")
            usage.update({k: v for k, v in (c.usage or {}).items() if isinstance(v, int)})
            continue
        assert c.changeset_id is not None, f"applied chunk {c.seq} has no changeset"
        changeset = changesets.get(c.changeset_id)
        assert changeset is not None, f"changeset of chunk {c.seq} not found"
        assert isinstance(changeset.guards, list), changeset.guards
        for guard in changeset.guards:
            assert isinstance(guard, dict), guard
            assert isinstance(guard.get("guard"), str), guard
            guards[guard["guard"]] += 1
        ops.update(str(op.get("op")) for op in changeset.ops)
        detail["ops"] = [[op.get("op"), op.get("content")] for op in changeset.ops]
        detail["guards"] = [[g["guard"], g.get("detail")] for g in changeset.guards]
        detail["usage"] = changeset.usage
        assert (changeset.writer, changeset.profile) == (writer, profile)
        usage.update({k: v for k, v in changeset.usage.items() if isinstance(v, int)})

    # Every request the server did not answer, even one a retry made good, by the chunk it was for.
    unanswered = [
        f"request {i} ({chunk_of(e['request'], said)}): "
        + (f"no answer: {e.get('error')}" if e.get("status") is None
           else f"answered after {e['elapsed_s']:g} s, when the writer had given up on it" if e.get("late")
           else f"HTTP {e['status']}: " + json.dumps(e.get("response"), ensure_ascii=False)[:300])
        for i, e in enumerate(model_proxy.exchanges, 1)
        if transport_exchange(e)
    ]  # fmt: skip

    active = [m for m in memories if m.status == "active"]
    report = {
        "profile": profile,
        "chunks": len(chunk_rows),
        "applied": statuses.get("applied", 0),
        "failed": statuses.get("failed", 0),
        "active_memories": len(active),
        "memories_by_status": dict(Counter(m.status for m in memories)),
        "versions": versions,
        "ops": dict(ops),
        "guards": dict(guards),
        "calls": usage.get("calls", 0),
        "http_requests": len(model_proxy.exchanges),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "repairs": usage.get("repairs", 0),
        "resends": usage.get("resends", 0),
        "salvaged": usage.get("salvaged", 0),
        "response_formats": dict(Counter(_format_sent(e["request"]) for e in model_proxy.exchanges)),
        "http_statuses": dict(Counter(str(e.get("status")) for e in model_proxy.exchanges)),
        "wall_s": round(wall_s, 1),
        "unfinished": [c.seq for c in chunk_rows if c.status not in ("applied", "failed")],
        "examples": [m.content for m in active[:5]],
        "all_memories": [[m.status, m.content] for m in memories],
        "errors": errors,
        "min_applied": MIN_APPLIED.get(profile, 0),
        "model_failures": failures["model"],
        "transport_failures": failures["transport"] + unanswered,
        "other_failures": failures["other"],
        "chunk_details": details,
    }
    REPORTS.append(report)

    if failures["transport"] or unanswered:
        pytest.fail(
            f"{profile}: the model server did not answer (a transport failure, not the model's output):\n"
            + "\n".join(f"  {line}" for line in failures["transport"] + unanswered)
            + "\n"
            + server_log_tail(),
            pytrace=False,
        )
    assert not failures["other"], f"{profile}: chunks failed, not for the model's output: {failures['other']}"
    minimum = MIN_APPLIED.get(profile, len(chunk_rows))
    if report["applied"] < minimum:
        pytest.fail(
            f"{profile}: {report['applied']} of {len(chunk_rows)} chunks applied, below the minimum of "
            f"{minimum} this model reaches (conftest.MIN_APPLIED); the model's own failures "
            f"({len(failures['model'])}):\n" + "\n".join(f"  {f}" for f in failures["model"] or ["none"]),
            pytrace=False,
        )

    placeholders = [m.content for m in active if is_placeholder(m.content)]
    assert not placeholders, f"placeholders stored as memories by {profile}: {placeholders}"
