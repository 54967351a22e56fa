"""A spot check on real processes: the canaries are calibrated on the reference
model, and an honest agent running the same model passes its first-load check."""

from __future__ import annotations

import time

import pytest

from ballast.stack import manage

from .env import children_rows

pytestmark = pytest.mark.e2e


def _spot_checks(env) -> list[tuple]:
    rows = children_rows(env, "SELECT reason, passed, detail FROM jobs_spotcheck")
    return [(r, None if p is None else bool(p), d) for r, p, d in rows]


def test_an_honest_agent_passes_its_first_spot_check(e2e_env, tmp_path):
    from ballast.stack import Stack

    e2e_env["BALLAST_SPOT_CHECK_MAX_DELAY_S"] = "0"
    with Stack(env=e2e_env, log_dir=tmp_path / "spot-logs") as stack:
        stack.migrate()
        manage(
            "canary_calibrate", "smollm2-135m-instruct", "--count", "1", env=stack.env
        )
        stack.start_coordinator()
        token = manage(
            "machine_create", "host@example.com", "honest", env=stack.env
        ).split()[-1]
        stack.start_agent("honest", token)
        deadline = time.monotonic() + 120
        checks = []
        while time.monotonic() < deadline:
            checks = [c for c in _spot_checks(stack.env) if c[1] is not None]
            if checks:
                break
            time.sleep(0.5)
        assert checks, f"no spot check judged:\n{stack.log_tail('coordinator')}"
        assert checks[0][:2] == ("first_load", True), checks
