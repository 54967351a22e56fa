"""Browser tests in headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) against a live server: a host logs in, watches a machine go
offline and come back on the dashboard without a reload (htmx), and opens the
machine page with a failed capability and a benchmark.

Set ``BALLAST_SCREENSHOTS_DIR`` to save screenshots of the main pages there
(``docs/screenshots/`` keeps them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hosts.models import Machine
from hosts.services import machine_disconnect

from .conftest import PASSWORD, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (./dev installs them as root)",
)

WAIT_S = 20  # the dashboard polls every 3 s


def retry_locked(write, attempts: int = 50):
    """Run a write from the test thread, retrying while the live server reads.

    The SQLite test database is a shared-cache in-memory one, which answers
    "table is locked" at once instead of waiting; PostgreSQL never needs a retry.
    """
    import time

    from django.db import OperationalError

    for attempt in range(attempts):
        try:
            return write()
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.1)


@pytest.fixture
def browser():
    """A headless Chromium with a throwaway profile; quit after the test."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="ballast-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(
        service=Service(executable_path=CHROMEDRIVER), options=options
    )
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shoot(driver, name: str, height: int | None = None) -> None:
    """Save a screenshot when BALLAST_SCREENSHOTS_DIR is set (full page height if asked)."""
    folder = os.environ.get("BALLAST_SCREENSHOTS_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    if height is None:
        driver.set_window_size(1280, 4000)
        height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 140, 4000)))
    driver.save_screenshot(str(Path(folder) / f"{name}.png"))
    driver.set_window_size(1280, 900)


def history_make(machine) -> None:
    """A week of score samples, earnings over several days and a failed-over job."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import Earning
    from hosts.models import ScoreSample
    from jobs.models import Attempt

    from .conftest import attempt_make

    device = machine.devices.get()
    now = timezone.now()
    scores = [
        60,
        61,
        63,
        62,
        66,
        70,
        72,
        71,
        58,
        49,
        52,
        57,
        63,
        68,
        74,
        77,
        79,
        80,
        81,
        81,
    ]
    ScoreSample.objects.bulk_create(
        ScoreSample(
            device=device,
            score=s,
            taken_at=now - timedelta(hours=8 * (len(scores) - i)),
        )
        for i, s in enumerate(scores)
    )
    for days, nano in [
        (1, 41_000),
        (2, 29_500),
        (3, 52_300),
        (5, 18_000),
        (6, 36_400),
        (9, 12_000),
    ]:
        attempt = attempt_make(
            device, renter=machine.owner, earn_nano=nano, tokens=nano // 160
        )
        Earning.objects.filter(attempt=attempt).update(
            created_at=now - timedelta(days=days), status=Earning.Status.RELEASED
        )
    first = attempt_make(
        device, renter=machine.owner, outcome="died_midstream", failed_over=True
    )
    Attempt.objects.create(
        job=first.job,
        device=device,
        kind=Attempt.Kind.CONTINUATION,
        state=Attempt.State.ENDED,
        outcome="succeeded",
        claim_deadline=now,
        output_chars=90,
        tokens_billed=22,
    )


def wait_for(driver, by: str, value: str):
    """The element, once the page that has it has loaded (up to WAIT_S)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(by, value))[0]


