"""Browser tests in headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) against the server the README starts: ``uvicorn
ballast.asgi:application`` (``ballast.stack.Stack``) with ``DJANGO_DEBUG=0``, its
own database, the static files ``collectstatic`` made, and a real agent (scripted
engine) connected. Not pytest-django's ``live_server``, which serves static files
itself and so hid that the real server served none.

Every page a host and a renter use is loaded and must show no console error and no
failed request, have its stylesheet applied (a computed style), and not overflow
sideways at 390 px. Screenshots of each at 1280 px and 390 px wide (full page) are
kept in ``var/screenshots/`` (or ``BALLAST_SCREENSHOTS_DIR``); the path is printed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from ballast.stack import ROOT, Stack
from tests.e2e.conftest import e2e_env  # noqa: F401 - the site's own database

from .conftest import MODEL, PASSWORD

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (./dev test installs them as root)",
)

POLL_S = 3.0  # the live tables' hx-trigger="every 3s"
WAIT_S = 20
SCREENSHOTS = Path(
    os.environ.get("BALLAST_SCREENSHOTS_DIR") or ROOT / "var" / "screenshots"
)
# header.top's background (#14213d in static/ballast.css): the stylesheet applied
HEADER_BACKGROUND = "rgb(20, 33, 61)"
# the timeline's online stretches (svg.day-bar .on) and the waiting box's border
# (--accent) in static/ballast.css
ONLINE_FILL = "rgb(45, 164, 78)"
ACCENT = "rgb(36, 87, 197)"
# the admin's #header (--header-bg in Django's admin/css/base.css)
ADMIN_HEADER = ("#header", "rgb(65, 118, 144)")
SCRIPT = json.dumps({"text": "The answer is 4.", "models": [MODEL]})


def world(env: dict[str, str], *args: str) -> dict:
    """Run a phase of ``tests.web.browser_world`` against the site's database."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.web.browser_world", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def site(e2e_env, tmp_path):  # noqa: F811 - the fixture imported above
    """The README's server with the browser world in it and rig-1's agent running.

    Yields ``(stack, facts)``: facts from ``browser_world`` (ids, token, API key,
    the renter's job ids after three real completions)."""
    env = {
        **e2e_env,
        "DJANGO_DEBUG": "0",
        "BALLAST_STATIC_ROOT": str(settings.STATIC_ROOT),
        "BALLAST_SPOT_CHECKS": "0",
    }
    with Stack(env=env, log_dir=tmp_path / "logs") as stack:
        stack.migrate()
        stack.start_coordinator()
        facts = world(env, "people")
        stack.start_agent(
            "rig-1", facts["token"], "--engine", "scripted", "--script", SCRIPT
        )
        stack.wait_for_capacity(facts["api_key"], MODEL, timeout_s=60)
        for question in ("What is 2+2?", "And 3+3?", "Name a colour."):
            answer = httpx.post(
                stack.url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {facts['api_key']}"},
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": question}],
                },
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
        facts.update(world(env, "history", facts["rig_id"]))
        yield stack, facts


@pytest.fixture
def browser():
    """A headless Chromium with a throwaway profile, its console kept; quit after."""
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(executable_path=CHROMEDRIVER), options=options
    )
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def until(driver, check, what: str, timeout_s: float = WAIT_S):
    """Wait for ``check(driver)`` (Selenium's wait: it polls the page); its value."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(
        driver, timeout_s, ignored_exceptions=[StaleElementReferenceException]
    ).until(check, what)


def log_in(driver, url: str, email: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/accounts/login/")
    driver.find_element(By.NAME, "username").send_keys(email)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    until(driver, lambda d: "/accounts/login/" not in d.current_url, "logged in")


def screenshot(driver, name: str, width: int) -> Path:
    """A full-page screenshot at ``width`` CSS px (Chromium's device metrics)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600},
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}-{width}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


OVERFLOWING = """
const width = document.documentElement.clientWidth;
if (document.documentElement.scrollWidth <= width) return [];
return [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > width + 1)
  .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
            (e.className && e.className.baseVal === undefined ? '.' + e.className : ''))
  .slice(0, 8);
"""

FAILED_REQUESTS = """
return performance.getEntriesByType('navigation').concat(
         performance.getEntriesByType('resource'))
  .filter(e => e.responseStatus >= 400)
  .map(e => e.responseStatus + ' ' + e.name);
"""


