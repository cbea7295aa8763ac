"""`memstore eval jsonl` on an operator's own conversations: the offline baseline against a writer that
rewrites one memory per user, where a memory's earlier versions speak for the chunks they came from;
the file's mistakes are refused by line; scores are SQuAD's F1 and a judge read strictly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.domain.evaluation.datasets import (
    DatasetError,
    frame_chunks,
    frame_question,
    framing_for,
    load_jsonl,
    load_locomo,
)
from app.domain.evaluation.scoring import parse_verdict, token_f1
from tests.integration.evaluation.test_locomo import LOCOMO, memstore
from tests.integration.evaluation.writers import PLUGINS
from tests.support.fake_llm import FakeLLM
from tests.support.fake_reader import judge_responder, reader_responder


def _said(name: str, text: str, when: str) -> dict[str, Any]:
    return {"role": "user", "name": name, "content": text, "created_at": when}


LINES = [
    {
        "conversation": "c1",
        "user_id": "ana",
        "messages": [_said("Ana", "I live in Lyon.", "2026-01-05T10:00:00Z")],
        "turn_ids": ["a1"],
    },
    {
        "conversation": "c1",
        "user_id": "ana",
        "messages": [
            _said("Ana", "I mainly use Python.", "2026-02-05T10:00:00Z"),
            {"role": "assistant", "content": "Nice."},
        ],
        "turn_ids": ["a2", "a3"],
    },
    {
        "conversation": "c2",
        "user_id": "ben",
        "messages": [_said("Ben", "My daughter's name is Mia.", "2026-03-01T09:00:00+01:00")],
        "turn_ids": ["b1"],
    },
    {
        "conversation": "c1",
        "question": "Where does Ana live?",
        "answer": "Lyon",
        "evidence": ["a1"],
        "category": "place",
    },
    {
        "conversation": "c1",
        "question": "What does Ana mainly use?",
        "answer": "Python",
        "evidence": ["a2"],
    },
    {
        "conversation": "c2",
        "question": "What is the name of Ben's daughter?",
        "answer": "Mia",
        "evidence": ["b1"],
    },
    {"conversation": "c2", "question": "How old is Ben?", "answer": 41},
]


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


async def test_an_operators_own_conversations_are_written_and_questioned_per_writer(
    settings: Settings, tmp_path: Path
) -> None:
    data = _write(tmp_path / "mine.jsonl", LINES)
    async with (
        FakeLLM(responder=reader_responder, model="reader-7b") as reader,
        FakeLLM(responder=judge_responder, model="judge-1") as judge,
    ):
        done = await memstore(
            settings.model_copy(update={"writer_plugins": PLUGINS}),
            "eval",
            "jsonl",
            str(data),
            "--writers",
            "offline,merging",
            "--answer-model",
            f"{reader.base_url}|reader-7b",
            "--judge-model",
            f"{judge.base_url}|judge-1",
            "--top-k",
            "1",
            "--json",
            str(tmp_path / "report.json"),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["dataset"]["name"] == "mine"
    assert report["categories"] == {"place": "place", "all": "all"}
    offline, merging = report["writers"]["offline"], report["writers"]["merging"]

    # The offline baseline stores the three first-person facts; each question finds its own.
    assert offline["writer"]["memories"] == 3
    assert offline["overall"] == {
        "n": 4,
        "judge_accuracy": 0.75,
        "f1": offline["overall"]["f1"],
        "evidence_recall": 1.0,
        "evidence_n": 3,  # the question without evidence is not in it
    }
    assert 0.0 < offline["overall"]["f1"] < 1.0  # "The user lives in Lyon." against "Lyon"
    assert offline["by_category"]["place"]["n"] == 1

    # One memory per user, rewritten: Ana's is at version 2, written from her second chunk, and its
    # version 1 still speaks for the first.
    assert merging["writer"]["memories"] == 2
    lyon = next(r for r in report["questions"] if r["writer"] == "merging" and r["gold"] == "Lyon")
    [memory] = lyon["memories"]
    assert memory["version"] == 2
    assert len(memory["chunk_ids"]) == 2
    assert lyon["evidence_found"] == ["a1"]
    assert merging["overall"]["evidence_recall"] == 1.0
    assert "| offline | 4 | 75.0 % |" in done.stdout


def test_mistakes_in_an_operators_file_are_refused_by_line(tmp_path: Path) -> None:
    chunk = LINES[0]
    for lines, expected in (
        ([chunk, "not json"], "mine.jsonl:2: not JSON"),
        ([chunk, ["a", "list"]], "mine.jsonl:2: expected a JSON object"),
        (
            [{**chunk, "messages": [{"role": "user", "content": "a\u0000b"}]}],
            "mine.jsonl:1: messages[0].content",
        ),
        ([{**chunk, "messages": []}], "mine.jsonl:1: not a valid chunk"),
        ([{**chunk, "extra": 1}], "mine.jsonl:1: not a valid chunk"),
        ([{**chunk, "messages": [_said("Ana", "hi", "2026-01-05T10:00:00")]}], "needs a zone"),
        (
            [chunk, {"conversation": "zz", "question": "q?", "answer": "a"}],
            "mine.jsonl:2: conversation 'zz' has no chunk",
        ),
        ([{**chunk, "user_id": "other"}, chunk, LINES[3]], "chunks of several users (ana, other)"),
        ([LINES[3]], "no chunk"),
    ):
        path = tmp_path / "mine.jsonl"
        path.write_text(
            "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines), encoding="utf-8"
        )
        with pytest.raises(DatasetError) as caught:
            load_jsonl(path)
        assert expected in str(caught.value), (lines, str(caught.value))


def test_a_fixed_seed_picks_the_same_questions_and_says_so(tmp_path: Path) -> None:
    dataset = load_jsonl(_write(tmp_path / "mine.jsonl", LINES))
    first, info = dataset.sample(2, seed=5)
    again, _ = dataset.sample(2, seed=5)
    assert [q.id for q in first] == [q.id for q in again]
    assert info == {"size": 2, "of": 4, "seed": 5}
    everything, none = dataset.sample(10, seed=5)
    assert len(everything) == 4
    assert none is None


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"no LoCoMo file at {LOCOMO}")
def test_locomo_is_read_as_sessions_with_their_turn_ids_and_categories_one_to_four() -> None:
    whole = load_locomo(LOCOMO)
    assert len(whole.chunks) == 272
    assert sum(len(c.turn_ids) for c in whole.chunks) == 5882
    assert len(whole.questions) == 1986 - 446  # category 5 (adversarial) left out
    assert {q.category for q in whole.questions} == {"1", "2", "3", "4"}
    # LoCoMo's evidence lists sometimes join ids ("D8:6; D9:17") or pad them ("D30:05").
    assert all(
        e in {t for c in whole.chunks for t in c.turn_ids} for q in whole.questions for e in q.evidence
    )
    adversarial = load_locomo(LOCOMO, conversations=["conv-26"], include_adversarial=True)
    assert {q.answer for q in adversarial.questions if q.category == "5"} == {
        "Not mentioned in the conversation."
    }
    with pytest.raises(DatasetError, match="no conversation 'conv-0'"):
        load_locomo(LOCOMO, conversations=["conv-0"])


def test_token_f1_is_squads_and_the_judge_is_read_strictly() -> None:
    assert token_f1("The Lyon.", "lyon") == 1.0
    assert token_f1("in Lyon, France", "Lyon") == pytest.approx(0.5)
    assert token_f1("Paris", "Lyon") == 0.0
    assert token_f1("", "") == 1.0
    assert parse_verdict('{"correct": true}').correct
    assert parse_verdict('```json\n{"correct": false, "why": "another city"}\n```').parsed
    assert parse_verdict('Verdict: {"correct": true}').correct
    for garbage in ("yes", '{"correct": "yes"}', '{"correct": 1}', "{", ""):
        verdict = parse_verdict(garbage)
        assert (verdict.correct, verdict.parsed) == (False, False), garbage


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"no LoCoMo file at {LOCOMO}")
def test_each_protocol_is_shown_locomo_as_its_harness_or_convention_shows_it() -> None:
    dataset = load_locomo(LOCOMO, conversations=["1"], sessions={1})
    first = dataset.chunks[0]
    a, b = first.speakers
    assert (a, b) == ("Caroline", "Melanie")
    assert framing_for("hy-memory") == "named-pair"
    assert framing_for("mem0") == framing_for("mem0-v3") == framing_for("memos") == "bank-per-speaker"
    assert framing_for(None) == framing_for("simple") == "one-bank"

    # Hy-Memory: one bank, the first speaker the user, the other a named `assistant` (a real person)
    [pair] = frame_chunks([first], "named-pair")
    assert {(m.role, m.name) for m in pair.messages} == {("user", a), ("assistant", b)}
    assert not any(m.content.startswith(f"{m.name}: ") for m in pair.messages)

    # Mem0 / MemOS: a bank per speaker, each `user` in their own and `assistant` in the other's,
    # "Name: text", two turns a chunk
    banks = frame_chunks([first], "bank-per-speaker")
    assert {c.user_id for c in banks} == {f"{first.user_id}:{a}", f"{first.user_id}:{b}"}
    assert all(len(c.messages) <= 2 for c in banks)
    assert sum(len(c.messages) for c in banks) == 2 * len(first.messages)
    in_a = [c for c in banks if c.user_id.endswith(a)]
    assert in_a[0].messages[0].content == first.messages[0].content
    assert {m.role for c in in_a for m in c.messages if m.content.startswith(f"{a}: ")} == {"user"}
    assert {m.role for c in in_a for m in c.messages if m.content.startswith(f"{b}: ")} == {"assistant"}
    assert [t for c in in_a for t in c.turn_ids] == list(first.turn_ids)
    question = frame_question(dataset.questions[0], dataset.chunks, "bank-per-speaker")
    assert (question.user_id, question.also_user_ids) == (f"{first.user_id}:{a}", (f"{first.user_id}:{b}",))
