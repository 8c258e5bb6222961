"""In-process tests on a fake engine: engine failures mapped to HTTP, fan-out ids and seeds,
per-app state. Behaviour against real engines lives in the other test_api_* modules."""
from __future__ import annotations

import asyncio
import json

import httpx

from shared.api import build_app
from shared.config import ServerConfig
from shared.errors import EngineDeadError, QueueFullError
from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, sse_data
from tests.shared.api.fake_engine import FakeEngine


def _run(engine: FakeEngine, fn, **cfg):
    app = build_app(engine, ServerConfig(engine="v0", **cfg))

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as c:
            return await fn(c)
    return asyncio.run(main())


def test_queue_full_is_429():
    async def fn(c):
        return [await c.post(CHAT, json={"messages": HELLO, "stream": s}) for s in (False, True)]
    for r in _run(FakeEngine(fail_at_start=QueueFullError("full")), fn):
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"


def test_engine_dead_is_503_and_health_fails():
    engine = FakeEngine(fail_at_start=EngineDeadError("gone"))
    engine.healthy = False

    async def fn(c):
        return await c.post(COMPLETIONS, json={"prompt": "x"}), await c.get("/health")
    gen, health = _run(engine, fn)
    assert gen.status_code == 503 and health.status_code == 503
    assert set(health.json()["error"]) == {"message", "type", "param", "code"}


def test_error_after_stream_began_is_an_sse_event():
    async def fn(c):
        r = await c.post(CHAT, json={"messages": HELLO, "stream": True, "max_tokens": 10})
        return r.status_code, sse_data(r.text.splitlines())
    status, events = _run(FakeEngine(die_after=2), fn)
    assert status == 200
    assert events[-1] == "[DONE]" and "error" in events[-2]
    assert events[-2]["error"]["code"] == "engine_unavailable"


def test_fan_out_ids_and_seeds():
    engine = FakeEngine()

    async def fn(c):
        return await c.post(COMPLETIONS, json={"prompt": ["ab", "cd"], "n": 3, "seed": 10, "max_tokens": 2})
    body = _run(engine, fn).json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    base = body["id"]
    assert sorted(rid for rid, _ in engine.calls) == sorted(f"{base}-{i}" for i in range(6))
    seeds = {rid: p.seed for rid, p in engine.calls}
    assert [seeds[f"{base}-{i}"] for i in range(6)] == [10, 11, 12, 10, 11, 12]
    # The first choice of each prompt prefills it for the other two (one prefill per prompt).
    assert [engine.leaders[f"{base}-{i}"] for i in range(6)] == [
        None, f"{base}-0", f"{base}-0", None, f"{base}-3", f"{base}-3"]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_default_max_tokens():
    engine = FakeEngine()

    async def fn(c):
        await c.post(CHAT, json={"messages": HELLO})
        await c.post(COMPLETIONS, json={"prompt": "abc"})
    _run(engine, fn)
    chat_params, completion_params = engine.calls[0][1], engine.calls[1][1]
    prompt_len = len("user: Say hello.\n")
    assert chat_params.max_tokens == 256 - prompt_len   # chat: up to the context window
    assert completion_params.max_tokens == 16           # completions: OpenAI's default


def test_two_apps_in_one_process_and_api_key():
    async def fn(c):
        return (await c.get("/metrics")).text, await c.post(CHAT, json={"messages": HELLO})
    for _ in range(2):   # a second app must not clash on a global Prometheus registry
        text, r = _run(FakeEngine(), fn, api_key="k")
        assert "twinserve:num_requests_running" in text and r.status_code == 401


def test_openapi_refs_resolve():
    async def fn(c):
        return (await c.get("/openapi.json")).json()
    doc = _run(FakeEngine(), fn)
    schemas = doc["components"]["schemas"]
    refs = {m.split("/")[-1] for m in json.dumps(doc).split('"$ref": "')[1:] for m in [m.split('"')[0]]}
    assert refs <= set(schemas)


def test_schema_edge_cases():
    """Found by schemathesis: Allow on 405, integral floats as ints, tokenize's one-of."""
    async def fn(c):
        return (await c.put(CHAT), await c.post(COMPLETIONS, json={"prompt": [[97.0, 98]], "max_tokens": 2.0}),
                await c.post("/tokenize", json={"prompt": "a", "messages": HELLO}),
                await c.post("/tokenize", json={"prompt": None}),
                await c.post(COMPLETIONS, json={"prompt": [[97.5]]}))
    put, floats, both, null, frac = _run(FakeEngine(), fn)
    assert put.status_code == 405 and "POST" in put.headers["allow"]
    assert floats.status_code == 200 and floats.json()["usage"]["completion_tokens"] == 2
    assert both.status_code == null.status_code == frac.status_code == 400
