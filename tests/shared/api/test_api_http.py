"""Raw HTTP against the real server: exact response shapes, SSE framing, side endpoints."""
from __future__ import annotations

import httpx

from tests.shared.api.api_helpers import (
    CHAT,
    COMPLETIONS,
    HELLO,
    assert_error,
    stream_events,
    wait_engine_idle,
)


def test_chat_shape(client):
    r = client.post(CHAT, json={"messages": HELLO, "max_tokens": 3, "ignore_eos": True, "foo": 1})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    choice = body["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and choice["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 3


def test_chat_content_parts_and_roles(client):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
    r = client.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_chat_stream_framing(client):
    events = stream_events(client, CHAT, {"messages": HELLO, "max_tokens": 4, "ignore_eos": True,
                                          "logprobs": True, "top_logprobs": 1})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    lps = [e for c in chunks[1:-1] for e in c["choices"][0]["logprobs"]["content"]]
    assert len(lps) == 4 and all(len(e["top_logprobs"]) == 1 for e in lps)


def test_completion_forms_of_prompt(client):
    ids = client.post("/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    for prompt, choices in (("Hello world", 1), (["Hello", "world"], 2), (ids, 1), ([ids, ids[:1]], 2)):
        r = client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [c["index"] for c in body["choices"]] == list(range(choices))
        assert body["usage"]["completion_tokens"] == 2 * choices


def test_completion_echo_logprobs(client):
    r = client.post(COMPLETIONS, json={"prompt": "Hello world", "max_tokens": 3, "echo": True,
                                       "logprobs": 2, "ignore_eos": True, "temperature": 0})
    choice = r.json()["choices"][0]
    assert choice["text"].startswith("Hello world")
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])
    assert lp["token_logprobs"][-3:] and all(v <= 0 for v in lp["token_logprobs"][-3:])
    assert lp["text_offset"] == sorted(lp["text_offset"])


def test_completion_stream_include_usage(client):
    events = stream_events(client, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True,
                                                 "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 3
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-3]["choices"][0]["finish_reason"] == "length"


def test_tokenize_roundtrip(client):
    r = client.post("/tokenize", json={"prompt": "The quick brown fox"}).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] > 0
    back = client.post("/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "The quick brown fox"
    chat = client.post("/tokenize", json={"messages": HELLO}).json()
    assert chat["count"] > r["count"] - 10
    assert_error(client.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")
    assert_error(client.post("/tokenize", json={}), 400)


def test_auth(server):
    protected = [("POST", CHAT), ("POST", COMPLETIONS), ("GET", "/v1/models"), ("POST", "/tokenize"),
                 ("POST", "/detokenize"), ("GET", "/debug/stats")]
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        for method, path in protected:
            assert_error(c.request(method, path, json={}), 401)
            assert_error(c.request(method, path, json={}, headers={"Authorization": "Bearer nope"}), 401)
        for path in ("/health", "/metrics", "/version", "/openapi.json"):
            assert c.get(path).status_code == 200, path


def test_version_and_models(client, server):
    assert client.get("/version").json()["engine"] == server.engine
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"


def test_metrics(client):
    client.post(CHAT, json={"messages": HELLO, "max_tokens": 2, "ignore_eos": True})
    text = client.get("/metrics").text
    for name in ("twinserve:num_requests_running", "twinserve:num_requests_waiting",
                 "twinserve:kv_cache_usage_perc", "twinserve:prompt_tokens_total",
                 "twinserve:generation_tokens_total", "twinserve:time_to_first_token_seconds_bucket",
                 "twinserve:inter_token_latency_seconds_bucket",
                 "twinserve:e2e_request_latency_seconds_count"):
        assert name in text, name
    gen = [l for l in text.splitlines() if l.startswith("twinserve:generation_tokens_total")]
    assert float(gen[0].split()[-1]) >= 2


def test_openapi(client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in (CHAT, COMPLETIONS, "/v1/models", "/health", "/version", "/tokenize", "/detokenize",
                 "/metrics", "/debug/stats"):
        assert path in doc["paths"], path
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert "messages" in chat["required"] and "temperature" in chat["properties"]


def test_unknown_route_and_method(client):
    assert_error(client.get("/v1/nope"), 404)
    assert_error(client.get(CHAT), 405)


def test_debug_stats_idle(client):
    stats = wait_engine_idle(client)
    assert stats["num_total_blocks"] > 0
