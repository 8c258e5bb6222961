"""v0 and v1 give identical greedy and seeded outputs for the same requests; the offline LLM
drives the core in-process or in its own process with the same results."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine_v1 import CoreProcessClient
from shared import LLM, SamplingParams
from tests.server_util import start_server, stop_server
from tests.shared.api.api_helpers import CHAT, COMPLETIONS

REQUESTS = [
    (CHAT, {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24, "temperature": 0}),
    (CHAT, {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24,
            "temperature": 1.0, "seed": 11, "n": 2, "logprobs": True, "top_logprobs": 2}),
    (COMPLETIONS, {"prompt": ["Once upon a time", "The best way to"], "max_tokens": 16,
                   "temperature": 0.8, "top_p": 0.9, "seed": 5}),
    # Structured outputs: the same matcher masks in both topologies, sampled and seeded.
    (CHAT, {"messages": [{"role": "user", "content": "A point as JSON."}], "max_tokens": 40,
            "temperature": 1.0, "seed": 2, "n": 2, "logprobs": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "point", "schema": {
                "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"]}}}}),
]


def _choices(resp: dict) -> list[dict]:
    return list(resp["choices"])


def _same(a: object, b: object) -> bool:
    """Equal, except floats (logprobs) within 1e-3: the two children of n=2 may share a step
    or not (and hit the prefix cache or not) depending on timing, which moves float32
    logprobs in the last digits without changing any token."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-3
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, default_model_dir: str) -> dict[str, list[list[dict]]]:
    out: dict[str, list[list[dict]]] = {}       # default_model_dir: fetched before the servers start
    for engine in ("v0", "v1"):
        # float32: bf16 results depend on batch composition, which differs between topologies.
        server = start_server(engine, tmp_path_factory.mktemp(engine) / "server.log", "--dtype", "float32",
                              "--quantization", "none")
        try:
            with server.client() as c:
                out[engine] = []
                for path, body in REQUESTS:
                    resp = c.post(path, json=body)
                    assert resp.status_code == 200, resp.text
                    out[engine].append(_choices(resp.json()))
        finally:
            assert stop_server(server) == 0
    return out


def test_v0_and_v1_answer_identically(answers: dict[str, list[list[dict]]]) -> None:
    assert _same(answers["v0"], answers["v1"]), (answers["v0"], answers["v1"])
    greedy = answers["v0"][0][0]["message"]["content"]
    assert greedy == "The capital of France is Paris."
    seeded = answers["v0"][1]
    assert len(seeded) == 2 and seeded[0]["message"]["content"] != seeded[1]["message"]["content"]


def test_offline_llm_over_core_process_matches_in_process(default_model_dir: str) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = [SamplingParams(temperature=0, max_tokens=12),
              SamplingParams(temperature=0.7, seed=3, max_tokens=12, ignore_eos=True)]
    local = LLM(default_model_dir, dtype="float32", quantization="none",
                num_blocks=256).generate(prompts, params)
    remote_llm = LLM(default_model_dir, dtype="float32", quantization="none",
                     num_blocks=256, core_factory=CoreProcessClient)
    try:
        remote = remote_llm.generate(prompts, params)
    finally:
        remote_llm.core.shutdown()
    assert [o.outputs[0].token_ids for o in remote] == [o.outputs[0].token_ids for o in local]
    assert [o.outputs[0].text for o in remote] == [o.outputs[0].text for o in local]
    assert Path(remote_llm.core.launcher.ipc_dir).exists() is False
