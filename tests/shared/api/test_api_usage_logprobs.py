"""cached_tokens, continuous usage, logit_bias, echo + logprobs and prompt_logprobs over HTTP."""
from __future__ import annotations

import uuid

import pytest

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, assert_error, model_id, stream_events

BLOCK = 16      # the server's default block_size


def _system() -> str:
    """A long system prompt no other test sent, so the first request cannot hit the cache."""
    return f"Session {uuid.uuid4().hex}. " + "You are a careful, concise assistant. " * 12


def test_chat_cached_tokens_on_second_request(oai):
    msgs = [{"role": "system", "content": _system()}, *HELLO]
    first = oai.chat.completions.create(model=model_id(oai), messages=msgs, max_tokens=2, temperature=0)
    second = oai.chat.completions.create(model=model_id(oai), messages=msgs, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % BLOCK == 0 and first.usage.prompt_tokens - BLOCK <= cached < first.usage.prompt_tokens


def test_completion_cached_tokens_streamed_usage(client):
    prompt = _system() + " Answer:"
    body = {"prompt": prompt, "max_tokens": 2, "stream_options": {"include_usage": True}}
    first = stream_events(client, COMPLETIONS, body)[-2]["usage"]
    second = stream_events(client, COMPLETIONS, body)[-2]["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - BLOCK


def test_continuous_usage_stats_on_every_chunk(oai):
    chunks = list(oai.chat.completions.create(
        model=model_id(oai), messages=HELLO, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] <= 1
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in chunks)


def test_continuous_usage_needs_include_usage(client):
    events = stream_events(client, CHAT, {"messages": HELLO, "max_tokens": 2,
                                          "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in e for e in events[:-1]) and events[-1] == "[DONE]"


def test_logit_bias_forces_a_token(oai, client):
    token = client.post("/tokenize", json={"prompt": " banana"}).json()["tokens"][-1]
    r = oai.completions.create(model=model_id(oai), prompt="My favourite fruit is", max_tokens=3,
                               temperature=0, logit_bias={str(token): 100})
    want = client.post("/detokenize", json={"tokens": [token] * 3}).json()["prompt"]
    assert r.choices[0].text == want


@pytest.mark.parametrize("bias", [{"abc": 1}, {"49152": 1}, {"-1": 1}, {"5": 100.5}, {"5": "x"},
                                  {str(i): 1 for i in range(301)}])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_logit_bias_rejected(client, path, bias):
    body = {"messages": HELLO} if path == CHAT else {"prompt": "Hi"}
    assert_error(client.post(path, json={**body, "max_tokens": 1, "logit_bias": bias}), 400,
                 "logit_bias")
    assert client.post(path, json={**body, "max_tokens": 1}).status_code == 200


def test_echo_logprobs_score_the_prompt(client):
    ids = client.post("/tokenize", json={"prompt": "The capital of France is Paris"}).json()["tokens"]
    r = client.post(COMPLETIONS, json={"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1,
                                       "temperature": 0}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"][1:])
    # The last prompt token's score = its logprob when generated after the rest (forced by a
    # bias; logprobs come from the raw logits, so the bias does not change them).
    gen = client.post(COMPLETIONS, json={"prompt": ids[:-1], "max_tokens": 1, "logprobs": 0,
                                         "temperature": 0, "logit_bias": {str(ids[-1]): 100}}).json()
    generated = gen["choices"][0]["logprobs"]["token_logprobs"][0]
    assert lp["token_logprobs"][len(ids) - 1] == pytest.approx(generated, abs=5e-2)


def test_echo_logprobs_streamed(client):
    events = stream_events(client, COMPLETIONS, {"prompt": "One two three", "echo": True,
                                                 "logprobs": 1, "max_tokens": 2})
    first = events[0]["choices"][0]["logprobs"]
    assert first["token_logprobs"][0] is None and first["token_logprobs"][1] <= 0


def test_prompt_logprobs_completions_and_chat(oai, client):
    ids = client.post("/tokenize", json={"prompt": "Hello there friend"}).json()["tokens"]
    r = client.post(COMPLETIONS, json={"prompt": ids, "max_tokens": 1, "prompt_logprobs": 3}).json()
    plp = r["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for tid, entry in zip(ids[1:], plp[1:]):
        assert str(tid) in entry and 3 <= len(entry) <= 4
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 for v in entry.values())
    chat = oai.chat.completions.create(model=model_id(oai), messages=HELLO, max_tokens=1,
                                       extra_body={"prompt_logprobs": 0})
    assert chat.model_extra["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in chat.model_extra["prompt_logprobs"][1:])


@pytest.mark.parametrize("extra", [{"prompt_logprobs": 21}, {"prompt_logprobs": -1},
                                   {"prompt_logprobs": 1, "stream": True}])
def test_prompt_logprobs_rejected(client, extra):
    assert_error(client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 1, **extra}), 400,
                 "prompt_logprobs")


def test_openapi_describes_new_fields(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    text = str(schemas)
    for name in ("logit_bias", "prompt_logprobs", "continuous_usage_stats"):
        assert name in text
