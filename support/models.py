"""Support tickets opened by hosts and renters and answered by staff."""

from django.conf import settings
from django.db import models


class Ticket(models.Model):
    """A support ticket; its conversation is its messages."""

    class Status(models.TextChoices):
        OPEN = "open"
        ANSWERED = "answered"
        CLOSED = "closed"

    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tickets"
    )
    subject = models.CharField(max_length=200)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.OPEN
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.subject


class TicketMessage(models.Model):
    """One message of a ticket, by its author or by staff."""

    ticket = models.ForeignKey(
        Ticket, on_delete=models.CASCADE, related_name="messages"
    )
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "message"

    def __str__(self) -> str:
        who = (self.author.email or self.author.username) if self.author_id else "?"
        if self.created_at is None:
            return who
        return f"{who}, {self.created_at:%d %b %Y %H:%M} UTC"
