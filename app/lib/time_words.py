"""How German, Spanish, Chinese and Japanese say a time: the words of each, in tables, and the shapes
of its time phrases over them, for `time_expressions` to read (English is written out there).

Only data lives here; `time_expressions` builds the patterns and resolves what they find, the same way
whatever the language. A shape is a short pattern in which a name in braces stands for a table:

    {month}         a month's name (`month_names`)      {month_number}  a month as a number: 3
    {day}           a day of the month: 7, 七             {year}          1900 to 2099: 2024, 二〇二四
    {count}         a number, in digits or words           {unit}          day, week, month, year (`units`)
    {day_word}      yesterday, today, tomorrow (`days`)    {period_word}   last week, next year (`periods`)

and a form (what sets `valid_from` / `valid_to`, as in English: "since", "until", a range ...) names
the shapes it takes: {any}; {dated} (a date with its year); {undated} (a day and month without one);
{months_of_year} (a month and its year); {month_or_year} (that, a month alone or a year alone);
{relative} (a day word, a period word, "N units ago"); {duration} ("seit drei Jahren").

Words are matched whatever their case and, in German and Spanish, with or without their accents
("proxima semana" is read as "próxima semana"), unless a table says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

_Value = TypeVar("_Value")

# A form's "sets": what its match gives the fact (as in English), or "none" for a phrase that is not
# read at all, not even in part ("2019年以前" is before 2019, not 2019).


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeWords:
    """How one language says a time: its words, and the shapes of its time phrases over them."""

    language: str  # ISO 639-1
    spaced: bool  # written with spaces between words, so words are matched whole
    month_names: Mapping[str, int]
    numbers: Mapping[str, int]  # number words ("zwei", "dos"); in Chinese and Japanese, the numerals
    digits: str = ""  # numerals a year may be written in, digit by digit ("二〇二四年")
    units: Mapping[str, str]  # unit word -> "day", "week", "month" or "year"
    days: Mapping[str, int]  # yesterday, today, tomorrow ...: days after the day said
    periods: Mapping[str, tuple[int, str]]  # last week, this month, next year ...: (step, unit)
    # Where a word is also part of something else: the words that must not stand right before it ("por
    # la mañana" is the morning) or right after it ("hoy en día" is nowadays, "上周末" last weekend).
    not_after: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    not_before: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Words read in lower case only, or capitalised at the start of a sentence: German "Morgen" is the
    # morning, "morgen" tomorrow.
    lower_case: tuple[str, ...] = ()
    dates: tuple[str, ...]  # a day, month and year (an ISO date is read in every language)
    undated: tuple[str, ...]  # a day and month without a year
    months_of_year: tuple[str, ...]
    month_alone: str
    year_alone: str
    named_day: str = "{day_word}"
    named_period: str = "{period_word}"
    ago: tuple[str, ...]
    durations: tuple[str, ...] = ()  # read like "ago", only where a form names {duration}
    forms: tuple[tuple[str, str], ...]  # (pattern, sets), as English's


# --- German -----------------------------------------------------------------------------------------

# "letzte Woche", "letzten Monat", "letztes Jahr", "seit letzter Woche", "Ende letzten Jahres": each
# word that says which, with each of its endings, before each word for the period.
_GERMAN_WHICH = {
    "vorletzt": -2,
    "letzt": -1,
    "vergangen": -1,
    "vorig": -1,
    "dies": 0,
    "nächst": 1,
    "kommend": 1,
    "übernächst": 2,
}
_GERMAN_PERIODS = {"woche": "week", "monat": "month", "monats": "month", "jahr": "year", "jahres": "year"}

GERMAN = TimeWords(
    language="de",
    spaced=True,
    month_names={
        "januar": 1,
        "jänner": 1,
        "februar": 2,
        "feber": 2,
        "märz": 3,
        "april": 4,
        "mai": 5,
        "juni": 6,
        "juli": 7,
        "august": 8,
        "september": 9,
        "oktober": 10,
        "november": 11,
        "dezember": 12,
    },
    numbers={
        "ein": 1,
        "eine": 1,
        "einem": 1,
        "einen": 1,
        "einer": 1,
        "eins": 1,
        "zwei": 2,
        "drei": 3,
        "vier": 4,
        "fünf": 5,
        "sechs": 6,
        "sieben": 7,
        "acht": 8,
        "neun": 9,
        "zehn": 10,
        "elf": 11,
        "zwölf": 12,
    },
    units={
        "tag": "day",
        "tage": "day",
        "tagen": "day",
        "woche": "week",
        "wochen": "week",
        "monat": "month",
        "monate": "month",
        "monaten": "month",
        "jahr": "year",
        "jahre": "year",
        "jahren": "year",
    },
    days={"vorgestern": -2, "gestern": -1, "heute": 0, "morgen": 1, "übermorgen": 2},
    periods={
        **{
            f"{which}{ending} {word}": (step, unit)
            for which, step in _GERMAN_WHICH.items()
            for ending in ("e", "en", "er", "em", "es")
            for word, unit in _GERMAN_PERIODS.items()
        },
        "heuer": (0, "year"),
    },
    lower_case=("morgen",),
    dates=(r"{day}(?:\.\s*|\s+){month}\s+{year}", r"{day}\.{month_number}\.{year}"),  # 3. März 2024, 3.3.2024
    undated=(r"{day}(?:\.\s*|\s+){month}",),
    months_of_year=(r"{month}\s+{year}",),
    month_alone="{month}",
    year_alone="{year}",
    ago=(r"\bvor\s+{count}\s+{unit}",),
    durations=(r"{count}\s+{unit}",),
    forms=(
        (r"\b(?:von|vom)\s+(?P<first>{any})\s+bis\s+(?:zum\s+|zur\s+)?(?P<last>{any})", "both"),
        (r"\bzwischen\s+(?:dem\s+)?(?P<first>{any})\s+und\s+(?:dem\s+)?(?P<last>{any})", "both"),
        # "seit drei Jahren" is for three years: since three years ago.
        (r"\bseit\s+(?P<first>{duration})", "since"),
        (r"\b(?:seit|ab)\s+(?:dem\s+)?(?P<first>{any})", "since"),
        (r"\bwährend\s+(?:des\s+|der\s+)?(?P<first>{any})", "during"),
        (r"\bbis\s+(?:zum\s+|zur\s+)?(?P<last>{any})", "to"),
        # A month or a year alone needs "im" / "in", and a day without a year "am", as in English.
        (r"(?:\bam\s+)?(?P<first>{dated})", "from"),
        (r"\bam\s+(?P<first>{undated})", "from"),
        (r"\bi[mn]\s+(?:jahre?\s+)?(?P<first>{month_or_year})", "from"),
        (r"(?P<first>{months_of_year})", "from"),
        (r"(?P<first>{relative})", "from"),
    ),
)


# --- Spanish ----------------------------------------------------------------------------------------

SPANISH = TimeWords(
    language="es",
    spaced=True,
    month_names={
        "enero": 1,
        "febrero": 2,
        "marzo": 3,
        "abril": 4,
        "mayo": 5,
        "junio": 6,
        "julio": 7,
        "agosto": 8,
        "septiembre": 9,
        "setiembre": 9,
        "octubre": 10,
        "noviembre": 11,
        "diciembre": 12,
    },
    numbers={
        "un": 1,
        "uno": 1,
        "una": 1,
        "dos": 2,
        "tres": 3,
        "cuatro": 4,
        "cinco": 5,
        "seis": 6,
        "siete": 7,
        "ocho": 8,
        "nueve": 9,
        "diez": 10,
        "once": 11,
        "doce": 12,
    },
    units={
        "día": "day",
        "días": "day",
        "semana": "week",
        "semanas": "week",
        "mes": "month",
        "meses": "month",
        "año": "year",
        "años": "year",
    },
    days={
        "antes de ayer": -2,
        "anteayer": -2,
        "antier": -2,
        "ayer": -1,
        "hoy": 0,
        "mañana": 1,
        "pasado mañana": 2,
    },
    periods={
        "semana pasada": (-1, "week"),
        "esta semana": (0, "week"),
        "próxima semana": (1, "week"),
        "semana próxima": (1, "week"),
        "semana que viene": (1, "week"),
        "mes pasado": (-1, "month"),
        "este mes": (0, "month"),
        "próximo mes": (1, "month"),
        "mes próximo": (1, "month"),
        "mes que viene": (1, "month"),
        "año antepasado": (-2, "year"),
        "año pasado": (-1, "year"),
        "este año": (0, "year"),
        "próximo año": (1, "year"),
        "año próximo": (1, "year"),
        "año que viene": (1, "year"),
    },
    not_after={
        # "por la mañana", "esta mañana", "cada mañana": the morning, not tomorrow.
        "mañana": ("la", "una", "esta", "esa", "cada", "toda", "media", "misma", "buena", "aquella", "otra"),
    },
    not_before={"hoy": ("en día", "día")},  # "hoy en día", "hoy día": nowadays
    dates=(r"{day}(?:º|°)?\s+de\s+{month}\s+del?\s+{year}", r"{day}/{month_number}/{year}"),
    undated=(r"{day}(?:º|°)?\s+de\s+{month}",),
    months_of_year=(r"{month}\s+(?:del?\s+)?{year}",),
    month_alone="{month}",
    year_alone="{year}",
    named_period=r"(?:\b(?:el|la|del|al)\s+)?{period_word}",
    ago=(r"\bhace\s+{count}\s+{unit}", r"{count}\s+{unit}\s+atrás\b"),
    forms=(
        (r"\bdesde\s+(?:el\s+)?(?P<first>{any})\s+hasta\s+(?:el\s+)?(?P<last>{any})", "both"),
        (r"\bdel?\s+(?P<first>{any})\s+al?\s+(?P<last>{any})", "both"),
        (r"\bentre\s+(?:el\s+)?(?P<first>{any})\s+y\s+(?:el\s+)?(?P<last>{any})", "both"),
        # "desde hace tres años": since three years ago.
        (r"\b(?:desde|a\s+partir\s+del?)\s+(?:el\s+)?(?P<first>{any})", "since"),
        (r"\bdurante\s+(?:el\s+)?(?P<first>{any})", "during"),
        (r"\bhasta\s+(?:el\s+)?(?P<last>{any})", "to"),
        # A month or a year alone needs "en", and a day without a year "el", as in English.
        (r"(?:\bel\s+)?(?P<first>{dated})", "from"),
        (r"\bel\s+(?P<first>{undated})", "from"),
        (r"\ben\s+(?:el\s+)?(?:año\s+)?(?P<first>{month_or_year})", "from"),
        (r"(?P<first>{months_of_year})", "from"),
        (r"(?P<first>{relative})", "from"),
    ),
)


# --- Chinese and Japanese ---------------------------------------------------------------------------
# Written without spaces: a word is found inside the text, so the tables say where one is part of
# another word. A month, a year and a date need no preposition ("我2019年搬到上海", "3月に").

_CJK_NUMBERS = {
    "〇": 0,  # noqa: RUF001  (the numeral zero, as in 二〇二四)
    "零": 0,
    "一": 1,
    "二": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
    "十": 10,  # and "十二" is 12, "二十" 20
}
_CJK_DIGITS = "〇零一二三四五六七八九"
_CJK_MONTHS = {
    "一月": 1,
    "二月": 2,
    "三月": 3,
    "四月": 4,
    "五月": 5,
    "六月": 6,
    "七月": 7,
    "八月": 8,
    "九月": 9,
    "十月": 10,
    "十一月": 11,
    "十二月": 12,
}
# Names written with 明日 / 今日 ("明日香", Asuka; "今日子", Kyōko) and words with 年 after 今年 / 去年
# ("如今年轻人": young people nowadays).
_NAMES_AFTER_DAY = ("香", "美", "菜", "葉", "子")
_WORDS_AFTER_YEAR = ("轻", "纪", "龄", "级", "輕", "紀", "齡", "級")
# 上周一 is last Monday, 上周末 last weekend: a day of a week, not the week.
_DAYS_OF_WEEK = ("一", "二", "三", "四", "五", "六", "日", "天", "末")

# Chinese is read in both scripts: each simplified character below also as its traditional form.
_TRADITIONAL = str.maketrans("从为来后间开号个两这周礼轻纪龄级", "從為來後間開號個兩這週禮輕紀齡級")


def _both_scripts(words: Mapping[str, _Value]) -> dict[str, _Value]:
    return {**words, **{word.translate(_TRADITIONAL): value for word, value in words.items()}}


def _both_scripts_in(pattern: str) -> str:
    """A pattern that reads each of its simplified characters in either script (patterns here write
    alternatives as (?:a|b), never as character classes, so a character becomes a group safely)."""
    return "".join(
        f"(?:{char}|{char.translate(_TRADITIONAL)})" if char.translate(_TRADITIONAL) != char else char
        for char in pattern
    )


_CHINESE_WEEKS = {
    "上上周": -2,
    "上周": -1,
    "上星期": -1,
    "上个星期": -1,
    "上礼拜": -1,
    "上个礼拜": -1,
    "这周": 0,
    "本周": 0,
    "这星期": 0,
    "这个星期": 0,
    "这礼拜": 0,
    "这个礼拜": 0,
    "下周": 1,
    "下星期": 1,
    "下个星期": 1,
    "下礼拜": 1,
    "下个礼拜": 1,
    "下下周": 2,
}
_CHINESE_YEARS = {"前年": -2, "去年": -1, "今年": 0, "明年": 1, "后年": 2}

CHINESE = TimeWords(
    language="zh",
    spaced=False,
    month_names=_CJK_MONTHS,
    numbers={**_CJK_NUMBERS, "两": 2, "兩": 2},  # 两周前: two weeks ago
    digits=_CJK_DIGITS,
    units=_both_scripts(
        {
            "天": "day",
            "日": "day",
            "周": "week",
            "星期": "week",
            "个星期": "week",
            "礼拜": "week",
            "个礼拜": "week",
            "个月": "month",  # 三个月 is three months; 三月 is March
            "年": "year",
        }
    ),
    days=_both_scripts(
        {"前天": -2, "昨天": -1, "昨日": -1, "今天": 0, "今日": 0, "明天": 1, "明日": 1, "后天": 2}
    ),
    periods=_both_scripts(
        {
            **{word: (step, "week") for word, step in _CHINESE_WEEKS.items()},
            "上上个月": (-2, "month"),
            "上个月": (-1, "month"),
            "上月": (-1, "month"),
            "这个月": (0, "month"),
            "本月": (0, "month"),
            "下个月": (1, "month"),
            "下月": (1, "month"),
            "下下个月": (2, "month"),
            **{word: (step, "year") for word, step in _CHINESE_YEARS.items()},
        }
    ),
    not_after=_both_scripts(
        {
            # 以前天气 (the weather, formerly), 然后天 (then the sky ...): not the day before yesterday.
            "前天": ("以", "之", "然", "先", "最"),
            "后天": ("以", "之", "然", "先", "最"),
            "后年": ("以", "之", "然", "最"),
            "今天": ("如",),  # 如今天气: nowadays the weather
            "今年": ("如",),
        }
    ),
    not_before=_both_scripts(
        {
            "明日": _NAMES_AFTER_DAY,
            "今日": _NAMES_AFTER_DAY,
            **dict.fromkeys(_CHINESE_YEARS, _WORDS_AFTER_YEAR),
            **dict.fromkeys(_CHINESE_WEEKS, _DAYS_OF_WEEK),
        }
    ),
    dates=(_both_scripts_in(r"{year}年(?:{month}|{month_number}月){day}(?:日|号)"),),
    undated=(_both_scripts_in(r"(?:{month}|{month_number}月){day}(?:日|号)"),),
    months_of_year=(r"{year}年(?:{month}|{month_number}月)",),
    month_alone=r"(?:{month}|{month_number}月)",
    year_alone=r"{year}年(?!代)",  # 1990年代 is the 1990s
    ago=(r"{count}{unit}(?:以前|之前|前)",),
    forms=tuple(
        (_both_scripts_in(pattern), sets)
        for pattern, sets in (
            (r"(?:从|自)(?P<first>{any})(?:到|至)(?P<last>{any})(?:为止)?", "both"),
            (r"(?P<first>{any})(?:到|至)(?P<last>{any})(?:为止)?", "both"),
            (r"(?:自从|从|自)(?P<first>{any})(?:以来|以后|之后|开始|起)?", "since"),
            (r"(?P<first>{any})以来", "since"),
            (r"(?:直到|一直到|到)(?P<last>{any})为止", "to"),
            (r"直到(?P<last>{any})", "to"),
            (r"在?(?P<first>{any})期间", "during"),
            # "2019年以前" is before 2019, "去年以后" after last year: neither says when a fact held.
            (r"(?<!从)(?<!自)(?P<first>{any})(?:以前|之前|以后|之后)", "none"),
            (r"在?(?P<first>{any})", "from"),
        )
    ),
)

JAPANESE = TimeWords(
    language="ja",
    spaced=False,
    month_names=_CJK_MONTHS,
    numbers=_CJK_NUMBERS,
    digits=_CJK_DIGITS,
    units={
        "日": "day",
        "週間": "week",
        "週": "week",
        "ヶ月": "month",
        "ヵ月": "month",
        "か月": "month",
        "カ月": "month",
        "ケ月": "month",
        "箇月": "month",
        "年": "year",
    },
    days={"一昨日": -2, "昨日": -1, "今日": 0, "本日": 0, "明日": 1, "明後日": 2},
    periods={
        "先々週": (-2, "week"),
        "先週": (-1, "week"),
        "今週": (0, "week"),
        "来週": (1, "week"),
        "再来週": (2, "week"),
        "先々月": (-2, "month"),
        "先月": (-1, "month"),
        "今月": (0, "month"),
        "来月": (1, "month"),
        "再来月": (2, "month"),
        "一昨年": (-2, "year"),
        "去年": (-1, "year"),
        "昨年": (-1, "year"),
        "今年": (0, "year"),
        "来年": (1, "year"),
        "再来年": (2, "year"),
    },
    not_before={
        "明日": _NAMES_AFTER_DAY,
        "今日": _NAMES_AFTER_DAY,
        **dict.fromkeys(("先々週", "先週", "今週", "来週", "再来週"), ("末",)),  # 週末: the weekend
    },
    dates=(r"{year}年(?:{month}|{month_number}月){day}日",),
    undated=(r"(?:{month}|{month_number}月){day}日",),
    months_of_year=(r"{year}年(?:{month}|{month_number}月)",),
    month_alone=r"(?:{month}|{month_number}月)",
    year_alone=r"{year}年(?!代)",
    ago=(r"{count}{unit}(?:以)?前",),
    forms=(
        (r"(?P<first>{any})から(?P<last>{any})(?:まで)?", "both"),
        ("(?P<first>{any})(?:\u301c|\uff5e|~)(?P<last>{any})", "both"),  # 2019年〜2021年
        (r"(?P<first>{any})(?:から|以来|以降|以後)", "since"),
        # "3月までに" is by March (a deadline) and "2019年以前" before 2019: neither is read.
        (r"(?P<first>{any})(?:までに|以前|より前)", "none"),
        (r"(?P<last>{any})まで", "to"),
        (r"(?P<first>{any})の間", "during"),
        (r"(?P<first>{any})(?:には|に|は)?", "from"),  # the particle is the phrase's, as "in" is in English
    ),
)

LANGUAGES = (GERMAN, SPANISH, CHINESE, JAPANESE)
