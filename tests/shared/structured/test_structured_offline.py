"""Constrained decoding through the real engine core: preemption and recompute under a tiny
KV cache, n > 1 children, and stop strings, all still ending in valid output."""
from __future__ import annotations

import json

import jsonschema
import pytest

from shared import LLM, SamplingParams
from shared.messages import StructuredOutputsParams as Spec

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 30},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                  "minItems": 2, "maxItems": 4}}}


@pytest.fixture(scope="module")
def llm(default_model_dir: str) -> LLM:
    # 10 blocks of 16 tokens for 6 requests of ~40 prompt tokens: they must preempt each other.
    return LLM(num_blocks=10, max_num_seqs=6, dtype="float32")


def test_preempted_constrained_requests_still_validate(llm: LLM) -> None:
    chats = [[{"role": "user", "content": f"Profile {i} as JSON, please."}] for i in range(6)]
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=100,
                            structured_outputs=Spec(json=json.dumps(SCHEMA)))
    before = llm.core.scheduler.get_stats().num_preemptions
    outs = llm.chat(chats, params)
    assert llm.core.scheduler.get_stats().num_preemptions > before
    for out in outs:
        o = out.outputs[0]
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), SCHEMA)


def test_a_stop_string_cuts_constrained_output(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60, stop=['"tags"'],
                            structured_outputs=Spec(json=json.dumps(SCHEMA)))
    o = llm.chat([[{"role": "user", "content": "A profile."}]], params)[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == '"tags"'
    assert o.text.startswith('{"name": "') and '"tags"' not in o.text
