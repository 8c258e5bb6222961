"""--generation-config FOLDER on a real server, both engines: its defaults reach the engine."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.server_util import start_server, stop_server
from tests.shared.api.api_helpers import CHAT, HELLO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["v0", "v1"])
def test_a_folders_defaults_fill_omitted_fields(engine: str, tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 12,
                                                                 "temperature": 0.0}))
    server = start_server(engine, tmp_path / "server.log", "--generation-config", str(tmp_path))
    try:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as c:
            omitted = c.post(CHAT, json={"messages": HELLO, "ignore_eos": True, "logprobs": True,
                                         "top_logprobs": 1}).json()
            given = c.post(CHAT, json={"messages": HELLO, "ignore_eos": True, "max_tokens": 7,
                                       "temperature": 1.0, "seed": 3}).json()
        # max_new_tokens stands in for an omitted max_tokens; temperature 0 makes it greedy:
        # every token is the top one (at temperature 1, twelve in a row would be unlikely).
        assert omitted["usage"]["completion_tokens"] == 12
        assert omitted["choices"][0]["finish_reason"] == "length"
        for t in omitted["choices"][0]["logprobs"]["content"]:
            assert t["logprob"] == pytest.approx(t["top_logprobs"][0]["logprob"])
        assert given["usage"]["completion_tokens"] == 7     # the request's own value wins
        log = (tmp_path / "server.log").read_text()
        assert "sampling defaults from" in log and "max_tokens" in log
    finally:
        stop_server(server)
