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

It reads English by default, and German, Spanish, Chinese and Japanese when the caller names them (it
knows the text's language: the rule that read a statement, the query's detected language). Their words
are tables in `app.lib.time_words`; what a phrase resolves to follows the same four decisions below,
so "letzten Monat", "el mes pasado", "上个月" and "先月" give what "last month" gives. A language is
read only where named, so an English text with "Hoy" or "Ayer" in it (an island, a name) reads as it
always did.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import partial

from app.lib.time_words import LANGUAGES as OTHER_LANGUAGES
from app.lib.time_words import TimeWords

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
    return _month(_most_recent_year_of(month, moment.said_on), month, moment.zone)


def _most_recent_year_of(month: int, said_on: date) -> int:
    """A month alone is the most recent one that has begun: "in March" said in February is last March."""
    return said_on.year if month <= said_on.month else said_on.year - 1


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
    return _period_from_now(step, groups["period"].lower(), moment)


def _period_from_now(step: int, period: str, moment: _Moment) -> _Period:
    """The week / month / year `step` periods after the one said in (before it when negative)."""
    said_on = moment.said_on
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
    return _counted_back(count, groups["unit"].lower(), moment)


def _counted_back(count: int, unit: str, moment: _Moment) -> _Period:
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


def _period(
    shape_text: str, moment: _Moment, parsers: tuple[tuple[re.Pattern[str], _Parser], ...] = _PARSERS
) -> _Period | None:
    """The period one matched shape names, or None when it names no real day ("February 30")."""
    for pattern, parse in parsers:
        match = pattern.fullmatch(shape_text)
        if match:
            return parse({k: v for k, v in match.groupdict().items() if v is not None}, moment)
    return None


# --- other languages: their tables (app.lib.time_words), read by the same calendar ------------------

# Accents fold to their letters ("proxima" is read as "próxima"), and full-width digits and spaces, as
# Chinese and Japanese keyboards type them, to ASCII: one character for one, so every offset is kept.
_FOLD = str.maketrans(
    "áàâäéèêëíìîïóòôöúùûüñÁÀÂÄÉÈÊËÍÌÎÏÓÒÔÖÚÙÛÜÑ\u3000" + "".join(chr(0xFF10 + n) for n in range(10)),
    "aaaaeeeeiiiioooouuuunAAAAEEEEIIIIOOOOUUUUN " + "0123456789",
)


def _folded(text: str) -> str:
    return text.translate(_FOLD)


def _key(text: str) -> str:
    """How a table's word and a matched one are compared: folded, lower case, single spaces."""
    return " ".join(_folded(text).casefold().split())


@dataclass(frozen=True, slots=True)
class _Tables:
    """A language's tables, keyed as `_key` reads a matched word."""

    months: Mapping[str, int]
    numbers: Mapping[str, int]
    units: Mapping[str, str]
    days: Mapping[str, int]
    periods: Mapping[str, tuple[int, str]]


def _number_in(tables: _Tables, text: str) -> int | None:
    """A number in digits, in words ("zwei", "dos"), or in Chinese numerals: 三, 十二, 二十, 二〇二四."""
    if text.isdigit():
        return int(text)
    key = _key(text)
    if key in tables.numbers:
        return tables.numbers[key]
    tens, ten, ones = key.partition("十")
    if ten:
        high = tables.numbers.get(tens) if tens else 1
        low = tables.numbers.get(ones) if ones else 0
        return None if high is None or low is None else high * 10 + low
    digits = [tables.numbers.get(char) for char in key]  # a year written digit by digit
    return int("".join(str(d) for d in digits)) if digits and None not in digits else None


def _year_in(tables: _Tables, text: str) -> int | None:
    year = _number_in(tables, text)
    return year if year is not None and 1900 <= year <= 2099 else None


def _month_in(tables: _Tables, groups: dict[str, str]) -> int:
    return tables.months[_key(groups["month"])] if "month" in groups else int(groups["month_number"])


