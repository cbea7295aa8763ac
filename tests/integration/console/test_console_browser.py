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
from tests.integration.search.test_search import add as add_memories
from tests.support.history import db_now
from tests.support.live import free_port, live_api
from tests.support.waiting import wait_for
from tests.support.workers import running_worker, wait_for_chunks, wait_until
from tests.support.writers import PLUGINS

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


async def _say(
    http: httpx.AsyncClient, tenant: TenantKeys, user: str, text: str, at: str | None = None
) -> None:
    body = {"user_id": user, "messages": [{"role": "user", "content": text, "created_at": at}]}
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
            await _say(http, tenant, "ana", "I live in Lyon.", "2020-01-05T10:00:00Z")
            await wait_for_chunks(sessionmaker, tenant.tenant_id, 2)
            in_lyon = await db_now(sessionmaker)
            # Said on 10 March 2024: the move, and so Lyon's end, was on 1 February (valid time).
            await _say(http, tenant, "ana", "I moved to Seattle last month.", "2024-03-10T09:00:00Z")
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
        await expect(bank.locator("tr", has_text="Seattle")).to_contain_text("held since 2024-02-01")

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
        # When the fact held: open when added, closed by the move; and the text's language.
        await expect(page.locator("#memory-held")).to_have_text("held until 2024-02-01")
        await expect(page.locator("#memory-language")).to_have_text("en")
        await expect(first.locator(".held")).to_have_count(0)
        await expect(second.locator(".held")).to_have_text("held until 2024-02-01")

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
        # Rolled back to its first version, the fact is open again.
        await expect(page.locator("#memory-held")).to_have_text("— (not known)")
        await page.screenshot(path=shots / "timeline.png", full_page=True)
    print(f"screenshots: {shots}")


