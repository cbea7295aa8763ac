"""Every request schemathesis derives from the OpenAPI document gets a documented answer, never a 5xx.

The checks: no server error; the status, the content type and the headers are those documented for
the route; the body matches the documented schema (errors too: the shared `Error`). Generation is
deterministic (a fixed seed, derandomised), so CI sends the same requests every run. Most requests
carry the tenant's admin key; some carry none, a read-only key or an ingest-only key, so the 401 and
403 answers are exercised too.

The document is read when the module is collected, from an app whose settings point nowhere (the
document does not depend on them); the requests go, in-process, to an app on the fuzz database.
(`schemathesis.pytest.from_fixture`, which would load it from a fixture instead, does not run under
pytest 9.2: it sets `Node._nodeid`, which pytest no longer has.)
"""

from __future__ import annotations

import os

import pytest
import schemathesis

from app.config import Settings
from app.server.asgi import create_app
from tests.conftest import FUZZ_REQUESTS
from tests.fuzz.conftest import FuzzTarget

# Per route, in the fuzzing phase (the coverage phase adds its own boundary cases): about 1,900
# requests in all, a minute here. MEMSTORE_FUZZ_EXAMPLES=150 fuzzes deeper (about 4,800, a few minutes).
MAX_EXAMPLES = int(os.environ.get("MEMSTORE_FUZZ_EXAMPLES", "25"))

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 20_241_112,
        "generation": {"deterministic": True, "max-examples": MAX_EXAMPLES, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "response_headers_conformance": {"enabled": True},
        },
    }
)

_NOWHERE = Settings(database_url="postgresql+asyncpg://unused@localhost/unused", redis_url="redis://unused")
schema = schemathesis.openapi.from_dict(
    create_app(_NOWHERE, configure_logs=False).openapi_schema.to_schema(), config=CONFIG
)


@schema.parametrize()
def test_every_generated_request_gets_a_documented_answer(
    case: schemathesis.Case, fuzz_target: FuzzTarget, pytestconfig: pytest.Config
) -> None:
    sent = pytestconfig.stash[FUZZ_REQUESTS]
    pytestconfig.stash[FUZZ_REQUESTS] = sent + 1
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    if (authorization := fuzz_target.authorizations[sent % len(fuzz_target.authorizations)]) is not None:
        headers["Authorization"] = authorization
    case.headers = headers
    case.call_and_validate(app=fuzz_target.app)
