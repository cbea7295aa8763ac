"""Statements and their negations are told apart; restatements are not mistaken for negations."""

from __future__ import annotations

import pytest

from app.domain.memories.polarity import opposite_polarity


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The user likes jazz.", "The user dislikes jazz."),
        ("The user is vegetarian.", "The user is not vegetarian."),
        ("The user is allergic to peanuts.", "The user isn\u2019t allergic to peanuts."),
        ("The user likes jazz.", "The user no longer likes jazz."),
        ("The user is happy at work.", "The user is unhappy at work."),
        ("The user can swim.", "The user cannot swim."),
    ],
)
def test_opposites(a: str, b: str) -> None:
    assert opposite_polarity(a, b)
    assert opposite_polarity(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The user likes jazz.", "The user loves jazz."),
        ("The user is vegetarian.", "The user is a vegetarian."),
        ("The user does not drink.", "The user never drinks."),  # both negative
        ("The user lives in Lyon.", "The user lives in Lyon, France."),
        ("The user uses Python.", "The user uses Python daily."),
    ],
)
def test_not_opposites(a: str, b: str) -> None:
    assert not opposite_polarity(a, b)
