"""Offline alerts: one email per outage when a machine is silent longer than
BALLAST_OFFLINE_ALERT_AFTER_S, one when it is back; never two for one outage."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from hosts.models import Machine
from hosts.services import machine_disconnect
from hosts.web_services import (
    machine_offline_alert_try,
    machines_offline_alert,
)

from .conftest import connect


@pytest.fixture(autouse=True)
def alert_after(settings):
    settings.BALLAST_OFFLINE_ALERT_AFTER_S = 300
    settings.BALLAST_HEARTBEAT_MAX_AGE_S = 30


def test_it_emails_the_owner_once_per_outage_and_once_when_back(machine, owner):
    t0 = machine.last_heartbeat_at
    machine_disconnect(machine_id=machine.id, channel_name=machine.channel_name)
    assert machines_offline_alert(now=t0 + timedelta(seconds=299)) == (0, 0)
    assert machines_offline_alert(now=t0 + timedelta(seconds=301)) == (1, 0)
    assert machines_offline_alert(now=t0 + timedelta(seconds=900)) == (0, 0)
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == [owner.email]
    assert mail.outbox[0].subject == 'Ballast: your machine "rig-1" is offline'
    assert "no heartbeat" in mail.outbox[0].body

    back_at = t0 + timedelta(seconds=1000)
    connect(machine, now=back_at)
    assert machines_offline_alert(now=back_at + timedelta(seconds=1)) == (0, 1)
    assert machines_offline_alert(now=back_at + timedelta(seconds=2)) == (0, 0)
    assert len(mail.outbox) == 2
    assert mail.outbox[1].subject == 'Ballast: your machine "rig-1" is back online'


def test_it_alerts_again_for_a_second_outage(machine):
    t0 = machine.last_heartbeat_at
    machines_offline_alert(now=t0 + timedelta(seconds=400))
    connect(machine, now=t0 + timedelta(seconds=500))
    machines_offline_alert(now=t0 + timedelta(seconds=501))
    machines_offline_alert(now=t0 + timedelta(seconds=900))
    assert [m.subject.rsplit(" ", 1)[1] for m in mail.outbox] == [
        "offline",
        "online",
        "offline",
    ]


def test_it_says_nothing_for_a_short_blip(machine):
    t0 = machine.last_heartbeat_at
    connect(machine, now=t0 + timedelta(seconds=200))
    assert machines_offline_alert(now=t0 + timedelta(seconds=400)) == (0, 0)
    assert mail.outbox == []


def test_it_never_alerts_a_machine_that_never_connected(owner, db):
    from hosts.services import machine_register

    machine_register(owner=owner, name="new")
    assert machines_offline_alert(now=timezone.now() + timedelta(days=1)) == (0, 0)


def test_it_sends_one_email_when_two_runs_race_for_one_machine(machine):
    """The compare-and-set: a second run that saw the same stale row sends nothing."""
    now = machine.last_heartbeat_at + timedelta(seconds=600)
    assert machine_offline_alert_try(machine_id=machine.id, now=now) is True
    assert (
        machine_offline_alert_try(machine_id=machine.id, now=now + timedelta(seconds=1))
        is False
    )
    assert len(mail.outbox) == 1


def test_it_keeps_the_outage_unmarked_when_the_email_fails(machine, monkeypatch):
    """Sending inside the transaction: a failed send is retried by the next run."""
    from hosts import emails

    def broken(**_):
        raise ConnectionError("smtp down")

    monkeypatch.setattr(emails, "machine_offline", broken)
    now = machine.last_heartbeat_at + timedelta(seconds=600)
    with pytest.raises(ConnectionError):
        machines_offline_alert(now=now)
    assert Machine.objects.get(id=machine.id).offline_alert_sent_at is None
    monkeypatch.undo()
    assert machines_offline_alert(now=now) == (1, 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_sends_one_email_when_two_workers_run_at_once(owner, catalog):
    """Two concurrent runs (threads, each with its own connection) send one email.

    PostgreSQL only: the test database of SQLite is a shared-cache in-memory one that
    answers "table is locked" instead of waiting (the product's SQLite file waits).
    """
    if connection.vendor != "postgresql":
        pytest.skip(
            "needs PostgreSQL: in-memory SQLite test databases cannot wait for locks"
        )
    from hosts.services import machine_register

    machine, _ = machine_register(owner=owner, name="rig-race")
    connect(machine)
    now = Machine.objects.get(id=machine.id).last_heartbeat_at + timedelta(seconds=600)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def worker():
        from django.db import connections

        try:
            barrier.wait(timeout=10)
            results.append(machines_offline_alert(now=now))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert sorted(results) == [(0, 0), (1, 0)]
    assert len(mail.outbox) == 1
