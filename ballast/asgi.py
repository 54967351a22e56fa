"""ASGI entry point: HTTP (Django) and websockets (Channels).

Websocket routes: ``/ws/host/`` (PROTOCOL.md §2, agents) and ``/ws/v1/chat/``
(PROTOCOL.md §1, renters). Both authenticate with a bearer header themselves.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.urls import path  # noqa: E402

from hosts.consumers import HostConsumer  # noqa: E402
from jobs.consumers import RenterChatConsumer  # noqa: E402


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with no middleware, for the renter completions.

    The page middleware (sessions, CSRF, messages, …) is sync-only: under ASGI
    each of its hooks is a hop to the one sync thread, a dozen per request, all
    requests of the process queueing for it. The completions need none of it
    (API-key auth, no cookies, CSRF-exempt), so their requests skip it.
    """

    async def __call__(self, scope, receive, send) -> None:
        """Handle one HTTP request, without Django's per-request ``ThreadSensitiveContext``.

        Inside that context every thread-sensitive ``sync_to_async`` call (the
        ``request_started``/``request_finished`` signals' receivers, the response's
        ``close``) gets a new one-thread executor for the request, and leaving it
        starts one more thread to join that one: two threads made per request, on
        the event loop's time (profiled: ~4 ms a request under load). The
        completions' own database work goes through ``ballast.db.db_call``;
        what stays thread-sensitive here runs on asgiref's one process-wide
        thread. Raises ValueError for a non-HTTP scope, as Django does.
        """
        if scope["type"] != "http":
            raise ValueError(f"ApiHandler serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)


API_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
api_asgi_app = ApiHandler()


async def http_app(scope, receive, send) -> None:
    """Route HTTP: the completions to ``ApiHandler``, everything else to Django."""
    app = api_asgi_app if scope["path"] in API_PATHS else django_asgi_app
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": URLRouter(
            [
                path("ws/host/", HostConsumer.as_asgi()),
                path("ws/v1/chat/", RenterChatConsumer.as_asgi()),
            ]
        ),
    }
)
