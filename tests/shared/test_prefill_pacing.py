"""The engine core feeds the scheduler's prefill pacer its real step times (real model)."""
from __future__ import annotations

import time

from shared.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from shared.engine_core import EngineCore
from shared.messages import EngineCoreRequest, SamplingParams


def test_a_long_prompt_beside_a_decoding_stream_fills_in_paced_chunks(default_model_dir: str) -> None:
    config = EngineConfig(model=ModelConfig(model=default_model_dir, dtype="float32",
                                            quantization="none"),
                          cache=CacheConfig(num_blocks=64),
                          scheduler=SchedulerConfig(prefill_step_ratio=2.0))
    core = EngineCore(config)
    sched, pacer = core.scheduler, core.scheduler.pacer

    def add(rid: str, n: int, max_tokens: int) -> None:
        first = {"stream": 100, "warm": 1100, "long": 2100}[rid]   # no shared prefix to reuse
        prompt = [first + (7 * i) % 997 for i in range(n)]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        core.add_request(EngineCoreRequest(rid, prompt, params, None, time.time()))

    add("stream", 8, 200)
    for _ in range(4):
        core.step()
    assert pacer.decode_step is not None and pacer.limit is None
    add("warm", 400, 1)             # the first prompt beside the stream: whole, then a cap
    while "warm" in sched.requests:
        core.step()
    assert pacer.limit is not None and pacer.floor <= pacer.limit < 400
    add("long", 400, 1)
    chunks, caps = [], []
    while "long" in sched.requests:
        caps.append(pacer.cap(1))
        core.step()
        req = sched.requests.get("long")
        chunks.append((400 if req is None else req.num_computed_tokens) - sum(chunks))
    assert sum(chunks) == 400
    left = 400
    for chunk, cap in zip(chunks, caps):     # each step: the cap learnt so far, or what was left
        assert chunk == min(cap, left)
        left -= chunk
    assert len(chunks) > 1
    core.close()
