"""CORS: off by default; with --allowed-origins, preflight answered and headers on responses."""
from __future__ import annotations

import httpx

from tests.shared.api.api_helpers import CHAT, HELLO
from tests.shared.api.conftest import ORIGIN

PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


def test_off_by_default(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        r = c.options(CHAT, headers=PREFLIGHT)
        assert "access-control-allow-origin" not in r.headers
        r = c.get("/health", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in r.headers


def test_preflight_needs_no_api_key(edge_server):
    with httpx.Client(base_url=edge_server.base_url, timeout=30) as c:
        r = c.options(CHAT, headers=PREFLIGHT)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-allow-credentials"] == "true"
    assert set(r.headers["access-control-allow-methods"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_other_origins_and_methods_refused(edge_server):
    with httpx.Client(base_url=edge_server.base_url, timeout=30) as c:
        r = c.options(CHAT, headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        r = c.options(CHAT, headers={**PREFLIGHT, "Access-Control-Request-Method": "DELETE"})
        assert r.status_code == 400


def test_actual_request_gets_cors_headers_and_still_needs_the_key(edge_server):
    with edge_server.client() as c:
        r = c.post(CHAT, json={"messages": HELLO, "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    with httpx.Client(base_url=edge_server.base_url, timeout=30) as c:
        r = c.post(CHAT, json={"messages": HELLO, "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert r.status_code == 401
