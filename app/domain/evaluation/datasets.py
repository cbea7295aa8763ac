"""What an evaluation reads: conversations cut into chunks, and questions about them with a gold
answer and the turns that hold the evidence.

Two sources: the LoCoMo benchmark file (each session of a conversation is one chunk, every turn a
message named after its speaker) and an operator's own JSON Lines (docs/evaluation.md). Either way a
chunk keeps the ids of its turns in its metadata (`turn_ids`), so the chunk a memory was written from
says which turns it can speak for.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec

from app.domain.ingest.schemas import MessageIn
from app.lib.validation import Moment, first_unstorable, parse_moment

# The LoCoMo categories as its file numbers them; 5 (adversarial) asks about what was never said.
LOCOMO_CATEGORIES = {
    "1": "multi-hop",
    "2": "temporal",
    "3": "open-domain",
    "4": "single-hop",
    "5": "adversarial",
}
ADVERSARIAL = "5"
NOT_MENTIONED = "Not mentioned in the conversation."

_SESSION = re.compile(r"^session_(\d+)$")
_TURN_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_LOCOMO_TIME = "%I:%M %p on %d %B, %Y"


class DatasetError(ValueError):
    """The file is not what its format says it should be; the message names the place."""


@dataclass(frozen=True)
class EvalChunk:
    """One chunk of a conversation, as it will be posted to each writer's bank."""

    conversation: str
    user_id: str
    messages: tuple[MessageIn, ...]
    turn_ids: tuple[str, ...]
    label: str  # where it comes from ("session 3"), for reports
    # A conversation between two people (LoCoMo's speaker_a, speaker_b): each message is named after
    # its speaker and says "Speaker: text", so that a protocol can frame it as its harness does.
    speakers: tuple[str, ...] = ()

    def metadata(self) -> dict[str, Any]:
        return {"conversation": self.conversation, "turn_ids": list(self.turn_ids), "source": self.label}


@dataclass(frozen=True)
class EvalQuestion:
    id: str
    conversation: str
    user_id: str
    question: str
    answer: str
    evidence: tuple[str, ...]  # turn ids; empty when the file gives none that it holds
    category: str
    also_user_ids: tuple[str, ...] = ()  # further banks the answer reads (a bank per speaker)
    # When it is asked: the "now" of its time words ("last year"); LoCoMo's, its conversation's last session.
    asked_at: datetime | None = None


@dataclass
class Dataset:
    name: str
    chunks: list[EvalChunk]
    questions: list[EvalQuestion]
    categories: dict[str, str] = field(default_factory=dict)  # key -> name
    notes: list[str] = field(default_factory=list)  # what was left out, and why

    def sample(self, size: int | None, seed: int) -> tuple[list[EvalQuestion], dict[str, Any] | None]:
        """A fixed-seed subsample of the questions (in file order), and what it is."""
        if size is None or size >= len(self.questions):
            return list(self.questions), None
        # The same seed picks the same questions on every run and machine: not a secret.
        picked = sorted(random.Random(seed).sample(range(len(self.questions)), size))  # noqa: S311
        return [self.questions[i] for i in picked], {"size": size, "of": len(self.questions), "seed": seed}


def turn_id(value: str) -> str | None:
    """A LoCoMo turn id in its one spelling (`D3:7`); None when `value` holds none."""
    match = _TURN_ID.fullmatch(value.strip())
    return f"D{int(match.group(1))}:{int(match.group(2))}" if match else None


def _evidence_ids(values: Iterable[Any]) -> list[str]:
    """Turn ids from LoCoMo's evidence lists, some of which join several ids in one string."""
    found: list[str] = []
    for value in values:
        found.extend(f"D{int(a)}:{int(b)}" for a, b in _TURN_ID.findall(str(value)))
    return list(dict.fromkeys(found))


def _text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text") or "")
    if caption := turn.get("blip_caption"):
        text = f"{text} [shares a photo: {caption}]"
    return text


