"""Slow and idle clients: limits uvicorn's h11 protocol lacks (lifecycle step 1).

uvicorn has keep-alive timeouts, a connection cap (503 past it) and h11's bound on an
incomplete header block, but no deadline for receiving a request's headers: a client that
trickles them holds its connection forever. ``GuardedH11Protocol`` adds that deadline; the body
deadline (408) is in ``read_body``. Chosen over another server (hypercorn has similar gaps for
h11) to keep uvicorn, which the rest of the stack and its signal handling are built on.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from shared.api.errors import APIError


class GuardedH11Protocol(H11Protocol):
    """Closes a connection whose request headers are not complete ``header_timeout`` seconds
    after it opened, or after the first bytes of its next request."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first bytes of a keep-alive connection's next request start its clock (idle
        # time before them is the keep-alive timeout's business).
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:    # the request line and headers are in
            self._cancel_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_h11(header_timeout: float) -> Any:
    """The protocol class uvicorn instantiates for each connection."""
    return functools.partial(GuardedH11Protocol, header_timeout=header_timeout)


class HeaderLimitMiddleware:
    """431 for a header block over ``max_bytes`` (h11's own bound only catches a block that
    arrives in pieces; one sent at once is parsed whole)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) + 4 for k, v in scope["headers"])
            if size > self.max_bytes:
                error = APIError(431, f"request headers are {size} bytes, over the limit of "
                                      f"{self.max_bytes} (--max-header-bytes)")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
