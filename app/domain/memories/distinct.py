"""Whether two close statements are two facts, whatever their vectors say.

A sentence embedder places minimal pairs next to each other: all-MiniLM-L6-v2 gives "... a support
group on 7 May 2023." and "... on 8 May 2023." a cosine of 0.981, "10 mg" / "20 mg of lisinopril"
0.971, "on Tuesday" / "on Thursday" 0.969 — above the near-duplicate threshold, so the newer of two
true facts would be dropped as a repeat. Before an ADD is taken for a repeat, this asks whether the
two texts differ in a detail that makes them different facts: a number (in digits or words), a unit
of one, a time of day, a weekday, a month, a day named relative to today, a proper name, a family
member or gender, or a negation (`polarity`). Any such difference makes them distinct; the rules are
small, explicit and English (other scripts keep the number and name-free rules that apply to them).
"""

from __future__ import annotations

import re

from app.domain.memories.polarity import opposite_polarity
from app.lib.time_expressions import MONTH_NAMES, WEEKDAY_NAMES


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NUMBER_WORDS = {
    word: str(value)
    for value, words in enumerate(
        (
            ("zero",),
            ("one", "first", "once"),
            ("two", "second", "twice"),
            ("three", "third", "thrice"),
            ("four", "fourth"),
            ("five", "fifth"),
            ("six", "sixth"),
            ("seven", "seventh"),
            ("eight", "eighth"),
            ("nine", "ninth"),
            ("ten", "tenth"),
            ("eleven", "eleventh"),
            ("twelve", "twelfth", "dozen"),
            ("thirteen", "thirteenth"),
            ("fourteen", "fourteenth"),
            ("fifteen", "fifteenth"),
            ("sixteen", "sixteenth"),
            ("seventeen", "seventeenth"),
            ("eighteen", "eighteenth"),
            ("nineteen", "nineteenth"),
            ("twenty", "twentieth"),
        )
    )
    for word in words
} | {
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "half": "0.5",
}
_UNITS = {
    **dict.fromkeys(("mg", "milligram", "milligrams"), "mg"),
    **dict.fromkeys(("g", "gram", "grams"), "g"),
    **dict.fromkeys(("kg", "kilo", "kilos", "kilogram", "kilograms"), "kg"),
    **dict.fromkeys(("lb", "lbs", "pound", "pounds"), "lb"),
    **dict.fromkeys(("oz", "ounce", "ounces"), "oz"),
    **dict.fromkeys(("ml", "milliliter", "milliliters", "millilitre", "millilitres"), "ml"),
    **dict.fromkeys(("l", "liter", "liters", "litre", "litres"), "l"),
    **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres", "k"), "km"),
    **dict.fromkeys(("mi", "mile", "miles"), "mi"),
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), "m"),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "cm"),
    **dict.fromkeys(("mm", "millimeter", "millimeters"), "mm"),
    **dict.fromkeys(("ft", "foot", "feet"), "ft"),
    **dict.fromkeys(("inch", "inches"), "in"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "min"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("day", "days"), "day"),
    **dict.fromkeys(("week", "weeks"), "week"),
    **dict.fromkeys(("month", "months"), "month"),
    **dict.fromkeys(("year", "years", "yr", "yrs"), "year"),
    **dict.fromkeys(("%", "percent", "per cent"), "%"),
    **dict.fromkeys(("$", "dollar", "dollars", "usd"), "$"),
    **dict.fromkeys(("€", "euro", "euros", "eur"), "€"),
    **dict.fromkeys(("£", "gbp"), "£"),
    **dict.fromkeys(("°", "degree", "degrees", "°c", "°f"), "°"),
    **dict.fromkeys(("am", "a.m."), "am"),
    **dict.fromkeys(("pm", "p.m."), "pm"),
    **dict.fromkeys(("cup", "cups"), "cup"),
    **dict.fromkeys(("step", "steps"), "step"),
    **dict.fromkeys(("time", "times"), "time"),
}
_TIMES_OF_DAY = frozenset(
    ("morning", "afternoon", "evening", "night", "tonight", "noon", "midnight", "midday")
)
_RELATIVE_DAYS = frozenset(("yesterday", "today", "tomorrow"))
_WEEKDAYS = {name: full for full in WEEKDAY_NAMES for name in (full, full[:3])} | {
    "tues": "tuesday",
    "thur": "thursday",
    "thurs": "thursday",
    "weds": "wednesday",
}
_MONTHS = {name: full for full in MONTH_NAMES for name in (full, full[:3])} | {"sept": "september"}
_KIN = {
    **{
        w: w
        for w in ("son", "daughter", "brother", "sister", "husband", "wife", "boy", "girl", "aunt", "uncle")
    },
    **{
        w: w
        for w in (
            "nephew",
            "niece",
            "grandson",
            "granddaughter",
            "boyfriend",
            "girlfriend",
            "fiance",
            "fiancee",
        )
    },
    **{
        w + "s": w
        for w in ("son", "daughter", "brother", "sister", "husband", "boy", "girl", "aunt", "uncle")
    },
    **{w + "s": w for w in ("nephew", "niece", "grandson", "granddaughter", "boyfriend", "girlfriend")},
    **dict.fromkeys(("mother", "mom", "mum", "mommy", "mama", "mothers", "moms"), "mother"),
    **dict.fromkeys(("father", "dad", "daddy", "papa", "fathers", "dads"), "father"),
    **dict.fromkeys(("grandmother", "grandma", "granny"), "grandmother"),
    **dict.fromkeys(("grandfather", "grandpa"), "grandfather"),
    **dict.fromkeys(("wives",), "wife"),
    **dict.fromkeys(("he", "him", "his", "himself", "man", "men"), "male"),
    **dict.fromkeys(("she", "her", "hers", "herself", "woman", "women"), "female"),
}
# Capitalised words that are not names: sentence starters and the subjects memories are written about.
_NOT_NAMES = _word_set(
    """
    the a an user users assistant agent i he she they it we you this that these those his her their
    its our my your in on at for and but or so if when while after before since until during of to
    from with as by about also then there here yes no not every each some all both one once later
    earlier now recently currently usually often sometimes always never previously last next
    """
)
_TOKEN = re.compile(r"\$|€|£|%|°[cCfF]?|\d+(?:[.,]\d+)*(?:st|nd|rd|th)?|[^\W\d_]+(?:['\u2019][^\W\d_]+)*|\S")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")


