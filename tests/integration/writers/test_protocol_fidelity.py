"""Each profile sends what its reference framework sends: the same inputs rendered by the reference's
own code (run by `tests/support/references/`, its model call captured by the fake server) and by
Memstore give the same message lists, apart from the differences listed here, each for a reason
(docs/writers.md, "What each profile sends").

Both sides meet the same fake model server; where a protocol makes a second call, the same scripted
answer to the first leads both to it.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from app.writers.base import Candidate, CandidateQuery, Message, WriteRequest
from app.writers.llm import LLMWriter, LLMWriterSpec
from tests.support.fake_llm import FakeLLM, Reply

MODEL = "hy-memory"
NOW = datetime(2026, 12, 6, 10, 30, tzinfo=UTC)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


# Two people, named; times; an earlier conversation with a long turn of the other person; memories of
# the scope with and without a date, out of time order.
ENGLISH: dict[str, Any] = {
    "memory_at": "2023-05-08T13:56:00+00:00",
    "messages": [
        {
            "role": "user",
            "name": "Caroline",
            "content": "I went to the LGBTQ support group yesterday.",
            "created_at": "2023-05-08T13:55:00+00:00",
        },
        {
            "role": "assistant",
            "name": "Melanie",
            "content": "That's great! I'm painting a sunrise now.",
            "created_at": "2023-05-08T13:56:00+00:00",
        },
    ],
    "context": [
        [
            {"role": "user", "name": "Caroline", "content": "Hey Mel! Long time no see.\nHow are you?"},
            {"role": "assistant", "name": "Melanie", "content": "I took my kids to the museum. " * 30},
        ],
        [
            {"role": "user", "content": "[note]: I moved from Sweden 4 years ago."},
            {"role": "assistant", "content": "Noted."},
        ],
    ],
    "extracted": [
        {
            "content": "The user went to an LGBTQ support group on 2023-05-07.",
            "owner": "user",
            "tags": ["LGBTQ"],
        },
        {"content": "Melanie is painting a sunrise.", "owner": "user", "tags": ["painting"]},
    ],
    "existing": [
        {
            "memory_id": "0",
            "content": "The user moved from Sweden in 2019.",
            "owner": "user",
            "memory_at": "2023-05-01T09:00:00+00:00",
            "tags": ["Sweden"],
            "created_at": "2026-11-01T00:00:00+00:00",
        },
        {
            "memory_id": "1",
            "content": "Melanie likes painting.",
            "owner": "user",
            "memory_at": None,
            "tags": [],
            "created_at": "2026-10-01T00:00:00+00:00",
        },
        {
            "memory_id": "2",
            "content": "The assistant suggested a museum.",
            "owner": "agent",
            "memory_at": "2022-01-02T03:04:00+00:00",
            "tags": ["museum", "kids"],
            "created_at": "2026-11-02T00:00:00+00:00",
        },
    ],
}
CHINESE: dict[str, Any] = {
    "memory_at": "2026-11-20T08:00:00+00:00",
    "messages": [
        {"role": "user", "name": "小王", "content": "我上个月搬到了上海浦东，现在每天骑车上班。"},
        {"role": "assistant", "content": "听起来不错！浦东有很多公园。"},
    ],
    "context": [
        [
            {"role": "user", "name": "小王", "content": "我对花生过敏。"},
            {"role": "assistant", "content": "好的，我记住了。"},
        ]
    ],
    "extracted": [{"content": "用户于2026年10月搬到上海浦东。", "owner": "user", "tags": ["上海"]}],
    "existing": [
        {
            "memory_id": "0",
            "content": "用户住在北京。",
            "owner": "user",
            "memory_at": "2025-03-01T10:00:00+00:00",
            "tags": ["北京"],
            "created_at": "2025-03-01T10:00:00+00:00",
        },
    ],
}
SCENARIOS = {"english": ENGLISH, "chinese": CHINESE}


def _messages(items: list[dict[str, Any]]) -> tuple[Message, ...]:
    return tuple(
        Message(m["role"], m["content"], m.get("name"), _at(m["created_at"]) if m.get("created_at") else None)
        for m in items
    )


def _candidates(scenario: dict[str, Any]) -> tuple[Candidate, ...]:
    return tuple(
        Candidate(
            int(m["memory_id"]),
            m["content"],
            tuple(m["tags"]),
            m["owner"],
            _at(m["memory_at"]) if m["memory_at"] else None,
            _at(m["created_at"]),
        )
        for m in scenario["existing"]
    )


def _request(scenario: dict[str, Any], asked: list[CandidateQuery | None]) -> WriteRequest:
    candidates = _candidates(scenario)

    async def search(queries: list[str], query: CandidateQuery | None) -> tuple[Candidate, ...]:
        asked.append(query)  # which memories qualify is the search's business, tested with the pipeline
        return candidates

    context = [m for chunk in scenario["context"] for m in chunk]
    return WriteRequest(
        user_id="user",
        messages=_messages(scenario["messages"]),
        context=_messages(context)[-10:],
        candidates=(),
        memory_at=_at(scenario["memory_at"]),
        now=NOW,
        search=search,
    )


async def _memstore(fake: FakeLLM, profile: str, request: WriteRequest) -> list[dict[str, Any]]:
    writer = LLMWriter(
        "w", LLMWriterSpec(profile=profile, base_url=fake.base_url, model=MODEL, max_retries=0)
    )
    start = len(fake.requests)
    try:
        await writer.write(request)
    finally:
        await writer.aclose()
    return fake.requests[start:]


async def _reference(fake: FakeLLM, driver: str, scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """The requests the reference's own code makes for `scenario` (run in a process of its own)."""
    start = len(fake.requests)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"tests.support.references.{driver}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    payload = {
        "base_url": fake.base_url,
        "model": MODEL,
        "now": NOW.replace(tzinfo=None).isoformat(),
        **scenario,
    }
    _, err = await asyncio.wait_for(process.communicate(json.dumps(payload).encode()), 120)
    assert process.returncode == 0, err.decode()[-3000:]
    return fake.requests[start:]


