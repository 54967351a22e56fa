"""The staff console's forms."""

from __future__ import annotations

from django import forms

from hosts.services.decisions import REASON_MAX_CHARS, REASON_MIN_CHARS


class DecisionForm(forms.Form):
    """Quarantine a device, or release it, with the reason its host reads."""

    reason = forms.CharField(
        min_length=REASON_MIN_CHARS,
        max_length=REASON_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="The host reads this on the machine page and in an email.",
    )


class FindForm(forms.Form):
    """Find people (email or username) and machines (name, owner, id)."""

    q = forms.CharField(max_length=200, required=False, label="Find")
