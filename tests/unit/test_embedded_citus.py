"""`memstore up --citus-workers N` without the Citus build says how to get one and exits non-zero,
before anything starts; the cluster's nodes take the Citus build's programs and preload Citus."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import cli
from app.lib import embedded
from app.lib.embedded import EmbeddedCitus, EmbeddedError, EmbeddedStack


@pytest.fixture
def no_citus_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(embedded, "CITUS_HOME", tmp_path / "citus-pg16")
    return tmp_path


def test_up_with_citus_workers_without_the_build_says_how_to_get_it(
    no_citus_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MEMSTORE_DATABASE_URL", "MEMSTORE_ADMIN_DATABASE_URL", "MEMSTORE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    data_dir = no_citus_build / "data"
    result = CliRunner().invoke(cli, ["up", "--citus-workers", "2", "--data-dir", str(data_dir)])
    assert result.exit_code == 1, result.output
    assert "make citus" in result.output
    assert not (data_dir / "citus").exists()  # nothing was started


def test_the_stack_refuses_a_cluster_beside_a_configured_database(no_citus_build: Path) -> None:
    stack = EmbeddedStack(no_citus_build, "postgresql+asyncpg://elsewhere/db", "unused", citus_workers=2)
    with pytest.raises(EmbeddedError, match="not both"):
        stack.start()


def test_a_cluster_has_a_coordinator_and_its_workers_each_preloading_citus(tmp_path: Path) -> None:
    cluster = EmbeddedCitus(tmp_path, workers=2)
    assert [n.data_dir.name for n in cluster.servers] == ["worker-1", "worker-2", "coordinator"]
    assert [n.worker for n in cluster.servers] == [True, True, False]
    for node in cluster.servers:
        assert "shared_preload_libraries=citus" in node.settings
        assert node.log_path == tmp_path / f"{node.data_dir.name}.log"
    assert len({n.socket_dir for n in cluster.servers}) == 3
