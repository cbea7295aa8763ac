"""Time expressions in a user's message, resolved against the moment the message was said.

The offline writer already drops time phrases from the facts it extracts ("I moved to Seattle last
month" gives "The user lives in Seattle."), but the phrase also says *when* the fact began or stopped
holding. This module reads that part: it finds one plain English time expression and turns it into a
validity window. Calendar words are resolved in the message's own time zone, not in UTC: "yesterday"
said at 00:30 in Tokyo is the Tokyo day before, whatever the UTC date was, and "last month" said in
January is December of the year before.

It is deliberately narrow and pure (no I/O, no clock: `said_at` is the only "now"). Vague phrases
("recently", "a few weeks ago", "a while ago") are not resolved, because a guessed date would be stored
as if the user had said it. The rules, with examples, are listed in docs/offline-writer.md,
"Time expressions".

Four decisions shape every answer:

- **A plain expression marks a start.** "in 2019", "last month", "on May 7", "yesterday" set
  `valid_from` to the start of that day / week / month / year and leave `valid_to` unknown: "I moved to
  Seattle last month" means the fact holds from then on. "since X" reads the same way. "until X" sets
  only `valid_to`, to the end of X (the start of the following day / month / year). "from X to Y" and
  "between X and Y" set both.
- **A date without a year, or a month alone, is the most recent one.** "on May 7" is May 7 of the
  message's year, or of the year before when that day has not come yet; "in March" likewise.
- **A weekday alone looks back unless its clause speaks of the future.** "I moved on Friday" and "last
  Friday" are the last Friday before the message's day; "my flight is on Friday", "I'm flying Friday",
  "I will ... Friday" and "next Friday" are the next one after it. It is never the message's own day.
- **The first expression in the text wins** (the leftmost; of several starting at the same place, the
  longest: "since last year" rather than "last year"). The writer removes one span from one clause, and
  a clause rarely holds two time phrases; "most specific" would need a ranking between, say, "in 2019"
  and "last month" that the text does not give.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

_FLAGS = re.IGNORECASE


@dataclass(frozen=True, slots=True)
class Validity:
    """When a stated fact held, by the first time expression in the text, and where that phrase is."""

    valid_from: datetime | None  # when the stated fact began to hold (None: unknown)
    valid_to: datetime | None  # when it stopped holding (None: still holds / unknown)
    phrase: str  # the matched text, as written
    start: int  # its span in the text, so the writer can remove it from the fact
    end: int
    # The stretch of time the phrase names, for a search to look in: a plain expression's whole day /
    # week / month / year, a range's two ends; "since X" is open at its end, "until X" at its start.
    named: tuple[datetime | None, datetime | None] = (None, None)


@dataclass(frozen=True, slots=True)
class _Period:
    """A stretch of local time: a day, a week, a month or a year. `end` is the start of the next one."""

    start: datetime
    end: datetime


# --- words ------------------------------------------------------------------------------------------

MONTH_NAMES = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
WEEKDAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}

_MONTH = r"\b(?:" + "|".join(MONTH_NAMES) + r")\b"  # full names only: "Jan" is also a name
_WEEKDAY = r"\b(?:" + "|".join(WEEKDAY_NAMES) + r")\b"  # "Fridays" (a habit) is not a day
# Years from 1900 to 2099 only, so that "I ran 5000 metres" or "room 1204" is never a year.
_YEAR = r"\b(?:19|20)\d{2}(?!\d)"
_DAY_NUMBER = r"\b\d{1,2}(?:st|nd|rd|th)?\b"  # checked against the month when the date is built
_NUMBER = r"\b(?:\d{1,3}|" + "|".join(_NUMBER_WORDS) + r")\b"


# --- shapes: the time expressions themselves, without "on" / "in" / "since" ... ---------------------
# Each shape is written once, with named groups for the parser; the search patterns reuse it with the
# names taken out (`_unnamed`), because a range ("from X to Y") holds two shapes and Python's re does
# not allow one group name twice.

_ISO_DATE = r"\b(?P<year>(?:19|20)\d{2})-(?P<month_number>\d{2})-(?P<day>\d{2})(?!\d)"
_DAY_MONTH = (
    rf"(?:\bthe\s+)?(?P<day>{_DAY_NUMBER})\s+(?:of\s+)?(?P<month>{_MONTH})"  # "7 May", "the 7th of May"
)
_MONTH_DAY = rf"(?P<month>{_MONTH})\s+(?P<day>{_DAY_NUMBER})"  # "May 7", "May 7th"
_WITH_YEAR = rf",?\s+(?P<year>{_YEAR})"
_MONTH_YEAR = rf"(?P<month>{_MONTH})\s+(?P<year>{_YEAR})"
_MONTH_ALONE = rf"(?P<month>{_MONTH})"
_YEAR_ALONE = rf"(?P<year>{_YEAR})"
_RELATIVE_DAY = (
    r"\b(?P<relative_day>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow"
    r"|yesterday|today|tomorrow)\b"
)
_RELATIVE_PERIOD = r"\b(?P<which>last|this|next)\s+(?P<period>week|month|year)\b"
_AGO = rf"(?P<count>{_NUMBER})\s+(?P<unit>day|week|month|year)s?\s+ago\b"
_WEEKDAY_REF = rf"(?:\b(?P<modifier>next|last|this\s+past|this)\s+)?(?P<weekday>{_WEEKDAY})"

_DATE_WITH_YEAR = (_ISO_DATE, _DAY_MONTH + _WITH_YEAR, _MONTH_DAY + _WITH_YEAR)
_DATE_WITHOUT_YEAR = (_DAY_MONTH, _MONTH_DAY)
# Longer shapes first: the first alternative that fits wins, and "May 7, 2023" must not stop at "May".
_ANY_SHAPE = (
    *_DATE_WITH_YEAR,
    *_DATE_WITHOUT_YEAR,
    _MONTH_YEAR,
    _MONTH_ALONE,
    _YEAR_ALONE,
    _RELATIVE_DAY,
    _RELATIVE_PERIOD,
    _AGO,
    _WEEKDAY_REF,
)


def _unnamed(*shapes: str) -> str:
    """The shapes as one non-capturing alternation, so a search pattern may hold several."""
    return "(?:" + "|".join(re.sub(r"\?P<\w+>", "?:", shape) for shape in shapes) + ")"


# --- forms: how a shape is introduced, and what it sets ---------------------------------------------


@dataclass(frozen=True, slots=True)
class _Form:
    """A search pattern with groups "first" and/or "last" (each one shape), and what the match sets."""

    pattern: re.Pattern[str]
    # "from" (valid_from), "since" (valid_from, and open-ended), "to" (valid_to), "both" (a range) or
    # "during" (valid_from and valid_to: the one period's start and end)
    sets: str


def _form(pattern: str, sets: str) -> _Form:
    return _Form(re.compile(pattern, _FLAGS), sets)


_ANY = _unnamed(*_ANY_SHAPE)
_FORMS = (
    # Ranges and connectives take any shape, a bare month or year included ("since 2019", "until March").
    _form(rf"\bfrom\s+(?P<first>{_ANY})\s+(?:to|until|till|through)\s+(?P<last>{_ANY})", "both"),
    _form(rf"\bbetween\s+(?P<first>{_ANY})\s+and\s+(?P<last>{_ANY})", "both"),
    _form(rf"\bsince\s+(?P<first>{_ANY})", "since"),
    _form(rf"\b(?:during|throughout)\s+(?P<first>{_ANY})", "during"),
    _form(rf"\b(?:up\s+)?(?:until|till)\s+(?P<last>{_ANY})", "to"),
    # Plain expressions. A bare number is never a year ("I have 2019 photos"), a bare month never a month
    # ("may" is also a verb), and a day without a year needs "on" ("these 2 may help" is not 2 May).
    _form(rf"(?:\bon\s+)?(?P<first>{_unnamed(*_DATE_WITH_YEAR)})", "from"),
    _form(rf"\bon\s+(?P<first>{_unnamed(*_DATE_WITHOUT_YEAR)})", "from"),
    _form(rf"\bin\s+(?P<first>{_unnamed(_MONTH_YEAR, _MONTH_ALONE, _YEAR_ALONE)})", "from"),
    _form(rf"(?P<first>{_unnamed(_MONTH_YEAR)})", "from"),
    _form(rf"(?P<first>{_unnamed(_RELATIVE_DAY, _RELATIVE_PERIOD, _AGO)})", "from"),
    # "every Monday" is a habit, not a day.
    _form(rf"(?<!\bevery\s)(?:\bon\s+)?(?P<first>{_unnamed(_WEEKDAY_REF)})", "from"),
)


# --- calendar arithmetic, all on local dates --------------------------------------------------------


def _start_of(day: date, zone: tzinfo) -> datetime:
    return datetime.combine(day, time(), tzinfo=zone)


def _day(day: date, zone: tzinfo) -> _Period:
    return _Period(_start_of(day, zone), _start_of(day + timedelta(days=1), zone))


def _week(monday: date, zone: tzinfo) -> _Period:
    return _Period(_start_of(monday, zone), _start_of(monday + timedelta(days=7), zone))


def _month_after(year: int, month: int, months: int) -> tuple[int, int]:
    """(year, month) `months` months after the given one (before it when negative)."""
    index = year * 12 + (month - 1) + months
    return index // 12, index % 12 + 1


def _month(year: int, month: int, zone: tzinfo) -> _Period:
    following = date(*_month_after(year, month, 1), 1)
    return _Period(_start_of(date(year, month, 1), zone), _start_of(following, zone))


def _year(year: int, zone: tzinfo) -> _Period:
    return _Period(_start_of(date(year, 1, 1), zone), _start_of(date(year + 1, 1, 1), zone))


def _months_back(day: date, months: int) -> date:
    """The same day of the month `months` months earlier; March 31 minus one month is the last of Feb."""
    year, month = _month_after(day.year, day.month, -months)
    last_day = (date(*_month_after(year, month, 1), 1) - timedelta(days=1)).day
    return date(year, month, min(day.day, last_day))


def _most_recent_date(month: int, day: int, said_on: date) -> date | None:
    """The latest month/day on or before the day said: this year's, or the year before's.

    Only February 29 needs more than one year back; None for a day no month has ("February 30").
    """
    for year in range(said_on.year, said_on.year - 9, -1):
        try:
            candidate = date(year, month, day)
        except ValueError:
            continue
        if candidate <= said_on:
            return candidate
    return None


def _weekday_date(weekday: int, said_on: date, future: bool) -> date:
    """The next such weekday after the day said, or the last one before it; never the day itself."""
    if future:
        return said_on + timedelta(days=(weekday - said_on.weekday()) % 7 or 7)
    return said_on - timedelta(days=(said_on.weekday() - weekday) % 7 or 7)


# --- tense, for weekdays ----------------------------------------------------------------------------
# "Friday" alone names two days, last Friday and next Friday. The clause around it decides: a future
# marker means the next one; otherwise it is the most recent one, as with a date without a year. Past
# is the default because what a user tells a memory store is mostly what happened.

_CLAUSE_BREAK = re.compile(r"[,;.!?\n]|\b(?:and|but|so|because)\b", _FLAGS)
_FUTURE_MARKER = re.compile(
    r"\b(?:will|won't|shall|gonna|going\s+to|about\s+to)\b|'ll\b"
    # Present "be" with an -ing verb or right before the day: "I'm flying Friday", "my flight is on Friday".
    rf"|(?:\b(?:am|is|are|im)|'(?:m|re|s))\s+(?:\w+ing\b|(?:on\s+)?{_WEEKDAY})",
    _FLAGS,
)


def _clause_around(text: str, start: int, end: int) -> str:
    """The clause holding text[start:end]: out to the nearest comma, full stop or "and"/"but"/"so"."""
    breaks_before = list(_CLAUSE_BREAK.finditer(text, 0, start))
    left = breaks_before[-1].end() if breaks_before else 0
    break_after = _CLAUSE_BREAK.search(text, end)
    right = break_after.start() if break_after else len(text)
    return text[left:right]


def _speaks_of_future(text: str, start: int, end: int) -> bool:
    return _FUTURE_MARKER.search(_clause_around(text, start, end)) is not None


# --- parsing one shape into a period ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Moment:
    """What a shape is resolved against: the message's local day, its zone, and the clause's tense."""

    said_on: date
    zone: tzinfo
    future: bool


def _month_number(name: str) -> int:
    return MONTH_NAMES.index(name.lower()) + 1


def _day_number(text: str) -> int:
    return int(text.rstrip("stndrhSTNDRH"))


def _date_period(groups: dict[str, str], moment: _Moment) -> _Period | None:
    month = int(groups["month_number"]) if "month_number" in groups else _month_number(groups["month"])
    day = _day_number(groups["day"])
    if "year" not in groups:
        found = _most_recent_date(month, day, moment.said_on)
        return _day(found, moment.zone) if found else None
    try:
        return _day(date(int(groups["year"]), month, day), moment.zone)
    except ValueError:  # "31 April 2023": not a day, so not an expression
        return None


def _month_period(groups: dict[str, str], moment: _Moment) -> _Period:
    month = _month_number(groups["month"])
    if "year" in groups:
        return _month(int(groups["year"]), month, moment.zone)
    # A month alone is the most recent one that has begun: "in March" said in February is last March.
    year = moment.said_on.year if month <= moment.said_on.month else moment.said_on.year - 1
    return _month(year, month, moment.zone)


def _year_period(groups: dict[str, str], moment: _Moment) -> _Period:
    return _year(int(groups["year"]), moment.zone)


def _relative_day_period(groups: dict[str, str], moment: _Moment) -> _Period:
    offsets = {
        "the day before yesterday": -2,
        "yesterday": -1,
        "today": 0,
        "tomorrow": 1,
        "the day after tomorrow": 2,
    }
    offset = offsets[" ".join(groups["relative_day"].lower().split())]
    return _day(moment.said_on + timedelta(days=offset), moment.zone)


def _relative_period(groups: dict[str, str], moment: _Moment) -> _Period:
    step = {"last": -1, "this": 0, "next": 1}[groups["which"].lower()]
    said_on = moment.said_on
    period = groups["period"].lower()
    if period == "week":  # weeks start on Monday
        monday = said_on - timedelta(days=said_on.weekday())
        return _week(monday + timedelta(weeks=step), moment.zone)
    if period == "month":
        return _month(*_month_after(said_on.year, said_on.month, step), moment.zone)
    return _year(said_on.year + step, moment.zone)


def _ago_period(groups: dict[str, str], moment: _Moment) -> _Period:
    """A day counted back from the day said: "2 weeks ago" is 14 days back, "a month ago" the same date."""
    count_word = groups["count"].lower()
    count = int(count_word) if count_word.isdigit() else _NUMBER_WORDS[count_word]
    unit = groups["unit"].lower()
    if unit in ("day", "week"):
        return _day(moment.said_on - timedelta(days=count * (7 if unit == "week" else 1)), moment.zone)
    months = count * (12 if unit == "year" else 1)
    return _day(_months_back(moment.said_on, months), moment.zone)


def _weekday_period(groups: dict[str, str], moment: _Moment) -> _Period:
    modifier = " ".join(groups.get("modifier", "").lower().split())
    if modifier == "next":
        future = True
    elif modifier in ("last", "this past"):
        future = False
    else:  # "Friday", "on Friday", "this Friday": the clause's tense decides
        future = moment.future
    weekday = WEEKDAY_NAMES.index(groups["weekday"].lower())
    return _day(_weekday_date(weekday, moment.said_on, future), moment.zone)


_Parser = Callable[[dict[str, str], _Moment], _Period | None]
_PARSERS: tuple[tuple[re.Pattern[str], _Parser], ...] = tuple(
    (re.compile(shape, _FLAGS), parse)
    for shape, parse in (
        (_ISO_DATE, _date_period),
        (_DAY_MONTH + f"(?:{_WITH_YEAR})?", _date_period),
        (_MONTH_DAY + f"(?:{_WITH_YEAR})?", _date_period),
        (_MONTH_YEAR, _month_period),
        (_MONTH_ALONE, _month_period),
        (_YEAR_ALONE, _year_period),
        (_RELATIVE_DAY, _relative_day_period),
        (_RELATIVE_PERIOD, _relative_period),
        (_AGO, _ago_period),
        (_WEEKDAY_REF, _weekday_period),
    )
)


def _period(shape_text: str, moment: _Moment) -> _Period | None:
    """The period one matched shape names, or None when it names no real day ("February 30")."""
    for pattern, parse in _PARSERS:
        match = pattern.fullmatch(shape_text)
        if match:
            return parse({k: v for k, v in match.groupdict().items() if v is not None}, moment)
    return None


# --- the entry point --------------------------------------------------------------------------------


def _validity(match: re.Match[str], sets: str, moment: _Moment) -> Validity | None:
    """What one match of a form says, or None when a shape in it names no real day."""
    groups = match.groupdict()
    first = _period(groups["first"], moment) if groups.get("first") else None
    last = _period(groups["last"], moment) if groups.get("last") else None
    named: tuple[datetime | None, datetime | None]
    if sets == "both":
        if first is None or last is None or first.start >= last.end:
            return None  # "from 2021 to 2019" states no stretch of time
        valid_from, valid_to, named = first.start, last.end, (first.start, last.end)
    elif sets == "during":
        if first is None:
            return None
        valid_from, valid_to, named = first.start, first.end, (first.start, first.end)
    elif sets in ("from", "since"):
        if first is None:
            return None
        valid_from, valid_to = first.start, None
        named = (first.start, None if sets == "since" else first.end)
    else:
        if last is None:
            return None
        valid_from, valid_to, named = None, last.end, (None, last.end)
    return Validity(valid_from, valid_to, match.group(), match.start(), match.end(), named)


def resolve(text: str, said_at: datetime) -> Validity | None:
    """The first time expression in `text`, resolved against `said_at` in said_at's own time zone.

    None when the text holds no expression this module reads ("recently" and "a few weeks ago" are too
    vague to be one). Raises ValueError for a naive `said_at`: without a zone there is no local day.
    """
    zone = said_at.tzinfo
    if zone is None or said_at.utcoffset() is None:
        raise ValueError("said_at must be timezone-aware")
    # A curly apostrophe, as phones type it, reads as a straight one; the length, so every offset, is kept.
    normalised = text.replace("\u2019", "'")
    found: list[Validity] = []
    refused: list[tuple[int, int]] = []
    for form in _FORMS:
        for match in form.pattern.finditer(normalised):
            moment = _Moment(said_at.date(), zone, _speaks_of_future(normalised, *match.span()))
            validity = _validity(match, form.sets, moment)
            if validity is not None:
                found.append(validity)
            else:
                refused.append(match.span())
    # A phrase that names no real day ("on 31 April 2023") is not read in part either: "April 2023" alone
    # would be a month the user did not mean, and removing it would leave "on 31" in the fact.
    found = [v for v in found if not any(start < v.end and v.start < end for start, end in refused)]
    if not found:
        return None
    first = min(found, key=lambda v: (v.start, -(v.end - v.start)))
    return Validity(
        first.valid_from, first.valid_to, text[first.start : first.end], first.start, first.end, first.named
    )


def named_time(
    text: str, reference_time: datetime | None = None
) -> tuple[datetime | None, datetime | None] | None:
    """The stretch of time a query names ("in May 2023", "last week", "since 2019"), its calendar words
    read at `reference_time` (default: now, UTC); None when it names none."""
    found = resolve(text, reference_time or datetime.now(UTC))
    return found.named if found is not None else None
