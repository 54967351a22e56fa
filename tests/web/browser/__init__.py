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

A host's pages are ``test_host_pages``, a renter's (and staff's admin)
``test_renter_pages``; the people and history they look at, ``world``; the
fixtures, ``conftest``; what the tests share, ``pages``.
"""
