"""Limits that need their own server flags: the waiting-queue bound gives 429, then recovers."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.server_util import ENGINES, start_server, stop_server
from tests.shared.api.api_helpers import COMPLETIONS, assert_error


@pytest.mark.parametrize("engine", ENGINES)
def test_queue_full_gives_429_and_server_recovers(engine: str, tmp_path: Path) -> None:
    server = start_server(engine, tmp_path / "server.log", "--max-num-seqs", "1",
                          "--max-waiting-requests", "2")
    body = {"prompt": "Count slowly:", "max_tokens": 8, "ignore_eos": True}
    try:
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(
                lambda _: httpx.post(f"{server.base_url}{COMPLETIONS}", json=body,
                                     headers=server.headers, timeout=120), range(8)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(429) >= 1 and codes.count(200) >= 2, codes
        assert set(codes) <= {200, 429}
        for r in responses:
            if r.status_code == 429:
                assert_error(r, 429)
            else:
                assert r.json()["usage"]["completion_tokens"] == 8
        with server.client() as c:
            assert c.post(COMPLETIONS, json=body).status_code == 200
    finally:
        assert stop_server(server) == 0
