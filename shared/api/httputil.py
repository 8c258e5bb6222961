"""HTTP plumbing: bounded body reads, client-disconnect races, and bearer-token auth."""
from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.api.errors import APIError

T = TypeVar("T")
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/debug/")


class ClientGone(Exception):
    """The client closed the connection before the response was ready."""


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    """The whole body, refusing (413) anything over ``limit`` bytes, declared or not, and
    (408) a body not received within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, "invalid Content-Length header")
        if int(declared) > limit:
            raise _too_large(limit)
    try:
        return await asyncio.wait_for(_read(request, limit), timeout)
    except TimeoutError:
        raise APIError(408, f"the request body was not received within {timeout:g} s") from None


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a chunked or lying client: count while reading
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body exceeds {limit} bytes")


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` but raise ClientGone as soon as the client hangs up.

    Call only after the body has been read: then the next ASGI message is the disconnect.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientGone()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class AuthMiddleware:
    """Pure ASGI (no response buffering, so SSE streams pass straight through)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.expected is not None and scope["type"] == "http"
                and scope["path"].startswith(PROTECTED_PREFIXES) and not self._allowed(scope)):
            response = APIError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'")
            await response.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
        assert self.expected is not None
        return hmac.compare_digest(given, self.expected)
