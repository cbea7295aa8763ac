"""Time expressions: which phrases resolve, to which local day / month / year, and which are left alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest

from app.lib.time_expressions import Validity, resolve

LOS_ANGELES = ZoneInfo("America/Los_Angeles")
TOKYO = ZoneInfo("Asia/Tokyo")
ZONES = [pytest.param(UTC, id="UTC"), pytest.param(LOS_ANGELES, id="Los_Angeles")]

# Wednesday 12 June 2024, mid-afternoon wherever it is said.
WEDNESDAY = (2024, 6, 12, 15, 0)


def _day(zone: tzinfo, year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=zone)


def _resolved(text: str, said_at: datetime) -> Validity:
    validity = resolve(text, said_at)
    assert validity is not None, text
    return validity


# text, valid_from, valid_to (local dates, or None), the phrase — said on Wednesday 12 June 2024.
EXPRESSIONS = [
    # Explicit dates.
    ("I moved to Lyon on 7 May 2023", (2023, 5, 7), None, "on 7 May 2023"),
    ("I moved to Lyon May 7, 2023", (2023, 5, 7), None, "May 7, 2023"),
    ("I moved to Lyon on 2023-05-07", (2023, 5, 7), None, "on 2023-05-07"),
    ("I moved to Lyon 2023-05-07", (2023, 5, 7), None, "2023-05-07"),
    ("I moved to Lyon on the 7th of May 2023", (2023, 5, 7), None, "on the 7th of May 2023"),
    ("I moved to Lyon on May 7", (2024, 5, 7), None, "on May 7"),
    ("I moved to Lyon on 7 May", (2024, 5, 7), None, "on 7 May"),
    ("I moved to Lyon in March 2024", (2024, 3, 1), None, "in March 2024"),
    ("I moved to Lyon March 2024", (2024, 3, 1), None, "March 2024"),
    ("I moved to Lyon in March", (2024, 3, 1), None, "in March"),
    ("I moved to Lyon in 2019", (2019, 1, 1), None, "in 2019"),
    # since
    ("I've lived in Lyon since 2019", (2019, 1, 1), None, "since 2019"),
    ("I've lived in Lyon since March 2024", (2024, 3, 1), None, "since March 2024"),
    ("I've lived in Lyon since last year", (2023, 1, 1), None, "since last year"),
    ("I've lived in Lyon since May 7", (2024, 5, 7), None, "since May 7"),
    # until: the end of the period, i.e. the start of the next one.
    ("I was vegetarian until last year", None, (2024, 1, 1), "until last year"),
    ("I lived in Lyon until 2020", None, (2021, 1, 1), "until 2020"),
    ("I lived in Lyon until March", None, (2024, 4, 1), "until March"),
    ("I lived in Lyon till May 7, 2023", None, (2023, 5, 8), "till May 7, 2023"),
    # Ranges.
    ("I lived in Lyon from 2019 to 2021", (2019, 1, 1), (2022, 1, 1), "from 2019 to 2021"),
    ("I lived in Lyon between 2019 and 2021", (2019, 1, 1), (2022, 1, 1), "between 2019 and 2021"),
    ("I was in Lyon from May 7 to May 9", (2024, 5, 7), (2024, 5, 10), "from May 7 to May 9"),
    # One period, start and end.
    ("I was vegetarian during 2019", (2019, 1, 1), (2020, 1, 1), "during 2019"),
    ("I lived in Lyon throughout March 2024", (2024, 3, 1), (2024, 4, 1), "throughout March 2024"),
    ("I was in Lyon during last week", (2024, 6, 3), (2024, 6, 10), "during last week"),
    # Relative days and periods (weeks start on Monday).
    ("I got a cat yesterday", (2024, 6, 11), None, "yesterday"),
    ("I got a cat today", (2024, 6, 12), None, "today"),
    ("My flight is tomorrow", (2024, 6, 13), None, "tomorrow"),
    ("I got a cat the day before yesterday", (2024, 6, 10), None, "the day before yesterday"),
    ("My flight is the day after tomorrow", (2024, 6, 14), None, "the day after tomorrow"),
    ("I started running last week", (2024, 6, 3), None, "last week"),
    ("I started running this week", (2024, 6, 10), None, "this week"),
    ("I start the new job next week", (2024, 6, 17), None, "next week"),
    ("I moved to Seattle last month", (2024, 5, 1), None, "last month"),
    ("I moved to Seattle this month", (2024, 6, 1), None, "this month"),
    ("I move to Seattle next month", (2024, 7, 1), None, "next month"),
    ("I moved to Seattle last year", (2023, 1, 1), None, "last year"),
    ("I moved to Seattle this year", (2024, 1, 1), None, "this year"),
    ("I move to Seattle next year", (2025, 1, 1), None, "next year"),
    # "ago": a day counted back from the day said.
    ("I got a cat 3 days ago", (2024, 6, 9), None, "3 days ago"),
    ("I got a cat 2 weeks ago", (2024, 5, 29), None, "2 weeks ago"),
    ("I got a cat a week ago", (2024, 6, 5), None, "a week ago"),
    ("I got a cat a month ago", (2024, 5, 12), None, "a month ago"),
    ("I got a cat two years ago", (2022, 6, 12), None, "two years ago"),
    ("I got a cat twelve days ago", (2024, 5, 31), None, "twelve days ago"),
    ("I got a cat one year ago", (2023, 6, 12), None, "one year ago"),
    # Weekdays: the next Friday after Wednesday 12 June is the 14th, the last one the 7th.
    ("My flight is on Friday", (2024, 6, 14), None, "on Friday"),
    ("I'm flying Friday", (2024, 6, 14), None, "Friday"),
    ("I\u2019m flying Friday", (2024, 6, 14), None, "Friday"),
    ("I will see her on Friday", (2024, 6, 14), None, "on Friday"),
    ("I'm going to move on Friday", (2024, 6, 14), None, "on Friday"),
    ("We'll meet Friday", (2024, 6, 14), None, "Friday"),
    ("I see her next Friday", (2024, 6, 14), None, "next Friday"),
    ("I moved on Friday", (2024, 6, 7), None, "on Friday"),
    ("I saw her Friday", (2024, 6, 7), None, "Friday"),
    ("I was flying Friday", (2024, 6, 7), None, "Friday"),
    ("I saw her last Friday", (2024, 6, 7), None, "last Friday"),
    ("I saw her this past Friday", (2024, 6, 7), None, "this past Friday"),
    # The future marker counts only in the weekday's own clause.
    ("I'm feeling great, we met on Friday", (2024, 6, 7), None, "on Friday"),
    ("I booked it, and I'm flying on Friday", (2024, 6, 14), None, "on Friday"),
    # Case does not matter.
    ("I MOVED TO LYON IN MARCH 2024", (2024, 3, 1), None, "IN MARCH 2024"),
    ("i moved here last month", (2024, 5, 1), None, "last month"),
]


def _expected(local: tuple[int, int, int] | None, zone: tzinfo) -> datetime | None:
    return None if local is None else _day(zone, *local)


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize(("text", "valid_from", "valid_to", "phrase"), EXPRESSIONS)
def test_expression_resolves_to_local_start_and_end(
    zone: tzinfo,
    text: str,
    valid_from: tuple[int, int, int] | None,
    valid_to: tuple[int, int, int] | None,
    phrase: str,
) -> None:
    validity = _resolved(text, datetime(*WEDNESDAY, tzinfo=zone))

    assert (validity.valid_from, validity.valid_to) == (
        _expected(valid_from, zone),
        _expected(valid_to, zone),
    )
    assert validity.phrase == phrase
    assert text[validity.start : validity.end] == phrase
    for moment in (validity.valid_from, validity.valid_to):
        assert moment is None or moment.tzinfo is zone


# --- the message's own zone, not UTC ----------------------------------------------------------------


def test_just_after_midnight_in_tokyo_reads_the_tokyo_day() -> None:
    said_at = datetime(2024, 3, 1, 0, 30, tzinfo=TOKYO)  # still 29 February in UTC
    assert said_at.astimezone(UTC).day == 29

    assert _resolved("today", said_at).valid_from == _day(TOKYO, 2024, 3, 1)
    assert _resolved("yesterday", said_at).valid_from == _day(TOKYO, 2024, 2, 29)
    assert _resolved("last month", said_at).valid_from == _day(TOKYO, 2024, 2, 1)
    # The same instant said in UTC is still February.
    assert _resolved("last month", said_at.astimezone(UTC)).valid_from == _day(UTC, 2024, 1, 1)


def test_late_evening_in_los_angeles_reads_the_los_angeles_day() -> None:
    said_at = datetime(2024, 2, 29, 20, 0, tzinfo=LOS_ANGELES)  # already 1 March in UTC
    assert said_at.astimezone(UTC).day == 1

    assert _resolved("today", said_at).valid_from == _day(LOS_ANGELES, 2024, 2, 29)
    assert _resolved("this month", said_at).valid_from == _day(LOS_ANGELES, 2024, 2, 1)
    assert _resolved("today", said_at.astimezone(UTC)).valid_from == _day(UTC, 2024, 3, 1)


def test_just_after_midnight_in_los_angeles_yesterday_is_the_local_day_before() -> None:
    said_at = datetime(2024, 6, 12, 0, 5, tzinfo=LOS_ANGELES)

    validity = _resolved("yesterday", said_at)

    assert validity.valid_from == _day(LOS_ANGELES, 2024, 6, 11)
    assert validity.valid_from.utcoffset() == timedelta(hours=-7)


def test_a_day_across_the_daylight_saving_change_keeps_its_own_offset() -> None:
    said_at = datetime(2024, 3, 11, 10, 0, tzinfo=LOS_ANGELES)  # PDT, the day after the change

    validity = _resolved("yesterday", said_at)

    assert validity.valid_from == _day(LOS_ANGELES, 2024, 3, 10)
    assert validity.valid_from.utcoffset() == timedelta(hours=-8)  # midnight on the 10th was still PST


# --- month and year boundaries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said_on", "valid_from"),
    [
        ("last month", (2024, 1, 15), (2023, 12, 1)),
        ("next month", (2024, 12, 15), (2025, 1, 1)),
        ("last week", (2024, 1, 3), (2023, 12, 25)),  # said on a Wednesday
        ("last week", (2024, 6, 16), (2024, 6, 3)),  # said on a Sunday: its week began on the 10th
        ("last week", (2024, 6, 10), (2024, 6, 3)),  # said on a Monday
        ("on May 7", (2024, 5, 6), (2023, 5, 7)),  # not yet May 7 this year
        ("on May 7", (2024, 5, 7), (2024, 5, 7)),  # the day itself has come
        ("in March", (2024, 2, 20), (2023, 3, 1)),  # a month alone is the last one begun
        ("on February 29", (2025, 3, 1), (2024, 2, 29)),  # the most recent one that exists
        ("a month ago", (2024, 3, 31), (2024, 2, 29)),  # no 31 February: the month's last day
        ("a year ago", (2024, 2, 29), (2023, 2, 28)),
        ("3 days ago", (2024, 3, 1), (2024, 2, 27)),
        ("yesterday", (2024, 1, 1), (2023, 12, 31)),
    ],
)
def test_boundaries(text: str, said_on: tuple[int, int, int], valid_from: tuple[int, int, int]) -> None:
    said_at = datetime(*said_on, 12, 0, tzinfo=UTC)

    assert _resolved(text, said_at).valid_from == _day(UTC, *valid_from)


def test_until_a_month_alone_ends_after_the_most_recent_such_month() -> None:
    said_at = datetime(2024, 2, 20, 12, 0, tzinfo=UTC)

    assert _resolved("I was in Lyon until March", said_at).valid_to == _day(UTC, 2023, 4, 1)


def test_a_weekday_named_on_that_same_weekday_is_a_week_away() -> None:
    friday = datetime(2024, 6, 14, 12, 0, tzinfo=UTC)

    assert _resolved("I moved on Friday", friday).valid_from == _day(UTC, 2024, 6, 7)
    assert _resolved("My flight is on Friday", friday).valid_from == _day(UTC, 2024, 6, 21)


# --- which expression, when there are several -------------------------------------------------------


def test_the_first_expression_in_the_text_wins() -> None:
    said_at = datetime(*WEDNESDAY, tzinfo=UTC)

    validity = _resolved("In 2019 I moved to Lyon, and last month to Seattle", said_at)

    assert (validity.phrase, validity.valid_from) == ("In 2019", _day(UTC, 2019, 1, 1))


def test_the_first_expression_wins_even_when_a_later_one_is_more_specific() -> None:
    said_at = datetime(*WEDNESDAY, tzinfo=UTC)

    validity = _resolved("Last year I moved to Seattle, on 7 May 2023", said_at)

    assert (validity.phrase, validity.valid_from) == ("Last year", _day(UTC, 2023, 1, 1))


def test_of_expressions_starting_together_the_longest_wins() -> None:
    said_at = datetime(*WEDNESDAY, tzinfo=UTC)

    validity = _resolved("I was vegetarian until 7 May 2023 or so", said_at)

    assert validity.phrase == "until 7 May 2023"
    assert validity.valid_to == _day(UTC, 2023, 5, 8)


def test_the_span_is_in_the_text_as_written() -> None:
    text = "Honestly, I\u2019ve been in Seattle since March 2024 and love it"

    validity = _resolved(text, datetime(*WEDNESDAY, tzinfo=UTC))

    assert (validity.start, validity.end) == (text.index("since"), text.index(" and"))
    assert text[: validity.start] + text[validity.end :] == "Honestly, I\u2019ve been in Seattle  and love it"


# --- what is not an expression ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I live in Lyon",
        "recently",
        "I recently moved to Seattle",
        "I moved to Seattle a few weeks ago",
        "I moved to Seattle a while ago",
        "I have 2 cats",
        "I have 2019 photos",
        "I ran 5000 metres",
        "I live in room 1204",
        "I may move to Lyon",
        "these 2 may help",
        "I love March",  # a month alone needs "in", "since", "until" ...
        "I love Fridays",  # a habit, not a day
        "I run every Monday",
        "I moved on February 30",
        "I moved on 31 April 2023",
        "I lived there from 2021 to 2019",
        "I move to Seattle in 2 weeks",
        "I'm from Seattle",
    ],
)
def test_no_expression(text: str) -> None:
    assert resolve(text, datetime(*WEDNESDAY, tzinfo=UTC)) is None


def test_a_naive_message_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        resolve("yesterday", datetime(*WEDNESDAY))  # the naive time is the point


# A query's time: the whole stretch it names, for search to look in (said on Wednesday 12 June 2024).
NAMED = [
    ("what did I do in May 2023?", (2023, 5, 1), (2023, 6, 1)),
    ("where did I live in 2019", (2019, 1, 1), (2020, 1, 1)),
    ("who did I see last week", (2024, 6, 3), (2024, 6, 10)),
    ("what did I eat yesterday", (2024, 6, 11), (2024, 6, 12)),
    ("what happened on 7 May 2023", (2023, 5, 7), (2023, 5, 8)),
    ("what changed since 2019", (2019, 1, 1), None),
    ("what did I believe until March", None, (2024, 4, 1)),
    ("where was I between 2019 and 2021", (2019, 1, 1), (2022, 1, 1)),
    ("which city did I live in during 2022", (2022, 1, 1), (2023, 1, 1)),
]


@pytest.mark.parametrize(("text", "start", "end"), NAMED, ids=[n[0] for n in NAMED])
@pytest.mark.parametrize("zone", ZONES)
def test_a_query_names_a_whole_stretch_of_time(
    text: str, start: tuple[int, int, int] | None, end: tuple[int, int, int] | None, zone: tzinfo
) -> None:
    named = _resolved(text, datetime(*WEDNESDAY, tzinfo=zone)).named
    assert named == (_day(zone, *start) if start else None, _day(zone, *end) if end else None)
