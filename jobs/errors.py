"""OpenAI-shaped errors: ``{"error": {"message", "type", "code"}}`` (PROTOCOL.md §1)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import JsonResponse
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