def _number(token: str) -> str | None:
    lowered = token.lower()
    if match := _DIGITS.match(lowered):
        value = match.group(0).replace(",", "")
        return value.lstrip("0") or "0" if "." not in value else value.rstrip("0").rstrip(".")
    return _NUMBER_WORDS.get(lowered)


def details(text: str) -> dict[str, frozenset[str]]:
    """The details of `text` that tell one fact from another, by kind."""
    tokens = _TOKEN.findall(text.replace("\u2019", "'"))
    found: dict[str, set[str]] = {
        k: set() for k in ("number", "unit", "time", "weekday", "month", "day", "name", "kin")
    }
    numbers = [_number(t) for t in tokens]
    for index, token in enumerate(tokens):
        lowered = re.sub(r"'s$|'$", "", token.lower())  # the daughter's name: the daughter
        near_number = any(0 <= j < len(tokens) and numbers[j] is not None for j in (index - 1, index + 1))
        if numbers[index] is not None:
            found["number"].add(numbers[index] or "")
        if lowered in _UNITS and (near_number or lowered in ("am", "pm", "a.m.", "p.m.")):
            found["unit"].add(_UNITS[lowered])
        if lowered in _TIMES_OF_DAY:
            found["time"].add(lowered)
        if lowered in _RELATIVE_DAYS:
            found["day"].add(lowered)
        if lowered in _KIN:
            found["kin"].add(_KIN[lowered])
        capitalised = token[:1].isupper()
        if capitalised and lowered in _WEEKDAYS:
            found["weekday"].add(_WEEKDAYS[lowered])
        elif capitalised and lowered in _MONTHS and (lowered != "may" or near_number or index > 0):
            found["month"].add(_MONTHS[lowered])
        elif capitalised and lowered.isalpha() and lowered not in _NOT_NAMES and len(lowered) > 1:
            found["name"].add(lowered)
    return {kind: frozenset(values) for kind, values in found.items()}


def _words(text: str) -> set[str]:
    return {re.sub(r"'s$|'$", "", t.lower()) for t in _TOKEN.findall(text.replace("\u2019", "'"))}


