"""`memstore history / rollback / revert / restore / audit verify` as an operator runs them."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import db_now, memory, write
from tests.support.workers import settings_env


async def memstore(settings: Settings, *args: str) -> tuple[int, str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args, "--tenant", "acme"],
            env=settings_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await asyncio.to_thread(run)
    return done.returncode, done.stdout + done.stderr


async def test_history_rollback_revert_restore_and_verify_from_the_terminal(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    first = await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    moment = await db_now(sessionmaker)
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.UPDATE, "The user lives in Paris.", (0,))], [lyon]
    )

    code, out = await memstore(settings, "history", str(lyon.id))
    assert code == 0, out
    assert "v1" in out
    assert "ADD" in out
    assert "The user lives in Lyon." in out
    assert "v2" in out
    assert "UPDATE" in out
    assert "writer=w/m-1" in out

    code, out = await memstore(settings, "rollback", str(lyon.id), "--to-version", "1", "--dry-run")
    assert code == 0, out
    assert "1 memories would change (dry run)" in out
    assert "- The user lives in Paris.\n  + The user lives in Lyon." in out
    assert (await memory(sessionmaker, "The user lives in Paris.")).version == 2

    code, out = await memstore(settings, "revert", str(first))
    assert code == 1
    assert "revert_conflict" in out
    assert f"conflict: memory {lyon.id} v2" in out

    code, out = await memstore(
        settings, "rollback", str(lyon.id), "--to-version", "1", "--reason", "bad merge"
    )
    assert code == 0, out
    assert "1 memories changed" in out
    rolled = await memory(sessionmaker, "The user lives in Lyon.")
    assert rolled.version == 3

    code, out = await memstore(settings, "restore", "u", "--as-of", moment.isoformat())
    assert code == 0, out
    assert "0 memories changed" in out  # already as it was then

    code, out = await memstore(
        settings, "revert", "--since", moment.isoformat(), "--model", "m-1", "--dry-run"
    )
    assert code == 0, out
    assert "(dry run)" in out

    code, out = await memstore(settings, "audit", "verify")
    assert code == 0, out
    assert "ok: " in out
    async with sessionmaker() as session, session.begin():
        await session.execute(text("SET LOCAL session_replication_role = replica"))
        await session.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 2"))
    code, out = await memstore(settings, "audit", "verify")
    assert code == 1
    assert "BROKEN at event 2" in out
