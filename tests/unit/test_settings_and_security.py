"""Settings come from MEMSTORE_* variables; keys are random and hashed."""

from __future__ import annotations

import hashlib

import pytest

from app.config import Settings
from app.lib.security import display_prefix, generate_api_key, has_role, hash_api_key


def test_settings_read_env_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_WRITER", "openai")
    monkeypatch.setenv("MEMSTORE_EMBEDDING_DIM", "768")
    monkeypatch.setenv("MEMSTORE_MAX_BODY_BYTES", "2048")
    settings = Settings()
    assert settings.writer == "openai"
    assert settings.embedding_dim == 768
    assert settings.max_body_bytes == 2048
    assert settings.embedded_database is (settings.database_url is None)


def test_every_setting_is_documented() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description"


def test_bad_setting_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_WRITER_RESPONSE_FORMAT", "telepathy")
    with pytest.raises(ValueError, match="writer_response_format"):
        Settings()
    monkeypatch.delenv("MEMSTORE_WRITER_RESPONSE_FORMAT")
    monkeypatch.setenv("MEMSTORE_DUPLICATE_THRESHOLD", "1.5")
    with pytest.raises(ValueError, match="duplicate_threshold"):
        Settings()


def test_keys_are_unique_and_hashed() -> None:
    keys = {generate_api_key() for _ in range(1000)}
    assert len(keys) == 1000
    key = next(iter(keys))
    assert key.startswith("ms_")
    assert len(key) >= 32
    assert hash_api_key(key) == hashlib.sha256(key.encode()).hexdigest()
    assert display_prefix(key) == key[:9]


def test_admin_implies_every_role() -> None:
    assert has_role({"admin"}, "ingest")
    assert has_role({"read"}, "read")
    assert not has_role({"read"}, "write")


def test_an_unavailable_default_writer_fails_loudly() -> None:
    from app.writers.registry import UnknownWriterError, WriterRegistry

    with pytest.raises(ValueError, match="not available"):
        WriterRegistry(Settings(writer="telepathy"))
    assert WriterRegistry(Settings(writer="openai")).knows("openai")
    registry = WriterRegistry(Settings(writer="offline"))
    assert not registry.knows("openai")  # no endpoint configured
    assert registry.resolve_name(None) == "offline"
    with pytest.raises(UnknownWriterError, match="nope"):  # never a silent fall-back to the default
        registry.resolve_name("nope")
    assert registry.knows("default")
    assert not registry.knows("nope")