def distinct_facts(a: str, b: str) -> str | None:
    """The kind of detail in which `a` and `b` differ as facts (a number, a month, a name, a
    negation ...), or None when they may state the same thing."""
    if opposite_polarity(a, b):
        return "negation"
    details_a, details_b = details(a), details(b)
    for kind, found_a in details_a.items():
        found_b = details_b[kind]
        if kind == "name":
            # A name written in lower case in the other text ("Jazz" / "jazz") is not another name.
            words_a, words_b = _words(a), _words(b)
            if any(n not in words_b for n in found_a) or any(n not in words_a for n in found_b):
                return kind
        elif kind == "unit" and not (found_a and found_b):
            continue  # "34 years old" / "34": a unit said on one side only is no other fact
        elif found_a != found_b:
            return kind
    return None


# Words a restatement adds or drops without changing the fact.
_FILLER = _word_set(
    """
    the a an user user's users is are was were be been being am has have had does do did of to in
    on at for with as by and their his her its that this who which very really currently recently
    now also just still usually regularly every each some any there it they them time times who's s
    called named name works work working job old year years going using how located about over
    while during up practice practices practicing take takes taking
    """
)
# One word for each group of words that restatements of a memory use interchangeably.
_SAME_WORD = {
    **dict.fromkeys(("favourite", "favorite"), "favorite"),
    **dict.fromkeys(("colour", "color"), "color"),
    **dict.fromkeys(("mum", "mom", "mother"), "mother"),
    **dict.fromkeys(("dad", "father"), "father"),
    **dict.fromkeys(("like", "likes", "enjoy", "enjoys", "love", "loves", "lover", "fond", "fan"), "like"),
    **dict.fromkeys(("support", "supports"), "like"),
    **dict.fromkeys(("member", "belong", "belongs"), "member"),
    **dict.fromkeys(("glasses", "eyeglasses", "spectacles"), "glasses"),
    **dict.fromkeys(("own", "owns", "possess", "possesses", "hold", "holds"), "has"),
    **dict.fromkeys(("daily", "day"), "day"),
    **dict.fromkeys(("mainly", "mostly", "primarily", "largely"), "mostly"),
    **dict.fromkeys(("afraid", "fear", "scared", "frightened"), "afraid"),
    **dict.fromkeys(("allergic", "allergy"), "allergic"),
    **dict.fromkeys(("big", "huge", "great", "avid"), "big"),
    **dict.fromkeys(("begin", "began", "start", "started"), "start"),
    **dict.fromkeys(("relocate", "relocated", "move", "moved"), "move"),
    **dict.fromkeys(("kid", "kids", "child", "children"), "child"),
    **dict.fromkeys(("flat", "apartment"), "apartment"),
    **dict.fromkeys(("cuisine", "food", "dishes", "dish"), "food"),
    **dict.fromkeys(("bike", "bikes", "cycle", "cycles"), "cycle"),
    **dict.fromkeys(("journal", "diary"), "diary"),
    **dict.fromkeys(("poetry", "poems", "poem"), "poem"),
    **dict.fromkeys(("near", "close"), "near"),
    **dict.fromkeys(("healthy", "healthily"), "healthy"),
    **dict.fromkeys(("intolerant", "intolerance"), "intolerant"),
}


def _stem(word: str) -> str:
    """A crude stem: the same for hike / hiking / hikes, plan / planning / plans."""
    for suffix in ("ing", "ies", "es", "ed", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]  # plann(ing) -> plan
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def content_words(text: str) -> frozenset[str]:
    """The words of `text` that carry its fact, stemmed: what a restatement keeps."""
    words = (re.sub(r"'s$|'$", "", t.lower()) for t in _TOKEN.findall(text.replace("\u2019", "'")))
    words = (_SAME_WORD.get(w, w) for w in ("not" if w.endswith("n't") else w for w in words))
    return frozenset(_stem(_NUMBER_WORDS.get(w, w)) for w in words if w.isalnum() and w not in _FILLER)


def restates(a: str, b: str) -> bool:
    """Whether `b` says what `a` says in the same words: the words that carry the fact are the same,
    whatever the order, the articles and auxiliaries, the inflection or the spelling."""
    words_a = content_words(a)
    return bool(words_a) and words_a == content_words(b)
