"""A rental on real processes (issue 32, item 5): coordinator, Celery (worker
and beat) and an agent running the real model. The renter pays only for the
time the rented device was live: an outage in the middle of the rental is
neither charged nor paid, and a device that stays away for
``BALLAST_RENTAL_OFFLINE_END_S`` ends the rental by itself — billed for its
live time, the rest of the period back to the renter, the owner emailed why."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timezone
from decimal import Decimal

import httpx
import pytest

from ballast.stack import Stack, last_line, manage

from .env import children_rows

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
AWAY_LIMIT_S = 20  # BALLAST_RENTAL_OFFLINE_END_S here: the watch runs every 5 s
OUTAGE_S = 15  # longer than the heartbeat age the uptime forgives (10 s here)
LIVE_S = 8  # each live stretch: many heartbeats (1 s), so each bills measurably
HEARTBEAT_S = 1  # the agent's heartbeat interval (tests/e2e/env.py)
USD_PER_HOUR = Decimal("0.20")
NANO = 10**9


def _at(value) -> float:
    """A timestamp column as unix seconds (SQLite gives text, PostgreSQL datetimes)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def _machine_live(env) -> bool:
    [(connected, stale)] = children_rows(
        env, "SELECT connected, stale FROM hosts_machine"
    )
    return bool(connected) and not bool(stale)


def _no_check_open(stack) -> None:
    """Wait until no spot check is due or unanswered: the agent is stopped
    between checks (a host that hangs or dies in one has failed it)."""
    stack.wait_for(
        lambda: not children_rows(
            stack.env,
            "SELECT id FROM jobs_spotcheck WHERE passed IS NULL UNION ALL"
            " SELECT id FROM hosts_device WHERE spot_check_due_at IS NOT NULL",
        ),
        "no spot check open",
        90,
    )


def _balance_nano(stack, key) -> int:
    usage = httpx.get(
        f"{stack.url}/v1/usage", headers={"Authorization": f"Bearer {key}"}
    ).json()
    return int(Decimal(usage["balance"]) * NANO)


def test_a_rental_pays_only_live_time_and_ends_when_its_device_stays_away(
    e2e_env, tmp_path
):
    e2e_env.update(
        BALLAST_SPOT_CHECK_MAX_DELAY_S="0",
        BALLAST_RENTAL_OFFLINE_END_S=str(AWAY_LIMIT_S),
        BALLAST_HEARTBEAT_MAX_AGE_S="10",
        BALLAST_RENTAL_USD_PER_HOUR=str(USD_PER_HOUR),
    )
    with Stack(env=e2e_env, log_dir=tmp_path / "logs") as stack:
        stack.migrate()
        manage("canary_calibrate", MODEL, "--count", "3", env=stack.env)
        stack.start_coordinator()
        stack.start_celery()
        key = last_line(
            manage(
                "renter_create", "renter@example.com", "--credit", "5", env=stack.env
            )
        )
        token = last_line(
            manage("machine_create", "host@example.com", "rig", env=stack.env)
        )
        headers = {"Authorization": f"Bearer {key}"}
        stack.start_agent("rig", token)
        stack.wait_for_capacity(key, MODEL)
        [device] = httpx.get(f"{stack.url}/v1/devices", headers=headers).json()["data"]
        rental = httpx.post(
            f"{stack.url}/v1/rentals",
            headers=headers,
            json={"device": device["id"], "hours": 1},
        ).json()
        url = f"{stack.url}/v1/rentals/{rental['id']}"

        def status() -> str:
            return httpx.get(url, headers=headers).json()["status"]

        stack.wait_for(lambda: status() == "live", "the rental live", 120)
        before = _balance_nano(stack, key)
        # the live stretches are the test's input: LIVE_S each (a stretch
        # shorter than a heartbeat interval may bill nothing, within the
        # tolerance below, and leave no earning to compare)
        time.sleep(LIVE_S)

        # an outage in the middle of the rental: the agent frozen (no
        # heartbeat), then thawed — back within seconds, with no model to load
        _no_check_open(stack)
        first_kill = time.time()
        os.killpg(stack.processes["rig"].pid, signal.SIGSTOP)
        stack.wait_for(lambda: not _machine_live(stack.env), "the machine offline", 30)
        # the outage is the test's input: it lasts OUTAGE_S
        time.sleep(max(0.0, first_kill + OUTAGE_S - time.time()))
        os.killpg(stack.processes["rig"].pid, signal.SIGCONT)
        stack.wait_for(lambda: _machine_live(stack.env), "the machine back", 60)
        back = time.time()
        assert status() == "live", "a short outage does not end the rental"
        time.sleep(LIVE_S)

        # then it stays away: the rental ends itself
        _no_check_open(stack)
        second_kill = time.time()
        stack.kill("rig", signal.SIGKILL)
        stack.wait_for(lambda: status() == "stopped", "the rental ended", 90)
        ended = httpx.get(url, headers=headers).json()
        assert "offline" in ended["stop_reason"], (
            ended,
            children_rows(
                stack.env,
                "SELECT id, created_at, judged_at, passed, detail FROM jobs_spotcheck",
            ),
            second_kill,
        )

        [(starts_at, ends_at)] = children_rows(
            stack.env, "SELECT starts_at, ends_at FROM jobs_rental"
        )
        starts, stopped = _at(starts_at), _at(ends_at)
        # away since its last heartbeat, which came up to an interval before the kill
        assert stopped - second_kill >= AWAY_LIMIT_S - HEARTBEAT_S
        live_s = (first_kill - starts) + (second_kill - back)
        per_s = USD_PER_HOUR * NANO / 3600
        charged = before - _balance_nano(stack, key)
        # each edge known to a heartbeat interval (1 s) and a poll (0.2 s)
        assert abs(charged - live_s * float(per_s)) <= 3 * float(per_s), (
            charged,
            live_s,
        )
        assert charged < (stopped - starts - OUTAGE_S) * float(per_s), (
            "the outage and the time away were not charged"
        )
        earned = children_rows(
            stack.env,
            "SELECT amount_nano FROM billing_earning WHERE rental_id IS NOT NULL",
        )
        assert [amount for (amount,) in earned] == [charged * 80 // 100]
        [(unbalanced,)] = children_rows(
            stack.env,
            "SELECT COUNT(*) FROM (SELECT transaction_id FROM billing_entry"
            " GROUP BY transaction_id HAVING SUM(amount_nano) != 0) AS t",
        )
        assert unbalanced == 0
        # the owner was told why (the console email backend writes to the log)
        stack.wait_for(
            lambda: f"the rental of {device['label']} ended" in stack.log_tail("celery", 400),
            "the owner's email",
            30,
        )
        assert ended["stop_reason"].split(":")[0] in stack.log_tail("celery", 400)
