"""Writes of support tickets: open, reply (by the author or by staff), each emailing
the other side (DESIGN.md "What hosts and staff see")."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from . import emails
from .models import Ticket, TicketMessage


def staff_emails() -> list[str]:
    """Addresses of active staff, who answer tickets."""
    User = get_user_model()
    return list(
        User.objects.filter(is_staff=True, is_active=True)
        .exclude(email="")
        .values_list("email", flat=True)
    )


@transaction.atomic
def ticket_open(*, author: AbstractBaseUser, subject: str, body: str) -> Ticket:
    """Open a ticket with its first message; staff are emailed after commit."""
    ticket = Ticket.objects.create(author=author, subject=subject.strip())
    message = TicketMessage.objects.create(ticket=ticket, author=author, body=body)
    transaction.on_commit(
        lambda: emails.ticket_to_staff(message=message, to=staff_emails())
    )
    return ticket


@transaction.atomic
def ticket_reply(
    *, ticket: Ticket, author: AbstractBaseUser, body: str
) -> TicketMessage:
    """Add a message to a ticket and email the other side after commit.

    A staff member's reply (not the ticket's own author) marks the ticket answered
    and emails its author; the author's reply reopens it and emails staff.
    """
    message = TicketMessage.objects.create(ticket=ticket, author=author, body=body)
    ticket_after_message(message=message)
    return message


def ticket_after_message(*, message: TicketMessage) -> None:
    """Set the ticket's status for a new message and email the other side (after commit)."""
    ticket = message.ticket
    by_staff = message.author_id != ticket.author_id and message.author.is_staff
    status = Ticket.Status.ANSWERED if by_staff else Ticket.Status.OPEN
    Ticket.objects.filter(id=ticket.id).update(status=status)
    if by_staff:
        transaction.on_commit(lambda: emails.ticket_answered(message=message))
    else:
        transaction.on_commit(
            lambda: emails.ticket_to_staff(message=message, to=staff_emails())
        )


def ticket_close(*, ticket: Ticket) -> None:
    """Close a ticket (its author is done)."""
    Ticket.objects.filter(id=ticket.id).update(status=Ticket.Status.CLOSED)
