"""Errors the API layer turns into OpenAI error objects."""
from __future__ import annotations


class ParamError(ValueError):
    """A request parameter is invalid; ``param`` names it for the client (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestTooLongError(ParamError):
    """The prompt plus max_tokens does not fit the context window or the KV cache."""


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more (HTTP 503)."""


class RequestFailedError(RuntimeError):
    """This one request failed inside the engine, which goes on serving the others (HTTP 500)."""


class QueueFullError(RuntimeError):
    """Too many requests are waiting (HTTP 429)."""
