"""The machine page: telemetry, score parts, quarantine, jobs, earnings, failed
capabilities, benchmarks beside the catalog estimate, charts. Spot checks are not
told apart from jobs (DESIGN.md "Spot checks")."""

from __future__ import annotations

import re
from decimal import Decimal

from django.urls import reverse
from django.utils import timezone

from hosts.services import device_online_fraction
from hosts.web_services import score_samples_take


def page(client, machine):
    response = client.get(reverse("hosts:machine", args=[machine.id]))
    assert response.status_code == 200
    return response.content.decode()


def test_it_shows_devices_live_telemetry(owner_client, machine):
    html = page(owner_client, machine)
    assert "NVIDIA GeForce RTX 4090" in html
    assert "61 °C" in html
    assert "20480 MiB" in html
    assert "<code>smollm2-135m-instruct</code>" in html


def test_it_shows_the_score_and_its_three_parts(owner_client, busy_machine):
    device = busy_machine.devices.get()
    before = 20 * device_online_fraction(device=device, now=timezone.now())
    html = page(owner_client, busy_machine)
    after = 20 * device_online_fraction(device=device, now=timezone.now())
    assert "Success over the last 3 outcomes" in html
    assert "46.7 / 70" in html  # 2 of 3 succeeded
    uptime = Decimal(
        re.search(
            r"Online in the last 24 h</td><td class=\"num\">([\d.]+) / 20", html
        ).group(1)
    )
    assert (
        min(before, after) - Decimal("0.05")
        <= uptime
        <= max(before, after) + Decimal("0.05")
    )
    assert "10.0 / 10" in html  # the only device: as fast as the median
    assert "weight 0.06" in html


def test_it_shows_quarantine_and_failed_spot_checks_only(owner_client, busy_machine):
    """A failure is told (it reversed earnings); a pass is not (DESIGN.md "Spot
    checks": nothing afterwards tells a check from a job)."""
    device = busy_machine.devices.get()
    device.quarantined = True
    device.save()
    html = page(owner_client, busy_machine)
    assert "quarantined" in html and "(0 of 3 so far)" in html
    checks = html[html.index('class="spot-checks"') :]
    checks = checks[: checks.index("</table>")]
    assert "wrong_answer" in checks
    assert checks.count("<tr>") == 2, "the header and the one failure"
    assert "passed" not in checks


def test_it_lists_recent_jobs_with_outcomes_and_earnings(owner_client, busy_machine):
    html = page(owner_client, busy_machine)
    jobs = html[html.index('id="recent-jobs"') :]
    assert "first_token_timeout" in jobs
    assert "succeeded" in jobs
    assert "$0.00000192" in jobs and "held" in jobs
    assert "$0.0000032" in jobs and "released" in jobs


def test_it_shows_failed_capabilities_with_the_engines_error(
    owner_client, busy_machine
):
    html = page(owner_client, busy_machine)
    failed = html[html.index('id="failed-capabilities"') :]
    assert "llama-3.1-70b" in failed
    assert "CUDA error: out of memory (needed 40960 MiB)" in failed
    assert "agent 0.1.0 / llamacpp 0.3.16" in failed


def test_it_shows_benchmarks_beside_the_catalog_estimate(owner_client, busy_machine):
    html = page(owner_client, busy_machine)
    bench = html[html.index('id="benchmarks"') :]
    assert "142.5" in bench and "95 ms" in bench and "310 MiB" in bench
    assert "256 MiB (estimate)" in bench


def test_it_draws_the_score_and_earnings_charts(owner_client, busy_machine):
    score_samples_take()
    html = page(owner_client, busy_machine)
    assert 'id="score-chart"' in html and "<polyline" in html
    assert 'id="earnings-chart"' in html and 'class="bar"' in html


def test_it_serves_the_device_rows_fragment_to_htmx(owner_client, machine):
    url = reverse("hosts:device_rows", args=[machine.id])
    response = owner_client.get(url, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert b"<html" not in response.content and b"61 \xc2\xb0C" in response.content
    assert owner_client.get(url).status_code == 302


def test_it_hides_another_owners_machine(stranger_client, machine):
    assert (
        stranger_client.get(reverse("hosts:machine", args=[machine.id])).status_code
        == 404
    )
    fragment = reverse("hosts:device_rows", args=[machine.id])
    assert stranger_client.get(fragment, HTTP_HX_REQUEST="true").status_code == 404
