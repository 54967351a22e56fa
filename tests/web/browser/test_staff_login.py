"""Staff sign in the README's way (issue 35 item 1): ``BALLAST_DEV=1 ./dev manage
createsuperuser`` on a terminal asks for a username, an email address and a
password; the admin's login page in Chromium takes that username (``staff``:
not an email, which an ``type=email`` field would refuse before sending)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import termios
import time

from selenium.webdriver.common.by import By

from ballast.stack import ROOT
from tests.e2e.conftest import stack  # noqa: F401 - the README's server

from .pages import needs_chromium, until

pytestmark = needs_chromium

PASSWORD = "a long staff passphrase 42"
# createsuperuser's prompts, in order, and what staff type
ANSWERS = (
    ("Username", "staff"),
    ("Email address", "staff@example.com"),
    ("Password:", PASSWORD),
    ("Password (again)", PASSWORD),
)


def _controlling_terminal() -> None:
    """In the child (a new session): its terminal, stdin, becomes the session's
    controlling one, so ``getpass`` reads the password from it as at a shell."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def createsuperuser_on_a_terminal(env: dict[str, str], timeout_s: float = 120) -> str:
    """Run ``./dev manage createsuperuser`` on a pseudo-terminal, answering each
    prompt of ``ANSWERS`` when it appears; returns what the terminal showed.
    Raises AssertionError when a prompt does not come or the command fails."""
    main, child = os.openpty()
    process = subprocess.Popen(
        [str(ROOT / "dev"), "manage", "createsuperuser"],
        stdin=child,
        stdout=child,
        stderr=child,
        cwd=ROOT,
        env={**env, "BALLAST_DEV": "1"},
        start_new_session=True,
        preexec_fn=_controlling_terminal,
    )
    os.close(child)
    shown, answered, read_to = "", 0, 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                data = os.read(main, 4096)
            except OSError:  # the command ended: its terminal closed
                break
            if not data:
                break
            shown += data.decode(errors="replace")
            if answered < len(ANSWERS) and ANSWERS[answered][0] in shown[read_to:]:
                os.write(main, ANSWERS[answered][1].encode() + b"\n")
                answered += 1
                read_to = len(shown)
        assert process.wait(timeout=30) == 0, shown
    finally:
        os.close(main)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert answered == len(ANSWERS), shown
    return shown


def test_staff_log_in_to_the_admin_with_the_username_createsuperuser_asked(
    stack,  # noqa: F811 - the fixture imported above
    browser,
) -> None:
    shown = createsuperuser_on_a_terminal(stack.env)
    assert "Superuser created successfully." in shown, shown
    browser.get(f"{stack.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("staff")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "form [type=submit]").click()
    until(browser, lambda d: "/admin/login/" not in d.current_url, "staff logged in")
    assert browser.current_url.rstrip("/").endswith("/admin")
    assert "staff" in browser.find_element(By.ID, "user-tools").text.lower()
