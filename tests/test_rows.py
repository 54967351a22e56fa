"""``ballast.rows``: instances from a fixed SELECT equal what the ORM loads,
field by field (UUIDs, aware datetimes, JSON, booleans, NULLs), on the
database the suite runs on (SQLite and PostgreSQL in CI); a LEFT JOIN that
found nothing is None."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ballast.rows import columns, instances
from hosts.models import CoordinatorLease, Device, Machine
from hosts.services import user_get_or_create
from jobs.models import Attempt, Job
from tests.devices import MODEL, device_online
from tests.factories import MachineFactory

pytestmark = pytest.mark.django_db

PARTS = (
    (Attempt, "a"),
    (Job, "j"),
    (Device, "d"),
    (Machine, "m"),
    (CoordinatorLease, "l"),
)
SQL = (
    "SELECT {cols} FROM jobs_attempt a JOIN jobs_job j ON j.id = a.job_id"
    " JOIN hosts_device d ON d.id = a.device_id"
    " JOIN hosts_machine m ON m.id = d.machine_id"
    " LEFT JOIN hosts_coordinatorlease l ON l.id = m.lease_id WHERE a.job_id = %s"
)


def _values(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _attempt(*, leased: bool) -> Attempt:
    device = device_online(MachineFactory())
    machine = device.machine
    if leased:
        machine.lease = CoordinatorLease.objects.create(
            name="here", lease_until=timezone.now() + timedelta(seconds=30)
        )
    else:
        machine.lease = None
    machine.save(update_fields=["lease"])
    now = timezone.now()
    job = Job.objects.create(
        renter=user_get_or_create(email="renter@example.com"),
        model_id=MODEL,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": "héllo ✓"}],
        params={"max_tokens": 5, "temperature": 0.5, "stop": ["\n"]},
    )
    return Attempt.objects.create(
        job=job,
        device=device,
        offered_at=now,
        claim_deadline=now + timedelta(seconds=5),
    )


@pytest.mark.parametrize("leased", [True, False])
def test_instances_equal_what_the_orm_loads(leased):
    attempt = _attempt(leased=leased)
    with connection.cursor() as cursor:
        cursor.execute(
            SQL.format(cols=columns(*PARTS)),
            [Job._meta.pk.get_db_prep_value(attempt.job_id, connection)],
        )
        (row,) = cursor.fetchall()
    got = instances(row, *PARTS)
    orm = Attempt.objects.select_related("job", "device__machine__lease").get(
        id=attempt.id
    )
    wanted = [orm, orm.job, orm.device, orm.device.machine, orm.device.machine.lease]
    assert [None if o is None else _values(o) for o in got] == [
        None if o is None else _values(o) for o in wanted
    ]
    assert (got[4] is None) == (not leased)
    assert (
        got[1].params["stop"] == ["\n"] and got[1].messages[0]["content"] == "héllo ✓"
    )
    assert timezone.is_aware(got[0].offered_at)
    assert all(o._state.adding is False for o in got if o is not None)


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="values"):
        instances((1, 2, 3), (CoordinatorLease, "l"), (CoordinatorLease, "k"))