def page_check(
    driver,
    url: str,
    name: str,
    *,
    status_ok: bool = True,
    styled: tuple[str, str] = ("header.top", HEADER_BACKGROUND),
) -> list[Path]:
    """Load ``url``; assert it is styled, without console errors or failed requests,
    and fits 390 px; return its screenshots (1280 px and 390 px)."""
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.get(url)
    until(
        driver,
        lambda d: d.execute_script("return document.readyState") == "complete",
        f"{name} loaded",
    )
    selector, background = styled
    style = driver.execute_script(
        "return getComputedStyle(document.querySelector(arguments[0])).backgroundColor",
        selector,
    )
    assert style == background, f"{name}: the stylesheet did not apply ({style})"
    if status_ok:
        assert driver.execute_script(FAILED_REQUESTS) == [], f"{name}: failed requests"
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if not status_ok:  # the page's own 404 is the one error it may show
        errors = [
            e for e in errors if "the server responded with a status of 404" not in e
        ]
    assert errors == [], f"{name}: console errors"
    shots = [screenshot(driver, name, 1280), screenshot(driver, name, 390)]
    assert driver.execute_script(OVERFLOWING) == [], f"{name}: wider than 390 px"
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return shots


# the status and text of a GET from the page (the browser's own session)
FETCH_TEXT = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.text().then(t => done(r.status + '\\n' + t)));
"""


def row_status(driver, machine_id: str) -> str:
    return driver.execute_script(
        "const r = document.getElementById(arguments[0]);return r && r.dataset.status;",
        f"machine-{machine_id}",
    )


def test_a_host_s_pages_are_styled_live_and_fit_a_phone(site, browser):
    stack, facts = site
    url, rig = stack.url, facts["rig_id"]
    shots = page_check(browser, f"{url}/", "home")
    shots += page_check(browser, f"{url}/accounts/login/", "login")
    log_in(browser, url, "host@example.com")
    shots += page_check(browser, f"{url}/machines/", "machines")
    assert browser.execute_script("return typeof htmx") == "object", "htmx did not load"
    assert row_status(browser, rig) == "online"
    shots += page_check(browser, f"{url}/machines/{rig}/", "machine")
    text = browser.find_element("id", "failed-capabilities").text
    assert "CUDA error: out of memory" in text
    machine_page_is_what_a_host_looks_for(browser)
    shots += page_check(browser, f"{url}/machines/{facts['long_id']}/", "machine-new")
    assert browser.find_element("id", "waiting").is_displayed()
    shots += page_check(browser, f"{url}/machines/new/", "machine-register")
    shots += page_check(browser, f"{url}/billing/earnings/", "earnings")
    shots += page_check(browser, f"{url}/support/", "support")
    shots += page_check(browser, f"{url}/support/{facts['ticket_id']}/", "ticket")
    shots += page_check(browser, f"{url}/no/such/page/", "not-found", status_ok=False)
    shots += a_new_machine_connects_then_is_renamed_and_retired(browser, stack, facts)
    print("\nscreenshots:", *shots, sep="\n  ")

    # the live table: the agent stops, the row flips by itself within one poll
    browser.get(f"{url}/machines/")
    until(browser, lambda d: row_status(d, rig) == "online", "rig-1 online")
    browser.execute_script("window.__notReloaded = true")
    stack.kill("rig-1")
    killed = time.monotonic()
    until(browser, lambda d: row_status(d, rig) == "offline", "rig-1 offline")
    took = time.monotonic() - killed
    assert took <= POLL_S + 1.0, f"the row flipped after {took:.1f} s"
    assert browser.execute_script("return window.__notReloaded === true")
    badge = f"#machine-{rig} .badge"
    until(
        browser,
        lambda d: d.find_element("css selector", badge).text == "offline",
        "offline badge",
    )

    # the session ends: the next poll sends the browser to log in, not into the table
    browser.delete_cookie("sessionid")
    until(browser, lambda d: "/accounts/login/" in d.current_url, "sent to log in")
    assert browser.current_url.endswith("/accounts/login/?next=%2Fmachines%2F")
    assert browser.find_elements("id", "machine-rows") == []


def style(driver, selector: str, prop: str) -> str:
    """The computed CSS ``prop`` of the first element matching ``selector``."""
    return driver.execute_script(
        "return getComputedStyle(document.querySelector(arguments[0]))"
        ".getPropertyValue(arguments[1])",
        selector,
        prop,
    )


CUT_OFF = """
const width = document.documentElement.clientWidth;
return [...document.querySelectorAll(arguments[0])]
  .filter(e => e.getBoundingClientRect().right > width + 1 ||
               e.getBoundingClientRect().left < -1)
  .map(e => (e.dataset.label || e.tagName) + ': ' + e.textContent.trim().slice(0, 30));
