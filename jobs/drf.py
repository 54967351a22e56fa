"""The API's errors as DRF answers them: the exception handler DRF calls
(``REST_FRAMEWORK["EXCEPTION_HANDLER"]``), in OpenAI's shape (``errors``).

Apart from ``errors`` because DRF's views import the authentication classes,
which import the services, which raise ``errors.ApiError``: nothing of jobs
imports this module, DRF loads it by name."""

from __future__ import annotations

from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .errors import ApiError, error_body, failure_error


def openai_exception_handler(exc: Exception, context: dict):
    """DRF exception handler that answers every API error in OpenAI's shape:
    a database that cannot be reached is a 503 to retry, anything unexpected a
    500 (logged), never Django's HTML error page. Returns a DRF Response."""
    if isinstance(exc, ApiError):
        return _drf_response(exc)
    response = exception_handler(exc, context)
    if response is None:
        return _drf_response(failure_error(exc, "API request"))
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response.status_code = 401
        code = "invalid_api_key"
    elif isinstance(exc, (exceptions.NotFound, Http404)):
        code = "not_found"
        response.data = error_body(404, "not found (or not yours)", code)
        return response
    else:
        code = getattr(exc, "default_code", "error")
    detail = getattr(exc, "detail", str(exc))
    message = detail if isinstance(detail, str) else str(detail)
    response.data = error_body(response.status_code, message, code)
    return response


def _drf_response(exc: ApiError):
    """A DRF Response for an ApiError (with ``Retry-After`` when it has one)."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return Response(exc.body(), status=exc.status, headers=headers)
