"""How an answer is scored: the judge's verdict, token F1 against the gold answer, and evidence recall.

- The judge (a chat model) is shown the question, the gold answer and the generated one, and must
  answer JSON `{"correct": true|false}`. Anything else — prose, broken JSON, a verdict that is not a
  boolean — counts as incorrect and is reported as unparseable, never guessed at.
- Token F1 is SQuAD's: both answers lower-cased, punctuation and the articles a/an/the dropped,
  whitespace collapsed, then F1 over the tokens they share (with multiplicity).
- Evidence recall is the share of a question's evidence turns that lie in a chunk from which at least
  one retrieved memory derives (any version of it up to the one retrieved).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

JUDGE_INSTRUCTIONS = (
    "You grade answers to questions about a conversation. You are given the question, the gold "
    "answer and a generated answer. The generated answer is correct if it says what the gold answer "
    'says: be generous with wording, length and date formats ("May 7" matches "7 May 2023"), but '
    "it is incorrect if it gives another fact, hedges between several, or says it does not know while "
    'the gold answer gives a fact. Reply with JSON only: {"correct": true} or {"correct": false}.'
)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def judge_messages(question: str, gold: str, generated: str) -> list[dict[str, str]]:
    prompt = f"Question: {question}\nGold answer: {gold}\nGenerated answer: {generated}\nVerdict:"
    return [{"role": "system", "content": JUDGE_INSTRUCTIONS}, {"role": "user", "content": prompt}]


@dataclass(frozen=True)
class Verdict:
    correct: bool
    parsed: bool  # False: the judge's output held no {"correct": true|false}; counted incorrect


def parse_verdict(text: str) -> Verdict:
    """The judge's verdict: the first JSON object in its output with a boolean `correct`."""
    for candidate in [text.strip(), *_JSON_OBJECT.findall(text)]:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("correct"), bool):
            return Verdict(correct=value["correct"], parsed=True)
    return Verdict(correct=False, parsed=False)


def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation."""
    lowered = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", lowered).split())


def token_f1(generated: str, gold: str) -> float:
    predicted = normalise_answer(generated).split()
    truth = normalise_answer(gold).split()
    if not predicted or not truth:
        return float(predicted == truth)
    shared = sum((Counter(predicted) & Counter(truth)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(predicted)
    recall = shared / len(truth)
    return 2 * precision * recall / (precision + recall)


def evidence_recall(evidence: Iterable[str], covered: set[str]) -> float | None:
    """The share of `evidence` turns in `covered`; None for a question without evidence."""
    wanted = set(evidence)
    if not wanted:
        return None
    return len(wanted & covered) / len(wanted)
