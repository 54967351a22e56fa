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


def test_the_embedded_default_keeps_its_sqlite_connection_between_calls(tmp_path):
    """Every database call closes old connections around it (``ballast.db.
    db_call``); SQLite's, on the embedded default or a ``DATABASE_URL``, is not
    one: opening it again cost each call about 2 ms (docs/performance.md)."""
    code = (
        "import django; django.setup()\n"
        "from asgiref.sync import async_to_sync\n"
        "from django.db import connection\n"
        "from ballast.db import db_call\n"
        "def opened():\n"
        "    connection.ensure_connection()\n"
        "    return connection.connection\n"
        "call = async_to_sync(db_call(opened))\n"
        "first = call()\n"
        "print(call() is first)\n"
    )
    for url in ("", f"sqlite:///{tmp_path / 'other.sqlite3'}"):
        env = {
            **os.environ,
            "BALLAST_VAR_DIR": str(tmp_path / "var"),
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "ballast.settings",
        }
        if not url:
            env.pop("DATABASE_URL")
        run = _run(env, "-c", code)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "True", (url, run.stdout)


# The production environment README "Production" documents (values made up).
PRODUCTION_ENV = {
    "DJANGO_SECRET_KEY": "k" * 10
    + "3Qv9-pX2_mZr7LtYw8uNcE4sHbGd6aJfK1oTiVyU5nRqWxP0lS",
    "DJANGO_ALLOWED_HOSTS": "ballast.example.com",
    "DATABASE_URL": "postgres://ballast@db.internal:5432/ballast",
    "REDIS_URL": "redis://redis.internal:6379/0",
    "DJANGO_EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto=https",
}


