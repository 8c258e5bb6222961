"""Small helpers shared by the api tests: SSE parsing, error-shape checks, engine idleness."""
from __future__ import annotations

import json
import time

import httpx

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


def sse_data(lines: list[str]) -> list[dict | str]:
    """The payloads of 'data:' lines: dicts, or the literal '[DONE]'."""
    out: list[dict | str] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def stream_events(client: httpx.Client, path: str, body: dict) -> list[dict | str]:
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return sse_data(list(resp.iter_lines()))


def assert_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] is not None and err["param"].startswith(param), err
    return err


def wait_engine_idle(client: httpx.Client, timeout: float = 10.0) -> dict:
    """Poll /debug/stats until no request runs or waits and every KV block is free."""
    deadline = time.monotonic() + timeout
    stats: dict = {}
    while time.monotonic() < deadline:
        stats = client.get("/debug/stats").json()
        if (stats["num_running"] == 0 and stats["num_waiting"] == 0
                and stats["num_free_blocks"] == stats["num_total_blocks"]):
            return stats
        time.sleep(0.1)
    raise AssertionError(f"engine not idle after {timeout}s: {stats}")


def model_id(oai) -> str:
    """The served model's id, as a client finds it."""
    return oai.models.list().data[0].id
