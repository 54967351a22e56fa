"""What the browser tests share: Chromium found (or the tests skipped), the
waiting, logging in, screenshots, and the check every page must pass (styled, no
console error, no failed request, and at 1280 px and at 390 px: no sideways
scroll of the page, no box scrolling sideways, no text cut)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from ballast.stack import ROOT

from ..conftest import MODEL, PASSWORD

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# every browser test's pytestmark
needs_chromium = pytest.mark.skipif(
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
# the scripted engine of the agents the tests start
SCRIPT = json.dumps({"text": "The answer is 4.", "models": [MODEL]})


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

# boxes that scroll sideways (a strip of table whose columns are off-screen)
# and text cut by its box (overflow hidden or an ellipsis): a command or a
# token in a <pre>/<code> may scroll inside its own box, nothing else
SIDEWAYS = """
const cut = [];
for (const e of document.querySelectorAll('main *, header *, #content *')) {
  if (e.closest('pre, code, textarea, input, select, svg')) continue;
  // Django admin's own lists scroll inside their box on a phone (its CSS);
  // on a desktop every column shows
  if (e.closest('#changelist .results') && window.innerWidth < 768) continue;
  const s = getComputedStyle(e);
  if (s.display === 'none' || s.visibility === 'hidden') continue;
  // a box of a pixel or two is one for screen readers only (visually hidden)
  if (e.scrollWidth <= e.clientWidth + 1 || e.clientWidth <= 2) continue;
  const scrolls = s.overflowX === 'auto' || s.overflowX === 'scroll';
  const clips = s.overflowX === 'hidden' || s.overflowX === 'clip' ||
                s.textOverflow === 'ellipsis';
  if (scrolls || clips) {
    cut.push((scrolls ? 'scrolls: ' : 'cut: ') + e.tagName.toLowerCase() +
             (e.id ? '#' + e.id : '') + ' ' + e.textContent.trim().slice(0, 40));
  }
}
return cut.slice(0, 8);
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
    shots = []
    for width in (1280, 390):
        shots.append(screenshot(driver, name, width))
        wide = driver.execute_script(OVERFLOWING)
        assert wide == [], f"{name}: wider than {width} px: {wide}"
        cut = driver.execute_script(SIDEWAYS)
        assert cut == [], f"{name} at {width} px: {cut}"
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return shots
