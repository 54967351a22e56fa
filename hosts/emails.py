"""Emails to hosts: one small function per email.

Each email is two templates, ``templates/emails/<name>-subject.txt`` and
``<name>-body.txt`` (plain text, rendered with autoescape off).
"""

from __future__ import annotations

from django.conf import settings

from ballast.emails import send_templated, site_url

from .models import Machine, QuarantineDecision


def machine_offline(*, machine: Machine) -> None:
    """Tell the owner their machine has been silent (no heartbeat) for a while."""
    send_templated(
        name="machine-offline",
        to=[machine.owner.email],
        context={"machine": machine, "last_heartbeat_at": machine.seen_until()},
    )


def machine_back(*, machine: Machine) -> None:
    """Tell the owner their machine is back online after an outage we emailed about."""
    send_templated(
        name="machine-back", to=[machine.owner.email], context={"machine": machine}
    )


def rental_stopped(*, rental) -> None:
    """Tell the owner a renter's rental of one of their devices ended early
    because the device was away (offline or paused) too long, and what it was
    paid for. ``rental``: a ``jobs.Rental`` with ``device.machine.owner``
    loaded and its ``stop_reason`` set."""
    machine = rental.device.machine
    send_templated(
        name="rental-stopped",
        to=[machine.owner.email],
        context={
            "machine": machine,
            "device": rental.device,
            "reason": rental.stop_reason,
            "started_at": rental.starts_at,
            "stopped_at": rental.ends_at,
            "host_percent": f"{settings.BALLAST_HOST_SHARE * 100:g}",
        },
    )


def quarantine_decided(*, decision_id: int) -> None:
    """Tell the owner that staff quarantined a device of theirs, or released it,
    and why (``QuarantineDecision``), with the machine page's absolute link."""
    decision = QuarantineDecision.objects.select_related(
        "device__machine__owner"
    ).get(id=decision_id)
    machine = decision.device.machine
    if machine.owner.email:
        send_templated(
            name="quarantine-decided",
            to=[machine.owner.email],
            context={
                "decision": decision,
                "device": decision.device,
                "machine": machine,
                "machine_url": site_url(f"/machines/{machine.id}/"),
            },
        )
