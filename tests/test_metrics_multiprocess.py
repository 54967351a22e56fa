"""Several coordinator processes, one scrape: with ``PROMETHEUS_MULTIPROC_DIR``
shared, ``/metrics`` served by any process sums every process's counters
(prometheus-client's multiprocess mode, docs/metrics.md). Real processes: the
mode is chosen when prometheus-client is imported."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from ballast.stack import ROOT, manage

COUNT_ONE = """
import django; django.setup()
from ballast import metrics
metrics.attempt_ended(outcome="stalled", kind="fresh")  # autocommit: counted at once
"""

SCRAPE = """
import django; django.setup()
from django.conf import settings
from django.test import Client
settings.ALLOWED_HOSTS = ["*"]
settings.BALLAST_METRICS_TOKEN = "t"
print(Client().get("/metrics", headers={"authorization": "Bearer t"}).content.decode())
"""


def test_it_sums_the_counters_of_every_process(tmp_path):
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DATABASE_URL", None)  # a SQLite database of its own
    env.update(
        DJANGO_SETTINGS_MODULE="ballast.settings",
        BALLAST_VAR_DIR=str(tmp_path / "var"),
        PROMETHEUS_MULTIPROC_DIR=str(shared),
    )
    manage("migrate", "--noinput", "-v0", env=env)
    for _ in range(2):  # two processes, each counts one stalled attempt
        subprocess.run([sys.executable, "-c", COUNT_ONE], env=env, cwd=ROOT, check=True)
    text = subprocess.run(
        [sys.executable, "-c", SCRAPE],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = ("ballast_attempts_total", (("kind", "fresh"), ("outcome", "stalled")))
    assert samples[key] == 2
    assert ("ballast_devices_online", (("model", "smollm2-135m-instruct"),)) in samples
