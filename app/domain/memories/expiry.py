"""When a memory expires, from the dates clients give: Mem0's `expiration_date` (`YYYY-MM-DD`, the last
day the memory is shown; Mem0 hides it from the next day on, UTC) and back.

An expired memory (`expires_at` at or before now) is hidden from list, search, answer and the writer's
candidates unless a read asks for it (`repositories.unexpired`); nothing deletes it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

# The key of a chunk's metadata naming the last day the memories it adds are shown (Mem0's add).
EXPIRATION_KEY = "expiration_date"


def after_day(day: date) -> datetime:
    """The expiry of a memory shown until the end of `day` (UTC): the next midnight, or the calendar's
    last instant for its last day."""
    try:
        return datetime.combine(day + timedelta(days=1), time(), UTC)
    except OverflowError:
        return datetime.combine(day, time.max, UTC)


def last_day(expires_at: datetime | None) -> str | None:
    """The last day (YYYY-MM-DD, UTC) a memory expiring at `expires_at` is shown."""
    if expires_at is None:
        return None
    return (expires_at.astimezone(UTC) - timedelta(microseconds=1)).date().isoformat()


def of_date_text(value: object) -> datetime | None:
    """The expiry named by a `YYYY-MM-DD` date held as text (a chunk's `metadata.expiration_date`, as
    Mem0's add stores it); None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return after_day(date.fromisoformat(value))
    except ValueError:
        return None
