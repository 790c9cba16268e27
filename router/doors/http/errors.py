"""Core exceptions to HTTP statuses and OpenAI's error body. One table of exceptions to codes
(pdserve/rpc/errors.py), then the code's HTTP status here, so both doors refuse alike."""

from __future__ import annotations

import math

import grpc
from aiohttp import web

from pdserve.rpc.errors import failure_of, retry_after_of

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}


class ModelNotFound(LookupError):
    """A request names a model this router does not serve (HTTP 404)."""


class BodyTooLarge(ValueError):
    """A body over the size the prompt limits allow (HTTP 413)."""


def error_body(kind: str, message: str, code: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_of(exc: Exception) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body for a refusal or failure."""
    if isinstance(exc, ModelNotFound):
        return 404, error_body("invalid_request_error", str(exc), "model_not_found")
    if isinstance(exc, BodyTooLarge):
        return 413, error_body("invalid_request_error", str(exc), "request_too_large")
    failure = failure_of(exc)
    status, kind = HTTP_STATUS.get(failure.code, (500, "internal_error"))
    return status, error_body(kind, failure.details, failure.code.name.lower())


def error_response(exc: Exception) -> web.Response:
    status, body = error_of(exc)
    return web.json_response(body, status=status, headers=retry_headers(exc))


def retry_headers(exc: Exception) -> dict[str, str]:
    """`Retry-After` (whole seconds, rounded up) for a refusal that knows when room may come."""
    retry_after = retry_after_of(exc)
    return {} if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}
