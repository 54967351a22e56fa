"""Everything a host sends (machine and GPU names, error texts) is escaped."""

from __future__ import annotations

from django.urls import reverse

from hosts.services import capability_failed_record, machine_register

from .conftest import connect

HOSTILE = '<script>alert("pwn")</script><img src=x onerror=alert(1)>'


def test_it_escapes_hostile_names_and_error_text(owner_client, owner, catalog):
    machine, _ = machine_register(owner=owner, name=f"rig {HOSTILE}")
    connect(machine, gpu=f"RTX {HOSTILE}")
    capability_failed_record(
        machine_id=str(machine.id),
        report={"device": 0, "model": f"m{HOSTILE}", "error": f"boom {HOSTILE}"},
    )
    pages = [
        owner_client.get(reverse("hosts:dashboard")),
        owner_client.get(reverse("hosts:machine_rows"), HTTP_HX_REQUEST="true"),
        owner_client.get(reverse("hosts:machine", args=[machine.id])),
        owner_client.get(
            reverse("hosts:device_rows", args=[machine.id]), HTTP_HX_REQUEST="true"
        ),
    ]
    for response in pages:
        html = response.content.decode()
        assert response.status_code == 200
        assert "<script>alert" not in html
        assert "<img src=x" not in html
        assert "&lt;script&gt;alert(&quot;pwn&quot;)&lt;/script&gt;" in html
