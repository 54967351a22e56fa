"""OpenAI-shaped errors: ``{"error": {"message", "type", "code"}}`` (PROTOCOL.md §1)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import Http404, JsonResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "no_capacity",
    504: "timeout",
}


class ApiError(Exception):
    """An error to answer in OpenAI's shape with ``status`` (HTTP code).

    ``param`` names the bad field of a 400; ``retry_after_s`` (seconds), when
    set, is sent as the ``Retry-After`` header of an HTTP answer.
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        """The JSON body: ``{"error": {"message", "type", "code", "param"}}``."""
        return error_body(self.status, self.message, self.code, self.param)


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict:
    """An OpenAI error object for an HTTP status."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "api_error"),
            "code": code,
            "param": param,
        }
    }


log = logging.getLogger("ballast.api")

# seconds a renter is told to wait (``Retry-After``) before retrying a 503/429
RETRY_AFTER_S = 1

# the answer to a request whose database step failed to reach the database
DATABASE_UNAVAILABLE = ApiError(
    503,
    "the database is unavailable right now; retry the request",
    "service_unavailable",
    retry_after_s=RETRY_AFTER_S,
)

# the answer to a request whose message between coordinator processes (the
# channel layer: Redis) could not be sent or received: Redis is restarting
MESSAGE_LAYER_UNAVAILABLE = ApiError(
    503,
    "the coordinator's message layer is unavailable right now; retry the request",
    "service_unavailable",
    retry_after_s=RETRY_AFTER_S,
)

# what the channel layer raises when Redis cannot be reached (channels_redis
# uses redis-py; a refused or reset socket can surface as a bare OSError)
LAYER_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError)


# the answer to a request that failed on something unexpected (logged)
INTERNAL_ERROR = ApiError(500, "internal error", "internal_error")


def failure_error(exc: Exception, where: str) -> ApiError:
    """The error a request is answered with when the coordinator itself failed
    (``exc``, logged with its traceback under ``where``): a database or a
    channel layer (Redis) that cannot be reached is a 503 with ``Retry-After``,
    anything else a 500."""
    if isinstance(exc, DatabaseError):
        log.exception("%s: the database step failed", where, exc_info=exc)
        return DATABASE_UNAVAILABLE
    if isinstance(exc, LAYER_UNAVAILABLE):
        log.warning("%s: the channel layer is unavailable: %r", where, exc)
        return MESSAGE_LAYER_UNAVAILABLE
    log.exception("%s failed", where, exc_info=exc)
    return INTERNAL_ERROR


def error_response(exc: ApiError) -> JsonResponse:
    """A JsonResponse for an ApiError (with ``Retry-After`` when it has one)."""
    response = JsonResponse(exc.body(), status=exc.status)
    if exc.retry_after_s is not None:
        response["Retry-After"] = str(exc.retry_after_s)
    return response


def rate_limited(what: str, retry_after: int) -> ApiError:
    """The 429 of a request past a limit (``what`` names it), to retry after
    ``retry_after`` s (DESIGN.md "Limits and abuse")."""
    return ApiError(
        429,
        f"{what}; retry after {retry_after} s",
        "rate_limit_exceeded",
        retry_after_s=retry_after,
    )


def openai_exception_handler(exc: Exception, context: dict):
    """DRF exception handler that answers every API error in OpenAI's shape:
    a database that cannot be reached is a 503 to retry, anything unexpected a
    500 (logged), never Django's HTML error page. Returns a DRF Response."""
    # imported here: DRF's views import the authentication classes, which
    # import the services, which raise ApiError (this module)
    from rest_framework import exceptions
    from rest_framework.views import exception_handler

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
    from rest_framework.response import Response

    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return Response(exc.body(), status=exc.status, headers=headers)
