"""The channel layer and Celery (Redis when ``REDIS_URL`` is set, else the
in-memory layer and a server-less broker), and email."""

from __future__ import annotations

import os

from ballast.envvars import (
    env_url,
)

from .base import VAR_DIR

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
