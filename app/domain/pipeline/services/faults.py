"""What goes wrong with a claimed chunk, as the drain tells it apart, and how long the chunk then waits.

`OUTAGES` are the faults outside Postgres that are not the chunk's (the embedder down or changed, a
writer this worker does not know): the claim is given back uncounted and the chunk waits
`outage_backoff`, which grows with the outage. Anything else a writer or its chunk does wrong is a
failed attempt, retried after `backoff` until the chunk has had its attempts. Both are jittered, so
the retries of many scopes do not align.
"""

from __future__ import annotations

import random
from datetime import timedelta

from app.config import Settings
from app.embeddings.openai import EmbeddingError
from app.lib.errors import EmbedderMismatch
from app.writers.registry import UnknownWriterError

# Faults outside Postgres that are not the chunk's: its claim is given back, its attempt not counted.
OUTAGES = (EmbeddingError, EmbedderMismatch, UnknownWriterError)


def backoff(settings: Settings, attempt: int) -> timedelta:
    """Exponential backoff with +-20 % jitter, so retries of many scopes do not align."""
    delay = min(settings.retry_backoff_max_s, settings.retry_backoff_s * 2 ** max(0, attempt - 1))
    return jittered(delay)


def outage_backoff(settings: Settings, outage_s: float) -> timedelta:
    """While a dependency has been down `outage_s` seconds: about as long again, so the retries of a
    long outage thin out exponentially as `backoff`'s do, within the same bounds. Counting no attempts,
    they go on until it is back."""
    return jittered(min(settings.retry_backoff_max_s, max(settings.retry_backoff_s, outage_s)))


def jittered(delay_s: float) -> timedelta:
    return timedelta(seconds=delay_s * random.uniform(0.8, 1.2))  # noqa: S311  (jitter, not security)
