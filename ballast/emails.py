"""Sending an email from its two templates (CONVENTIONS.md "Templates": one
template per part, one small function per email, in the app that sends it)."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail
from django.template.loader import render_to_string


def site_url(path: str) -> str:
    """``path`` (``/support/1/``) as an absolute link under the site's address
    (``BALLAST_PUBLIC_URL``): emails are read away from the site."""
    return settings.BALLAST_PUBLIC_URL + "/" + path.lstrip("/")


def send_templated(*, name: str, to: list[str], context: dict) -> None:
    """Render ``emails/<name>-subject.txt`` and ``-body.txt`` (plain text) and
    send them to ``to``."""
    subject = " ".join(render_to_string(f"emails/{name}-subject.txt", context).split())
    body = render_to_string(f"emails/{name}-body.txt", context)
    send_mail(subject, body, None, to)