def _outside_development(tmp_path, **env: str) -> dict[str, str]:
    """This process's environment without development mode or Django's
    variables, plus ``env``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "PYTEST_"))
        and k not in {"BALLAST_DEV", "DATABASE_URL", "REDIS_URL"}
    }
    return {
        **base,
        "BALLAST_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "ballast.settings",
        **env,
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_the_documented_production_environment(tmp_path):
    """``manage.py check --deploy`` reports nothing, not even a warning."""
    run = _run(
        _outside_development(tmp_path, **PRODUCTION_ENV),
        "manage.py",
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "System check identified no issues" in run.stdout, run.stdout


def test_it_refuses_to_start_without_a_secret_key_or_allowed_hosts(tmp_path):
    """Outside development (no ``BALLAST_DEV=1``) a missing secret key or host
    list, '*' as the hosts, or ``DJANGO_DEBUG=1`` stop start-up naming the
    variable."""
    cases = [
        ("DJANGO_SECRET_KEY", {"DJANGO_SECRET_KEY": ""}),
        ("DJANGO_ALLOWED_HOSTS", {"DJANGO_ALLOWED_HOSTS": ""}),
        ("DJANGO_ALLOWED_HOSTS", {"DJANGO_ALLOWED_HOSTS": "*"}),
        ("DJANGO_DEBUG", {"DJANGO_DEBUG": "1"}),
        ("DJANGO_SECURE_PROXY_SSL_HEADER", {"DJANGO_SECURE_PROXY_SSL_HEADER": "x"}),
    ]
    for name, change in cases:
        env = _outside_development(tmp_path, **{**PRODUCTION_ENV, **change})
        run = _run(env, "manage.py", "check")
        assert run.returncode != 0, (name, run.stdout)
        assert "ImproperlyConfigured" in run.stderr and name in run.stderr, (
            name,
            run.stderr[-500:],
        )


def test_production_is_debug_off_https_only_and_development_is_not(tmp_path):
    code = (
        "from django.conf import settings as s; print(s.DEBUG, s.SESSION_COOKIE_SECURE,"
        " s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_SSL_REDIRECT,"
        " s.SECURE_PROXY_SSL_HEADER)"
    )
    production = _run(_outside_development(tmp_path, **PRODUCTION_ENV), "-c", code)
    assert production.returncode == 0, production.stderr
    assert production.stdout.split(maxsplit=5) == [
        "False",
        "True",
        "True",
        "31536000",
        "True",
        "('HTTP_X_FORWARDED_PROTO', 'https')\n",
    ]
    development = _run(_outside_development(tmp_path, BALLAST_DEV="1"), "-c", code)
    assert development.returncode == 0, development.stderr
    assert development.stdout.split() == [
        "True",
        "False",
        "False",
        "0",
        "False",
        "None",
    ]


def test_liveness_settings_that_would_break_liveness_are_refused_at_start(tmp_path):
    """Max age 5 s with the default lease (5 s) and margin (1 s) marked every
    machine stale at once (``hosts.liveness.stale_after_s`` was 0): no device
    was ever eligible. Such settings now stop start-up naming the variables; a
    combination that leaves room for the heartbeats starts."""
    broken = [
        (
            {"BALLAST_HEARTBEAT_MAX_AGE_S": "5", "BALLAST_HEARTBEAT_INTERVAL_S": "1"},
            "BALLAST_HEARTBEAT_MAX_AGE_S − BALLAST_LEASE_S − BALLAST_LEASE_MARGIN_S",
        ),
        (
            {"BALLAST_HEARTBEAT_INTERVAL_S": "25"},
            "BALLAST_HEARTBEAT_INTERVAL_S (25)",
        ),
        ({"BALLAST_LEASE_RENEW_S": "5"}, "BALLAST_LEASE_RENEW_S (5)"),
    ]
    for change, named in broken:
        run = _run(
            _outside_development(tmp_path, BALLAST_DEV="1", **change),
            "manage.py",
            "check",
        )
        assert run.returncode != 0 and "ImproperlyConfigured" in run.stderr, change
        assert named in run.stderr, (change, run.stderr[-400:])
    works = {
        "BALLAST_HEARTBEAT_MAX_AGE_S": "5",
        "BALLAST_HEARTBEAT_INTERVAL_S": "1",
        "BALLAST_LEASE_S": "2",
        "BALLAST_LEASE_RENEW_S": "0.5",
        "BALLAST_LEASE_MARGIN_S": "0.5",
    }
    run = _run(
        _outside_development(tmp_path, BALLAST_DEV="1", **works), "manage.py", "check"
    )
    assert run.returncode == 0, run.stderr


def test_a_sqlite_database_url_gets_the_embedded_defaults_options(tmp_path):
    """WAL, IMMEDIATE transactions and a 30 s busy timeout, as the embedded
    default: without them ``machine_create`` failed with "database is locked"
    while the server ran."""
    code = (
        "from django.conf import settings; from django.db import connection;"
        " o = settings.DATABASES['default']['OPTIONS'];"
        " c = connection.cursor(); c.execute('PRAGMA journal_mode');"
        " print(o['transaction_mode'], o['timeout'], c.fetchone()[0])"
    )
    url = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    run = _run(
        _outside_development(tmp_path, BALLAST_DEV="1", DATABASE_URL=url), "-c", code
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["IMMEDIATE", "30", "wal"]


def test_a_low_balance_amount_that_is_not_one_is_refused_at_start(tmp_path):
    """``BALLAST_LOW_BALANCE_USD`` is a USD amount ≥ 0 of at most 9 decimals."""
    code = "from django.conf import settings; print(settings.BALLAST_LOW_BALANCE_USD)"
    cases = [("2.50", True), ("0", True), ("-1", False), ("1e-12", False)]
    for value, ok in [*cases, ("lots", False), ("nan", False)]:
        run = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={
                **os.environ,
                "BALLAST_VAR_DIR": str(tmp_path),
                "BALLAST_LOW_BALANCE_USD": value,
                "DJANGO_SETTINGS_MODULE": "ballast.settings",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.returncode == 0) is ok, (value, run.stderr[-300:])
        if not ok:
            assert "BALLAST_LOW_BALANCE_USD must be a USD amount" in run.stderr


def test_verification_settings_that_are_not_rates_are_refused_at_start(tmp_path):
    """``BALLAST_VERIFY_RATE`` (and the raised rates) are fractions 0..1, the
    deadline a number of seconds ≥ 1: anything else stops start-up naming the
    variable (trust/verification/rate.py)."""
    code = "from django.conf import settings; print(settings.BALLAST_VERIFY_RATE)"
    cases = [
        ("BALLAST_VERIFY_RATE", "0.02", True),
        ("BALLAST_VERIFY_RATE", "1.5", False),
        ("BALLAST_VERIFY_RATE", "often", False),
        ("BALLAST_VERIFY_NEW_RATE", "-0.1", False),
        ("BALLAST_VERIFY_SUSPECT_RATE", "2", False),
        ("BALLAST_VERIFY_DEADLINE_S", "0.5", False),
        ("BALLAST_VERIFY_EXEMPT_SHARE", "0", False),  # (a share over it: above 0)
        ("BALLAST_VERIFY_EXEMPT_SHARE", "0.1", True),
        ("BALLAST_VERIFY_SECOND_SHARE", "1.5", False),
        ("BALLAST_VERIFY_NEW_JOBS", "x", False),
        ("BALLAST_VERIFIER_CHECK_EVERY_S", "often", False),
        ("BALLAST_VERIFIER_TRUST_PASSES", "0", False),
        ("BALLAST_VERIFIER_CHECK_NEW_EVERY_S", "0", False),
        ("BALLAST_VERIFIER_CHECKS", "perhaps", False),
    ]
    for name, value, ok in cases:
        run = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={
                **os.environ,
                "BALLAST_VAR_DIR": str(tmp_path),
                name: value,
                "DJANGO_SETTINGS_MODULE": "ballast.settings",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.returncode == 0) is ok, (name, value, run.stderr[-300:])
        if not ok:
            assert f"{name} must be" in run.stderr


def test_access_settings_that_are_not_counts_or_seconds_are_refused_at_start(
    tmp_path,
):
    """The websockets' limits (docs/protocol-notes.md "Access"): caps are
    whole numbers ≥ 1, the hello timeout ≥ 0.1 s, the lease ≥ 1 s; anything
    else stops start-up naming the variable."""
    code = "from django.conf import settings; print(settings.BALLAST_SOCKETS_PER_KEY)"
    cases = [
        ("BALLAST_SOCKETS_PER_KEY", "8", True),
        ("BALLAST_SOCKETS_PER_KEY", "0", False),
        ("BALLAST_SOCKETS_PER_MACHINE", "two", False),
        ("BALLAST_SOCKETS_PER_ADDRESS", "1.5", False),
        ("BALLAST_HELLO_TIMEOUT_S", "2.5", True),
        ("BALLAST_HELLO_TIMEOUT_S", "0", False),
        ("BALLAST_SOCKET_LEASE_S", "0.5", False),
    ]
    for name, value, ok in cases:
        run = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={
                **os.environ,
                "BALLAST_VAR_DIR": str(tmp_path),
                name: value,
                "DJANGO_SETTINGS_MODULE": "ballast.settings",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.returncode == 0) is ok, (name, value, run.stderr[-300:])
        if not ok:
            assert "ImproperlyConfigured" in run.stderr and name in run.stderr
