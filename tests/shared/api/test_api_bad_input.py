"""Every kind of bad input gets an OpenAI error object with the right status and param,
and the server keeps serving afterwards."""
from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, assert_error

M = {"messages": HELLO}
P = {"prompt": "Hello"}

BAD_BODIES = [
    # (path, body, status, param)
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
    (CHAT, {**M, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {**M, "max_tokens": "5"}, 400, "max_tokens"),
    (CHAT, {**M, "max_tokens": 2.5}, 400, "max_tokens"),
    (CHAT, {**M, "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    (CHAT, {**M, "temperature": -0.1}, 400, "temperature"),
    (CHAT, {**M, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {**M, "top_p": 0}, 400, "top_p"),
    (CHAT, {**M, "top_p": 1.5}, 400, "top_p"),
    (CHAT, {**M, "top_k": -2}, 400, "top_k"),
    (CHAT, {**M, "min_p": 2}, 400, "min_p"),
    (CHAT, {**M, "n": 0}, 400, "n"),
    (CHAT, {**M, "n": 1000}, 400, "n"),
    (CHAT, {**M, "stop": [f"s{i}" for i in range(100)]}, 400, "stop"),
    (CHAT, {**M, "stop": [""]}, 400, "stop"),
    (CHAT, {**M, "stop": 3}, 400, "stop"),
    (CHAT, {**M, "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    (CHAT, {**M, "presence_penalty": 3}, 400, "presence_penalty"),
    (CHAT, {**M, "repetition_penalty": 0}, 400, "repetition_penalty"),
    (CHAT, {**M, "logprobs": True, "top_logprobs": 1000}, 400, "top_logprobs"),
    (CHAT, {**M, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {**M, "logprobs": 3}, 400, "logprobs"),
    (CHAT, {**M, "seed": 1 << 70}, 400, "seed"),
    (CHAT, {**M, "stream": "yes"}, 400, "stream"),
    (CHAT, {**M, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage"),
    (CHAT, {**M, "min_tokens": -1}, 400, "min_tokens"),
    (COMPLETIONS, {}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ["a", 1]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10 ** 9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt"),
    (COMPLETIONS, {**P, "logprobs": True}, 400, "logprobs"),
    (COMPLETIONS, {**P, "logprobs": 1000}, 400, "logprobs"),
    (COMPLETIONS, {**P, "echo": "no"}, 400, "echo"),
    (COMPLETIONS, {**P, "max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, {**P, "model": "gpt-4"}, 404, "model"),
    (CHAT, {**M, "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize("path,body,status,param", BAD_BODIES,
                         ids=[f"{p.rsplit('/', 1)[-1]}-{i}" for i, (p, *_) in enumerate(BAD_BODIES)])
def test_bad_body(client, path, body, status, param):
    assert_error(client.post(path, json=body), status, param)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"", b"null"])
def test_malformed_json(client, raw):
    for path in (CHAT, COMPLETIONS, "/tokenize"):
        assert_error(client.post(path, content=raw, headers={"Content-Type": "application/json"}), 400)


def test_context_window(client):
    max_len = client.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"]
    err = assert_error(client.post(COMPLETIONS, json={"prompt": "Hello", "max_tokens": max_len}),
                       400, "max_tokens")
    assert str(max_len) in err["message"] and str(max_len + 1) in err["message"]
    err = assert_error(client.post(COMPLETIONS, json={"prompt": [1] * max_len}), 400, "prompt")
    assert str(max_len) in err["message"]
    assert_error(client.post(CHAT, json={**M, "max_completion_tokens": max_len}), 400,
                 "max_completion_tokens")


def test_body_too_large(client):
    big = {"prompt": "x" * (2 << 20)}
    assert_error(client.post(COMPLETIONS, json=big), 413)


def test_body_too_large_chunked(client):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'
    assert_error(client.post(COMPLETIONS, content=chunks()), 413)


def test_invalid_content_length(server):
    """A malformed Content-Length is a 400, not a crash."""
    url = urlparse(server.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        body = b'{"prompt": "' + b"x" * 100 + b'"}'
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + server.api_key.encode() + b"\r\n"
                  b"Content-Length: abc\r\n\r\n" + body)
        assert s.recv(100).split(b" ")[1] in (b"400",)


def test_still_serving_after_bad_input(client):
    r = client.post(CHAT, json={**M, "max_tokens": 1})
    assert r.status_code == 200


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "hi"}], "junk": ' + DEEP + b"}",   # unknown field
    b'{"messages": ' + DEEP + b"}",                                                # accepted field
    b'{"prompt": [' + b"1," * 500_001 + b"1]}",                                    # too many elements
])
def test_hostile_json_is_400(server, client, raw):
    """Deep nesting and huge element counts are refused at decode time: 400, no traceback."""
    for path in (CHAT, COMPLETIONS):
        err = assert_error(client.post(path, content=raw,
                                       headers={"Content-Type": "application/json"}), 400)
        assert "nested deeper" in err["message"] or "JSON elements" in err["message"]
    assert "Traceback" not in server.process.log_path.read_text()
    assert client.post(CHAT, json={**M, "max_tokens": 1}).status_code == 200


def test_prompts_times_n_capped(client):
    """Prompts x n past the admission queue is a 400 before any per-choice work."""
    err = assert_error(client.post(COMPLETIONS, json={"prompt": ["a"] * 200, "n": 2,
                                                      "max_tokens": 1}), 400, "prompt")
    assert "prompts x n is 400" in err["message"]
    assert_error(client.post(COMPLETIONS, json={**P, "n": 1000}), 400, "n")


def test_tiny_temperature_is_greedy(client):
    """temperature below 1e-5 is greedy (not logits / 0.0 giving garbage): every sampled
    token is the top-1 token (compared by logprobs, not by text across batch shapes)."""
    body = {**M, "max_tokens": 8, "logprobs": True, "top_logprobs": 1}
    for t in (1e-50, 1e-9, 1e-6):   # 1e-50 is 0.0 in float32
        r = client.post(CHAT, json={**body, "temperature": t})
        assert r.status_code == 200, r.text
        for entry in r.json()["choices"][0]["logprobs"]["content"]:
            assert entry["token"] == entry["top_logprobs"][0]["token"]
