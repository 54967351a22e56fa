"""Sending an email from its two templates (CONVENTIONS.md "Templates": one
template per part, one small function per email, in the app that sends it)."""

from __future__ import annotations

from django.core.mail import send_mail
from django.template.loader import render_to_string


def send_templated(*, name: str, to: list[str], context: dict) -> None:
    """Render ``emails/<name>-subject.txt`` and ``-body.txt`` (plain text) and
    send them to ``to``."""
    subject = " ".join(render_to_string(f"emails/{name}-subject.txt", context).split())
    body = render_to_string(f"emails/{name}-body.txt", context)
    send_mail(subject, body, None, to)
