"""Forms of the billing pages."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from .money import usd_to_nano


class PayoutRequestForm(forms.Form):
    """A payout request: an amount in USD (up to 9 decimals, i.e. 1 nano-USD)."""

    amount_usd = forms.DecimalField(
        label="Amount (USD)",
        max_digits=18,
        decimal_places=9,
        min_value=Decimal("0.000000001"),
    )
    note = forms.CharField(label="Note for staff", max_length=300, required=False)

    def amount_nano(self) -> int:
        """The cleaned amount in nano-USD."""
        return usd_to_nano(self.cleaned_data["amount_usd"])
