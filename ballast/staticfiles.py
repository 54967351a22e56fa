"""WhiteNoise's middleware made async-capable.

``whitenoise.middleware.WhiteNoiseMiddleware`` is sync-only: in Django's ASGI
handler one sync middleware makes every page's async view run through
``async_to_sync`` on a thread of its own (another event loop), which the
coordinator's async views cannot afford (a job's coroutine and the request that
waits on it must share the loop). This subclass answers on the loop: the file
table is built once at start (``WHITENOISE_AUTOREFRESH`` off), so the lookup is a
dictionary read and the response opens one file; everything else is WhiteNoise's.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise for both handlers: sync as WhiteNoise, async without a thread hop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None) -> None:
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = self.find_file(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)
