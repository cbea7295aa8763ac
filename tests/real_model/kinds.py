"""Why a chunk or a question of the real-model run failed: the model's own doing, or the server's.

Kept free of the service's imports, so that run.py (which checks the eval's report) and the profile
test read failures the same way.
"""

from __future__ import annotations

import re

# A failed chunk's error (chunks.last_error) that is the model's own doing: it answered, but nothing
# usable could be read (app.writers.profiles.base.ModelSession.ask).
MODEL_FAILURE = re.compile(
    r"^writer error: (?:unparseable \S+ output after one repair request"
    r"|\S+ output was cut off at the token limit before any item was complete)"
)
# The endpoint gave no answer (app.writers.transport.ChatTransport), or none within the chunk's time.
TRANSPORT_FAILURE = re.compile(r"^writer error: the endpoint |^writer timed out after ")


def failure_kind(error: str) -> str:
    """`model` (the model's own: unreadable or cut-off output), `transport` or `other` (a bug)."""
    if MODEL_FAILURE.search(error):
        return "model"
    return "transport" if TRANSPORT_FAILURE.search(error) else "other"