"""


def cells_fit_a_phone(driver, selector: str) -> None:
    """At 390 px, every cell matching ``selector`` is on screen: a table of
    ``class="stack"`` shows one card per row, not a strip that scrolls sideways
    and hides the columns a host looks for (issue 24)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 390, "height": 900, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        assert driver.find_elements("css selector", selector), selector
        assert driver.execute_script(CUT_OFF, selector) == [], selector
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def machine_page_is_what_a_host_looks_for(driver) -> None:
    """rig-1's page (loaded): the online timeline drawn and styled from its nine
    days of history, live VRAM, a died segment saying why it earned nothing, and
    no spot check told apart from a job."""
    days = driver.find_elements("css selector", "#uptime-timeline .day[data-day]")
    assert len(days) == 10, "registered nine days ago: ten UTC days"
    assert style(driver, "#uptime-timeline rect.on", "fill") == ONLINE_FILL
    bar = driver.find_element("css selector", "#uptime-timeline svg.day-bar")
    assert bar.size["width"] > 200 and bar.size["height"] >= 10
    shares = [d.get_attribute("data-share") for d in days]
    assert shares[5] == "0.0000", "the day it was away is all offline"
    assert 0.5 < float(shares[1]) < 1, "a day with a night off"
    vram = driver.find_element("id", "vram-0").text
    assert " of " in vram and vram.endswith("MiB")
    jobs = driver.find_element("id", "recent-jobs").text
    assert "the stream died mid-answer" in jobs
    # a job is never labelled a spot check, and no passed check is listed
    # (issue 22: only failures, which the host is told of, are shown)
    assert "spot check" not in jobs.lower() and "canary" not in jobs.lower()
    assert not driver.find_elements("css selector", "table.spot-checks")
    cells_fit_a_phone(driver, "#devices td, #recent-jobs td")


def a_new_machine_connects_then_is_renamed_and_retired(driver, stack, facts):
    """The long-named machine's page waits for its first heartbeat; its agent
    starts and the box goes by itself (no reload) within a poll of the heartbeat;
    the host renames it, then retires it, and finds it listed apart. Returns the
    screenshots taken."""
    from selenium.webdriver.common.by import By

    url, long_id = stack.url, facts["long_id"]
    driver.get(f"{url}/machines/{long_id}/")
    assert style(driver, "#waiting", "border-top-color") == ACCENT
    waiting = driver.find_element("id", "waiting").text
    assert "Waiting for the first heartbeat" in waiting
    driver.execute_script("window.__notReloaded = true")
    stack.start_agent(
        "long", facts["long_token"], "--engine", "scripted", "--script", SCRIPT
    )
    stack.wait_for_capacity(facts["api_key"], MODEL, devices=2, timeout_s=60)
    live = time.monotonic()
    until(driver, lambda d: not d.find_elements("id", "waiting"), "waiting box gone")
    took = time.monotonic() - live
    assert took <= POLL_S + 1.0, f"the box went {took:.1f} s after the heartbeat"
    assert driver.execute_script("return window.__notReloaded === true")
    assert driver.find_element("id", "machine-status").text == "online"
    assert driver.find_elements("id", "device-0")
    shots = page_check(driver, f"{url}/machines/{long_id}/", "machine-connected")

    form = driver.find_element("id", "machine-rename")
    name = form.find_element(By.NAME, "name")
    name.clear()
    name.send_keys("rig-1")  # taken: refused, said so
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(
        driver,
        lambda d: "Not renamed" in d.find_element("css selector", "ul.messages").text,
        "a taken name refused",
    )
    form = driver.find_element("id", "machine-rename")
    name = form.find_element(By.NAME, "name")
    name.clear()
    name.send_keys("living-room-pc")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(
        driver,
        lambda d: d.find_element("css selector", "h1").text == "living-room-pc",
        "renamed",
    )

    form = driver.find_element("id", "machine-retire")
    form.find_element(By.NAME, "confirm").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(driver, lambda d: d.current_url.endswith("/machines/"), "back to machines")
    retired = driver.find_element("id", "retired-machines").text
    assert "living-room-pc" in retired
    assert "living-room-pc" not in driver.find_element("id", "machine-rows").text
    stack.kill("long")  # refused from now on: it would only retry
    shots += page_check(driver, f"{url}/machines/", "machines-retired")
    cells_fit_a_phone(driver, "#machine-rows td, #retired-machines td")
    return shots


