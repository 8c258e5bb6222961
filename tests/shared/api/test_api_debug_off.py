"""Debug endpoints are off by default: /debug/* answer 404 and the trace header records nothing."""
from __future__ import annotations

from tests.shared.api.api_helpers import CHAT, HELLO, assert_error


def test_debug_endpoints_are_404_by_default(edge_server) -> None:
    with edge_server.client() as c:
        for path in ("/debug/stats", "/debug/lifecycle", "/debug/lifecycle/chatcmpl-x"):
            assert_error(c.get(path), 404)
        assert c.get("/health").status_code == 200


def test_the_trace_header_is_ignored_without_them(edge_server) -> None:
    with edge_server.client() as c:
        # Not even a bad header value is looked at: nothing is traced, so nothing is checked.
        r = c.post(CHAT, json={"messages": HELLO, "max_tokens": 2},
                   headers={"X-Twinserve-Trace": "bogus"})
        assert r.status_code == 200
        r = c.post(CHAT, json={"messages": HELLO, "max_tokens": 2}, headers={"X-Twinserve-Trace": "1"})
        assert r.status_code == 200 and "x-twinserve-trace-id" not in r.headers


def test_they_are_on_with_the_flag(server) -> None:
    with server.client() as c:           # the suite's server runs with --enable-debug-endpoints
        assert c.get("/debug/stats").status_code == 200
        r = c.post(CHAT, json={"messages": HELLO, "max_tokens": 2}, headers={"X-Twinserve-Trace": "bogus"})
        assert_error(r, 400, "x-twinserve-trace")