async def test_the_bank_and_each_version_say_the_language_of_their_text(
    page: Page, settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """Search reads each text in its language; the console shows it on the bank and on every version
    (a text rewritten in another language changes it)."""
    munich, _ = await add_memories(
        sessionmaker, tenant.tenant_id, "lea", ["Die Nutzerin wohnt in München.", "用户住在上海。"]
    )
    async with live_api(settings) as base_url:
        async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:
            edited = await http.patch(f"/v1/memories/{munich}", json={"content": "The user lives in Munich."})
            assert edited.status_code == 200, edited.text
            await _say(http, tenant, "lea", "Hallo!")  # the users list is of those who sent chunks

        await page.goto(f"{base_url}/admin/")
        await page.get_by_label("Admin API key").fill(tenant.admin_key)
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Users")).to_be_visible()
        await page.get_by_role("link", name="lea").click()
        bank = page.locator("#bank")
        await expect(bank.locator("th")).to_contain_text(["Memory", "Language"])
        await expect(bank.locator("tr", has_text="上海").locator("td.language")).to_have_text("zh")
        await expect(bank.locator("tr", has_text="Munich").locator("td.language")).to_have_text("en")

        await page.get_by_role("link", name="The user lives in Munich.").click()
        timeline = page.locator("ol.timeline")
        await expect(timeline.locator("li[data-version]")).to_have_count(2)
        await expect(timeline.locator("li[data-version='1'] .language")).to_have_text("de")
        await expect(timeline.locator("li[data-version='2'] .language")).to_have_text("en")
        await expect(page.locator("#memory-language")).to_have_text("en")


UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea, button')]
    .filter((e) => !e.closest('[hidden]') && !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                   && !(e.tagName === 'BUTTON' && e.textContent.trim()))
    .map((e) => e.outerHTML)"""


async def _unlabelled(page: Page) -> list[str]:
    found: list[str] = await page.evaluate(UNLABELLED)
    return found


async def test_reviews_failed_chunks_bulk_revert_with_conflicts_and_the_audit_chain(
    page: Page,
    settings: Settings,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    tmp_path: Path,
) -> None:
    settings = settings.model_copy(update={"writer_plugins": PLUGINS, "max_attempts": 1})
    async with (
        live_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http,
    ):
        held = await http.patch("/v1/admin/settings", json={"destructive_ops": "review"})
        assert held.status_code == 200, held.text
        async with running_worker(settings):
            await _say(http, tenant, "eve", "I live in Lyon.")
            await _say(http, tenant, "eve", "I'm vegetarian.")
            await wait_for_chunks(sessionmaker, tenant.tenant_id, 2)
            await _say(http, tenant, "eve", "I moved to Seattle last month.")  # held for review
            body = {
                "user_id": "fay",
                "writer": "failing",
                "messages": [{"role": "user", "content": "boom"}],
            }
            assert (await http.post("/v1/chunks", json=body)).status_code == 202
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 4) == {"applied": 3, "failed": 1}
        # An admin's hand edit after the writer's: a later change that a revert of the writer must not
        # overwrite unforced.
        veggie = next(
            m
            for m in (await http.get("/v1/memories", params={"user_id": "eve"})).json()["items"]
            if m["content"] == "The user is vegetarian."
        )
        edited = await http.patch(f"/v1/memories/{veggie['id']}", json={"content": "The user is vegan."})
        assert edited.status_code == 200, edited.text

        await page.goto(f"{base_url}/admin/")
        await page.get_by_label("Admin API key").fill(tenant.admin_key)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("heading", name="Users")).to_be_visible()
        assert await _unlabelled(page) == []

        # The held SUPERSEDE, approved.
        await page.get_by_role("link", name="Reviews").click()
        await expect(page.locator("main")).to_contain_text("Proposed: The user lives in Seattle.")
        await page.get_by_role("button", name="Approve").click()
        await expect(page.locator("main")).to_contain_text("No review is pending.")
        now = (await http.get("/v1/memories", params={"user_id": "eve"})).json()["items"]
        assert sorted(m["content"] for m in now) == ["The user is vegan.", "The user lives in Seattle."]

        # The failed chunk, its error and messages, retried.
        await page.get_by_role("link", name="Failed chunks").click()
        failed = page.locator("main li.panel")
        await expect(failed).to_contain_text("output is not valid JSON")
        await expect(failed).to_contain_text("boom")
        await page.get_by_role("button", name="Retry").click()
        await expect(page.locator("main")).to_contain_text("No chunk has failed.")
        chunks = (await http.get("/v1/admin/chunks", params={"status": "queued"})).json()["items"]
        assert [c["user_id"] for c in chunks] == ["fay"]

        # Undo everything the offline writer wrote: the approval touched Lyon since, a conflict.
        await page.get_by_role("link", name="Changesets").click()
        row = page.locator("tr", has_text="offline")
        await row.get_by_role("button", name="Revert everything since…").click()
        preview = page.locator("#bulk-box")
        await expect(preview).to_contain_text("later change(s) conflict")
        assert await _unlabelled(page) == []
        await page.screenshot(path=tmp_path / "bulk-revert-preview.png", full_page=True)
        # Word by word: the hand edit's word goes, the writer's comes back (with status deleted).
        edit_row = preview.locator("tr", has_text="vegetarian")
        await expect(edit_row.locator("del")).to_have_text("vegan")
        await expect(edit_row.locator("ins")).to_have_text("vegetarian")
        await preview.get_by_label("Overwrite them (force)").check()
        await preview.get_by_role("button", name="Confirm bulk revert of offline / any model").click()
        await expect(page.locator("#status")).to_contain_text("Done: bulk revert")
        await expect(page.locator("table")).to_contain_text("reverted")
        after = (await http.get("/v1/memories", params={"user_id": "eve"})).json()["items"]
        # What the offline writer added is gone, the hand edit on top of it included (forced).
        assert "The user is vegan." not in [m["content"] for m in after]

        # The audit log holds all of it, chained.
        await page.get_by_role("link", name="Audit log").click()
        await expect(page.locator("main table")).to_contain_text("changesets.reverted")
        await page.get_by_role("button", name="Verify the chain").click()
        await expect(page.locator("#verify-result")).to_contain_text("The chain holds")


async def test_webhooks_and_their_deliveries_with_a_redelivery(
    page: Page,
    settings: Settings,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # An endpoint nothing listens on (allowed past the SSRF guard for the test): its deliveries fail.
    port = free_port()
    settings = settings.model_copy(
        update={"webhook_allowed_hosts": ["127.0.0.1"], "webhook_retry_schedule_s": [60.0]}
    )
    async with (
        live_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http,
    ):
        created = await http.post(
            "/v1/admin/webhooks",
            json={"url": f"http://127.0.0.1:{port}/hook", "event_types": ["chunk.applied"]},
        )
        assert created.status_code == 201, created.text
        hook = created.json()["id"]
        async with running_worker(settings):
            await _say(http, tenant, "gil", "I live in Porto.")
            await wait_for_chunks(sessionmaker, tenant.tenant_id, 1)

            async def attempted() -> bool:
                log = (await http.get(f"/v1/admin/webhooks/{hook}/deliveries")).json()["items"]
                return bool(log) and log[0]["attempts"] >= 1

            await wait_until(attempted, 30, "a delivery attempt")

        await page.goto(f"{base_url}/admin/")
        await page.get_by_label("Admin API key").fill(tenant.admin_key)
        await page.get_by_role("button", name="Sign in").click()
        await page.get_by_role("link", name="Webhooks").click()
        main = page.locator("main")
        await expect(main).to_contain_text(f"http://127.0.0.1:{port}/hook")
        await expect(main).to_contain_text("events: chunk.applied")
        row = main.locator("tbody tr").first
        await expect(row).to_contain_text("chunk.applied")
        await expect(row).to_contain_text("gil")
        await expect(row).to_contain_text("pending")
        assert await _unlabelled(page) == []
        await page.get_by_role("button", name="Redeliver chunk.applied of gil").click()
        await expect(page.locator("#status")).to_contain_text("is sent again")
    audit = [e["action"] for e in (await _audit(settings, tenant))]
    assert "webhook.redelivered" in audit


async def _audit(settings: Settings, tenant: TenantKeys) -> list[dict[str, object]]:
    async with (
        live_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http,
    ):
        items: list[dict[str, object]] = (await http.get("/v1/admin/audit", params={"limit": 500})).json()[
            "items"
        ]
        return items


async def test_usage_shows_what_the_writes_cost_and_the_writer_share_pauses_and_resumes_a_tenant(
    page: Page, settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """The Usage page: the tenant's writes by day and writer; its writer share, set from the page (a
    budget of 0 tokens holds its chunks back, shown waiting for it; cleared, they are written)."""
    async with (
        live_api(settings) as base_url,
        running_worker(settings),
        httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http,
    ):
        await _say(http, tenant, "ida", "I live in Bergen.")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 1, timeout_s=30)

        await page.goto(f"{base_url}/admin/")
        await page.get_by_label("Admin API key").fill(tenant.admin_key)
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Users")).to_be_visible()
        await page.get_by_role("link", name="Usage").click()
        await expect(page.get_by_role("heading", name="Usage")).to_be_visible()
        table = page.locator("table", has_text="by day and writer")
        await expect(table.locator("tbody tr")).to_have_count(1)
        await expect(table.locator("tbody tr td").nth(1)).to_have_text("offline")
        await expect(table.locator("tbody tr td").nth(2)).to_have_text("1")
        await expect(page.locator("#budget-today")).to_contain_text("no daily budget")

        await page.get_by_label("Writer tokens a UTC day").fill("0")
        await page.get_by_role("button", name="Save").click()
        await expect(page.locator("#budget-today")).to_contain_text("spent")
        await _say(http, tenant, "ida", "I like skiing.")
        await page.get_by_role("link", name="Usage").click()
        waiting = page.locator("section", has_text="Chunks waiting for the budget")
        # A chunk waits for the budget as soon as it is queued; the page, read again, lists it.
        await wait_for(
            lambda: http.get("/v1/admin/chunks", params={"status": "queued"}),
            lambda r: any(c["waiting_for"] for c in r.json()["items"]),
            timeout_s=30,
            what="the chunk queued, waiting for the budget",
        )
        await page.evaluate("() => window.dispatchEvent(new HashChangeEvent('hashchange'))")
        await expect(waiting).to_contain_text("ida · chunk 2")
        assert len(await _unlabelled(page)) == 0, await _unlabelled(page)

        await page.get_by_label("Writer tokens a UTC day").fill("")
        await page.get_by_role("button", name="Save").click()
        await expect(page.locator("#budget-today")).to_contain_text("no daily budget")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 2, timeout_s=30)


async def test_the_tenants_embedder_is_moved_from_the_usage_page(
    page: Page, settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """The Usage page shows the tenant's embedder and moves it: the move under way is said, and once a
    worker has re-embedded the tenant the page names the new embedder."""
    from tests.integration.search.test_reembed import reversed_model
    from tests.support.fake_llm import FakeLLM

    with FakeLLM().in_thread() as server:
        server.embed_text = reversed_model
        moving = settings.model_copy(
            update={
                "tenant_embedders": ["openai"],
                "embedder_base_url": server.base_url,
                "embedder_switch_settle_s": 0.0,
            }
        )
        await add_memories(sessionmaker, tenant.tenant_id, "ida", ["The user lives in Bergen."])
        async with (
            live_api(moving) as base_url,
            httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http,
        ):
            await page.goto(f"{base_url}/admin/")
            await page.get_by_label("Admin API key").fill(tenant.admin_key)
            await page.keyboard.press("Enter")
            await expect(page.get_by_role("heading", name="Users")).to_be_visible()
            await page.get_by_role("link", name="Usage").click()
            await expect(page.get_by_role("heading", name="Usage")).to_be_visible()
            await expect(page.locator("#embedder-now")).to_contain_text("the deployment's embedder")
            # The view drawn once more as its reads come back would replace a field filled meanwhile.
            await page.wait_for_load_state("networkidle")
            field = page.get_by_label("Embedder (empty: the deployment's)")
            await field.fill("nope")
            await expect(field).to_have_value("nope")
            await page.get_by_role("button", name="Move").click()
            await expect(page.locator("#status")).to_contain_text("Unknown embedder 'nope'")

            await field.fill("openai")
            await page.get_by_role("button", name="Move").click()
            await expect(page.locator("#embedder-now")).to_contain_text("Moving to openai")
            assert len(await _unlabelled(page)) == 0, await _unlabelled(page)

            async with running_worker(moving):  # the worker's job carries the move out
                await wait_for(
                    lambda: http.get("/v1/admin/settings"),
                    lambda r: r.json()["embedder"] == "openai",
                    timeout_s=30,
                    what="the move done",
                )
            await page.get_by_role("link", name="Usage").click()
            await page.evaluate("() => window.dispatchEvent(new HashChangeEvent('hashchange'))")
            await expect(page.locator("#embedder-now")).to_contain_text("embedded by openai")
