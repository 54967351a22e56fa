"""Rentals under pressure (issue 23, item 1): ending twice (a double-click, a retry,
two processes at once) or an end racing a failed spot check charges exactly once,
never past the last passed check; each charge is keyed by the period it covers."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import Client
from django.utils import timezone

from billing.models import LedgerTransaction
from billing.services import renter_balance_nano
from jobs.models import Rental
from jobs.rentals import rental_end, rental_price_per_hour_nano, rentals_after_check
from tests.devices import machine_online_since
from tests.jobs.helpers import sessions_waiting_on_locks

pytestmark = pytest.mark.django_db(transaction=True)


def _live_rental(renter, live_device, *, hours=5, live_for=timedelta(hours=2)):
    """A rental that went live ``live_for`` ago, its last check passed 1 h in,
    its device online since."""
    device = live_device()
    start = timezone.now() - live_for
    machine_online_since(device.machine, start)
    return Rental.objects.create(
        renter=renter,
        device=device,
        hours=hours,
        price_per_hour_nano=rental_price_per_hour_nano(),
        status=Rental.Status.LIVE,
        starts_at=start,
        ends_at=start + timedelta(hours=hours),
        last_pass_at=start + timedelta(hours=1),
        last_check_at=start + timedelta(hours=1),
        billed_until=start,
    )


def _charged(renter, before: int) -> int:
    return before - renter_balance_nano(user=renter)


def test_it_charges_once_when_ended_twice(renter, live_device):
    """A retry (or a double-click) holding the rental as read before the first
    end: the second end charges nothing."""
    rental = _live_rental(renter, live_device)
    seen_by_first = Rental.objects.get(id=rental.id)
    seen_by_retry = Rental.objects.get(id=rental.id)
    before = renter_balance_nano(user=renter)
    now = timezone.now()
    rental_end(rental=seen_by_first, now=now)
    ended = rental_end(rental=seen_by_retry, now=now + timedelta(seconds=3))
    assert ended.status == Rental.Status.ENDED and ended.billed_until == now
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1
    expected = int(
        ((now - rental.starts_at).total_seconds()) * rental.price_per_hour_nano / 3600
    )
    assert abs(_charged(renter, before) - expected) <= 1


def test_it_keys_a_charge_by_the_period_it_covers(renter, live_device):
    rental = _live_rental(renter, live_device)
    now = timezone.now()
    rental_end(rental=rental, now=now)
    txn = LedgerTransaction.objects.get(kind="rental")
    assert txn.key == (
        f"rental:{rental.id}:{rental.starts_at.isoformat()}/{now.isoformat()}"
    )


def test_an_end_after_a_failed_check_charges_only_up_to_the_last_pass(
    renter, live_device
):
    """The renter's end was read before the check failed: the check's stop wins,
    the end charges nothing more."""
    rental = _live_rental(renter, live_device)
    seen_by_end = Rental.objects.get(id=rental.id)
    before = renter_balance_nano(user=renter)
    rentals_after_check(device_id=rental.device_id, passed=False, now=timezone.now())
    ended = rental_end(rental=seen_by_end)
    assert ended.status == Rental.Status.STOPPED
    assert ended.billed_until == rental.last_pass_at
    assert _charged(renter, before) == rental.price_per_hour_nano  # the 1 h passed
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1


def test_it_ends_once_through_the_api_called_twice(renter, api_key, live_device):
    rental = _live_rental(renter, live_device)
    client = Client(headers={"authorization": f"Bearer {api_key}"})
    first = client.delete(f"/v1/rentals/{rental.id}")
    second = client.delete(f"/v1/rentals/{rental.id}")
    assert first.status_code == second.status_code == 200
    assert json.loads(first.content)["status"] == "ended"
    assert json.loads(second.content)["status"] == "ended"
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1


def _race(first, second) -> None:
    """Run ``first`` in a transaction, ``second`` in a thread that must wait for
    its lock, then commit ``first`` (PostgreSQL)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            second()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():
        first()
        racer = threading.Thread(target=run)
        racer.start()
        sessions_waiting_on_locks()
    racer.join(10)
    assert not racer.is_alive() and not failures, failures


@pytest.mark.postgres
def test_two_ends_at_once_charge_once(renter, live_device):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no such race")
    rental = _live_rental(renter, live_device)
    seen_by_first = Rental.objects.get(id=rental.id)
    seen_by_second = Rental.objects.get(id=rental.id)
    now = timezone.now()
    _race(
        lambda: rental_end(rental=seen_by_first, now=now),
        lambda: rental_end(rental=seen_by_second, now=now + timedelta(seconds=1)),
    )
    rental.refresh_from_db()
    assert rental.status == Rental.Status.ENDED and rental.billed_until == now
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1


@pytest.mark.postgres
def test_an_end_racing_a_failed_check_charges_once_up_to_the_last_pass(
    renter, live_device
):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no such race")
    rental = _live_rental(renter, live_device)
    seen_by_end = Rental.objects.get(id=rental.id)
    before = renter_balance_nano(user=renter)
    _race(
        lambda: rentals_after_check(
            device_id=rental.device_id, passed=False, now=timezone.now()
        ),
        lambda: rental_end(rental=seen_by_end),
    )
    rental.refresh_from_db()
    assert rental.status == Rental.Status.STOPPED
    assert rental.billed_until == rental.last_pass_at
    assert _charged(renter, before) == rental.price_per_hour_nano
    assert LedgerTransaction.objects.filter(kind="rental").count() == 1
