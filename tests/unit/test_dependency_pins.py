"""The dependency pins of pyproject.toml resolve as they are written, offline: OpenTelemetry's packages
come from one release. Each instrumentation release pins one `opentelemetry-instrumentation` and one
semantic-conventions release, which one SDK release requires; not every instrumentation gets every
release, so open ranges let the newest of each disagree, and Python 3.11's own pip (23.2.1) stopped at
ResolutionImpossible there (tests/e2e/test_first_install.py installs with it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
INSTRUMENTATIONS = {"asgi", "sqlalchemy", "redis", "aiohttp-client"}
CORE = {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"}


def _opentelemetry() -> dict[str, Requirement]:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found = {r.name: r for r in map(Requirement, dependencies) if r.name.startswith("opentelemetry-")}
    assert set(found) == CORE | {f"opentelemetry-instrumentation-{n}" for n in INSTRUMENTATIONS}
    return found


def _cap(requirement: Requirement) -> str:
    """The newest release `requirement` admits, which it must name (`<=X` or `==X`)."""
    caps = [s.version for s in requirement.specifier if s.operator in ("<=", "==")]
    assert len(caps) == 1, f"{requirement}: no release named as its newest"
    return caps[0]


def test_every_instrumentation_is_capped_at_one_shared_release() -> None:
    found = _opentelemetry()
    caps = {_cap(found[f"opentelemetry-instrumentation-{n}"]) for n in INSTRUMENTATIONS}
    assert len(caps) == 1, f"the instrumentations name different releases: {sorted(caps)}"


def test_the_sdk_and_its_exporter_are_capped_at_one_release() -> None:
    found = _opentelemetry()
    assert len({_cap(found[name]) for name in CORE}) == 1
