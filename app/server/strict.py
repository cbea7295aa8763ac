"""Request bodies decoded strictly: a JSON value of another type than the schema says is a 422.

Litestar decodes a JSON body to Python values, then converts them to the handler's `data` type in
msgspec's lax mode, which takes `0` for `false` and `"5"` for `5`. The OpenAPI document promises
the strict types, so the body is decoded here straight into the handler's `data` type, strictly
(one decode, not two: the lax conversion that follows finds the type it asks for).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import SerializationException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.types import Empty

_AT = re.compile(r" - at `\$(.*)`$")


@cache
def _body_type(handler: HTTPRouteHandler) -> Any:
    """The `data` parameter's type, or None for a handler without one. An optional body (`X | None`)
    that is sent is an X: `null` is no body."""
    field = handler.parsed_fn_signature.parameters.get("data")
    if field is None:
        return None
    if field.is_optional:
        kept = [t.annotation for t in field.inner_types if not t.is_none_type]
        return kept[0] if len(kept) == 1 else field.annotation
    return field.annotation


def _integral_floats_as_ints(value: Any) -> Any:
    """JSON Schema's `integer` is any number without a fraction, `2.0` too; msgspec's strict `int`
    takes no float. So a body refused for a float where an int goes is decoded again with its
    integral floats as ints (only then: the common body is decoded once)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    return value


class StrictRequest(Request[Any, Any, Any]):
    """A request whose `json()` is the body decoded into the handler's `data` type, strictly."""

    async def json(self) -> Any:
        if self._json is not Empty:
            return self._json
        target = _body_type(self.route_handler)
        if target is None:
            return await super().json()
        body = await self.body()
        hook = self.route_handler.default_deserializer
        try:
            try:
                decoded = msgspec.json.decode(body or b"null", type=target, strict=True, dec_hook=hook)
            except msgspec.ValidationError as exc:
                if "got `float`" not in str(exc):
                    raise
                plain = _integral_floats_as_ints(msgspec.json.decode(body))
                decoded = msgspec.convert(plain, type=target, strict=True, dec_hook=hook)
        except msgspec.ValidationError as exc:
            message = str(exc)
            at = _AT.search(message)
            key = at.group(1).lstrip(".") if at else ""
            text = message[: at.start()] if at else message
            raise ValidationException(
                detail=f"Validation failed for {self.method} {self.url.path}",
                extra=[{"message": text, "key": key, "source": "body"}],
            ) from exc
        except msgspec.DecodeError as exc:
            raise SerializationException(str(exc)) from exc
        self._json = self._connection_state.json = decoded
        return decoded
