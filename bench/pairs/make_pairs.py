"""Writes tests/data/pairs/e5/<lang>.jsonl: labelled pairs of a user's memories in English, German,
Spanish, Chinese and Japanese, for the near-duplicate rule and the related floor of the `e5` embedder.

Each language has the same twelve topics (where the user lives, how many cats, coffee a day, the
partner's name, birthday, favourite food, job, weekly sport, allergy, car, gym day, language being
learnt), each with six or more values and, written in that language, the memory's sentence, sentences
that restate it, its negation and sentences that update it. From them, with a fixed seed:

- `duplicate` pairs: a memory and a restatement of it (`duplicate: true`), or a memory and a distinct
  fact differing in one detail: the value (a place, a number, a name, a date, a weekday, a preference),
  a restatement with another value, or the negation (`duplicate: false`);
- `related` pairs: a new fact and the memory it updates or contradicts (`related: true`), or two
  facts about the user on different topics, a memory and a memory or a new fact (`related: false`);

then each language's hand-written harder pairs (bench/pairs/hard.py) are appended.
`.venv/bin/python bench/pairs/make_pairs.py` rewrites the files; the output is the same every run.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hard import HARD
from topics import LANGUAGES, Topic

OUT = Path(__file__).parents[2] / "tests" / "data" / "pairs" / "e5"
SEED = 20261207
COUNTS = {"duplicate": 80, "distinct": 80, "related": 75, "unrelated": 75}  # per language


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    set: str  # "duplicate" or "related"
    label: bool
    kind: str

    def row(self, lang: str) -> dict[str, object]:
        key = "duplicate" if self.set == "duplicate" else "related"
        return {"lang": lang, "set": self.set, "a": self.a, "b": self.b, key: self.label, "kind": self.kind}


def candidates(topics: list[Topic]) -> dict[str, list[Pair]]:
    """Every pair the templates make, by category."""
    found: dict[str, list[Pair]] = {k: [] for k in COUNTS}
    for topic in topics:
        for value in topic.values:
            memory = topic.memory.format(x=value)
            for same in topic.same:
                found["duplicate"].append(
                    Pair(memory, same.format(x=value), "duplicate", True, "restatement")
                )
            others = [v for v in topic.values if v != value]
            for other in others:
                found["distinct"].append(
                    Pair(memory, topic.memory.format(x=other), "duplicate", False, topic.kind)
                )
                for same in topic.same:
                    found["distinct"].append(
                        Pair(memory, same.format(x=other), "duplicate", False, topic.kind)
                    )
                for update in topic.update:
                    found["related"].append(Pair(update.format(x=other), memory, "related", True, "update"))
            if topic.negation:
                negation = topic.negation.format(x=value)
                found["distinct"].append(Pair(memory, negation, "duplicate", False, "negation"))
                found["related"].append(Pair(negation, memory, "related", True, "contradiction"))
    for topic in topics:
        for other_topic in topics:
            if other_topic is topic:
                continue
            for value in topic.values:
                for other in other_topic.values:
                    memory = topic.memory.format(x=value)
                    found["unrelated"].append(
                        Pair(other_topic.memory.format(x=other), memory, "related", False, "other topic")
                    )
                    for update in other_topic.update:
                        found["unrelated"].append(
                            Pair(update.format(x=other), memory, "related", False, "other topic")
                        )
    return found


def sample(pairs: list[Pair], count: int, rng: random.Random) -> list[Pair]:
    """`count` distinct pairs spread over the kinds and topics: shuffled, then taken round robin by kind."""
    unique = list(dict.fromkeys(pairs))
    rng.shuffle(unique)
    by_kind: dict[str, list[Pair]] = {}
    for pair in unique:
        by_kind.setdefault(pair.kind, []).append(pair)
    taken: list[Pair] = []
    while len(taken) < count and any(by_kind.values()):
        for kind in sorted(by_kind):
            if by_kind[kind] and len(taken) < count:
                taken.append(by_kind[kind].pop())
    return taken


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for lang, topics in LANGUAGES.items():
        rng = random.Random(f"{SEED}:{lang}")
        found = candidates(topics)
        rows = [p.row(lang) for category, n in COUNTS.items() for p in sample(found[category], n, rng)]
        rows += [{"lang": lang, **row} for row in HARD[lang]]
        seen = {(r["a"], r["b"]) for r in rows}
        assert len(seen) == len(rows), f"{lang}: a pair is listed twice"
        path = OUT / f"{lang}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{path}: {len(rows)} pairs")


if __name__ == "__main__":
    main()
