"""Django's own settings: the project's folders, development mode and what
production must set (secret key, hosts, HTTPS), the apps, the middleware and
the templates."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from ballast.envvars import (
    env_bool,
    env_int,
    env_proxy_ssl_header,
    env_required,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
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

