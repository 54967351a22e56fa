"""ASGI entry point: HTTP (Django) and websockets (Channels).

Websocket routes: ``/ws/host/`` (PROTOCOL.md §2, agents) and ``/ws/v1/chat/``
(PROTOCOL.md §1, renters). Both authenticate with a bearer header themselves.
"""

import asyncio
import contextlib
import gc
import os
import socket
import tempfile

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.exceptions import RequestAborted, RequestDataTooBig  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, get_script_prefix  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.urls import path, resolve, reverse, set_script_prefix  # noqa: E402  # noqa: E402

from jobs import views as job_views  # noqa: E402
from jobs.consumers import RenterChatConsumer  # noqa: E402
from trust.consumers import MachineConsumer  # noqa: E402


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

    async def handle(self, scope, receive, send) -> None:
        """Django's ``ASGIHandler.handle``, without the request signals.

        ``request_started`` and ``request_finished`` only have sync receivers
        (``reset_queries``, ``close_old_connections``), so Django sends each through
        a hop to asgiref's one sync thread, on the event loop's time (profiled:
        0.26 ms of each request's time to first token). Their work concerns the
        database connection of the thread a request runs on; the completions run
        theirs through ``ballast.db.db_call``, which closes old connections around
        every call itself. The rest is Django's: the body read, the request
        object, the response sent while a disconnect is listened for (a renter
        going away cancels the view, which cancels its job), the response's
        resources closed at the end (inline: they are the request's body file and
        the finished stream).
        """
        try:
            body_file = await self.read_body(receive, _declared_length(scope))
        except RequestAborted:
            return
        except RequestDataTooBig:
            await self.send_response(job_views.body_too_large_response(), send)
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return

        send = HeadersWithFirstBody(send)

        async def process_request():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while the response was sent
            finally:
                send.release()
            return response

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request()),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                with contextlib.suppress(RequestAborted):
                    task.result()
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not tasks[1].cancelled():
            for closer in tasks[1].result()._resource_closers:
                with contextlib.suppress(Exception):  # as HttpResponse.close
                    closer()
        body_file.close()

    async def read_body(self, receive, declared: int | None = None):
        """Django's ``read_body``, bounded by ``DATA_UPLOAD_MAX_MEMORY_SIZE``
        (bytes): a body whose ``Content-Length`` (``declared``) or bytes received
        so far pass it raises RequestDataTooBig at once, before the rest is read
        or stored (Django reads it all, to a temporary file, before its own
        check: a client without a key could make the server take a gigabyte).
        Raises RequestAborted when the client disconnects."""
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and declared is not None and declared > limit:
            raise RequestDataTooBig("Content-Length past DATA_UPLOAD_MAX_MEMORY_SIZE")
        body_file = tempfile.SpooledTemporaryFile(
            max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b"
        )
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body_file.close()
                raise RequestAborted()
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit is not None and size > limit:
                body_file.close()
                raise RequestDataTooBig("body past DATA_UPLOAD_MAX_MEMORY_SIZE")
            body_file.write(chunk)
            if not message.get("more_body", False):
                break
        body_file.seek(0)
        return body_file

    def load_middleware(self, is_async: bool = False) -> None:
        """No middleware; the view is the one ``jobs/urls.py`` routes the path to;
        Django's conversion of an exception to a 500 response is kept (the views
        answer their own errors in OpenAI's shape first)."""
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(_api_view_call)


def _declared_length(scope) -> int | None:
    """The request's ``Content-Length`` (bytes), None when absent or not a number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _api_view_call(request):
    return await resolve(request.path_info).func(request)


class HeadersWithFirstBody:
    """An ASGI ``send`` that holds a response's headers until its first body
    message is written, so both leave in one TCP segment (Linux ``TCP_CORK`` on
    the connection's socket, set at ``http.response.start``, cleared after the
    first ``http.response.body``).

    A streamed completion's status waits for its first token (PROTOCOL.md §1:
    a failure before output is a 502/503/504), so its headers and first chunk
    are written back to back: sent apart, the renter wakes twice, once to parse
    the headers, once for the token, both on its time to first token
    (docs/performance.md, seventh round). Where the server gives no socket (a
    server other than uvicorn, a test's ``send``) or the platform has no such
    option, messages go straight through. ``release()`` clears the hold, for a
    response that ended without a body message; the kernel itself flushes a
    held segment after 200 ms at most.
    """

    def __init__(self, send) -> None:
        self.send = send
        self.held = False
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        self.socket = (
            transport.get_extra_info("socket")
            if transport is not None and hasattr(socket, "TCP_CORK")
            else None
        )

    async def __call__(self, message: dict) -> None:
        if self.socket is not None and message["type"] == "http.response.start":
            self._hold(True)
        try:
            await self.send(message)
        finally:
            if self.held and message["type"] != "http.response.start":
                self.release()

    def release(self) -> None:
        """Write what is held now (idempotent)."""
        if self.held:
            self._hold(False)

    def _hold(self, on: bool) -> None:
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, int(on))
        except OSError:  # the connection is gone: nothing to hold
            on = False
        self.held = on


# the completions' URL names (jobs/urls.py): served by ``ApiHandler``
API_URL_NAMES = ("chat-completions", "completions")
API_PATHS = frozenset(reverse(name) for name in API_URL_NAMES)
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
                path("ws/host/", MachineConsumer.as_asgi()),
                path("ws/v1/chat/", RenterChatConsumer.as_asgi()),
            ]
        ),
    }
)


# the collector's thresholds for a long-running server (Python's defaults:
# 700, 10, 10), in allocations of container objects between collections
GC_THRESHOLDS = (20_000, 50, 100)


def gc_tune() -> None:
    """Tune Python's cyclic garbage collector for the coordinator's process,
    once its code and Django are loaded: what exists now (modules, Django's
    registries, ~10⁵ objects) is moved out of the collector's reach
    (``gc.freeze``), and collections run ``GC_THRESHOLDS`` apart instead of
    every 700 allocations. A burst of requests allocates fast; each collection
    walked the young objects of every request in flight and, every hundred of
    them, the whole heap. Measured (three same-run pairs, without → with): one
    renter's 50 concurrent streams, time to first token p50 150–246 → 128–143
    ms (in-memory layer), 191–211 → 129–132 ms (pub/sub); sequential requests
    unchanged within the noise (docs/performance.md).
    Cyclic garbage waits longer to be freed; reference counting, which frees
    almost everything, is not affected."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


gc_tune()
