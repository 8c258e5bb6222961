"""GET /debug/lifecycle on real servers (both engines, the suite's shared server):
a traced request shows every lifecycle step in order, in the right processes."""
from __future__ import annotations

import httpx

from tests.server_util import Server
from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO
from tests.shared.trace.lifecycle_map import assert_event_on_the_map

TRACE = {"X-Twinserve-Trace": "1"}


def _first_index(events: list[dict], step: int) -> int:
    return next(i for i, e in enumerate(events) if e["step"] == step)


def _stream_id(client: httpx.Client, body: dict, headers: dict[str, str]) -> str:
    with client.stream("POST", CHAT, json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line for line in resp.iter_lines() if line.startswith("data: {")]
    return httpx.Response(200, content=lines[0][6:]).json()["id"]


def test_traced_stream_shows_every_step_in_order(server: Server, client: httpx.Client) -> None:
    rid = _stream_id(client, {"messages": HELLO, "max_tokens": 6, "temperature": 0}, TRACE)
    resp = client.get(f"/debug/lifecycle/{rid}")
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["request_id"] == rid and doc["engine"] == server.engine
    events = doc["events"]
    firsts = [_first_index(events, step) for step in range(1, 14)]   # every step is there
    assert firsts == sorted(firsts), [(e["step"], e["name"]) for e in events]
    assert events[0]["name"] == "HTTP request received" and events[0]["t_ms"] == 0.0
    assert events[-1]["name"] == "finished" and events[-1]["step"] == 13
    assert all(a["t_ms"] <= b["t_ms"] for a, b in zip(events, events[1:]))
    for e in events:
        assert {"step", "name", "t_ms", "pid", "process", "thread", "where"} <= set(e)
        assert_event_on_the_map(e)     # the README's map names the code that recorded it
    api_pid = server.pid
    core_pid = client.get("/debug/stats").json()["pids"]["core"]
    api_steps = {e["step"] for e in events if e["pid"] == api_pid}
    core_steps = {e["step"] for e in events if e["pid"] != api_pid}
    if server.engine == "v0":
        assert core_steps == set() and api_steps == set(range(1, 14))
        # the forward pass runs in a worker thread, the rest on the loop thread
        assert {e["thread"] for e in events if e["step"] in (9, 10)} != {events[0]["thread"]}
    else:
        assert {e["pid"] for e in events} == {api_pid, core_pid}
        assert core_steps == set(range(4, 12)) and api_steps == {1, 2, 3, 4, 12, 13}
        assert {e["process"] for e in events if e["pid"] == core_pid} == {"engine-core"}


def test_decode_steps_summarised_unless_all(client: httpx.Client) -> None:
    body = {"messages": HELLO, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    summarised = client.get(f"/debug/lifecycle/{_stream_id(client, body, TRACE)}").json()["events"]
    assert sum(e["step"] == 10 for e in summarised) == 2        # prefill + first decode step
    summary = [e for e in summarised if e["name"].endswith("(summary)")]
    assert summary and any(e["detail"]["count"] == 4 for e in summary)
    rid = _stream_id(client, body, {"X-Twinserve-Trace": "all"})
    full = client.get(f"/debug/lifecycle/{rid}").json()["events"]
    assert sum(e["step"] == 10 for e in full) == 6
    assert not any(e["name"].endswith("(summary)") for e in full)


def test_n_children_group_under_the_response_id(client: httpx.Client) -> None:
    resp = client.post(COMPLETIONS, json={"prompt": "Hello", "max_tokens": 3, "n": 2, "seed": 1},
                       headers=TRACE)
    assert resp.status_code == 200, resp.text
    rid = resp.json()["id"]
    events = client.get(f"/debug/lifecycle/{rid}").json()["events"]
    assert {e["request_id"] for e in events if e["step"] == 5} == {f"{rid}-0", f"{rid}-1"}
    assert {e["step"] for e in events} == set(range(1, 14))
    assert events[-1]["detail"]["response"] == "JSON"


def test_untraced_requests_record_nothing(client: httpx.Client) -> None:
    before = len(client.get("/debug/lifecycle").json()["traces"])
    resp = client.post(CHAT, json={"messages": HELLO, "max_tokens": 2})
    assert resp.status_code == 200
    missing = client.get(f"/debug/lifecycle/{resp.json()['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "trace_not_found"
    assert len(client.get("/debug/lifecycle").json()["traces"]) == before


def test_lifecycle_needs_the_api_key(server: Server, client: httpx.Client) -> None:
    resp = client.post(CHAT, json={"messages": HELLO, "max_tokens": 2}, headers=TRACE)
    rid = resp.json()["id"]
    for path in (f"/debug/lifecycle/{rid}", "/debug/lifecycle"):
        assert httpx.get(server.base_url + path).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(server.base_url + path, headers=wrong).status_code == 401
    assert client.get(f"/debug/lifecycle/{rid}").status_code == 200
