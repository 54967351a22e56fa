"""Support forms."""

from django import forms


class TicketOpenForm(forms.Form):
    """A new ticket: what it is about, and the first message."""

    subject = forms.CharField(max_length=200)
    body = forms.CharField(widget=forms.Textarea, label="Message", max_length=20000)


class TicketReplyForm(forms.Form):
    """A reply on a ticket."""

    body = forms.CharField(widget=forms.Textarea, label="Reply", max_length=20000)
