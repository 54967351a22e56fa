"""Registering a machine (token once, agent command), pause/resume, settings, key reset,
and that only the owner can do any of it, always with a CSRF token."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from hosts.models import Machine
from hosts.services import machine_authenticate


def test_it_registers_a_machine_and_shows_its_token_once(owner_client, owner):
    response = owner_client.post(
        reverse("hosts:machine_register"), {"name": "desk", "region": "EU"}
    )
    machine = Machine.objects.get(owner=owner, name="desk")
    assert machine.region == "eu"
    assert response["Location"] == reverse("hosts:machine", args=[machine.id])
    html = owner_client.get(response["Location"]).content.decode()
    start = html.index('id="agent-command">') + len('id="agent-command">')
    command = html[start : html.index("</pre>", start)]
    assert command.startswith(
        "ballast-agent run --server http://testserver --token bm_"
    )
    start = html.index('id="agent-install">') + len('id="agent-install">')
    assert html[start : html.index("</pre>", start)] == (
        "pipx install &#x27;ballast-agent[llamacpp]&#x27;"
    )
    token = command.rsplit(" ", 1)[1]
    assert machine_authenticate(token=token) == machine
    again = owner_client.get(response["Location"]).content.decode()
    assert token not in again and 'id="new-token"' not in again


def test_it_refuses_an_empty_machine_name(owner_client, owner):
    response = owner_client.post(reverse("hosts:machine_register"), {"name": "   "})
    assert response.status_code == 200
    assert not Machine.objects.filter(owner=owner).exists()


def test_it_pauses_and_resumes_a_machine(owner_client, machine):
    url = reverse("hosts:machine_pause", args=[machine.id])
    owner_client.post(url, {"paused": "1", "next": "dashboard"})
    machine.refresh_from_db()
    assert machine.paused
    owner_client.post(url, {"paused": "0"})
    machine.refresh_from_db()
    assert not machine.paused


def test_it_saves_region_and_serverless(owner_client, machine):
    owner_client.post(
        reverse("hosts:machine_settings", args=[machine.id]), {"region": " US-East "}
    )
    machine.refresh_from_db()
    assert machine.region == "us-east"
    assert machine.accepts_serverless is False


def test_it_resets_the_pinned_key(owner_client, machine):
    assert machine.public_key
    owner_client.post(reverse("hosts:machine_key_reset", args=[machine.id]))
    machine.refresh_from_db()
    assert machine.public_key == ""


@pytest.mark.parametrize(
    "name,data",
    [
        ("hosts:machine_pause", {"paused": "1"}),
        ("hosts:machine_settings", {"region": "xx"}),
        ("hosts:machine_key_reset", {}),
    ],
)
def test_it_gives_a_stranger_404_and_changes_nothing(
    stranger_client, machine, name, data
):
    before = Machine.objects.filter(id=machine.id).values().get()
    response = stranger_client.post(reverse(name, args=[machine.id]), data)
    assert response.status_code == 404
    assert Machine.objects.filter(id=machine.id).values().get() == before


def test_it_refuses_changes_by_get(owner_client, machine):
    assert (
        owner_client.get(reverse("hosts:machine_pause", args=[machine.id])).status_code
        == 405
    )


def test_it_requires_csrf_on_every_form(owner, machine):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    for name in (
        "hosts:machine_pause",
        "hosts:machine_settings",
        "hosts:machine_key_reset",
        "hosts:machine_token_rotate",
        "hosts:machine_token_revoke",
    ):
        assert (
            client.post(
                reverse(name, args=[machine.id]), {"paused": "1", "confirm": "1"}
            ).status_code
            == 403
        )
    assert (
        client.post(reverse("hosts:machine_register"), {"name": "x"}).status_code == 403
    )
    machine.refresh_from_db()
    assert not machine.paused and machine.public_key
    html = client.get(reverse("hosts:machine", args=[machine.id])).content.decode()
    forms = html.split("<form")[1:]
    assert forms and all("csrfmiddlewaretoken" in f.split("</form>")[0] for f in forms)
