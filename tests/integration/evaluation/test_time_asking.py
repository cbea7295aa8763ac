"""`memstore eval --time-boost 0,1 --valid-at off,named`: one bank per writer, asked once per way, so
only the asking differs; a question naming a time is read at its `asked_at`, and the report counts
the questions that name one apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.config import Settings
from tests.integration.evaluation.test_locomo import memstore
from tests.support.fake_llm import FakeLLM
from tests.support.fake_reader import judge_responder, reader_responder


def _chunk(turn: str, text: str, when: str) -> dict[str, Any]:
    return {
        "conversation": "c1",
        "user_id": "ana",
        "messages": [{"role": "user", "name": "Ana", "content": text, "created_at": when}],
        "turn_ids": [turn],
    }


LINES = [
    _chunk("t1", "I went hiking with friends in the hills.", "2022-03-01T10:00:00Z"),
    _chunk("t2", "I went hiking with my sister.", "2023-05-07T10:00:00Z"),
    _chunk("t3", "I went hiking with my brother.", "2023-08-20T10:00:00Z"),
    # "last week" is read at asked_at: the week of 14 August 2023.
    {
        "conversation": "c1",
        "question": "Who did I go hiking with last week?",
        "answer": "my brother",
        "evidence": ["t3"],
        "asked_at": "2023-08-23T12:00:00Z",
    },
    {
        "conversation": "c1",
        "question": "Who did I go hiking with in May 2023?",
        "answer": "my sister",
        "evidence": ["t2"],
        "asked_at": "2023-09-01T12:00:00Z",
    },
    {"conversation": "c1", "question": "Who did I go hiking with?", "answer": "friends", "evidence": ["t1"]},
]


async def test_each_way_of_asking_reads_the_same_bank(settings: Settings, tmp_path: Path) -> None:
    data = tmp_path / "hikes.jsonl"
    data.write_text("\n".join(json.dumps(line) for line in LINES) + "\n", encoding="utf-8")
    async with (
        FakeLLM(responder=reader_responder, model="reader") as reader,
        FakeLLM(responder=judge_responder, model="judge") as judge,
    ):
        done = await memstore(
            settings,
            "eval",
            "jsonl",
            str(data),
            "--writers",
            "verbatim",
            "--answer-model",
            f"{reader.base_url}|reader",
            "--judge-model",
            f"{judge.base_url}|judge",
            "--top-k",
            "1",
            "--time-boost",
            "0,1",
            "--valid-at",
            "off,named",
            "--json",
            str(tmp_path / "report.json"),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    runs = report["writers"]
    assert list(runs) == [
        "verbatim [boost 0]",
        "verbatim [boost 0, valid_at]",
        "verbatim [boost 1]",
        "verbatim [boost 1, valid_at]",
    ]
    assert len({run["tenant"] for run in runs.values()}) == 1  # one bank, written once
    assert report["protocol"]["askings"][1] == {"time_boost": 0.0, "valid_at": "end of the named time"}

    def found(run: str, question: str) -> list[str]:
        [record] = [r for r in report["questions"] if r["writer"] == run and r["question"] == question]
        return record["evidence_found"]

    # Two of the three questions name a time; the boost finds what happened then, at the asking's time.
    for run in ("verbatim [boost 1]", "verbatim [boost 1, valid_at]"):
        assert runs[run]["names_a_time"]["n"] == 2
        assert runs[run]["names_a_time"]["evidence_recall"] == 1.0
        assert found(run, "Who did I go hiking with last week?") == ["t3"]
        assert found(run, "Who did I go hiking with in May 2023?") == ["t2"]
    # valid_at the end of May 2023 leaves out what was said after it: the brother's hike is not found.
    assert found("verbatim [boost 0, valid_at]", "Who did I go hiking with in May 2023?") != ["t3"]
    # Without the boost, the words alone do not tell last week's hike from the others.
    assert found("verbatim [boost 0]", "Who did I go hiking with last week?") != ["t3"]
    assert "naming a time (any category)" in done.stdout
