"""Machines' names and regions (issue 24 item 5): names unique per owner, whatever
their case (a database constraint, and a clear error), renaming, regions from a
fixed list; the migration that renames existing duplicates."""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor

from hosts.models import Machine
from hosts.regions import REGIONS, region_clean
from hosts.services import MachineNameTaken, machine_create, machine_register
from hosts.web_services import machine_rename, machine_settings_update
from tests.jobs.helpers import sessions_waiting_on_locks

pytestmark = pytest.mark.django_db


def test_it_refuses_a_second_machine_of_the_same_name_whatever_its_case(owner):
    machine_register(owner=owner, name="rig-1")
    for name in ("rig-1", "RIG-1", "  Rig-1  "):
        with pytest.raises(MachineNameTaken, match="already have a machine named"):
            machine_register(owner=owner, name=name)
    assert Machine.objects.filter(owner=owner).count() == 1


def test_another_owner_may_use_the_same_name(owner, stranger):
    machine_register(owner=owner, name="rig-1")
    theirs, _ = machine_register(owner=stranger, name="rig-1")
    assert theirs.name == "rig-1"


def test_the_database_refuses_a_duplicate_past_the_service(owner):
    """The constraint holds for any writer (the admin, a raw update)."""
    machine_register(owner=owner, name="rig-1")
    other, _ = machine_register(owner=owner, name="rig-2")
    with pytest.raises(IntegrityError), transaction.atomic():
        Machine.objects.filter(id=other.id).update(name="RIG-1")


def test_it_renames_a_machine_and_keeps_names_unique(owner):
    first, _ = machine_register(owner=owner, name="rig-1")
    second, _ = machine_register(owner=owner, name="rig-2")
    assert machine_rename(machine=first, name="  desk  ") == "desk"
    first.refresh_from_db()
    assert first.name == "desk"
    assert first.devices.count() == 0 or first.devices.first().label.startswith("desk/")
    with pytest.raises(MachineNameTaken):
        machine_rename(machine=second, name="Desk")
    machine_rename(machine=first, name="DESK")  # its own name in another case
    first.refresh_from_db()
    assert first.name == "DESK"


@pytest.mark.parametrize(
    "name,error",
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("x" * 101, "at most 100 characters"),
        ("rig\x00one", "control characters"),
        ("rig\u202eone", "control characters"),  # a right-to-left override
    ],
)
def test_it_refuses_a_bad_name(owner, name, error):
    with pytest.raises(ValueError, match=error):
        machine_register(owner=owner, name=name)
    machine, _ = machine_register(owner=owner, name="ok")
    with pytest.raises(ValueError, match=error):
        machine_rename(machine=machine, name=name)


def test_it_takes_regions_only_from_the_fixed_list(owner):
    machine, _ = machine_register(owner=owner, name="rig", region=" EU ")
    assert machine.region == "eu"
    with pytest.raises(ValueError, match="unknown region 'mars': use one of af, "):
        machine_register(owner=owner, name="rig-2", region="mars")
    with pytest.raises(ValueError, match="unknown region"):
        machine_settings_update(
            machine=machine, region="eu; drop", accepts_serverless=True
        )
    machine_settings_update(machine=machine, region="", accepts_serverless=True)
    machine.refresh_from_db()
    assert machine.region == ""
    assert set(REGIONS) >= {"eu", "us-east", "us-west", "ap-south"}


def test_the_settings_can_narrow_the_regions(settings):
    settings.BALLAST_REGIONS = ("eu", "lab-1")
    assert region_clean("LAB-1") == "lab-1"
    with pytest.raises(ValueError, match="use one of eu, lab-1"):
        region_clean("us-east")


def test_the_operator_command_says_what_is_wrong(owner, capsys):
    with pytest.raises(CommandError, match="unknown region 'atlantis'"):
        call_command(
            "machine_create", "owner@example.com", "rig", "--region", "atlantis"
        )
    call_command("machine_create", "owner@example.com", "rig", "--region", "eu")
    with pytest.raises(CommandError, match="already have a machine named 'RIG'"):
        call_command("machine_create", "owner@example.com", "RIG")


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_existing_duplicates(owner, stranger):
    """Before the constraint, an owner could have several machines of one name:
    migrating keeps the oldest's name and gives the others " (2)", " (3)"… (cut
    to 100 characters), then adds the constraint."""
    before = [("hosts", "0008_device_retired_at")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("hosts", "Machine")
        long = "y" * 100
        rows = [
            (owner, "rig"),
            (owner, "RIG"),
            (owner, "rig"),
            (owner, "rig (2)"),
            (owner, long),
            (owner, long),
            (stranger, "rig"),
        ]
        made = [
            old.objects.create(
                owner_id=user.pk, name=name, token_hash=f"h{i}", token_prefix=""
            ).id
            for i, (user, name) in enumerate(rows)
        ]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    names = [Machine.objects.get(id=pk).name for pk in made]
    assert names == [
        "rig",
        "RIG (3)",
        "rig (4)",
        "rig (2)",
        long,
        "y" * 96 + " (2)",
        "rig",
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_registration_racing_another_of_its_name_gets_the_clear_error(owner):
    """The second's pre-check cannot see the first's uncommitted row: its insert
    waits on the unique index until the first commits, and the constraint's
    IntegrityError becomes the same MachineNameTaken, not a server error."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no such race")
    results: list = []

    def second() -> None:
        try:
            machine_create(owner_email=owner.email, name="TWIN")
            results.append("made")
        except MachineNameTaken:
            results.append("taken")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion
            results.append(repr(exc))
        finally:
            connections.close_all()

    with transaction.atomic():
        machine_create(owner_email=owner.email, name="twin")
        racer = threading.Thread(target=second)
        racer.start()
        sessions_waiting_on_locks()
    racer.join(10)
    assert not racer.is_alive() and results == ["taken"]
    assert Machine.objects.filter(owner=owner, name__iexact="twin").count() == 1
