"""The priority request field on a real server, both engines: honoured or refused by policy."""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server_util import ENGINES, Server, start_server, stop_server
from tests.shared.api.api_helpers import (
    CHAT,
    COMPLETIONS,
    HELLO,
    assert_error,
    stream_events,
    wait_engine_idle,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=ENGINES)
def priority_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    default_model_dir: str) -> Iterator[Server]:
    # One sequence at a time, so whoever waits is admitted strictly by priority.
    log_path = tmp_path_factory.mktemp(f"prio-{request.param}") / "server.log"
    srv = start_server(request.param, log_path, "--scheduling-policy", "priority",
                       "--max-num-seqs", "1")
    yield srv
    code = stop_server(srv)
    assert code == 0, f"server exited with {code}: {log_path.read_text()[-3000:]}"


def _complete(srv: Server, priority: int, max_tokens: int) -> float:
    """POST one completion; the time it finished."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "priority": priority}
    with srv.client() as c:
        resp = c.post(COMPLETIONS, json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == max_tokens
    return time.monotonic()


def test_the_waiting_request_with_the_lower_priority_value_runs_first(priority_server: Server) -> None:
    # Client-side finish times: busy must outlast both arrivals (0.4 s) on a fast machine, and
    # the short ones must take longer than a response's delivery to this client can lag behind
    # the engine's next step (8 tokens once did not, with the core's threads on both cores).
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(_complete, priority_server, 0, 200)   # holds the only seat
        time.sleep(0.2)
        low = pool.submit(_complete, priority_server, 5, 32)
        time.sleep(0.2)
        high = pool.submit(_complete, priority_server, -5, 32)   # arrives last, runs second
        assert busy.result() < high.result() < low.result()


def test_chat_and_streams_carry_a_priority(priority_server: Server) -> None:
    with priority_server.client() as c:
        resp = c.post(CHAT, json={"messages": HELLO, "max_tokens": 3, "priority": 2})
        assert resp.status_code == 200, resp.text
        events = stream_events(c, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "priority": -1})
        assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
        wait_engine_idle(c)


@pytest.mark.parametrize("path, body", [(CHAT, {"messages": HELLO}), (COMPLETIONS, {"prompt": "Hi"})])
@pytest.mark.parametrize("stream", [False, True])
def test_fcfs_refuses_a_priority_other_than_zero(client: httpx.Client, path: str, body: dict,
                                                 stream: bool) -> None:
    body = {**body, "max_tokens": 2, "stream": stream}
    err = assert_error(client.post(path, json={**body, "priority": 1}), 400, "priority")
    assert "--scheduling-policy priority" in err["message"]
    assert client.post(path, json={**body, "priority": 0}).status_code == 200
    wait_engine_idle(client)
