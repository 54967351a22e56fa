"""Fixtures of the browser tests: the README's server with the browser world in it
(``site``), and a headless Chromium (``browser``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import httpx
import pytest
from django.conf import settings

from ballast.stack import ROOT, Stack
from tests.e2e.conftest import e2e_env  # noqa: F401 - the site's own database

from ..conftest import MODEL
from .pages import CHROMEDRIVER, CHROMIUM, SCRIPT


def world(env: dict[str, str], *args: str) -> dict:
    """Run a phase of ``tests.web.browser.world`` against the site's database."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.web.browser.world", *args],
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

    Yields ``(stack, facts)``: facts from ``tests.web.browser.world`` (ids, token, API key,
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
