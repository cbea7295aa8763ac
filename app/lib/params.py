"""Query and path parameters shared by the API's list and admin endpoints."""

from __future__ import annotations

from typing import Annotated

from litestar.params import PathParameter, QueryParameter

from app.lib.validation import Moment

Limit = Annotated[int, QueryParameter(ge=1, le=1000)]  # items in one page
Text = Annotated[str | None, QueryParameter(min_length=1, max_length=200)]  # an exact filter
When = Annotated[Moment | None, QueryParameter()]  # a moment (ISO 8601 with an offset)
UserId = Annotated[str, PathParameter(min_length=1, max_length=200)]
