"""Ballast settings, read from the environment (PROTOCOL.md §4).

No variables give the embedded default: SQLite in the project folder, Channels'
in-memory layer, Celery on a server-less filesystem broker, console email.
``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` (channel layer and Celery broker)
switch to the production services. Every variable is read by one of the small
readers of ``ballast.envvars``, which refuse a bad value naming the variable.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ballast.envvars import (
    env_bool,
    env_codes,
    env_decimal,
    env_float,
    env_int,
    env_proxy_ssl_header,
    env_rate,
    env_required,
    env_url,
    env_usd,
    liveness_settings_check,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("BALLAST_VAR_DIR", BASE_DIR / "var"))
# made here whatever the databases: Celery beat keeps its schedule in it, and
# stopped (the worker running on without it) when it was missing
VAR_DIR.mkdir(parents=True, exist_ok=True)

# --- development mode and what production must set ----------------------------
# BALLAST_DEV=1 (set by ./dev demo, ./dev test, pytest.ini, .ci/run, bench/ and
# the Stack's children) is a developer's machine: DEBUG on unless DJANGO_DEBUG=0,
# a fixed secret key, local host names, plain-HTTP cookies. Without it the
# coordinator refuses to start unless DJANGO_SECRET_KEY and DJANGO_ALLOWED_HOSTS
# are set, and DEBUG stays off.
BALLAST_DEV = env_bool("BALLAST_DEV", False)
DEBUG = env_bool("DJANGO_DEBUG", BALLAST_DEV)
if DEBUG and not BALLAST_DEV:
    raise ImproperlyConfigured(
        "DJANGO_DEBUG=1 is for development only (set BALLAST_DEV=1 with it)"
    )
SECRET_KEY = env_required(
    "DJANGO_SECRET_KEY",
    "ballast-embedded-default-not-for-production",
    development=BALLAST_DEV,
)
ALLOWED_HOSTS = [
    host.strip()
    for host in env_required(
        "DJANGO_ALLOWED_HOSTS",
        "localhost,127.0.0.1,[::1],testserver",
        development=BALLAST_DEV,
    ).split(",")
    if host.strip()
]
if "*" in ALLOWED_HOSTS and not BALLAST_DEV:
    # any Host header would be believed: a password-reset mail could carry an
    # attacker's host name
    raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must name the hosts, not '*'")
CSRF_TRUSTED_ORIGINS = [
    origin.strip()
    for origin in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",")
    if origin.strip()
]
# HTTPS: on by default outside development (README "Production")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not BALLAST_DEV)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not BALLAST_DEV)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int(
    "DJANGO_SECURE_HSTS_SECONDS", 0 if BALLAST_DEV else 31_536_000, minimum=0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool(
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not BALLAST_DEV
)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", not BALLAST_DEV)
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "channels",
    "catalog",
    "hosts",
    "jobs",
    # spot checks, verification, checks of verifiers (above jobs: jobs.hooks)
    "trust",
    "billing",
    "support",
    "accounts",
    # the reference engine (SmolLM2 run by the agent's llama.cpp engine) that
    # calibrates the spot-check pool: only where llama-cpp-python is installed
    *(["refengine"] if importlib.util.find_spec("llama_cpp") else []),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # --- static files (WhiteNoise): served by the application in every mode ---
    "ballast.staticfiles.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # an htmx request after the session ended: HX-Redirect to the login page
    "accounts.middleware.HtmxLoginRedirectMiddleware",
]

ROOT_URLCONF = "ballast.urls"
ASGI_APPLICATION = "ballast.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------
# SQLite's options, whatever names the file (the embedded default or a
# DATABASE_URL): WAL lets the ASGI server, Celery and manage.py share the file;
# IMMEDIATE makes every transaction take the write lock up front, so the
# one-writer rule settles claims (DESIGN.md "Picking a device"); a writer waits
# up to 30 s for the lock instead of failing with "database is locked".
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    except Exception as exc:  # dj_database_url raises several types
        raise ImproperlyConfigured(
            f"DATABASE_URL is not a database URL: {exc}"
        ) from exc
    if _db["ENGINE"] == "django.db.backends.postgresql":
        # A bounded psycopg pool per process: every request's thread borrows a
        # connection instead of opening one (and many processes stay under
        # max_connections). BALLAST_DB_POOL_MAX connections at most per process.
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": env_int("BALLAST_DB_POOL_MAX", 8, minimum=1),
            "timeout": 30,
        }
        # Django's backend whose pool checks each connection as it hands it out
        # (``ballast.dbpool.CheckedPool``): one the server closed (a restart, a
        # killed session) is replaced at once instead of failing the request
        # that got it, and a healthy one costs no round trip (Django's
        # CONN_HEALTH_CHECKS sends an empty query every time, and its pool
        # sleeps 1 s, 2 s, … after each connection that fails the check)
        _db["ENGINE"] = "ballast.postgresql"
        # prepared statements: parameters bound by the server and a statement a
        # connection has run 5 times prepared, so PostgreSQL plans it once per
        # connection, not at every run (the dispatch's claim spent most of its
        # server time planning: docs/performance.md). Django turns them off by
        # default for external poolers (PgBouncer in transaction mode); this
        # pool is the process's own. Restart the coordinators after a migration
        # that changes a table's columns (docs/scaling.md).
        _db["OPTIONS"]["server_side_binding"] = True
        _db["OPTIONS"]["prepare_threshold"] = 5
    elif _db["ENGINE"] == "django.db.backends.sqlite3":
        _db["OPTIONS"] = {**SQLITE_OPTIONS, **_db.get("OPTIONS", {})}
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BALLAST_SQLITE_PATH", str(VAR_DIR / "ballast.sqlite3")),
        "OPTIONS": dict(SQLITE_OPTIONS),
    }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channel layer and Celery -----------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    _layer = os.environ.get(
        "BALLAST_CHANNEL_LAYER", "channels_redis.pubsub.RedisPubSubChannelLayer"
    )
    CHANNEL_LAYERS = {"default": {"BACKEND": _layer, "CONFIG": {"hosts": [REDIS_URL]}}}
    if _layer == "channels_redis.core.RedisChannelLayer":
        # every process-specific channel of a process shares one Redis list: its
        # default capacity (100) overflows with the tokens of a few streams in flight
        # (ChannelFull, the host's connection dropped); docs/performance.md "Relay"
        CHANNEL_LAYERS["default"]["CONFIG"]["capacity"] = 5000
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {
        "default": {
            # Channels' in-memory layer without its per-message costs (ballast/layers.py)
            "BACKEND": "ballast.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 5000, "expiry": 60},
        }
    }
    _broker_dir = VAR_DIR / "celery-broker"
    for _sub in ("out", "processed"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TIMEZONE = "UTC"

# --- email --------------------------------------------------------------------
EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = os.environ.get("DJANGO_DEFAULT_FROM_EMAIL", "ballast@localhost")
# the site's address as people reach it: emails link absolutely under it
BALLAST_PUBLIC_URL = env_url("BALLAST_PUBLIC_URL", "http://localhost:8000")

# --- auth, i18n, static ---------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/machines/"
LOGOUT_REDIRECT_URL = "/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files (WhiteNoise) ---------------------------------------------------
# The application serves its own static files in every mode (the demo, the README's
# production command, the tests): WhiteNoise from STATIC_ROOT, which
# ``collectstatic`` fills with compressed files under content-hashed names
# (``ballast.3f2a….css``, cached for ever). ./dev runs collectstatic before the
# demo and the tests; a page naming a file collectstatic has not seen fails loudly
# (ValueError from the manifest) instead of linking a 404.
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("BALLAST_STATIC_ROOT", BASE_DIR / "var" / "static"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_AUTOREFRESH = False  # the files of STATIC_ROOT only, as in production

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["jobs.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "jobs.drf.openai_exception_handler",
    # the renter API takes JSON only (a form's fields would all be strings: 415)
    "DEFAULT_PARSER_CLASSES": ["jobs.parsers.JsonParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Ballast renter API",
    "VERSION": "1",
    # the completions are plain async views: documented by twins (jobs.schema.completions)
    "PREPROCESSING_HOOKS": ["jobs.schema.completions.completions_endpoints"],
    "SERVE_INCLUDE_SCHEMA": False,  # the schema itself is no renter endpoint
    "ENUM_NAME_OVERRIDES": {
        "ChatCompletionObjectEnum": "jobs.schema.completion_answers.CHAT_OBJECT",
        "ChatCompletionChunkObjectEnum": "jobs.schema.completion_answers.CHAT_CHUNK_OBJECT",
        "TextCompletionObjectEnum": "jobs.schema.completion_answers.TEXT_OBJECT",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "ballast": {
            "handlers": ["console"],
            "level": os.environ.get("BALLAST_LOG_LEVEL", "INFO"),
        },
    },
}

# --- Ballast rules (PROTOCOL.md §4), read once at start -------------------------
BALLAST_CLAIM_TIMEOUT_S = env_float("BALLAST_CLAIM_TIMEOUT_S", 5.0)
BALLAST_FIRST_TOKEN_TIMEOUT_S = env_float("BALLAST_FIRST_TOKEN_TIMEOUT_S", 20.0)
BALLAST_STALL_TIMEOUT_S = env_float("BALLAST_STALL_TIMEOUT_S", 10.0)
BALLAST_QUEUE_TIMEOUT_S = env_float("BALLAST_QUEUE_TIMEOUT_S", 120.0)
BALLAST_MAX_ATTEMPTS = env_int("BALLAST_MAX_ATTEMPTS", 3, minimum=1)
BALLAST_HEARTBEAT_MAX_AGE_S = env_float("BALLAST_HEARTBEAT_MAX_AGE_S", 30.0)
BALLAST_HEARTBEAT_INTERVAL_S = env_float(
    "BALLAST_HEARTBEAT_INTERVAL_S", 10.0, minimum=0.05
)
# Liveness lease of each coordinator process (hosts.liveness): renewed every
# BALLAST_LEASE_RENEW_S to BALLAST_LEASE_S ahead; a machine silent for longer than
# max age − lease − margin is marked stale before each renewal.
BALLAST_LEASE_S = env_float("BALLAST_LEASE_S", 5.0, minimum=0.1)
BALLAST_LEASE_RENEW_S = env_float("BALLAST_LEASE_RENEW_S", 1.0, minimum=0.02)
BALLAST_LEASE_MARGIN_S = env_float("BALLAST_LEASE_MARGIN_S", 1.0)


liveness_settings_check(
    max_age_s=BALLAST_HEARTBEAT_MAX_AGE_S,
    interval_s=BALLAST_HEARTBEAT_INTERVAL_S,
    lease_s=BALLAST_LEASE_S,
    renew_s=BALLAST_LEASE_RENEW_S,
    margin_s=BALLAST_LEASE_MARGIN_S,
)
BALLAST_MAX_GPU_TEMP_C = env_float("BALLAST_MAX_GPU_TEMP_C", 88.0)

# the regions machines may be in (hosts.regions); none given: all of hosts.regions.REGIONS
BALLAST_REGIONS = env_codes("BALLAST_REGIONS")
# what a host may declare (hosts.protocol): devices in a hello (indexes below it),
# slots a device may report
BALLAST_MAX_DEVICES_PER_MACHINE = env_int(
    "BALLAST_MAX_DEVICES_PER_MACHINE", 16, minimum=1
)
BALLAST_MAX_SLOTS_PER_DEVICE = env_int("BALLAST_MAX_SLOTS_PER_DEVICE", 64, minimum=1)
BALLAST_SPOT_CHECKS = env_bool("BALLAST_SPOT_CHECKS", True)
# a job's coroutine and its machine's connection in one process skip the channel
# layer (ballast.local); 0: every message through the layer
BALLAST_LOCAL_DELIVERY = env_bool("BALLAST_LOCAL_DELIVERY", True)
BALLAST_CANARY_RATE = env_float("BALLAST_CANARY_RATE", 0.02)
BALLAST_SPOT_CHECK_MAX_DELAY_S = env_float("BALLAST_SPOT_CHECK_MAX_DELAY_S", 60.0)
# the spot-check pool (trust/canarypool.py): drawn under this secret (empty: one
# derived from SECRET_KEY), never-sent prompts kept per model (at least a day's
# checks), seconds of calibration per beat run, real jobs whose shapes checks
# copy, and a deployment's own words (a JSON file outside the repository)
BALLAST_CANARY_SECRET = os.environ.get("BALLAST_CANARY_SECRET", "")
BALLAST_CANARY_POOL_AHEAD = env_int("BALLAST_CANARY_POOL_AHEAD", 1000, minimum=1)
BALLAST_CANARY_POOL_BUDGET_S = env_float(
    "BALLAST_CANARY_POOL_BUDGET_S", 20.0, minimum=1.0
)
BALLAST_CANARY_SHAPE_JOBS = env_int("BALLAST_CANARY_SHAPE_JOBS", 500, minimum=1)
BALLAST_CANARY_VOCAB_FILE = os.environ.get("BALLAST_CANARY_VOCAB_FILE", "")
BALLAST_QUARANTINE_CHECK_EVERY_S = env_float("BALLAST_QUARANTINE_CHECK_EVERY_S", 180.0)
# verification of real answers (trust/verification/rate.py): the base share of
# answers re-scored by prefill on another owner's device, raised for a
# device's first jobs and after a failed check (halving every
# BALLAST_VERIFY_SUSPECT_PASSES passes); a verifier's scores due within the deadline.
# The defaults are what bench/trust.py needed to quarantine each cheat within 100
# of its jobs in 99 % of runs (docs/trust.md); at 0.08 a host honest for 500 jobs
# and then serving another model was caught in time in 99 of 101 runs of one seed
BALLAST_VERIFY_RATE = float(env_decimal("BALLAST_VERIFY_RATE", "0.10"))
BALLAST_VERIFY_NEW_JOBS = env_int("BALLAST_VERIFY_NEW_JOBS", 20, minimum=0)
BALLAST_VERIFY_NEW_RATE = float(env_decimal("BALLAST_VERIFY_NEW_RATE", "0.5"))
BALLAST_VERIFY_SUSPECT_RATE = float(env_decimal("BALLAST_VERIFY_SUSPECT_RATE", "0.5"))
BALLAST_VERIFY_SUSPECT_PASSES = env_int("BALLAST_VERIFY_SUSPECT_PASSES", 5, minimum=1)
# the share of a device's answers that may leave something out of verification
# (a stop sequence's cut last token, bytes that are no character) before it is
# verified more (trust/verification/rate.py exempt_multiplier: its share over this);
# the share of round-1 plausible verdicts asked of a second verifier all the same
BALLAST_VERIFY_EXEMPT_SHARE = float(env_decimal("BALLAST_VERIFY_EXEMPT_SHARE", "0.05"))
if BALLAST_VERIFY_EXEMPT_SHARE <= 0:
    raise ImproperlyConfigured("BALLAST_VERIFY_EXEMPT_SHARE must be above 0 (up to 1)")
BALLAST_VERIFY_SECOND_SHARE = float(env_decimal("BALLAST_VERIFY_SECOND_SHARE", "0.2"))
# (scoring 2,000 tokens takes ~30 s on a CPU, after the generation holding the engine)
BALLAST_VERIFY_DEADLINE_S = env_float("BALLAST_VERIFY_DEADLINE_S", 300.0, minimum=1.0)
# checks of verifiers (trust/verification/checks.py): answers whose verdict the
# reference model knows, sent to each verifying device on a clock of their own:
# every BALLAST_VERIFIER_CHECK_NEW_EVERY_S on average until it has passed
# BALLAST_VERIFIER_TRUST_PASSES in a row, then every BALLAST_VERIFIER_CHECK_EVERY_S
BALLAST_VERIFIER_CHECKS = env_bool("BALLAST_VERIFIER_CHECKS", True)
BALLAST_VERIFIER_TRUST_PASSES = env_int("BALLAST_VERIFIER_TRUST_PASSES", 3, minimum=1)
BALLAST_VERIFIER_CHECK_NEW_EVERY_S = env_float(
    "BALLAST_VERIFIER_CHECK_NEW_EVERY_S", 900.0, minimum=1.0
)
BALLAST_VERIFIER_CHECK_EVERY_S = env_float(
    "BALLAST_VERIFIER_CHECK_EVERY_S", 21600.0, minimum=1.0
)
BALLAST_RENTAL_CHECK_EVERY_S = env_float("BALLAST_RENTAL_CHECK_EVERY_S", 1800.0)
BALLAST_RENTAL_USD_PER_HOUR = os.environ.get("BALLAST_RENTAL_USD_PER_HOUR", "0.20")
# a rental whose device has been offline or paused this long (s) ends itself: its
# renter pays only the live time, its owner is told why (docs/money.md "Rentals")
BALLAST_RENTAL_OFFLINE_END_S = env_float(
    "BALLAST_RENTAL_OFFLINE_END_S", 600.0, minimum=1.0
)
BALLAST_HOST_SHARE = env_decimal("BALLAST_HOST_SHARE", "0.80")
BALLAST_HOLD_HOURS = env_float("BALLAST_HOLD_HOURS", 24.0)
# a renter is emailed once when their balance falls below this (USD; 0: never),
# unless they set their own threshold (docs/money.md "Low balance")
BALLAST_LOW_BALANCE_USD = env_usd("BALLAST_LOW_BALANCE_USD", "1.00")
BALLAST_OFFLINE_ALERT_AFTER_S = env_float("BALLAST_OFFLINE_ALERT_AFTER_S", 300.0)
BALLAST_REAPER_INTERVAL_S = env_float("BALLAST_REAPER_INTERVAL_S", 30.0, minimum=1.0)

# --- limits and abuse (DESIGN.md "Limits and abuse"; ballast/ratelimits.py) --------
BALLAST_KEY_RATE = env_rate("BALLAST_KEY_RATE", "120/minute")
BALLAST_KEY_MAX_JOBS = env_int("BALLAST_KEY_MAX_JOBS", 16, minimum=1)
# answers that came back empty (the model ended at once) per key: past it, the
# key's requests are refused until the window frees (hosts' work is never free)
BALLAST_EMPTY_ANSWER_RATE = env_rate("BALLAST_EMPTY_ANSWER_RATE", "60/hour")
BALLAST_QUEUE_SHARE = env_decimal("BALLAST_QUEUE_SHARE", "0.5")
BALLAST_QUEUE_SHARE_MIN = env_int("BALLAST_QUEUE_SHARE_MIN", 4, minimum=1)
BALLAST_LOGIN_RATE = env_rate("BALLAST_LOGIN_RATE", "10/minute")
BALLAST_SIGNUP_RATE = env_rate("BALLAST_SIGNUP_RATE", "5/hour")
BALLAST_PASSWORD_RESET_RATE = env_rate("BALLAST_PASSWORD_RESET_RATE", "5/hour")
BALLAST_TICKET_RATE = env_rate("BALLAST_TICKET_RATE", "10/hour")
BALLAST_CODE_REDEEM_RATE = env_rate("BALLAST_CODE_REDEEM_RATE", "10/hour")
# websockets (ballast/sockets.py): a socket that has not said hello (host) or sent
# a request (renter) within BALLAST_HELLO_TIMEOUT_S is closed (4408); open sockets
# per machine, API key and client address are capped (4429), counted with a lease
# (s) that a process renews for its live sockets
BALLAST_HELLO_TIMEOUT_S = env_float("BALLAST_HELLO_TIMEOUT_S", 10.0, minimum=0.1)
BALLAST_SOCKETS_PER_MACHINE = env_int("BALLAST_SOCKETS_PER_MACHINE", 4, minimum=1)
BALLAST_SOCKETS_PER_KEY = env_int("BALLAST_SOCKETS_PER_KEY", 32, minimum=1)
BALLAST_SOCKETS_PER_ADDRESS = env_int("BALLAST_SOCKETS_PER_ADDRESS", 128, minimum=1)
BALLAST_SOCKET_LEASE_S = env_float("BALLAST_SOCKET_LEASE_S", 60.0, minimum=1.0)
# how long (s) a job whose segment the coordinator ended waits for the host's
# ``cancelled`` receipt before it closes (docs/protocol-notes.md)
BALLAST_CANCEL_RECEIPT_WAIT_S = env_float("BALLAST_CANCEL_RECEIPT_WAIT_S", 2.0)

# Metrics (docs/metrics.md): GET /metrics for staff sessions, or for a scraper
# sending "Authorization: Bearer $BALLAST_METRICS_TOKEN" (unset: staff only).
# Several processes of one machine share their counters through prometheus-client's
# own PROMETHEUS_MULTIPROC_DIR (an existing, empty folder at their start).
BALLAST_METRICS_TOKEN = os.environ.get("BALLAST_METRICS_TOKEN", "")
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
if PROMETHEUS_MULTIPROC_DIR and not os.path.isdir(PROMETHEUS_MULTIPROC_DIR):
    raise ImproperlyConfigured(
        f"PROMETHEUS_MULTIPROC_DIR must be an existing folder, got {PROMETHEUS_MULTIPROC_DIR!r}"
    )
