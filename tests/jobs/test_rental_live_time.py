"""A rental pays for the time its device was live and not paused (issue 32,
item 5): time offline or paused is neither charged to the renter nor paid to
the host, and a device away (offline or paused) for
``BALLAST_RENTAL_OFFLINE_END_S`` ends its rental — the renter charged only
for the live time, the rest of the period free again, the owner emailed why
and the machine page saying it. The ledger stays balanced; each period is
charged once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.models import Earning, LedgerTransaction
from billing.money import share_of
from billing.selectors import transactions_unbalanced
from billing.services import renter_balance_nano
from hosts.models import Machine, OnlineSpan
from jobs.models import Rental, RentalPause
from jobs.rentals import rental_end, rental_price_per_hour_nano, rentals_watch
from jobs.rentaltime import stretches_minus, stretches_within
from jobs.services.credit import credit_reserved_nano
from tests.devices import machine_online_since

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


def _live_rental(renter, device, *, start, hours=5) -> Rental:
    """A rental of ``device`` live since ``start``, its device online since."""
    machine_online_since(device.machine, start)
    return Rental.objects.create(
        renter=renter,
        device=device,
        hours=hours,
        price_per_hour_nano=rental_price_per_hour_nano(),
        status=Rental.Status.LIVE,
        starts_at=start,
        ends_at=start + timedelta(hours=hours),
        last_pass_at=start,
        last_check_at=start,
        billed_until=start,
    )


def _cost(rental: Rental, live: timedelta) -> int:
    """What ``live`` of the rental costs, nano-USD, rounded down."""
    micro = live // timedelta(microseconds=1)
    return micro * rental.price_per_hour_nano // (3600 * 1_000_000)


def _went_offline(machine, at) -> None:
    """The machine's connection closed after its last heartbeat at ``at``
    (its online span ended there), as ``machine_disconnect`` records it."""
    OnlineSpan.objects.filter(machine_id=machine.id).update(ended_at=at)
    Machine.objects.filter(id=machine.id).update(
        connected=False, stale=True, channel_name="", last_heartbeat_at=at
    )


def test_it_keeps_the_parts_of_stretches_outside_the_holes():
    t = timezone.now()
    m = timedelta(minutes=1)
    kept = stretches_within([(t, t + 10 * m), (t + 9 * m, t + 12 * m)], t, t + 11 * m)
    assert kept == [(t, t + 11 * m)]
    holes = stretches_within(
        [(t + 2 * m, t + 3 * m), (t + 5 * m, t + 20 * m)], t, t + 11 * m
    )
    assert stretches_minus(kept, holes) == [(t, t + 2 * m), (t + 3 * m, t + 5 * m)]


def test_it_bills_only_the_time_the_device_was_live(renter, live_device, settings):
    """The issue's case: 93 s disconnected an hour into a rental are not
    charged, not paid; the renter pays the rest, the host earns 80 % of it."""
    device = live_device()
    now = timezone.now()
    start = now - 2 * HOUR
    rental = _live_rental(renter, device, start=start)
    gone_at = start + HOUR
    # the machine's record: online from the start, away 93 s, online since
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=gone_at + timedelta(seconds=93)
    )
    OnlineSpan.objects.create(
        machine=device.machine, started_at=start, ended_at=gone_at
    )
    before = renter_balance_nano(user=renter)
    rental_end(rental=rental, now=now)
    expected = _cost(rental, 2 * HOUR - timedelta(seconds=93))
    assert before - renter_balance_nano(user=renter) == expected
    assert expected < _cost(rental, 2 * HOUR)
    earning = Earning.objects.get(rental=rental)
    assert earning.amount_nano == share_of(expected, settings.BALLAST_HOST_SHARE)
    assert transactions_unbalanced() == []


def test_paused_time_is_not_billed(renter, live_device):
    """The watch sees the device paused (by its owner) and back: that stretch
    is not charged."""
    device = live_device()
    now = timezone.now()
    start = now - 2 * HOUR
    rental = _live_rental(renter, device, start=start)
    paused_at = start + timedelta(minutes=30)
    Machine.objects.filter(id=device.machine_id).update(paused=True)
    assert rentals_watch(now=paused_at) == 0
    Machine.objects.filter(id=device.machine_id).update(paused=False)
    assert rentals_watch(now=paused_at + timedelta(minutes=5)) == 0
    pause = RentalPause.objects.get(rental=rental)
    assert (pause.started_at, pause.ended_at) == (
        paused_at,
        paused_at + timedelta(minutes=5),
    )
    before = renter_balance_nano(user=renter)
    rental_end(rental=rental, now=now)
    charged = before - renter_balance_nano(user=renter)
    assert charged == _cost(rental, 2 * HOUR - timedelta(minutes=5))


def test_a_device_offline_too_long_ends_its_rental(renter, live_device, settings):
    """Offline for BALLAST_RENTAL_OFFLINE_END_S: the rental stops, billed only
    up to when the device went away; the rest of the period is no longer held
    from the renter's credit; the owner is emailed why, once."""
    settings.BALLAST_RENTAL_OFFLINE_END_S = 600
    device = live_device()
    now = timezone.now()
    start = now - HOUR
    rental = _live_rental(renter, device, start=start)
    assert credit_reserved_nano(renter=renter) > 0
    gone_at = now - timedelta(seconds=599)
    _went_offline(device.machine, gone_at)
    assert rentals_watch(now=now) == 0, "not yet away for 600 s"
    before = renter_balance_nano(user=renter)
    later = now + timedelta(seconds=2)
    assert rentals_watch(now=later) == 1
    rental.refresh_from_db()
    assert rental.status == Rental.Status.STOPPED and rental.ends_at == later
    assert "offline" in rental.stop_reason and "600 s" in rental.stop_reason
    expected = _cost(rental, gone_at - start)
    assert before - renter_balance_nano(user=renter) == expected
    assert credit_reserved_nano(renter=renter) == 0, "the rest is the renter's again"
    assert Earning.objects.get(rental=rental).amount_nano == share_of(
        expected, settings.BALLAST_HOST_SHARE
    )
    [email] = mail.outbox
    assert email.to == [device.machine.owner.email]
    assert device.label in email.subject
    assert rental.stop_reason in email.body
    # a second look changes nothing: no second charge, no second email
    assert rentals_watch(now=later + timedelta(seconds=60)) == 0
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1
    assert len(mail.outbox) == 1
    assert transactions_unbalanced() == []


