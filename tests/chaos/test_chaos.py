"""The bounded chaos run (issue 26): 100 requests through HAProxy to two
coordinators, 8 scripted agents (30 % SIGKILLed at a time, some stalled) and
one with the real model, coordinator B SIGKILLed and restarted, PostgreSQL and
Redis restarted, renters disconnecting mid-stream; then every invariant of
``tests.chaos.check`` from the database and the renters' records. The long form
is ``bench/chaos.py``."""

from __future__ import annotations

import json

import pytest

from .run import Chaos, ChaosConfig
from .services import services_missing

pytestmark = pytest.mark.chaos


def test_nothing_is_lost_charged_twice_or_leaked_under_faults(tmp_path):
    missing = services_missing()
    if missing:
        pytest.skip(missing)
    result = Chaos(ChaosConfig(requests=100, log_dir=tmp_path / "logs")).run()
    print(json.dumps(result.report["counts"], indent=1))
    breaches = result.report["breaches"]
    assert not breaches, "\n".join(breaches)
