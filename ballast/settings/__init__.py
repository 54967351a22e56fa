"""Ballast settings, read from the environment (PROTOCOL.md §4).

No variables give the embedded default: SQLite in the project folder, Channels'
in-memory layer, Celery on a server-less filesystem broker, console email.
``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` (channel layer and Celery broker)
switch to the production services. Every variable is read by one of the small
readers of ``ballast.envvars``, which refuse a bad value naming the variable.

Grouped by concern: ``base`` (Django's own: folders,
development mode, apps, middleware), ``database``, ``services`` (the channel
layer, Celery, email), ``web`` (auth, static files, the API, logging) and
``rules`` (Ballast's own).
"""

from .base import *  # noqa: F403
from .database import *  # noqa: F403
from .rules import *  # noqa: F403
from .services import *  # noqa: F403
from .web import *  # noqa: F403
