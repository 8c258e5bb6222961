"""Lifecycle tracing in the API layer on a fake engine: the server-wide flag, and traces of
requests that fail still close (no per-request state left behind)."""
from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette

from shared.api import build_app
from shared.config import ServerConfig
from tests.shared.api.api_helpers import CHAT, HELLO
from tests.shared.api.fake_engine import FakeEngine


def _run(app: Starlette, fn):
    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as c:
            return await fn(c)
    return asyncio.run(main())


def _app(engine: FakeEngine, **cfg) -> Starlette:
    return build_app(engine, ServerConfig(engine="v0", **{"enable_debug_endpoints": True, **cfg}))


def test_server_flag_traces_every_request_and_header_opts_out() -> None:
    app = _app(FakeEngine(), trace=True)

    async def fn(c):
        ok = await c.post(CHAT, json={"messages": HELLO, "max_tokens": 3})
        off = await c.post(CHAT, json={"messages": HELLO, "max_tokens": 3},
                           headers={"X-Twinserve-Trace": "0"})
        return ok.json()["id"], off.json()["id"], await c.get("/debug/lifecycle")
    traced, untraced, listing = _run(app, fn)
    assert [t["request_id"] for t in listing.json()["traces"]] == [traced]
    events = listing.json()["traces"][0]["events"]
    assert [e["step"] for e in events] == [1, 2, 3, 13]    # the fake engine records no steps
    assert untraced != traced


def test_failed_requests_close_their_traces() -> None:
    app = _app(FakeEngine(die_after=2))
    header = {"X-Twinserve-Trace": "1"}

    async def fn(c):
        bad = await c.post(CHAT, json={"messages": []}, headers=header)
        died = await c.post(CHAT, json={"messages": HELLO, "stream": True, "max_tokens": 9},
                            headers=header)
        return bad.status_code, died.status_code, (await c.get("/debug/lifecycle")).json()
    bad, died, listing = _run(app, fn)
    assert (bad, died) == (400, 200)
    state = app.state.twinserve
    assert state.traces.num_live == 0 and state.tracer.num_active == 0
    assert [e["step"] for e in listing["traces"][0]["events"]] == [1]   # refused after step 1
    assert len(listing["traces"]) == 2


def test_bad_trace_header_is_400() -> None:
    async def fn(c):
        return await c.post(CHAT, json={"messages": HELLO}, headers={"X-Twinserve-Trace": "x"})
    resp = _run(_app(FakeEngine()), fn)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "x-twinserve-trace"
