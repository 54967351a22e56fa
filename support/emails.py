"""Support emails: one small function per email (templates/emails/ticket-*)."""

from __future__ import annotations

from ballast.emails import send_templated, site_url

from .models import TicketMessage


def ticket_answered(*, message: TicketMessage) -> None:
    """Tell the ticket's author that staff replied."""
    ticket = message.ticket
    if ticket.author.email:
        send_templated(
            name="ticket-answered",
            to=[ticket.author.email],
            context={
                "ticket": ticket,
                "message": message,
                "ticket_url": site_url(f"/support/{ticket.id}/"),
            },
        )


def ticket_to_staff(*, message: TicketMessage, to: list[str]) -> None:
    """Tell staff that a ticket was opened or its author replied."""
    if to:
        send_templated(
            name="ticket-to-staff",
            to=to,
            context={
                "ticket": message.ticket,
                "message": message,
                "ticket_url": site_url(
                    f"/admin/support/ticket/{message.ticket.id}/change/"
                ),
            },
        )
