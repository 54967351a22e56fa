"""A renter's pages in headless Chromium against the server the README starts
(``tests.web.browser``): every page styled, without console errors or failed
requests, fitting a phone; the spend chart drawn, a credit code redeemed, the
job log filtered, the statement's CSV; staff topping the renter up in the
admin."""

from __future__ import annotations

from ..conftest import PASSWORD
from .pages import log_in, needs_chromium, page_check, until

pytestmark = needs_chromium

# the admin's #header (--header-bg in Django's admin/css/base.css)
ADMIN_HEADER = ("#header", "rgb(65, 118, 144)")
# the status and text of a GET from the page (the browser's own session)
FETCH_TEXT = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.text().then(t => done(r.status + '\\n' + t)));
"""


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
