"""The admin console in headless Chromium (Debian's `chromium`, driven by Playwright) against the real
API and a real worker: sign in, find a user, move the time control to see the older bank, open a
memory's timeline with its source messages, dry-run a rollback and see the diff, confirm it, see the
new version. Screenshots go to a temporary directory (their paths are printed)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.support.history import db_now
from tests.support.live import live_api
from tests.support.workers import running_worker, wait_for_chunks

CHROMIUM = os.environ.get("MEMSTORE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install -y chromium`)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        await browser.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(timezone_id="UTC", viewport={"width": 1200, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(15_000)
    yield page
    await context.close()


async def _say(http: httpx.AsyncClient, tenant: TenantKeys, user: str, text: str) -> None:
    body = {"user_id": user, "messages": [{"role": "user", "content": text}]}
    response = await http.post("/v1/chunks", json=body, headers=tenant.admin)
    assert response.status_code == 202, response.text


async def test_sign_in_find_a_user_go_back_in_time_and_roll_a_memory_back(
    page: Page,
    settings: Settings,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    tmp_path: Path,
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with live_api(settings) as base_url, running_worker(settings):
        async with httpx.AsyncClient(base_url=base_url) as http:
            await _say(http, tenant, "bob", "I'm vegetarian.")
            await _say(http, tenant, "ana", "I live in Lyon.")
            await wait_for_chunks(sessionmaker, tenant.tenant_id, 2)
            in_lyon = await db_now(sessionmaker)
            await _say(http, tenant, "ana", "I moved to Seattle last month.")
            await wait_for_chunks(sessionmaker, tenant.tenant_id, 3)

        # Sign in with the keyboard alone.
        await page.goto(f"{base_url}/admin/")
        await page.get_by_label("Admin API key").focus()
        await page.keyboard.type(tenant.admin_key)
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Users")).to_be_visible()
        await page.screenshot(path=shots / "users.png")

        # Find a user by the start of their id.
        await page.get_by_label("User id starts with").fill("an")
        await page.get_by_role("button", name="Find").click()
        await expect(page.get_by_role("link", name="bob")).to_have_count(0)
        await page.get_by_role("link", name="ana").click()
        bank = page.locator("#bank")
        await expect(bank).to_contain_text("The user lives in Seattle.")
        await expect(bank).not_to_contain_text("The user lives in Lyon.")

        # The time control: the bank as it stood before she moved.
        await page.get_by_label("Bank as of").fill(in_lyon.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3])
        await page.get_by_role("button", name="Show", exact=True).click()
        await expect(bank).to_contain_text("The user lives in Lyon.")
        await expect(bank).not_to_contain_text("The user lives in Seattle.")
        await page.screenshot(path=shots / "bank-as-of.png")

        # The Lyon memory's timeline, with the messages each version came from.
        await page.get_by_role("link", name="The user lives in Lyon.").click()
        timeline = page.locator("ol.timeline")
        await expect(timeline.locator("li[data-version]")).to_have_count(2)
        first = timeline.locator("li[data-version='1']")
        await expect(first).to_contain_text("I live in Lyon.")
        second = timeline.locator("li[data-version='2']")
        await expect(second).to_contain_text("SUPERSEDE")
        await expect(second).to_contain_text("I moved to Seattle last month.")

        # Dry run first: the diff, and nothing written yet.
        await first.get_by_role("button", name="Roll back to v1…").click()
        preview = first.locator("table.diff-table")
        await expect(preview).to_contain_text("v2 superseded")
        await expect(preview).to_contain_text("v3 active")
        await page.screenshot(path=shots / "rollback-preview.png", full_page=True)
        await expect(timeline.locator("li[data-version]")).to_have_count(2)

        # Confirm: a new version, active again, written by the admin's key.
        await first.get_by_role("button", name="Confirm rollback to v1").click()
        await expect(timeline.locator("li[data-version]")).to_have_count(3)
        third = timeline.locator("li[data-version='3']")
        await expect(third).to_contain_text("ROLLBACK")
        await expect(third).to_contain_text("rolled back from the admin console")
        await expect(page.locator("#memory-now")).to_have_text("The user lives in Lyon.")
        await page.screenshot(path=shots / "timeline.png", full_page=True)
    print(f"screenshots: {shots}")
