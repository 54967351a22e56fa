"""Support pages: a user's tickets, opening one, the conversation and replies."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from ballast.ratelimits import post_limited

from . import selectors, services
from .forms import TicketOpenForm, TicketReplyForm


@login_required
@post_limited("BALLAST_TICKET_RATE", "ticket")
def tickets(request: HttpRequest) -> HttpResponse:
    """The user's tickets and a form to open one (each emails staff: rate
    limited per address and account, ``BALLAST_TICKET_RATE``)."""
    form = TicketOpenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        ticket = services.ticket_open(
            author=request.user,
            subject=form.cleaned_data["subject"],
            body=form.cleaned_data["body"],
        )
        messages.success(
            request,
            "Ticket opened: staff are notified and you will get an email when they reply.",
        )
        return redirect("support:ticket", ticket_id=ticket.id)
    return render(
        request,
        "support/tickets.html",
        {"tickets": selectors.tickets_of(user=request.user), "form": form},
    )


@login_required
@post_limited("BALLAST_TICKET_RATE", "ticket")
def ticket(request: HttpRequest, ticket_id: int) -> HttpResponse:
    """One ticket's conversation; the author replies here (another user's is a 404)."""
    ticket = selectors.ticket_of(user=request.user, ticket_id=ticket_id)
    form = TicketReplyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        services.ticket_reply(
            ticket=ticket, author=request.user, body=form.cleaned_data["body"]
        )
        return redirect("support:ticket", ticket_id=ticket.id)
    conversation = ticket.messages.select_related("author").order_by("created_at", "id")
    return render(
        request,
        "support/ticket.html",
        {"ticket": ticket, "conversation": conversation, "form": form},
    )
