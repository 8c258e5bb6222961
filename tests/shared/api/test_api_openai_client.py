"""The official openai client against the real server: chat and completions, both modes."""
from __future__ import annotations

import openai
import pytest

from tests.shared.api.api_helpers import HELLO, model_id


def test_models_list(oai):
    models = oai.models.list().data
    assert len(models) == 1 and models[0].object == "model"


def test_chat(oai):
    r = oai.chat.completions.create(model=model_id(oai), messages=HELLO, max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_chat_stream_with_usage(oai):
    chunks = list(oai.chat.completions.create(
        model=model_id(oai), messages=HELLO, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = oai.chat.completions.create(model=model_id(oai), messages=HELLO, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert text == full.choices[0].message.content   # greedy: stream and non-stream agree


def test_chat_n_and_logprobs(oai):
    r = oai.chat.completions.create(model=model_id(oai), messages=HELLO, max_tokens=4, n=3, seed=7,
                                    logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 12
    for c in r.choices:
        assert len(c.logprobs.content) == 4
        for entry in c.logprobs.content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
            assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_completion(oai):
    r = oai.completions.create(model=model_id(oai), prompt="The capital of France is", max_tokens=4,
                               temperature=0, extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4


def test_completion_stream_multi_prompt(oai):
    chunks = list(oai.completions.create(
        model=model_id(oai), prompt=["Once upon", "The sky is"], max_tokens=3, n=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason}
    assert finished == {0: "length", 1: "length", 2: "length", 3: "length"}
    assert chunks[-1].usage.completion_tokens == 12


def test_completion_stop_string(oai):
    base = oai.completions.create(model=model_id(oai), prompt="1, 2, 3, 4,", max_tokens=12,
                                  temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = text.strip()[:2] or text[:1]
    r = oai.completions.create(model=model_id(oai), prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                               stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert text.startswith(r.choices[0].text)


def test_bad_request_raises(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=model_id(oai), messages=HELLO, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=1)
