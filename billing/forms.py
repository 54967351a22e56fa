"""Forms of the billing pages."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from .money import usd_to_nano
from .templatetags.billing_money import usd_text


def payout_limit_words(requestable_nano: int) -> str:
    """Why a payout of more than ``requestable_nano`` (nano-USD) is refused, in words."""
    if requestable_nano <= 0:
        return (
            "You have no earnings available to pay out yet: each job's earnings are "
            "held for 24 hours, then become available."
        )
    return f"You can request at most {usd_text(requestable_nano)} now."


class PayoutRequestForm(forms.Form):
    """A payout request: an amount in USD (up to 9 decimals, i.e. 1 nano-USD), at
    most ``requestable_nano`` when given (the page's figure; the service checks
    again under its lock)."""

    amount_usd = forms.DecimalField(
        label="Amount (USD)",
        max_digits=18,
        decimal_places=9,
        min_value=Decimal("0.000000001"),
        error_messages={
            "min_value": "Enter an amount greater than $0.00.",
            "max_decimal_places": "Enter at most nine decimals (the ledger's unit).",
            "invalid": "Enter an amount in dollars, e.g. 12.50.",
        },
    )
    note = forms.CharField(label="Note for staff", max_length=300, required=False)

    def __init__(self, *args, requestable_nano: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.requestable_nano = requestable_nano
        # the browser's own check: no "1E-9" in its message
        self.fields["amount_usd"].widget.attrs.update({"min": "0", "step": "any"})

    def clean_amount_usd(self) -> Decimal:
        amount = self.cleaned_data["amount_usd"]
        if (
            self.requestable_nano is not None
            and usd_to_nano(amount) > self.requestable_nano
        ):
            raise forms.ValidationError(payout_limit_words(self.requestable_nano))
        return amount

    def amount_nano(self) -> int:
        """The cleaned amount in nano-USD."""
        return usd_to_nano(self.cleaned_data["amount_usd"])


def _usd_field(label: str) -> forms.DecimalField:
    """An amount in USD, up to 9 decimals (1 nano-USD), more than zero."""
    return forms.DecimalField(
        label=label,
        max_digits=18,
        decimal_places=9,
        min_value=Decimal("0.000000001"),
        error_messages={
            "min_value": "Enter an amount greater than $0.00.",
            "max_decimal_places": "Enter at most nine decimals (the ledger's unit).",
            "invalid": "Enter an amount in dollars, e.g. 12.50.",
        },
    )


class CreditAdjustForm(forms.Form):
    """Staff's top-up or refund of one renter's credit (``billing.admin_credit``).

    ``token`` is made when the form is shown and is the movement's reference,
    so a form sent twice posts once."""

    TOP_UP = "top_up"
    REFUND = "refund"

    action = forms.ChoiceField(
        choices=[
            (TOP_UP, "Top up: add credit (money received from the renter)"),
            (REFUND, "Refund: give back credit the renter was charged"),
        ],
        widget=forms.RadioSelect,
        initial=TOP_UP,
    )
    amount_usd = _usd_field("Amount (USD)")
    reason = forms.CharField(
        max_length=300,
        help_text="why: kept in the ledger with your name, and shown to the renter "
        "on their statement",
    )
    job = forms.UUIDField(
        required=False,
        label="Job refunded",
        help_text="a refund of one job: at most what it was charged",
    )
    token = forms.CharField(widget=forms.HiddenInput, max_length=64)

    def amount_nano(self) -> int:
        """The cleaned amount in nano-USD."""
        return usd_to_nano(self.cleaned_data["amount_usd"])

    def clean(self):
        data = super().clean()
        if data.get("job") and data.get("action") != self.REFUND:
            self.add_error("job", "Only a refund names a job.")
        return data

