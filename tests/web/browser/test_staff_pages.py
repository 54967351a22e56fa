"""The staff console and the models page in headless Chromium against the
server the README starts (``tests.web.browser``), at 1280 and 390 px (issue 35
items 2–5): staff find a renter's whole picture, a machine's and a device's,
quarantine a device with a reason its host then reads on the machine page,
release it; the admin reads in dollars and words; anyone reads the models
with their prices, context and the fleet's measured speed."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from ..conftest import MODEL, PASSWORD
from .pages import log_in, needs_chromium, page_check, until

pytestmark = needs_chromium

# the admin's #header (--header-bg in Django's admin/css/base.css)
ADMIN_HEADER = ("#header", "rgb(65, 118, 144)")
REASON = "Its answers to checks disagree with every other device of the model."


def staff_log_in(driver, url: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{url}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys("staff@example.com")
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    until(driver, lambda d: "/admin/login/" not in d.current_url, "staff logged in")


def test_staff_answer_questions_from_the_console(site, browser):
    stack, facts = site
    url, rig = stack.url, facts["rig_id"]
    # anyone: the models page
    shots = page_check(browser, f"{url}/models/", "models")
    row = browser.find_element(By.ID, f"model-{MODEL}")
    assert row.find_element(By.CSS_SELECTOR, ".online").text.startswith("1")
    assert row.find_element(By.CSS_SELECTOR, ".ttft").text.endswith(" ms")
    assert "/ 1M tokens" in row.find_element(By.CSS_SELECTOR, ".price-out").text
    assert row.find_element(By.CSS_SELECTOR, ".context").text.endswith(" tokens")

    staff_log_in(browser, url)
    shots += page_check(browser, f"{url}/staff/", "staff-fleet")
    online = f"#fleet-{MODEL} td[data-label='Devices online']"
    assert browser.find_element(By.CSS_SELECTOR, online).text == "1"
    # what the model has to check with (issue 31 item 4): its pool and verification
    pool = browser.find_element(By.CSS_SELECTOR, f"#fleet-{MODEL} td.pool").text
    assert "unused of" in pool and "reference engine" in pool
    verification = f"#fleet-{MODEL} td.verification"
    verifiers = browser.find_element(By.CSS_SELECTOR, verification).text
    assert "verifiers available" in verifiers
    # a renter's whole picture, found by email
    shots += page_check(browser, f"{url}/staff/find/?q=renter", "staff-find")
    browser.find_element(By.LINK_TEXT, "renter@example.com").click()
    until(browser, lambda d: d.find_elements(By.ID, "renter-balance"), "renter page")
    shots += page_check(browser, browser.current_url, "staff-renter")
    assert browser.find_element(By.ID, "renter-balance").text.startswith("$")
    keys = browser.find_element(By.ID, "renter-keys").text
    assert "my-app" in keys and "per day" in keys.lower()
    jobs = browser.find_element(By.ID, "renter-jobs").text
    assert "rig-1/" in jobs and "failed over" in jobs and "died_midstream" in jobs
    assert "Credit added" in browser.find_element(By.ID, "renter-credit").text

    # a machine's, then a device's: quarantined with a reason
    shots += page_check(browser, f"{url}/staff/machines/{rig}/", "staff-machine")
    assert browser.find_element(By.ID, "machine-seen").text == "live now"
    browser.find_element(By.CSS_SELECTOR, "#machine-devices a").click()
    until(browser, lambda d: d.find_elements(By.ID, "decide"), "device page")
    device_url = browser.current_url
    shots += page_check(browser, device_url, "staff-device")
    form = browser.find_element(By.ID, "decide")
    form.find_element(By.NAME, "reason").send_keys(REASON)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(browser, lambda d: "was emailed why" in d.page_source, "quarantined")
    assert "quarantined" in browser.find_element(By.ID, "device-state").text
    assert REASON in browser.find_element(By.ID, "device-decisions").text
    # staff read the host's own page, without its controls
    shots += page_check(browser, f"{url}/machines/{rig}/", "staff-host-machine")
    assert not browser.find_elements(By.ID, "machine-settings")

    # the admin: dollars, words, records read-only
    shots += page_check(browser, f"{url}/admin/", "admin-index", styled=ADMIN_HEADER)
    index = browser.find_element(By.ID, "content").text
    assert "Entries" in index and "Failed capabilities" in index
    shots += page_check(
        browser, f"{url}/admin/jobs/job/", "admin-jobs", styled=ADMIN_HEADER
    )
    assert "$0.0000" in browser.find_element(By.ID, "result_list").text
    shots += page_check(
        browser, f"{url}/admin/hosts/machine/", "admin-machines", styled=ADMIN_HEADER
    )
    assert "live now" in browser.find_element(By.ID, "result_list").text

    # the host reads why on its machine page
    browser.delete_all_cookies()
    log_in(browser, url, "host@example.com")
    shots += page_check(browser, f"{url}/machines/{rig}/", "machine-quarantined")
    notice = browser.find_element(By.ID, "decision-0").text
    assert "Ballast staff quarantined " in notice and REASON in notice

    # released, with a reason
    staff_log_in(browser, url)
    browser.get(device_url)
    form = browser.find_element(By.ID, "decide")
    form.find_element(By.NAME, "reason").send_keys("Checked by hand: it answers right.")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(browser, lambda d: "released from quarantine" in d.page_source, "released")
    assert "in service" in browser.find_element(By.ID, "device-state").text
    print("\nscreenshots:", *shots, sep="\n  ")