def test_a_device_paused_too_long_ends_its_rental(renter, live_device, settings):
    settings.BALLAST_RENTAL_OFFLINE_END_S = 600
    device = live_device()
    now = timezone.now()
    start = now - HOUR
    rental = _live_rental(renter, device, start=start)
    Machine.objects.filter(id=device.machine_id).update(host_paused=True)
    paused_at = now - timedelta(seconds=700)
    assert rentals_watch(now=paused_at) == 0
    before = renter_balance_nano(user=renter)
    assert rentals_watch(now=now) == 1
    rental.refresh_from_db()
    assert rental.status == Rental.Status.STOPPED and "paused" in rental.stop_reason
    assert before - renter_balance_nano(user=renter) == _cost(rental, paused_at - start)


def test_the_machine_page_says_why_a_rental_ended(renter, live_device, settings):
    settings.BALLAST_RENTAL_OFFLINE_END_S = 600
    device = live_device()
    now = timezone.now()
    rental = _live_rental(renter, device, start=now - HOUR)
    _went_offline(device.machine, now - timedelta(seconds=601))
    assert rentals_watch(now=now) == 1
    rental.refresh_from_db()
    client = Client()
    client.force_login(device.machine.owner)
    page = client.get(reverse("hosts:machine", args=[device.machine_id]))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="rentals"' in html and "stopped" in html
    assert rental.stop_reason.split(":")[0] in html
