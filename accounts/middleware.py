"""Page middleware of the accounts: an htmx request whose session has ended.

A live part of a page (the machine table polling ``/machines/rows/``) asks with
htmx; once the session has ended, ``login_required`` answers with a redirect to the
login page, which the browser's XHR follows silently, and htmx swapped the whole
login page into the table. This middleware turns that redirect into htmx's
``HX-Redirect`` (django-htmx's ``HttpResponseClientRedirect``): the browser itself
goes to the login page, which brings the user back to the page they were on.
"""

from __future__ import annotations

from urllib.parse import urlencode

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class HtmxLoginRedirectMiddleware:
    """Answer an htmx request redirected to ``LOGIN_URL`` with ``HX-Redirect``.

    Shape: any response that is a 301/302 whose ``Location`` path is the login
    URL, to a request with ``HX-Request: true`` (``request.htmx``, set by
    django-htmx's middleware, which must come before this one), becomes a 200 with
    ``HX-Redirect: LOGIN_URL?next=<the page's path>`` (the page is
    ``HX-Current-URL``'s path; the request's own path when it is absent). Other
    responses pass unchanged.
    """

    sync_capable = True
    async_capable = True  # a sync middleware would push every async view to a thread

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        return self.rewrite(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        return self.rewrite(request, await self.get_response(request))

    def rewrite(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        """The response, or its HX-Redirect when it sends an htmx request to log in."""
        if not getattr(request, "htmx", False) or response.status_code not in (
            301,
            302,
        ):
            return response
        login = resolve_url(settings.LOGIN_URL)
        if not response.get("Location", "").split("?", 1)[0].endswith(login):
            return response
        page = request.htmx.current_url_abs_path or request.get_full_path()
        return HttpResponseClientRedirect(f"{login}?{urlencode({'next': page})}")
