"""The SDK stands alone: importing it loads nothing of the server (no web framework, no database)."""

from __future__ import annotations

import json
import subprocess
import sys

# Top-level packages of the server and of what only the server needs.
SERVER_MODULES = (
    *("app", "workers", "migrations"),
    *("litestar", "sqlalchemy", "asyncpg", "alembic", "arq", "redis", "onnxruntime", "pydantic"),
)


def test_the_sdk_imports_nothing_of_the_server() -> None:
    probe = (
        "import json, sys, memstore_client; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_MODULES!r})))"
    )
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(output) == []