def _words_date(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period | None:
    month, day = _month_in(tables, groups), _number_in(tables, groups["day"])
    if day is None:
        return None
    if "year" not in groups:
        found = _most_recent_date(month, day, moment.said_on)
        return _day(found, moment.zone) if found else None
    year = _year_in(tables, groups["year"])
    try:
        return _day(date(year, month, day), moment.zone) if year is not None else None
    except ValueError:  # "30. Februar 2023": not a day, so not an expression
        return None


def _words_month(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period | None:
    month = _month_in(tables, groups)
    if not 1 <= month <= 12:
        return None
    if "year" not in groups:
        return _month(_most_recent_year_of(month, moment.said_on), month, moment.zone)
    year = _year_in(tables, groups["year"])
    return _month(year, month, moment.zone) if year is not None else None


def _words_year(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period | None:
    year = _year_in(tables, groups["year"])
    return _year(year, moment.zone) if year is not None else None


def _words_day(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period:
    offset = tables.days[_key(groups["day_word"])]
    return _day(moment.said_on + timedelta(days=offset), moment.zone)


def _words_period(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period:
    return _period_from_now(*tables.periods[_key(groups["period_word"])], moment)


def _words_ago(tables: _Tables, groups: dict[str, str], moment: _Moment) -> _Period | None:
    count = _number_in(tables, groups["count"])
    if count is None:
        return None
    return _counted_back(count, tables.units[_key(groups["unit"])], moment)


def _alternatives(words: TimeWords, table: Iterable[str]) -> str:
    """A table's words as one pattern, longest first, each kept from where its language's guards say it
    is part of something else."""
    # Spaced: "(?<!\bla\s)manana" and "hoy(?!\s+en\s+dia\b)"; unspaced: "(?<!以)前天", "明日(?!香)".
    space, edge = (r"\s", r"\b") if words.spaced else ("", "")
    alternatives = []
    for word in sorted(table, key=len, reverse=True):
        written = _written(word)
        if word in words.lower_case:  # or capitalised where a sentence starts
            written = rf"(?-i:{written})|(?:^|(?<=[.!?\n]\s))(?-i:{written[0].upper()}{written[1:]})"
        before = "".join(rf"(?<!{edge}{_written(w)}{space})" for w in words.not_after.get(word, ()))
        after = "".join(
            rf"(?!{space and space + '+'}{_written(w)}{edge})" for w in words.not_before.get(word, ())
        )
        alternatives.append(f"{before}(?:{written}){after}")
    return rf"{edge}(?:{'|'.join(alternatives)}){edge}"


def _written(word: str) -> str:
    """A table's word as a pattern: folded, its spaces any run of white space."""
    return re.escape(_folded(word)).replace(r"\ ", r"\s+")


def _filled(template: str, pieces: Mapping[str, str]) -> str:
    """A shape with its table names ({month}, {count} ...) replaced by named groups of their words."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: f"(?P<{m[1]}>{pieces[m[1]]})", _folded(template))


@dataclass(frozen=True, slots=True)
class _Reading:
    """How a text in one language is read: its forms, how each shape parses, and how the text is folded
    before (English: as written)."""

    forms: tuple[_Form, ...]
    parsers: tuple[tuple[re.Pattern[str], _Parser], ...]
    fold: Callable[[str], str]
    reads_tense: bool  # whether a weekday's clause decides which one it is (English only)


def _reading_of(words: TimeWords) -> _Reading:
    tables = _Tables(
        months={_key(w): n for w, n in words.month_names.items()},
        numbers={_key(w): n for w, n in words.numbers.items()},
        units={_key(w): u for w, u in words.units.items()},
        days={_key(w): n for w, n in words.days.items()},
        periods={_key(w): p for w, p in words.periods.items()},
    )
    if words.spaced:
        count = rf"\b\d{{1,3}}\b|{_alternatives(words, words.numbers)}"
        day, month_number, year = r"\b\d{1,2}", r"\b\d{1,2}", _YEAR
    else:
        numerals = "".join(w for w in words.numbers if len(w) == 1)
        count = rf"(?<!\d)\d{{1,3}}|[{numerals}]{{1,3}}"
        day, month_number = rf"(?<!\d)\d{{1,2}}|[{numerals}]{{1,3}}", r"(?<!\d)\d{1,2}"
        year = rf"(?<!\d)(?:19|20)\d{{2}}(?!\d)|[{words.digits}]{{4}}"
    pieces = {
        "day": day,
        "month": _alternatives(words, words.month_names),
        "month_number": month_number,
        "year": year,
        "count": count,
        "unit": _alternatives(words, words.units),
        "day_word": _alternatives(words, words.days),
        "period_word": _alternatives(words, words.periods),
    }
    shapes: dict[str, tuple[str, ...]] = {
        "dated": (*(_filled(s, pieces) for s in words.dates), _ISO_DATE),
        "undated": tuple(_filled(s, pieces) for s in words.undated),
        "months_of_year": tuple(_filled(s, pieces) for s in words.months_of_year),
        "month_alone": (_filled(words.month_alone, pieces),),
        "year_alone": (_filled(words.year_alone, pieces),),
        "named_day": (_filled(words.named_day, pieces),),
        "named_period": (_filled(words.named_period, pieces),),
        "ago": tuple(_filled(s, pieces) for s in words.ago),
        "duration": tuple(_filled(s, pieces) for s in words.durations),
    }
    parse: dict[str, Callable[[_Tables, dict[str, str], _Moment], _Period | None]] = {
        "dated": _words_date,
        "undated": _words_date,
        "months_of_year": _words_month,
        "month_alone": _words_month,
        "year_alone": _words_year,
        "named_day": _words_day,
        "named_period": _words_period,
        "ago": _words_ago,
        "duration": _words_ago,
    }
    parsers = tuple(
        (re.compile(shape, _FLAGS), partial(parse[kind], tables)) for kind in shapes for shape in shapes[kind]
    )
    # Longer shapes first, as in English: the first alternative that fits wins.
    relative = (*shapes["named_day"], *shapes["named_period"], *shapes["ago"])
    month_or_year = (*shapes["months_of_year"], *shapes["month_alone"], *shapes["year_alone"])
    groups = {
        "any": _unnamed(*shapes["dated"], *shapes["undated"], *month_or_year, *relative),
        "dated": _unnamed(*shapes["dated"]),
        "undated": _unnamed(*shapes["undated"]),
        "months_of_year": _unnamed(*shapes["months_of_year"]),
        "month_or_year": _unnamed(*month_or_year),
        "relative": _unnamed(*relative),
        "duration": _unnamed(*shapes["duration"]) if shapes["duration"] else "(?!)",
    }
    forms = tuple(
        _form(re.sub(r"\{([a-z_]+)\}", lambda m: groups[m[1]], _folded(pattern)), sets)
        for pattern, sets in words.forms
    )
    return _Reading(forms, parsers, _folded, reads_tense=False)


def _as_written(text: str) -> str:
    return text


_WORDS = {words.language: words for words in OTHER_LANGUAGES}
LANGUAGES = ("en", *_WORDS)  # the languages whose time phrases are read (ISO 639-1)
# Each other language is built when a text in it first comes (some tens of milliseconds each, which a
# process that never reads one, such as the CLI, does not spend).
_READINGS: dict[str, _Reading] = {"en": _Reading(_FORMS, _PARSERS, _as_written, reads_tense=True)}


def _reading(language: str) -> _Reading | None:
    if language not in _READINGS and language in _WORDS:
        _READINGS[language] = _reading_of(_WORDS[language])
    return _READINGS.get(language)


# --- the entry point --------------------------------------------------------------------------------


def _validity(match: re.Match[str], sets: str, moment: _Moment, reading: _Reading) -> Validity | None:
    """What one match of a form says, or None when a shape in it names no real day (or the form is one
    that is never read: "none")."""
    if sets == "none":
        return None
    groups = match.groupdict()
    first = _period(groups["first"], moment, reading.parsers) if groups.get("first") else None
    last = _period(groups["last"], moment, reading.parsers) if groups.get("last") else None
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


def resolve(text: str, said_at: datetime, languages: Iterable[str] = ("en",)) -> Validity | None:
    """The first time expression in `text`, resolved against `said_at` in said_at's own time zone.

    `languages` are those the text is read in (ISO 639-1; those not in `LANGUAGES` are skipped). None
    when the text holds no expression this module reads ("recently" and "a few weeks ago" are too vague
    to be one). Raises ValueError for a naive `said_at`: without a zone there is no local day.
    """
    zone = said_at.tzinfo
    if zone is None or said_at.utcoffset() is None:
        raise ValueError("said_at must be timezone-aware")
    # A curly apostrophe, as phones type it, reads as a straight one; the length, so every offset, is kept.
    normalised = text.replace("\u2019", "'")
    found: list[Validity] = []
    refused: list[tuple[int, int]] = []
    for language in dict.fromkeys(languages):
        reading = _reading(language)
        if reading is None:
            continue
        read = reading.fold(normalised)
        for form in reading.forms:
            for match in form.pattern.finditer(read):
                future = reading.reads_tense and _speaks_of_future(read, *match.span())
                moment = _Moment(said_at.date(), zone, future)
                validity = _validity(match, form.sets, moment, reading)
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
    text: str, reference_time: datetime | None = None, languages: Iterable[str] = ("en",)
) -> tuple[datetime | None, datetime | None] | None:
    """The stretch of time a query names ("in May 2023", "last week", "since 2019"), its calendar words
    read at `reference_time` (default: now, UTC) in `languages`; None when it names none."""
    found = resolve(text, reference_time or datetime.now(UTC), languages)
    return found.named if found is not None else None
