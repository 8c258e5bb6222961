"""n > 1 on a real server, both engines: one prefill per prompt, every choice served."""
from __future__ import annotations

import pytest

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, wait_engine_idle

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name one colour of the rainbow, in one word."}]


def test_n8_prefills_once_and_serves_every_choice(client) -> None:
    # Exactness (forked choices equal a lone request) is tested offline in float32
    # (tests/shared/test_llm.py); this server runs the default quantized path, where batch
    # shape may flip near-ties, so here only the fork count and the choices are checked.
    one = client.post(CHAT, json={"messages": ASK, "max_tokens": 8, "temperature": 0}).json()
    before = wait_engine_idle(client)["num_forked_tokens"]
    eight = client.post(CHAT, json={"messages": ASK, "max_tokens": 8, "temperature": 0,
                                    "n": 8}).json()
    after = wait_engine_idle(client)["num_forked_tokens"]
    prompt = eight["usage"]["prompt_tokens"]
    assert prompt == one["usage"]["prompt_tokens"]
    # Seven siblings took all but the last prompt token from the first choice's prefill.
    assert after - before == 7 * (prompt - 1)
    assert [c["index"] for c in eight["choices"]] == list(range(8))
    assert all(c["message"]["content"] for c in eight["choices"])
    assert 8 <= eight["usage"]["completion_tokens"] <= 8 * 8


def test_n_with_echo_logprobs_scores_the_prompt_in_every_choice(client) -> None:
    body = {"prompt": "The sky is blue because", "max_tokens": 2, "n": 3, "echo": True,
            "logprobs": 1, "temperature": 0}
    before = wait_engine_idle(client)["num_forked_tokens"]
    r = client.post(COMPLETIONS, json=body).json()
    assert wait_engine_idle(client)["num_forked_tokens"] == before     # no fork: each scores
    firsts = [c["logprobs"]["token_logprobs"][:4] for c in r["choices"]]
    assert all(f[0] is None for f in firsts) and all(x is not None for x in firsts[0][1:])
    assert len(r["choices"]) == 3
