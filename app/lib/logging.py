"""structlog set-up: JSON lines in production, readable in a terminal, secrets never printed."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# Keys whose values must never reach a log line, wherever they appear in an event.
_SECRET_KEYS = frozenset(
    {"authorization", "api_key", "key", "admin_key", "password", "secret", "token", "writer_api_key"}
)
_REDACTED = "[redacted]"


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (_REDACTED if str(k).lower() in _SECRET_KEYS else _redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact(v) for v in value)
    return value


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: replace the values of secret-looking keys, at any depth."""
    for key in list(event_dict):
        if key.lower() in _SECRET_KEYS:
            event_dict[key] = _REDACTED
        elif isinstance(event_dict[key], dict | list | tuple):
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def configure_logging(level: str = "INFO", fmt: str = "auto", process: str | None = None) -> None:
    """Configure structlog and route stdlib logging (uvicorn, arq, alembic) through the same renderer."""
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    if process:
        structlog.contextvars.bind_contextvars(process=process)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if json_output else _identity,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Our own request log replaces uvicorn's access log (it carries the request id and no headers).
    logging.getLogger("uvicorn.access").disabled = True
    # arq logs every job start and end at INFO; the pipeline's own events say what matters.
    for noisy in ("asyncio", "httpx", "httpcore", "pgserver", "alembic.runtime.plugins", "arq.worker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _identity(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return event_dict