def _wire(body: dict[str, Any], *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a request asks of the model, less what the reference's client sends for its own reasons."""
    return {k: v for k, v in body.items() if k not in ("stream", *drop)}


def assert_same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], drop: tuple[str, ...]) -> None:
    """The requests agree but for `drop`; where they do not, the first difference is shown."""
    mine, reference = [_wire(b, drop=drop) for b in ours], [_wire(b, drop=drop) for b in theirs]
    if mine == reference:
        return
    lines = []
    for index, (a, b) in enumerate(zip(mine, reference, strict=False)):
        if a != b:
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    left, right = (
                        json.dumps(a.get(key), ensure_ascii=False, indent=1),
                        json.dumps(b.get(key), ensure_ascii=False, indent=1),
                    )
                    diff = difflib.unified_diff(
                        right.splitlines(), left.splitlines(), "reference", "memstore", lineterm="", n=2
                    )
                    lines.append(f"request {index}, {key}:\n" + "\n".join(list(diff)[:60]))
            break
    pytest.fail(f"{len(mine)} vs {len(reference)} requests\n" + "\n".join(lines))


# Sent differently on purpose: the sampling temperature (Memstore decodes greedily, as Hy-Memory's
# deployment recommends; the references' defaults are 0.1, 0.1 and 0.6).
TEMPERATURE = ("temperature",)
# The model here is Hy-Memory, whose reasoning Memstore turns off whatever protocol it is spoken to;
# Mem0 and MemOS, written for other models, send nothing (hy-memory's framework is run with it).
NO_THINK = ("chat_template_kwargs",)


@pytest.mark.parametrize("language", SCENARIOS)
async def test_hy_memory_extract_and_reconcile_are_the_frameworks_own(
    fake_llm: FakeLLM, language: str
) -> None:
    scenario = SCENARIOS[language]
    extraction = {"memory": scenario["extracted"], "intentions": [], "basic_info": {}}
    fake_llm.enqueue(Reply(content="```json\n" + json.dumps(extraction, ensure_ascii=False) + "\n```"))
    fake_llm.enqueue(Reply(content="```json\n[]\n```"))
    asked: list[CandidateQuery | None] = []
    ours = await _memstore(fake_llm, "hy-memory", _request(scenario, asked))
    fake_llm.enqueue(Reply(content="```json\n" + json.dumps(extraction, ensure_ascii=False) + "\n```"))
    [extract] = await _reference(fake_llm, "hy_memory", {**scenario, "step": "extract"})
    fake_llm.enqueue(Reply(content="```json\n[]\n```"))
    [reconcile] = await _reference(fake_llm, "hy_memory", {**scenario, "step": "reconcile"})

    assert_same(ours, [extract, reconcile], TEMPERATURE)
    assert extract["messages"][0]["content"].startswith("# ROLE") or language == "chinese"
    assert "response_format" not in ours[0]
    assert asked == [CandidateQuery(per_text=20, min_score=0.4, total=20)]  # SEARCH_TOPK, FINAL_TOPK*2, floor


