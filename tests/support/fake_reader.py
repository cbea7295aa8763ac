"""Responders that make the fake model server (`tests.support.fake_llm.FakeLLM`) act as a read model
and as a judge, over real HTTP.

- `reader_responder` answers with the first memory it was shown (without its date), or
  "I do not know." when it was shown none: an answer that is right exactly when search found it.
- `judge_responder` says `{"correct": true}` when every word of the gold answer is in the generated
  answer, else false.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.fake_llm import Reply

# "3. [8 May 2023] The user lives in Lyon. (true from 5 January 2020 until 10 March 2024)"
_MEMORY_LINE = re.compile(r"^\d+\. (?:\[[^\]]*\] )?(.*?)(?: \(true (?:from|until) [^)]*\))?$")
_WORDS = re.compile(r"\w+")


def _prompt(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def shown_memories(body: dict[str, Any]) -> list[str]:
    """The memories a reader request holds, in the order given."""
    found = []
    for line in _prompt(body).split("\n\nQuestion:", 1)[0].splitlines():
        match = _MEMORY_LINE.match(line)
        if match:
            found.append(match.group(1))
    return found


def reader_responder(body: dict[str, Any]) -> Reply:
    memories = shown_memories(body)
    return Reply(content=memories[0] if memories else "I do not know.")


def judged(body: dict[str, Any]) -> tuple[str, str]:
    """(gold answer, generated answer) of a judge request."""
    prompt = _prompt(body)
    gold = re.search(r"^Gold answer: (.*)$", prompt, re.MULTILINE)
    generated = re.search(r"^Generated answer: (.*)$", prompt, re.MULTILINE)
    assert gold is not None, prompt
    assert generated is not None, prompt
    return gold.group(1), generated.group(1)


def judge_responder(body: dict[str, Any]) -> Reply:
    gold, generated = judged(body)
    words = set(_WORDS.findall(generated.lower()))
    correct = all(w in words for w in _WORDS.findall(gold.lower()))
    return Reply(content=json.dumps({"correct": correct}))
