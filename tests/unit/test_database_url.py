"""MEMSTORE_DATABASE_URL in the spellings providers and libpq give is read into what asyncpg takes."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.config.database_url import postgres_target


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://u:p@db.example.com:6543/mem",
        "postgres://u:p@db.example.com:6543/mem",
        "postgresql+asyncpg://u:p@db.example.com:6543/mem",
    ],
)
def test_every_postgres_scheme_means_asyncpg(given: str) -> None:
    target = postgres_target(given)
    assert target.url.render_as_string(hide_password=False) == (
        "postgresql+asyncpg://u:p@db.example.com:6543/mem"
    )
    assert target.connect_args("memstore-api", 5.0) == {
        "server_settings": {"application_name": "memstore-api"},
        "timeout": 5.0,
    }


def test_libpq_options_are_spelt_as_asyncpg_takes_them() -> None:
    target = postgres_target(
        "postgresql://u@h/db?sslmode=verify-full&sslrootcert=/etc/ca%20certs/root.crt"
        "&connect_timeout=12&application_name=billing&options=-c%20statement_timeout%3D5000"
    )
    assert target.url.render_as_string() == "postgresql+asyncpg://u@h/db"
    args = target.connect_args("memstore-worker", 5.0)
    assert args["timeout"] == 12.0
    # The operator's application name wins over the process's own tag.
    assert args["server_settings"] == {"application_name": "billing", "options": "-c statement_timeout=5000"}
    # TLS options go through asyncpg's own DSN reader, which builds the verifying context from them.
    assert args["dsn"] == "postgresql://?sslmode=verify-full&sslrootcert=%2Fetc%2Fca+certs%2Froot.crt"


def test_unix_socket_and_asyncpg_options_stay_in_the_url() -> None:
    target = postgres_target("postgresql://postgres@/memstore?host=/tmp/pg&prepared_statement_cache_size=0")
    assert target.url.drivername == "postgresql+asyncpg"
    assert dict(target.url.query) == {"host": "/tmp/pg", "prepared_statement_cache_size": "0"}
    assert "dsn" not in target.connect_args("memstore-cli", 5.0)


def test_asyncpg_spelling_keeps_working() -> None:
    target = postgres_target("postgresql+asyncpg://u@h/db?ssl=require")
    assert dict(target.url.query) == {"ssl": "require"}


def test_features_asyncpg_lacks_are_ignored_unless_required() -> None:
    assert postgres_target("postgres://u@h/db?sslmode=require&channel_binding=prefer").dsn_options == {
        "sslmode": "require"
    }
    with pytest.raises(ValueError, match="channel_binding=require; asyncpg has no channel binding"):
        postgres_target("postgres://u@h/db?channel_binding=require")


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ("postgresql+psycopg://u@h/db", r"not postgresql\+psycopg://; Memstore connects through asyncpg"),
        ("mysql://u@h/db", "must be a PostgreSQL URL"),
        ("not a url", "is not a URL"),
        ("postgresql://u@h/db?keepalives=1", "option asyncpg does not know: keepalives"),
        ("postgresql://u@h/db?ssl=require&sslmode=require", "both ssl and sslmode"),
        ("postgresql://u@h/db?connect_timeout=0", "connect_timeout=0"),
    ],
)
def test_what_cannot_be_used_is_refused_with_a_reason(given: str, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        postgres_target(given)


def test_settings_refuse_an_unusable_url_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", "postgresql+psycopg2://u@h/db")
    with pytest.raises(ValueError, match="database_url"):
        Settings()
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", "postgres://u@h/db?sslmode=require")
    assert Settings().database_url == "postgres://u@h/db?sslmode=require"
