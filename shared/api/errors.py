"""OpenAI error objects: every failure a client sees is one of these, never a stack trace."""
from __future__ import annotations

import logging

import msgspec
from starlette.responses import Response

from shared.errors import EngineDeadError, ParamError, QueueFullError, RequestFailedError, RequestTooLongError

# status -> (OpenAI error type, default code)
_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "queue_full"),
    431: ("invalid_request_error", "request_headers_too_large"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "engine_unavailable"),
}

log = logging.getLogger("twinserve.api")


class APIError(Exception):
    """Raised anywhere in the API layer; turned into a JSON error response or SSE error event."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        err_type, default_code = _KINDS.get(self.status, ("invalid_request_error", None))
        return {"error": {"message": self.message, "type": err_type, "param": self.param,
                          "code": self.code or default_code}}

    def response(self) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return Response(msgspec.json.encode(self.body()), status_code=self.status,
                        media_type="application/json", headers=headers)


def to_api_error(exc: BaseException) -> APIError:
    """Map engine and validation exceptions to the status a client should see."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestTooLongError):
        return APIError(400, str(exc), exc.param, "context_length_exceeded")
    if isinstance(exc, ParamError):
        return APIError(400, str(exc), exc.param)
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc) or "too many requests are waiting; retry later")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc) or "the engine cannot serve requests")
    if isinstance(exc, RequestFailedError):     # already logged once, in the core
        return APIError(500, str(exc), code="request_failed")
    # Unexpected: log the traceback for the operator, name only the class to the client.
    log.error("internal error while serving a request", exc_info=exc)
    return APIError(500, f"internal server error ({type(exc).__name__})")
