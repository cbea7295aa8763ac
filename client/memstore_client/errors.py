"""The one exception of the SDK: an error answer of the API, with its `code` (docs/api.md, "Errors")."""

from __future__ import annotations

from typing import Any


class MemstoreError(Exception):
    """The API answered an error: `status`, and the body's `code`, `message` and `details`.

    A failure to reach the API at all (after the retries) is `code` `"unreachable"`, `status` 0.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.request_id = request_id
