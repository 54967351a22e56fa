"""Pages of the staff console (``staff`` package docstring). Thin: parse, call a
selector or a service, render. Staff only: anyone else is sent to the admin's
log-in (``staff_member_required``)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from billing.views import statement_lines
from hosts.models import Device, Machine, QuarantineDecision
from hosts.services import (
    DecisionRefused,
    device_quarantine_by_staff,
    device_release_by_staff,
)

from . import selectors
from .forms import DecisionForm, FindForm


@staff_member_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    """The fleet per model now and over the last hour, with the search box."""
    return render(
        request,
        "staff/fleet.html",
        {
            "rows": selectors.fleet_by_model(now=timezone.now()),
            "quarantined": Device.objects.filter(
                quarantined=True, retired_at__isnull=True
            )
            .select_related("machine__owner")
            .order_by("-quarantined_at")[:50],
            "find_form": FindForm(),
        },
    )


@staff_member_required
@require_GET
def find(request: HttpRequest) -> HttpResponse:
    """People and machines matching ``q``."""
    form = FindForm(request.GET)
    text = form.data.get("q", "") if form.is_valid() else ""
    return render(
        request,
        "staff/find.html",
        {
            "find_form": form,
            "q": text,
            "people": selectors.people_find(text=text),
            "machines": selectors.machines_find(text=text),
        },
    )


@staff_member_required
@require_GET
def renter(request: HttpRequest, user_id: int) -> HttpResponse:
    """A renter's whole picture (``selectors.RenterPicture``)."""
    user = get_object_or_404(get_user_model(), id=user_id)
    picture = selectors.renter_picture(user=user, now=timezone.now())
    return render(
        request,
        "staff/renter.html",
        {"p": picture, "entries": statement_lines(picture.entries)},
    )


@staff_member_required
@require_GET
def machine(request: HttpRequest, machine_id) -> HttpResponse:
    """A machine's whole picture (``selectors.MachinePicture``)."""
    found = get_object_or_404(
        Machine.objects.select_related("owner", "lease"), id=machine_id
    )
    return render(
        request,
        "staff/machine.html",
        {"p": selectors.machine_picture(machine=found, now=timezone.now())},
    )


@staff_member_required
@require_GET
def device(request: HttpRequest, device_id: int) -> HttpResponse:
    """A device's whole picture and the quarantine or release form."""
    found = get_object_or_404(
        Device.objects.select_related("machine__owner", "machine__lease"),
        id=device_id,
    )
    return render(
        request,
        "staff/device.html",
        {
            "p": selectors.device_picture(device=found, now=timezone.now()),
            "form": DecisionForm(),
        },
    )


@staff_member_required
@require_POST
def device_decide(request: HttpRequest, device_id: int) -> HttpResponse:
    """Quarantine the device, or release it (``action``), with the reason."""
    found = get_object_or_404(Device, id=device_id)
    form = DecisionForm(request.POST)
    action = request.POST.get("action")
    if action not in QuarantineDecision.Action.values:
        messages.error(request, "Choose to quarantine or to release.")
    elif not form.is_valid():
        messages.error(request, " ".join(form.errors.get("reason", ["Bad form."])))
    else:
        decide = (
            device_quarantine_by_staff
            if action == QuarantineDecision.Action.QUARANTINE
            else device_release_by_staff
        )
        try:
            decision = decide(
                device_id=found.id,
                staff=request.user,
                reason=form.cleaned_data["reason"],
            )
        except DecisionRefused as exc:
            messages.error(request, str(exc))
        else:
            messages.success(
                request,
                f"{found.label} {decision.get_action_display()};"
                f" {found.machine.owner.email or 'its owner'} was emailed why.",
            )
    return redirect("staff:device", device_id=found.id)
