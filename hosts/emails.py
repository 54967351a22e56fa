"""Emails to hosts: one small function per email.

Each email is two templates, ``templates/emails/<name>-subject.txt`` and
``<name>-body.txt`` (plain text, rendered with autoescape off).
"""

from __future__ import annotations

from ballast.emails import send_templated

from .models import Machine


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
