"""A real browser on the Coordination page: an operator finds who holds a key, then its timeline.

Playwright for Python drives Debian's Chromium (``/usr/bin/chromium``, headless) against
pytest-django's live server. A real execution waits inside its ``charge`` step in a thread,
holding ``acct:<n>`` in real Redis, while the browser logs in as staff, reads the Coordination
page and opens the key's timeline. Screenshots go to ``test-artifacts/``.

In CI (``CI`` set) a missing Chromium fails the test; locally it skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from reactor_app.coordination.state import lock_state
from reactor_app.models import ContentionState, Execution
from reactor_app.status import ExecutionStatus
from tests.api.holding import PaymentReactor, ShopSyncReactor, running

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: milliseconds Playwright waits for a page or an element
TIMEOUT_MS = 15_000

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (make browser-deps installs Debian's chromium)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    # Playwright's sync API keeps an asyncio loop in this thread; the ORM calls the test makes
    # between browser steps are ordinary synchronous code, not async-unsafe ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()
            # The test's ORM calls ran beside Playwright's event loop, under a connection of
            # their own: close it, or the test database cannot be dropped at the end.
            connections.close_all()


COORDINATION = "/admin/reactor_app/coordination/"


def park_behind(holder_id: str, key: str) -> Execution:
    """A parked execution as the worker leaves it, blocked by ``holder_id`` on ``key``."""
    waiting = Execution.objects.start(
        reactor=PaymentReactor.path(),
        inputs={"account_id": 31},
        status=ExecutionStatus.PARKED,
        current_step="charge",
    )
    lock = lock_state(key)
    ContentionState.objects.create(
        execution=waiting,
        step="charge",
        primitive="lock",
        key=key,
        attempts=2,
        next_attempt_at=timezone.now() + timedelta(seconds=4),
        blocker={
            "owner": lock.owner,
            "execution": holder_id,
            "step": lock.step,
            "since": lock.acquired_at,
            "ttl": lock.ttl,
        },
    )
    return waiting


def test_operator_finds_the_holder_of_a_key_and_its_timeline(
    live_server: Any, django_user_model: Any, browser_page: Any
) -> None:
    django_user_model.objects.create_superuser("operator", "op@example.com", "secret-pw")
    page = browser_page

    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "secret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")

    with (
        running(PaymentReactor, "browser", account_id=31) as payment,
        running(ShopSyncReactor, "browser-shop", shop_id=32) as shop,
    ):
        # from the admin index to the Coordination page, as an operator would go
        page.click('#content-main a:text-is("Coordination")')
        page.wait_for_url("**/admin/reactor_app/coordination/")
        row = page.locator('#holds-table tr[data-key="acct:31"]')
        row.wait_for()
        assert row.locator("td.reactor-key").inner_text() == "acct:31"
        assert row.locator("td.hold-step").inner_text() == "charge"
        link = row.locator("a.execution-link")
        assert link.inner_text() == payment.execution_id
        expected = reverse("admin:reactor_app_execution_change", args=[payment.execution_id])
        assert link.get_attribute("href") == expected
        assert "step" in row.locator(".reactor-level").inner_text()
        # the reactor-level hold of another execution, beside it
        shop_row = page.locator('#holds-table tr[data-key="shop:32"]')
        assert shop_row.locator("td.hold-step").inner_text() == "reactor"
        assert shop_row.locator("a.execution-link").inner_text() == shop.execution_id
        page.screenshot(path=str(ARTIFACTS / "coordination-page.png"), full_page=True)

        # the holder's execution page, one click away
        link.click()
        page.wait_for_url(f"**{expected}")
        assert "running" in page.locator(".reactor-status").first.inner_text()
        page.screenshot(path=str(ARTIFACTS / "execution-page.png"), full_page=True)

        # a parked execution waiting on that key reads as parked, with its blocker
        waiting = park_behind(payment.execution_id, "acct:31")
        page.goto(f"{live_server.url}/admin/reactor_app/parkedexecution/")
        parked_row = page.locator("#result_list tbody tr", has_text="acct:31")
        assert "parked" in parked_row.locator(".reactor-status").inner_text()
        assert parked_row.locator(f'a[href="{expected}"]').count() == 1  # blocked by
        waiting_url = reverse("admin:reactor_app_execution_change", args=[waiting.pk])
        assert parked_row.locator(f'a[href="{waiting_url}"]').count() == 1
        assert "(charge) since" in parked_row.inner_text()
        page.screenshot(path=str(ARTIFACTS / "parked-executions.png"), full_page=True)
        page.goto(f"{live_server.url}{COORDINATION}")

        # the key's timeline: the hold is drawn while it is still held
        page.locator('#holds-table tr[data-key="acct:31"] a', has_text="timeline").click()
        page.wait_for_url("**/coordination/timeline/?key=acct%3A31*")
        assert page.locator("#timeline-key").inner_text() == "acct:31"
        page.click(".reactor-periods >> text=5 min")
        page.wait_for_url("**/coordination/timeline/?key=acct%3A31&minutes=5")
        svg = page.locator("svg.reactor-timeline")
        svg.wait_for()
        assert svg.locator("g.bar.hold").count() == 1
        assert "step charge" in svg.locator("text.lane-label").first.text_content()
        assert page.locator('#holding-table tr[data-key="acct:31"]').count() == 1
        page.screenshot(path=str(ARTIFACTS / "timeline-held.png"), full_page=True)

    assert payment.outcome["result"].ok and shop.outcome["result"].ok
    # after the release the timeline shows the closed bar and the history
    page.reload()
    page.locator("svg.reactor-timeline").wait_for()
    assert page.locator("svg.reactor-timeline g.bar.hold").count() == 1
    assert page.locator("tr.event-released").count() == 1
    assert page.locator("#holding-table").inner_text().count("No live holds.") == 1
    page.screenshot(path=str(ARTIFACTS / "timeline-released.png"), full_page=True)
    assert Execution.objects.get(pk=payment.execution_id).status == "succeeded"


def test_operator_finds_one_holder_among_ten_thousand_holds_through_the_search_box(
    live_server: Any, django_user_model: Any, browser_page: Any
) -> None:
    """At 10,000 live holds the page shows one page of them, and the search box finds the one
    key the operator asks about (the live-holds index answers; nothing scans every key)."""
    from reactor_app.coordination.admission import Coordinator
    from reactor_app.coordination.claims import Admitted, Holder, LockClaim

    coordinator = Coordinator()
    crowd = Holder(owner="crowd", reactor="tests.browser.Crowd")
    for n in range(10_000):
        assert isinstance(coordinator.admit([LockClaim(f"crowd:{n}", ttl=300)], crowd), Admitted)
    needle = Holder(owner="needle-owner", step="charge", reactor="tests.browser.Needle")
    assert isinstance(coordinator.admit([LockClaim("needle:42", ttl=300)], needle), Admitted)

    django_user_model.objects.create_superuser("operator", "op@example.com", "secret-pw")
    page = browser_page
    page.goto(f"{live_server.url}/admin/login/?next={COORDINATION}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "secret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{COORDINATION}")

    rows = page.locator("#holds-table tbody tr[data-key]")
    assert 0 < rows.count() <= 50  # one page, not ten thousand rows
    assert len(page.content()) < 200 * 1024

    page.fill("#id_q", "needle:")
    page.click("#hold-search input[type=submit]")
    found = page.locator('#holds-table tr[data-key="needle:42"]')
    found.wait_for()
    assert rows.count() == 1
    assert found.locator("td.hold-step").inner_text() == "charge"
    assert "needle-owner" in found.inner_text()
    page.screenshot(path=str(ARTIFACTS / "coordination-search.png"), full_page=True)