def load_locomo(
    path: Path,
    *,
    conversations: list[str] | None = None,
    sessions: set[int] | None = None,
    include_adversarial: bool = False,
) -> Dataset:
    """LoCoMo's conversations (all, or those named by 1-based position or `sample_id`), each
    session one chunk; with `sessions`, only those sessions and the questions whose evidence lies
    wholly in them."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise DatasetError(msg) from exc
    if not isinstance(document, list):
        msg = f"{path}: expected a list of LoCoMo samples"
        raise DatasetError(msg)
    chosen = _choose(document, conversations, path)
    dataset = Dataset(name="locomo", chunks=[], questions=[], categories=dict(LOCOMO_CATEGORIES))
    if not include_adversarial:
        del dataset.categories[ADVERSARIAL]
    unresolved = 0
    for sample in chosen:
        conversation = str(sample["sample_id"])
        turns_held: set[str] = set()
        numbers = sorted(
            int(m.group(1)) for key in sample["conversation"] if (m := _SESSION.match(key)) is not None
        )
        for number in numbers:
            if sessions is not None and number not in sessions:
                continue
            chunk = _locomo_session(sample["conversation"], conversation, number)
            if chunk is not None:
                dataset.chunks.append(chunk)
                turns_held.update(chunk.turn_ids)
        times = [m.created_at for c in dataset.chunks if c.conversation == conversation for m in c.messages]
        asked_at = max((t for t in times if t is not None), default=None)
        for index, qa in enumerate(sample.get("qa", [])):
            category = str(qa.get("category"))
            if category not in dataset.categories:
                continue
            evidence = _evidence_ids(qa.get("evidence") or [])
            held = [e for e in evidence if e in turns_held]
            if sessions is not None and (not evidence or len(held) < len(evidence)):
                continue  # its evidence lies (partly) in sessions left out
            unresolved += len(evidence) - len(held)
            answer = NOT_MENTIONED if category == ADVERSARIAL else str(qa.get("answer", ""))
            dataset.questions.append(
                EvalQuestion(
                    id=f"{conversation}#{index}",
                    conversation=conversation,
                    user_id=conversation,
                    question=str(qa["question"]),
                    answer=answer,
                    evidence=tuple(held),
                    category=category,
                    asked_at=asked_at,
                )
            )
    if unresolved:
        dataset.notes.append(f"{unresolved} evidence ids name no turn of their conversation; left out")
    if sessions is not None:
        dataset.notes.append(
            f"sessions {_ranges(sessions)} only, and the questions whose evidence lies in them"
        )
    return dataset


def _choose(document: list[Any], wanted: list[str] | None, path: Path) -> list[dict[str, Any]]:
    if not wanted:
        return list(document)
    chosen = []
    for token in wanted:
        if token.isdigit() and 1 <= int(token) <= len(document):
            chosen.append(document[int(token) - 1])
            continue
        found = [s for s in document if str(s.get("sample_id")) == token]
        if not found:
            msg = f"{path} has no conversation {token!r} (1 … {len(document)} or a sample_id)"
            raise DatasetError(msg)
        chosen.extend(found)
    return chosen


def _locomo_session(conversation: dict[str, Any], name: str, number: int) -> EvalChunk | None:
    turns = conversation.get(f"session_{number}") or []
    when = conversation.get(f"session_{number}_date_time")
    created_at = None
    if isinstance(when, str):
        try:
            created_at = Moment.fromisoformat(
                datetime.strptime(when, _LOCOMO_TIME).replace(tzinfo=UTC).isoformat()
            )
        except ValueError:
            created_at = None
    messages, ids = [], []
    for turn in turns:
        text = _text(turn)
        if not text.strip():
            continue
        speaker = str(turn.get("speaker") or "someone")[:200]
        messages.append(
            MessageIn(role="user", content=f"{speaker}: {text}", name=speaker, created_at=created_at)
        )
        ids.append(turn_id(str(turn.get("dia_id", ""))) or str(turn.get("dia_id", "")))
    if not messages:
        return None
    speakers = tuple(str(s) for s in (conversation.get("speaker_a"), conversation.get("speaker_b")) if s)
    return EvalChunk(name, name, tuple(messages), tuple(ids), f"session {number}", speakers)


# --- how each protocol is shown a conversation between two people ----------------------------

# `one-bank`: the chunks as loaded (every turn a named `user` message). `named-pair`: Hy-Memory's
# convention, one bank, the first speaker `user` and the other `assistant`, both named. `bank-per-
# speaker`: Mem0's and MemOS's LoCoMo harnesses, a bank for each speaker in which they are `user`
# and the other `assistant`, each turn "Speaker: text", two turns to a chunk.
FRAMINGS = ("one-bank", "named-pair", "bank-per-speaker")
PROFILE_FRAMINGS = {"hy-memory": "named-pair", "mem0": "bank-per-speaker", "mem0-v3": "bank-per-speaker"} | {
    "memos": "bank-per-speaker"
}
HARNESS_TURNS = 2  # the harnesses' batch size: turns per add() call


def framing_for(profile: str | None) -> str:
    """How a writer speaking `profile` is shown a two-person conversation."""
    return PROFILE_FRAMINGS.get(profile or "", "one-bank")


def _said(message: MessageIn) -> str:
    """The text of a turn without the "Speaker: " the loader put before it."""
    prefix = f"{message.name}: "
    return (
        message.content[len(prefix) :]
        if message.name and message.content.startswith(prefix)
        else message.content
    )


def frame_chunks(chunks: list[EvalChunk], framing: str) -> list[EvalChunk]:
    """The chunks as `framing` shows them (chunks without two speakers are left as they are)."""
    if framing == "one-bank":
        return list(chunks)
    framed: list[EvalChunk] = []
    for chunk in chunks:
        if len(chunk.speakers) != 2:
            framed.append(chunk)
        elif framing == "named-pair":
            messages = tuple(
                MessageIn(
                    role="user" if m.name == chunk.speakers[0] else "assistant",
                    content=_said(m),
                    name=m.name,
                    created_at=m.created_at,
                )
                for m in chunk.messages
            )
            framed.append(replace(chunk, messages=messages))
        else:
            for speaker in chunk.speakers:
                for start in range(0, len(chunk.messages), HARNESS_TURNS):
                    part = chunk.messages[start : start + HARNESS_TURNS]
                    messages = tuple(
                        MessageIn(
                            role="user" if m.name == speaker else "assistant",
                            content=m.content,
                            created_at=m.created_at,
                        )
                        for m in part
                    )
                    framed.append(
                        replace(
                            chunk,
                            user_id=speaker_bank(chunk.user_id, speaker),
                            messages=messages,
                            turn_ids=chunk.turn_ids[start : start + HARNESS_TURNS],
                        )
                    )
    return framed


def frame_question(question: EvalQuestion, chunks: list[EvalChunk], framing: str) -> EvalQuestion:
    """The question asked of the bank(s) `framing` wrote its conversation into."""
    speakers = next((c.speakers for c in chunks if c.conversation == question.conversation), ())
    if framing != "bank-per-speaker" or len(speakers) != 2:
        return question
    first, second = (speaker_bank(question.user_id, s) for s in speakers)
    return replace(question, user_id=first, also_user_ids=(second,))


def speaker_bank(user_id: str, speaker: str) -> str:
    return f"{user_id}:{speaker}"[:200]


def _ranges(numbers: set[int]) -> str:
    return ",".join(str(n) for n in sorted(numbers))


# --- an operator's own data: JSON Lines ------------------------------------------------------

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class ChunkLine(msgspec.Struct, forbid_unknown_fields=True):
    conversation: Name
    user_id: Name
    messages: Annotated[list[MessageIn], msgspec.Meta(min_length=1)]
    turn_ids: list[Name] = msgspec.field(default_factory=list)


class QuestionLine(msgspec.Struct, forbid_unknown_fields=True):
    conversation: Name
    question: Annotated[str, msgspec.Meta(min_length=1)]
    answer: str | int | float
    evidence: list[Name] = msgspec.field(default_factory=list)
    category: str | int = "all"
    asked_at: Moment | None = None  # the "now" of its time words; default: when it is asked


def _decode_moment(target: type, value: Any) -> Any:
    if target is Moment:
        return parse_moment(value)
    msg = f"unsupported type {target!r}"
    raise NotImplementedError(msg)


def load_jsonl(path: Path) -> Dataset:
    """Chunks and questions, one JSON object a line (docs/evaluation.md); a bad line is refused by
    its number and field."""
    dataset = Dataset(name=path.stem, chunks=[], questions=[])
    users: dict[str, set[str]] = {}
    pending: list[tuple[int, QuestionLine]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read {path}: {exc}"
        raise DatasetError(msg) from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except ValueError as exc:
            msg = f"{where}: not JSON ({exc})"
            raise DatasetError(msg) from exc
        if not isinstance(raw, dict):
            msg = f"{where}: expected a JSON object"
            raise DatasetError(msg)
        if (bad := first_unstorable(raw)) is not None:
            msg = f"{where}: {bad[0]} {bad[1]}"
            raise DatasetError(msg)
        kind: type[ChunkLine | QuestionLine] = QuestionLine if "question" in raw else ChunkLine
        try:
            item = msgspec.convert(raw, kind, dec_hook=_decode_moment)
        except msgspec.ValidationError as exc:
            what = "question" if kind is QuestionLine else "chunk"
            msg = f"{where}: not a valid {what}: {exc}"
            raise DatasetError(msg) from exc
        if isinstance(item, ChunkLine):
            users.setdefault(item.conversation, set()).add(item.user_id)
            label = f"line {number}"
            dataset.chunks.append(
                EvalChunk(item.conversation, item.user_id, tuple(item.messages), tuple(item.turn_ids), label)
            )
        else:
            pending.append((number, item))
    for number, question in pending:
        owners = users.get(question.conversation, set())
        if len(owners) != 1:
            found = "no chunk" if not owners else f"chunks of several users ({', '.join(sorted(owners))})"
            msg = f"{path}:{number}: conversation {question.conversation!r} has {found}"
            raise DatasetError(msg)
        category = str(question.category)
        dataset.categories.setdefault(category, category)
        dataset.questions.append(
            EvalQuestion(
                id=f"{path.name}:{number}",
                conversation=question.conversation,
                user_id=next(iter(owners)),
                question=question.question,
                answer=str(question.answer),
                evidence=tuple(dict.fromkeys(question.evidence)),
                category=category,
                asked_at=question.asked_at,
            )
        )
    if not dataset.chunks:
        msg = f"{path} holds no chunk"
        raise DatasetError(msg)
    return dataset