def test_a_renter_s_pages_are_styled_and_fit_a_phone(site, browser):
    from selenium.webdriver.common.by import By

    stack, facts = site
    url = stack.url
    log_in(browser, url, "renter@example.com")
    shots = page_check(browser, f"{url}/renter/", "renter")
    # the spend chart is drawn: bars of the days with charges have a height
    bars = browser.execute_script(
        "return [...document.querySelectorAll('#spend-chart rect.bar')]"
        ".map(r => [r.getBoundingClientRect().height, r.textContent])"
    )
    assert len(bars) == 30 and sum(h > 0 for h, _ in bars) >= 3, bars
    assert max(bars)[1].endswith(": $0.04"), max(bars)  # 41,000,000 nano-USD
    assert "per day (UTC)" in browser.find_element(By.ID, "api-keys").text

    # a credit code, redeemed from the page, shows in the balance
    browser.find_element(By.CSS_SELECTOR, "#redeem input[name=code]").send_keys(
        facts["code"]
    )
    browser.find_element(By.CSS_SELECTOR, "#redeem button[type=submit]").click()
    until(browser, lambda d: "$2.00 added" in d.page_source, "code redeemed")
    assert browser.find_element(By.ID, "balance").text.startswith("$6.9")

    shots += page_check(browser, f"{url}/renter/jobs/", "renter-jobs")
    filtered = f"{url}/renter/jobs/?status=succeeded&key={facts['key_id']}"
    shots += page_check(browser, filtered, "renter-jobs-filtered")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert len(rows) == 3, [r.text for r in rows]  # the three real completions
    assert all("my-app" in r.text and " ms" in r.text for r in rows)
    shots += page_check(
        browser, f"{url}/renter/jobs/{facts['job_ids'][0]}/", "renter-job"
    )
    shots += page_check(browser, f"{url}/billing/statement/", "statement")
    csv_text = browser.execute_async_script(FETCH_TEXT, f"{url}/billing/statement.csv")
    status, header, *lines = csv_text.splitlines()
    assert status == "200" and header.startswith("time_utc,type,description")
    assert any("Credit added: credit code WELCOME-2026" in line for line in lines)
    assert any(",charge," in line and "my-app" in line for line in lines)
    shots += page_check(
        browser, f"{url}/admin/login/", "admin-login", styled=ADMIN_HEADER
    )

    # staff top the renter up in the admin, with a reason
    browser.delete_all_cookies()
    browser.get(f"{url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("staff@example.com")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    until(browser, lambda d: "/admin/login/" not in d.current_url, "staff logged in")
    credit = f"{url}/admin/billing/rentercredit/"
    shots += page_check(browser, credit, "admin-credit-list", styled=ADMIN_HEADER)
    browser.find_element(By.LINK_TEXT, "renter@example.com").click()
    until(browser, lambda d: d.find_elements(By.ID, "credit-adjust"), "credit page")
    shots += page_check(
        browser, browser.current_url, "admin-credit", styled=ADMIN_HEADER
    )
    browser.find_element(By.NAME, "amount_usd").send_keys("3")
    browser.find_element(By.NAME, "reason").send_keys("paid by bank transfer")
    browser.find_element(By.CSS_SELECTOR, "#credit-adjust input[type=submit]").click()
    until(browser, lambda d: "Added $3.00" in d.page_source, "topped up")
    assert browser.find_element(By.ID, "credit-balance").text.startswith("$9.9")
    assert "paid by bank transfer" in browser.find_element(By.ID, "credit-entries").text
    shots += page_check(
        browser, f"{url}/admin/billing/creditcode/", "admin-codes", styled=ADMIN_HEADER
    )
    print("\nscreenshots:", *shots, sep="\n  ")
