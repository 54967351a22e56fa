"""Settings read at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_var_dir_is_made_whatever_the_databases(tmp_path):
    """Celery beat keeps its schedule in ``BALLAST_VAR_DIR``; with PostgreSQL and
    Redis configured nothing else made the directory, and beat stopped (the
    worker running on with no scheduled task) when it was missing."""
    var_dir = tmp_path / "not" / "yet"
    env = {
        **os.environ,
        "BALLAST_VAR_DIR": str(var_dir),
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused",
        "REDIS_URL": "redis://127.0.0.1:6379/15",
        "DJANGO_SETTINGS_MODULE": "ballast.settings",
    }
    code = "from django.conf import settings; print(settings.CELERY_BEAT_SCHEDULE_FILENAME)"
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert var_dir.is_dir()
    assert run.stdout.strip() == str(var_dir / "celerybeat-schedule")
