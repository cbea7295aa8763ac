"""Secrets never reach a log line."""

from __future__ import annotations

import io
import json
import logging

import structlog

from app.lib.logging import configure_logging, redact_secrets


def test_redacts_secret_keys_at_any_depth() -> None:
    event = {
        "event": "x",
        "authorization": "Bearer ms_secret",
        "headers": {"Authorization": "Bearer ms_secret", "accept": "json"},
        "items": [{"api_key": "ms_secret"}],
        "user_id": "u1",
    }
    out = redact_secrets(None, "info", dict(event))
    assert "ms_secret" not in json.dumps(out)
    assert out["user_id"] == "u1"
    assert out["headers"]["accept"] == "json"


def test_json_lines_carry_bound_context_and_no_secret(capsys: object) -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", process="test")
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    with structlog.contextvars.bound_contextvars(request_id="r-1"):
        structlog.get_logger("t").info("key.used", key="ms_topsecret", tenant="acme")
    structlog.contextvars.clear_contextvars()
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert line["event"] == "key.used"
    assert line["request_id"] == "r-1"
    assert line["process"] == "test"
    assert line["key"] == "[redacted]"
    assert "ms_topsecret" not in stream.getvalue()