def log_in(driver, live_server, email: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{live_server.url}/accounts/login/")
    driver.find_element(By.NAME, "username").send_keys(email)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(driver, By.ID, "machine-rows")


def row_status(driver, machine) -> str:
    """The machine row's ``data-status``, read again when htmx swapped the row
    between finding and reading it (a stale element)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(5):
        try:
            return driver.find_element(By.ID, f"machine-{machine.id}").get_attribute(
                "data-status"
            )
        except StaleElementReferenceException:
            continue
    raise AssertionError("the machine's row kept being replaced")


def test_it_shows_a_machine_go_offline_and_back_without_reload(
    browser, live_server, owner, busy_machine
):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    log_in(browser, live_server, owner.email)
    WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url.endswith("/machines/"))
    assert row_status(browser, busy_machine) == "online"
    assert browser.execute_script("return typeof htmx") == "object", "htmx did not load"
    browser.execute_script("window.__notReloaded = true")
    shoot(browser, "dashboard")

    retry_locked(
        lambda: machine_disconnect(
            machine_id=busy_machine.id, channel_name=busy_machine.channel_name
        )
    )
    WebDriverWait(browser, WAIT_S).until(
        lambda d: row_status(d, busy_machine) == "offline"
    )
    assert browser.execute_script("return window.__notReloaded === true")
    # htmx swaps the row every few seconds: an element found may go stale before
    # it is read, so the badge is read inside a wait that tolerates that
    badge = f"#machine-{busy_machine.id} .badge"
    WebDriverWait(
        browser, WAIT_S, ignored_exceptions=[StaleElementReferenceException]
    ).until(lambda d: d.find_element(By.CSS_SELECTOR, badge).text == "offline")

    retry_locked(lambda: connect(Machine.objects.get(id=busy_machine.id)))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: row_status(d, busy_machine) == "online"
    )
    assert browser.execute_script("return window.__notReloaded === true")

    browser.find_element(By.LINK_TEXT, "rig-1").click()
    wait_for(browser, By.ID, "failed-capabilities")
    failed = browser.find_element(By.ID, "failed-capabilities").text
    assert "llama-3.1-70b" in failed and "CUDA error: out of memory" in failed
    bench = browser.find_element(By.ID, "benchmarks").text
    assert "142.5" in bench and "256 MiB (estimate)" in bench
    shoot(browser, "machine")


def test_it_takes_screenshots_of_the_other_pages(
    browser, live_server, owner, busy_machine, renter
):
    """Renter overview, job log, support ticket, registration with the token shown once."""
    if not os.environ.get("BALLAST_SCREENSHOTS_DIR"):
        pytest.skip("set BALLAST_SCREENSHOTS_DIR to take screenshots")
    from django.contrib.auth import get_user_model
    from selenium.webdriver.common.by import By

    from jobs.models import Job
    from support.services import ticket_open, ticket_reply

    Job.objects.update(renter=owner)
    history_make(busy_machine)
    ticket = ticket_open(
        author=owner,
        subject="rig-1 shows offline but the agent runs",
        body="The agent prints 'connected' but the dashboard says offline.",
    )
    staff = get_user_model().objects.create_user(
        username="staff@ballast", email="staff@ballast", is_staff=True
    )
    ticket_reply(
        ticket=ticket,
        author=staff,
        body="Your agent could not reach us through the proxy. Set HTTPS_PROXY and restart it.",
    )

    browser.get(f"{live_server.url}/accounts/login/")
    shoot(browser, "login", height=600)
    log_in(browser, live_server, owner.email)
    browser.find_element(By.NAME, "name").send_keys("gaming-pc")
    browser.find_element(By.NAME, "region").send_keys("eu")
    browser.find_element(
        By.CSS_SELECTOR, "form[action='/machines/new/'] button"
    ).click()
    wait_for(browser, By.ID, "agent-command")
    shoot(browser, "machine-registered", height=900)
    browser.get(f"{live_server.url}/renter/")
    browser.find_element(By.NAME, "name").clear()
    browser.find_element(By.NAME, "name").send_keys("my-app")
    browser.find_element(By.CSS_SELECTOR, "form[action='/renter/keys/'] button").click()
    wait_for(browser, By.ID, "new-key")
    shoot(browser, "renter-keys")
    browser.get(f"{live_server.url}/renter/jobs/")
    shoot(browser, "renter-jobs")
    browser.get(f"{live_server.url}/support/{ticket.id}/")
    shoot(browser, "support-ticket")
    browser.get(f"{live_server.url}/machines/{busy_machine.id}/")
    shoot(browser, "machine-with-history")
