"""ASGI entry point: HTTP (Django) and websockets (Channels).

Websocket routes: ``/ws/host/`` (PROTOCOL.md §2, agents) and ``/ws/v1/chat/``
(PROTOCOL.md §1, renters). Both authenticate with a bearer header themselves.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from hosts.consumers import HostConsumer  # noqa: E402
from jobs.consumers import RenterChatConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(
            [
                path("ws/host/", HostConsumer.as_asgi()),
                path("ws/v1/chat/", RenterChatConsumer.as_asgi()),
            ]
        ),
    }
)
