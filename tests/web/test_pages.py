"""What every page shares: static files served by the application (WhiteNoise,
hashed and compressed), friendly 404 and 500 pages, single titles, and an htmx
request after the session ended sent to the login page."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse


def stylesheet_url(html: str) -> str:
    found = re.search(r'<link rel="stylesheet" href="([^"]+)"', html)
    assert found, "the page links no stylesheet"
    return found.group(1)


def test_the_application_serves_its_static_files_hashed_and_compressed(owner_client):
    page = owner_client.get(reverse("hosts:dashboard")).content.decode()
    css = stylesheet_url(page)
    assert re.fullmatch(r"/static/ballast\.[0-9a-f]{12}\.css", css), css
    script = re.search(r'<script src="([^"]+)"', page).group(1)
    assert re.fullmatch(r"/static/htmx\.min\.[0-9a-f]{12}\.js", script), script
    answer = owner_client.get(css, HTTP_ACCEPT_ENCODING="gzip")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/css")
    assert answer["Content-Encoding"] == "gzip"
    # hashed names never change content: cached for ever
    assert "immutable" in answer["Cache-Control"]
    assert owner_client.get(script).status_code == 200


def test_the_admin_s_static_files_are_served(client, db):
    page = client.get("/admin/login/").content.decode()
    css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page)
    assert css, "the admin links no hashed stylesheet"
    assert client.get(css.group(1)).status_code == 200


def test_a_missing_page_is_a_friendly_404(owner_client):
    answer = owner_client.get("/no/such/page/")
    assert answer.status_code == 404
    body = answer.content.decode()
    assert "Page not found" in body and "/no/such/page/" in body
    # not Django's technical page listing every URL pattern
    assert "URLconf" not in body and "admin/" not in body.split("</header>")[1]
    assert "<title>Page not found · Ballast</title>" in body


def test_a_failing_view_is_a_friendly_500(client, db, settings):
    settings.ROOT_URLCONF = "tests.web.boom_urls"
    client.raise_request_exception = False
    answer = client.get("/boom/")
    assert answer.status_code == 500
    body = answer.content.decode()
    assert "Something went wrong" in body
    assert "RuntimeError" not in body and "Traceback" not in body
    assert re.search(r"/static/ballast\.[0-9a-f]{12}\.css", body)


@pytest.mark.parametrize(
    "url,title",
    [
        ("billing:earnings", "Earnings · Ballast"),
        ("billing:statement", "Usage and statement · Ballast"),
        ("hosts:dashboard", "Your machines · Ballast"),
    ],
)
def test_titles_name_ballast_once(owner_client, url, title):
    body = owner_client.get(reverse(url)).content.decode()
    assert f"<title>{title}</title>" in body


def test_an_htmx_request_after_the_session_ended_sends_the_browser_to_log_in(
    client, db
):
    answer = client.get(
        reverse("hosts:machine_rows"),
        HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL="http://testserver/machines/",
    )
    assert answer.status_code == 200
    assert answer["HX-Redirect"] == "/accounts/login/?next=%2Fmachines%2F"
    assert b"password" not in answer.content  # no login page to swap into the table


def test_a_plain_request_after_the_session_ended_is_still_redirected(client, db):
    answer = client.get(reverse("hosts:dashboard"))
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/")


def test_the_admin_login_asks_for_an_email_or_a_username(client, db):
    body = client.get("/admin/login/").content.decode()
    assert ">Email or username:</label>" in body
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user(
        username="plain@example.com", email="plain@example.com", password="pw-12345678"
    )
    refused = client.post(
        "/admin/login/", {"username": "plain@example.com", "password": "pw-12345678"}
    )
    assert b"staff account" in refused.content  # still the admin's staff-only form


def test_destructive_buttons_ask_first(owner_client, owner, machine):
    from jobs.services import api_key_create

    api_key_create(user=owner, name="ci")
    overview = owner_client.get(reverse("renter:overview")).content.decode()
    assert "return confirm('Revoke the key ci?" in overview
    page = owner_client.get(reverse("hosts:machine", args=[machine.id])).content
    assert b"return confirm('Reset the pinned key?" in page


def test_the_benchmark_hint_names_the_readme_s_command(owner_client, machine):
    from hosts.models import Benchmark

    Benchmark.objects.all().delete()
    page = owner_client.get(reverse("hosts:machine", args=[machine.id])).content
    assert b"ballast-agent benchmark" in page  # README's host section
    assert b"python -m agent benchmark" not in page


def test_every_middleware_is_async_capable(settings):
    """One sync-only middleware (WhiteNoise's own) sends every async view to a
    thread of its own, off the loop its job's coroutine runs on."""
    from django.utils.module_loading import import_string

    sync_only = [
        m
        for m in settings.MIDDLEWARE
        if not getattr(import_string(m), "async_capable", False)
    ]
    assert sync_only == []
