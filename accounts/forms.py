"""Sign-up and renter forms. One account is both a renter and a host."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm


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
        return self.cleaned_data["username"].strip().lower()


class ApiKeyCreateForm(forms.Form):
    """Name a new API key (e.g. the program that will use it)."""

    name = forms.CharField(max_length=100, initial="default")
