"""Sign-up and renter forms. One account is both a renter and a host."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm

from jobs.models import ApiKey, Job

from .selectors import login_username


class SignUpForm(UserCreationForm):
    """Sign up with an email address (it is also the username) and a password."""

    email = forms.EmailField(
        help_text="you log in with it; alerts and replies go there"
    )

    class Meta:
        model = get_user_model()
        fields = ["email"]

    def clean_email(self) -> str:
        email = self.cleaned_data["email"].strip().lower()
        User = get_user_model()
        if (
            User.objects.filter(username__iexact=email).exists()
            or User.objects.filter(email__iexact=email).exists()
        ):
            raise forms.ValidationError(
                "An account with this email exists: log in instead."
            )
        return email

    def save(self, commit: bool = True):
        user = super().save(commit=False)
        user.username = self.cleaned_data["email"]
        user.email = self.cleaned_data["email"]
        if commit:
            user.save()
        return user


class EmailAuthenticationForm(AuthenticationForm):
    """Log in with the email address (the username) and password."""

    username = forms.CharField(
        label="Email",
        max_length=254,
        widget=forms.EmailInput(attrs={"autofocus": True}),
    )

    def clean_username(self) -> str:
        return login_username(self.cleaned_data["username"])


class StaffAuthenticationForm(AdminAuthenticationForm):
    """The admin's login (staff accounts only): the username ``createsuperuser``
    asked for (``staff``), or the email a site account logs in with, in a text
    field (a browser refuses ``staff`` in an email field)."""

    username = forms.CharField(
        label="Email or username",
        max_length=254,
        widget=forms.TextInput(
            attrs={
                "autofocus": True,
                "autocapitalize": "none",
                "autocomplete": "username",
            }
        ),
    )

    def clean_username(self) -> str:
        return login_username(self.cleaned_data["username"])


class ApiKeyCreateForm(forms.Form):
    """Name a new API key (e.g. the program that will use it)."""

    name = forms.CharField(max_length=100, initial="default")


def _usd(label: str, **kwargs) -> forms.DecimalField:
    """An amount in USD (up to 9 decimals: the ledger's nano-USD), at least 0."""
    return forms.DecimalField(
        label=label,
        max_digits=16,
        decimal_places=9,
        min_value=0,
        error_messages={
            "min_value": "Enter an amount of $0.00 or more.",
            "max_decimal_places": "Enter at most nine decimals.",
            "invalid": "Enter an amount in dollars, e.g. 12.50.",
        },
        widget=forms.NumberInput(attrs={"step": "any", "min": "0"}),
        **kwargs,
    )


class CreditCodeRedeemForm(forms.Form):
    """A renter types a credit code (any case, spaces ignored)."""

    code = forms.CharField(
        label="Credit code",
        max_length=60,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )


class KeyCapForm(forms.Form):
    """A spending cap for one of the renter's keys (empty amount: no cap)."""

    key = forms.ModelChoiceField(queryset=ApiKey.objects.none(), label="API key")
    cap_usd = _usd("Cap (USD)", required=False, help_text="empty: no cap")
    period = forms.ChoiceField(choices=ApiKey.Period.choices, label="Period")

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["key"].queryset = ApiKey.objects.filter(
            user_id=user.pk, revoked_at__isnull=True
        ).order_by("-created_at")


class LowBalanceForm(forms.Form):
    """The balance under which the renter is emailed (empty: the default; 0: never)."""

    threshold_usd = _usd(
        "Email me when my balance falls below (USD)",
        required=False,
        help_text="0: never; empty: the default",
    )


class JobLogFilterForm(forms.Form):
    """The job log's filters (GET); every field may be left empty."""

    status = forms.ChoiceField(
        required=False, choices=[("", "any status"), *Job.Status.choices]
    )
    key = forms.ModelChoiceField(
        required=False, queryset=ApiKey.objects.none(), empty_label="any key"
    )
    model = forms.ChoiceField(required=False, choices=[("", "any model")])
    since = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, user=None, models=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["key"].queryset = ApiKey.objects.filter(user_id=user.pk).order_by(
            "revoked_at", "-created_at"
        )
        self.fields["model"].choices = [("", "any model")] + [(m, m) for m in models]

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("until", "The end is before the start.")
        return data

    def filters(self) -> dict:
        """The valid filters as ``accounts.selectors.job_log`` keywords."""
        self.is_valid()  # the fields that are valid stay in cleaned_data
        data = self.cleaned_data
        key = data.get("key")
        return {
            "status": data.get("status") or "",
            "key_id": key.id if key else None,
            "model_id": data.get("model") or "",
            "since": data.get("since"),
            "until": data.get("until"),
        }
