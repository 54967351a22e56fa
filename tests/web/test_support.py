"""Support: hosts and renters open tickets and reply; staff answer in admin; the
other side is emailed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse

from support.models import Ticket


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser(
        username="staff@example.com", email="staff@example.com", password="x"
    )


def test_it_opens_a_ticket_and_emails_staff(
    owner_client, owner, staff, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(
            reverse("support:tickets"),
            {"subject": "Payout?", "body": "When do I get paid?"},
        )
    ticket = Ticket.objects.get(author=owner)
    assert response["Location"] == reverse("support:ticket", args=[ticket.id])
    assert mail.outbox[-1].to == ["staff@example.com"]
    assert "When do I get paid?" in mail.outbox[-1].body


def test_it_emails_the_author_when_staff_answer_in_admin(
    client, owner, staff, django_capture_on_commit_callbacks, settings
):
    from support.services import ticket_open

    settings.BALLAST_PUBLIC_URL = "https://ballast.example.com"
    ticket = ticket_open(author=owner, subject="GPU <b>hot</b>", body="it is hot")
    client.force_login(staff)
    url = reverse("admin:support_ticket_change", args=[ticket.id])
    data = {
        "subject": ticket.subject,
        "status": "open",
        "messages-TOTAL_FORMS": "2",
        "messages-INITIAL_FORMS": "1",
        "messages-MIN_NUM_FORMS": "0",
        "messages-MAX_NUM_FORMS": "1000",
        "messages-0-id": str(ticket.messages.get().id),
        "messages-0-ticket": str(ticket.id),
        "messages-1-body": "Lower the power limit.",
        "messages-1-ticket": str(ticket.id),
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    ticket.refresh_from_db()
    assert ticket.status == Ticket.Status.ANSWERED
    reply = ticket.messages.order_by("-id").first()
    assert reply.author == staff
    assert mail.outbox[-1].to == [owner.email]
    assert "Lower the power limit." in mail.outbox[-1].body
    assert "GPU <b>hot</b>" in mail.outbox[-1].subject  # plain text: not HTML-escaped
    # the link works from a mail client: absolute, under the site's address
    assert f"https://ballast.example.com/support/{ticket.id}/" in mail.outbox[-1].body
    assert " (/support/" not in mail.outbox[-1].body


def test_it_lets_the_author_reply_and_reopens(
    owner_client, owner, staff, django_capture_on_commit_callbacks
):
    from support.services import ticket_open

    ticket = ticket_open(author=owner, subject="s", body="b")
    Ticket.objects.filter(id=ticket.id).update(status=Ticket.Status.ANSWERED)
    with django_capture_on_commit_callbacks(execute=True):
        owner_client.post(
            reverse("support:ticket", args=[ticket.id]), {"body": "still broken"}
        )
    ticket.refresh_from_db()
    assert ticket.status == Ticket.Status.OPEN
    assert (
        "still broken"
        in owner_client.get(
            reverse("support:ticket", args=[ticket.id])
        ).content.decode()
    )
    assert mail.outbox[-1].to == ["staff@example.com"]


def test_it_hides_another_users_ticket(stranger_client, owner):
    from support.services import ticket_open

    ticket = ticket_open(author=owner, subject="private", body="b")
    assert (
        stranger_client.get(reverse("support:ticket", args=[ticket.id])).status_code
        == 404
    )
    assert (
        stranger_client.post(
            reverse("support:ticket", args=[ticket.id]), {"body": "x"}
        ).status_code
        == 404
    )
    assert b"private" not in stranger_client.get(reverse("support:tickets")).content
