"""No per-request state is left behind on any path, in either process (both engines)."""
from __future__ import annotations

import time

import httpx

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, stream_events, wait_engine_idle


def _request_state_is_empty(client: httpx.Client, timeout: float = 10.0) -> dict:
    wait_engine_idle(client)
    deadline = time.monotonic() + timeout
    while True:
        state = client.get("/debug/stats").json()["request_state"]
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_every_path_leaves_nothing_behind(server, client) -> None:
    assert client.post(CHAT, json={"messages": HELLO, "max_tokens": 3}).status_code == 200
    stream_events(client, CHAT, {"messages": HELLO, "max_tokens": 3, "n": 3})
    # A stop string: the front end aborts the request in the core.
    client.post(COMPLETIONS, json={"prompt": "1, 2, 3,", "max_tokens": 30, "stop": [","],
                                   "temperature": 0})
    # A client that leaves mid-stream.
    with client.stream("POST", CHAT, json={"messages": HELLO, "max_tokens": 500, "ignore_eos": True,
                                           "stream": True}) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i > 5:
                break
    # Refused by the API layer, and refused by the core (fits the context, not the KV cache).
    assert client.post(CHAT, json={"messages": HELLO, "max_tokens": 0}).status_code == 400
    long_prompt = " hello" * 7000
    resp = client.post(COMPLETIONS, json={"prompt": long_prompt, "max_tokens": 1})
    assert resp.status_code == 400 and "KV-cache blocks" in resp.text, resp.text
    # A bad grammar, and a constrained request that completes.
    client.post(CHAT, json={"messages": HELLO, "structured_outputs": {"regex": "a("}})
    client.post(CHAT, json={"messages": HELLO, "max_tokens": 5, "structured_outputs": {"choice": ["x"]}})
    state = _request_state_is_empty(client)
    assert state.pop("api_routes", 0) == 0     # v1: the router's request -> core map
    assert state == {"api_streams": 0, "api_detokenizers": 0,
                     "api_traced": 0, "core_requests": 0}
