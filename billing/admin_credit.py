"""Staff's credit tools in the admin: top up or refund a renter, and credit codes.

Every movement goes through the services (``credit_add``, ``credit_refund``,
``credit_code_create``), so the ledger records it with the staff member (its
``actor``) and the reason (its ``memo``), under a key made when the form was
shown: a form sent twice posts once.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse

from . import selectors, services
from .forms import CreditAdjustForm
from .models import Account, CreditCode, CreditCodeRedemption, RenterCredit
from .money import usd_to_nano
from .templatetags.billing_money import usd_text


class RenterPickForm(forms.Form):
    email = forms.EmailField(label="Renter's email")

    def clean_email(self):
        email = self.cleaned_data["email"].strip().lower()
        user = get_user_model().objects.filter(email__iexact=email).first()
        if user is None:
            raise forms.ValidationError("No account has this email.")
        self.user = user
        return email


@admin.register(RenterCredit)
class RenterCreditAdmin(admin.ModelAdmin):
    """Renters' credit: the list with balances; each one's page tops up or refunds."""

    list_display = ["user", "balance_usd", "low_balance_usd", "low_balance_at"]
    list_filter = [("low_balance_at", admin.EmptyFieldListFilter)]
    search_fields = ["user__email", "user__username"]
    list_select_related = ["user"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(kind=Account.Kind.RENTER_CREDIT)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return self.has_change_permission(request)

    @admin.display(description="balance")
    def balance_usd(self, obj: Account) -> str:
        return usd_text(obj.balance_nano)

    @admin.display(description="low-balance email under")
    def low_balance_usd(self, obj: Account) -> str:
        return usd_text(services.balance_low_threshold_nano(obj))

    def add_view(self, request: HttpRequest, form_url="", extra_context=None):
        """Pick a renter by email (an account without credit yet included)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = RenterPickForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            account = services.account_for(
                kind=Account.Kind.RENTER_CREDIT, user=form.user
            )
            return redirect("admin:billing_rentercredit_change", account.id)
        return TemplateResponse(
            request,
            "admin/billing/rentercredit/pick.html",
            {**self.admin_site.each_context(request), "opts": self.opts, "form": form},
        )

    def change_view(
        self, request: HttpRequest, object_id, form_url="", extra_context=None
    ):
        """The renter's balance, recent ledger lines, and the top-up/refund form."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        account = get_object_or_404(self.get_queryset(request), id=object_id)
        renter = account.user
        if request.method == "POST":
            form = CreditAdjustForm(request.POST)
            if form.is_valid() and self._adjust(request, renter, form):
                return redirect("admin:billing_rentercredit_change", account.id)
        else:
            form = CreditAdjustForm(initial={"token": uuid.uuid4().hex})
        account.refresh_from_db()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Credit of {renter.email or renter.username}",
            "account": account,
            "renter": renter,
            "balance": usd_text(account.balance_nano),
            "refundable": usd_text(services.credit_refundable_nano(user=renter)),
            "entries": selectors.renter_statement(user=renter, limit=30),
            "form": form,
        }
        return TemplateResponse(
            request, "admin/billing/rentercredit/adjust.html", context
        )

    def _adjust(self, request: HttpRequest, renter, form: CreditAdjustForm) -> bool:
        """Post the form's top-up or refund; True when the page should reload."""
        data = form.cleaned_data
        try:
            if data["action"] == CreditAdjustForm.TOP_UP:
                txn = services.credit_add(
                    user=renter,
                    amount_nano=form.amount_nano(),
                    source=services.CreditSource.STAFF,
                    reference=data["token"],
                    memo=data["reason"],
                    actor=request.user,
                )
            else:
                txn = services.credit_refund(
                    user=renter,
                    amount_nano=form.amount_nano(),
                    reason=data["reason"],
                    actor=request.user,
                    reference=data["token"],
                    job_id=data["job"],
                )
        except services.CreditError as exc:
            form.add_error("amount_usd" if "most" in str(exc) else None, str(exc))
            return False
        if txn is None:
            messages.info(
                request, "That form was sent before: nothing more was posted."
            )
        else:
            what = "Refunded" if data["action"] == CreditAdjustForm.REFUND else "Added"
            messages.success(
                request, f"{what} {usd_text(form.amount_nano())} (ledger {txn.key})."
            )
        return True


class CreditCodeForm(forms.ModelForm):
    """A new code: its amount in USD; the text may be left empty (a random one)."""

    amount_usd = forms.DecimalField(
        label="Amount (USD) per redemption", max_digits=18, decimal_places=9
    )
    code = forms.CharField(
        required=False, max_length=40, help_text="empty: a random 16-letter code"
    )

    class Meta:
        model = CreditCode
        fields = ["code", "max_redemptions", "expires_at", "active", "memo"]

    def clean_amount_usd(self):
        amount = self.cleaned_data["amount_usd"]
        if amount <= 0:
            raise forms.ValidationError("Enter an amount greater than $0.00.")
        return amount

    def clean_code(self):
        text = services.credit_code_normalize(self.cleaned_data["code"])
        if text and CreditCode.objects.filter(code=text).exists():
            raise forms.ValidationError(f"The code {text} exists already.")
        return text


@admin.register(CreditCodeRedemption)
class CreditCodeRedemptionAdmin(admin.ModelAdmin):
    """Redemptions, read-only: each is made with its credit by the service."""

    list_display = ["code", "user", "transaction", "created_at"]
    list_filter = ["created_at"]
    search_fields = ["code__code", "user__email"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class RedemptionInline(admin.TabularInline):
    model = CreditCodeRedemption
    extra = 0
    can_delete = False
    fields = readonly_fields = ["user", "created_at", "transaction"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CreditCode)
class CreditCodeAdmin(admin.ModelAdmin):
    """Credit codes: made here (amount, uses, expiry, why), switched off by action;
    their redemptions read-only."""

    list_display = [
        "code",
        "amount",
        "redeemed_count",
        "max_redemptions",
        "expires_at",
        "active",
        "created_by",
        "created_at",
    ]
    list_filter = ["active", "expires_at", "created_at"]
    search_fields = ["code", "memo", "redemptions__user__email"]
    inlines = [RedemptionInline]
    actions = ["switch_off"]

    @admin.display(description="amount")
    def amount(self, obj: CreditCode) -> str:
        return usd_text(obj.amount_nano)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = CreditCodeForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ["redeemed_count"]
        return ["code", "amount", "max_redemptions", "redeemed_count", "created_by"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["code", "amount_usd", "max_redemptions", "expires_at", "memo"]
        return [
            "code",
            "amount",
            "max_redemptions",
            "redeemed_count",
            "expires_at",
            "active",
            "memo",
            "created_by",
        ]

    def save_model(self, request, obj: CreditCode, form, change: bool) -> None:
        if change:  # the amount and the uses stay as made
            obj.save(update_fields=["expires_at", "active", "memo"])
            return
        made = services.credit_code_create(
            amount_nano=usd_to_nano(form.cleaned_data["amount_usd"]),
            max_redemptions=form.cleaned_data["max_redemptions"],
            expires_at=form.cleaned_data["expires_at"],
            memo=form.cleaned_data["memo"],
            created_by=request.user,
            code=form.cleaned_data["code"],
        )
        obj.__dict__.update(made.__dict__)

    @admin.action(description="Switch off (no more redemptions)")
    def switch_off(self, request: HttpRequest, queryset: QuerySet) -> None:
        count = queryset.filter(active=True).update(active=False)
        self.message_user(request, f"{count} code(s) switched off.", messages.SUCCESS)

