"""Which contents stand in for a statement (a template filled in badly) and which make one."""

from __future__ import annotations

import pytest

from app.writers.base import is_placeholder


@pytest.mark.parametrize(
    "text",
    [
        # only punctuation or an ellipsis
        "",
        "   ",
        "...",
        "\u2026",
        ". . .",
        "-",
        "?!",
        # an ellipsis in place of the rest
        "The user ...",
        "The user \u2026",
        "User ...",
        "The user likes ...",
        "The user lives in [...].",
        "The user said: ...",
        # a subject with nothing said about it
        "The user",
        "the user.",
        "User",
        "The user...",
        "The user's",
        "The agent",
        # a bare date or time
        "2026-11-01 10:00",
        "[2026-11-01 10:00]",
        "2026-11-01",
        "10:00",
        "2026-11-01T10:00:00Z",
        "November 1, 2026",
        "1st of November 2026 at 10:00 AM",
        "Monday",
        # template slots and stand-in words, a lead-in with nothing after it
        "<memory>",
        "{content}",
        "N/A",
        "None",
        "The user's favourite foods:",
    ],
)
def test_placeholders_are_recognised(text: str) -> None:
    assert is_placeholder(text)


@pytest.mark.parametrize(
    "text",
    [
        "The user lives in Lyon.",
        "Mia's birthday is 2026-11-01.",
        "The user prefers meetings at 10:00.",
        "The user was born on 1 May 1990.",
        "The user may move to Oslo in March.",
        "The user is thinking of moving to Berlin...",
        "The user's favourite film is 'Dot...'.",
        "The user said: I also play chess.",
        "The user's daughter is named Ana.",
        "User prefers tea.",
        "The agent will send the report on 2026-11-03 at 09:00.",
        "The user mainly uses C++.",
        "Sushi",
        "The user's PIN hint is 1234.",
    ],
)
def test_statements_are_not_placeholders(text: str) -> None:
    assert not is_placeholder(text)