@pytest.mark.parametrize("bank", ["with memories", "empty"])
@pytest.mark.parametrize("agent_id", [None, "travel-bot"])
async def test_mem0_extract_and_update_are_mem0s_own(
    fake_llm: FakeLLM, bank: str, agent_id: str | None
) -> None:
    scenario = {
        **ENGLISH,
        "existing": ENGLISH["existing"] if bank == "with memories" else [],
        "agent_id": agent_id,
    }
    facts = {"facts": ["Went to an LGBTQ support group on 7 May 2023", "Melanie paints"]}
    asked: list[CandidateQuery | None] = []
    request = _request(scenario, asked)
    if bank == "empty":
        request = replace(request, search=_none)
    if agent_id:
        request = replace(request, agent_id=agent_id)
    fake_llm.enqueue(Reply.json(facts), Reply.json({"memory": []}))
    ours = await _memstore(fake_llm, "mem0", request)
    fake_llm.enqueue(Reply.json(facts), Reply.json({"memory": []}))
    theirs = await _reference(fake_llm, "mem0_classic", scenario)

    # Mem0's client also sends OpenAI's `store: false` and `top_p` (moot at temperature 0).
    drop = (*TEMPERATURE, *NO_THINK, "store", "top_p")
    assert_same(ours, theirs, drop)
    assert [m["role"] for m in ours[1]["messages"]] == ["user"]  # the update is one user message
    assert ours[0]["response_format"] == {"type": "json_object"}
    assert ours[0]["max_tokens"] == 2000
    if bank == "with memories":
        assert asked == [CandidateQuery(per_text=5)]


async def _none(queries: list[str], query: CandidateQuery | None) -> tuple[Candidate, ...]:
    return ()


async def test_mem0_additive_extraction_is_mem0s_own(fake_llm: FakeLLM) -> None:
    asked: list[CandidateQuery | None] = []
    answer = {
        "memory": [{"id": "0", "text": "Caroline went to an LGBTQ support group.", "attributed_to": "user"}]
    }
    fake_llm.enqueue(Reply.json(answer))
    ours = await _memstore(fake_llm, "mem0-v3", _request(ENGLISH, asked))
    fake_llm.enqueue(Reply.json(answer))
    theirs = await _reference(fake_llm, "mem0_additive", ENGLISH)

    # The observation date: Mem0's open-source add() writes today's (only its platform takes a
    # timestamp); Memstore writes the chunk's memory date, so an imported conversation is dated.
    today, memory_day = NOW.date().isoformat(), ENGLISH["memory_at"][:10]
    for body in theirs:
        user = body["messages"][1]
        user["content"] = user["content"].replace(
            f"## Observation Date\n{today}", f"## Observation Date\n{memory_day}"
        )
    drop = (*TEMPERATURE, *NO_THINK, "top_p")
    assert_same(ours, theirs, drop)
    assert ours[0]["response_format"] == {"type": "json_object"}
    assert asked == [CandidateQuery(per_text=10)]


@pytest.mark.parametrize("language", SCENARIOS)
async def test_memos_reader_request_is_memos_own(fake_llm: FakeLLM, language: str) -> None:
    scenario = SCENARIOS[language]
    answer = {
        "memory list": [{"key": "k", "memory_type": "UserMemory", "value": "v", "tags": ["t"]}],
        "summary": "s",
    }
    fake_llm.enqueue(Reply.json(answer))
    ours = await _memstore(fake_llm, "memos", _request(scenario, []))
    fake_llm.enqueue(Reply.json(answer))
    theirs = await _reference(fake_llm, "memos", scenario)

    drop = (*TEMPERATURE, *NO_THINK, "top_p")
    assert_same(ours, theirs, drop)
    assert [m["role"] for m in ours[0]["messages"]] == ["user"]
    assert ours[0]["max_tokens"] == 8000
    assert "response_format" not in ours[0]
