"""A fault in one request's own work inside the core fails that request alone (both engines)."""
from __future__ import annotations

import concurrent.futures

from tests.shared.api.api_helpers import CHAT, HELLO, assert_error
from tests.shared.api.conftest import FAULT_SEED


def test_one_requests_fault_fails_it_alone(edge_server) -> None:
    with edge_server.client() as c:
        normal = {"messages": HELLO, "max_tokens": 12, "ignore_eos": True, "temperature": 0.5, "seed": 1}
        faulty = {**normal, "seed": FAULT_SEED}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            good = pool.submit(c.post, CHAT, json=normal)
            bad = pool.submit(c.post, CHAT, json=faulty)
            err = assert_error(bad.result(), 500)
            assert err["code"] == "request_failed" and "injected" in err["message"]
            assert good.result().status_code == 200
            assert good.result().json()["usage"]["completion_tokens"] == 12
        # Streamed: it fails on its first token, before the stream opened, so a plain 500.
        with c.stream("POST", CHAT, json={**faulty, "stream": True}) as resp:
            resp.read()
            assert_error(resp, 500)
        assert c.get("/health").status_code == 200
        assert c.post(CHAT, json=normal).status_code == 200
