"""Reads of support pages."""

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.http import Http404

from .models import Ticket


def tickets_of(*, user: AbstractBaseUser) -> QuerySet[Ticket]:
    """The user's tickets, newest first."""
    return Ticket.objects.filter(author_id=user.pk).order_by("-created_at")


def ticket_of(*, user: AbstractBaseUser, ticket_id: int) -> Ticket:
    """The user's own ticket; raises Http404 for anyone else's."""
    ticket = Ticket.objects.filter(id=ticket_id, author_id=user.pk).first()
    if ticket is None:
        raise Http404("no such ticket")
    return ticket
