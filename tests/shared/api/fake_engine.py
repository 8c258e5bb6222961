"""An in-process EngineClient for unit tests of the API layer that need engine failures
the real engine will not produce on demand (queue full, death mid-stream)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from shared.errors import EngineDeadError
from shared.frontend.outputs import CompletionOutput, RequestOutput
from shared.messages import ModelInfo, SamplingParams, TokenLogprobs


class FakeTokenizer:
    """One token per byte; 'chat template' = role: content lines."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode(errors="replace")

    def id_to_token(self, token_id: int) -> str | None:
        return chr(token_id) if 33 <= token_id < 127 else None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        return "".join(f"{m['role']}: {m.get('content')}\n" for m in messages)


class FakeEngine:
    """Emits 'a', 'b', 'c', ... one token per step; can fail at start or mid-stream."""

    def __init__(self, fail_at_start: Exception | None = None, die_after: int | None = None) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_info = ModelInfo(name="fake", path="/fake", max_model_len=256, vocab_size=256,
                                    num_kv_blocks=16, block_size=16)
        self.fail_at_start = fail_at_start
        self.die_after = die_after
        self.healthy = True
        self.calls: list[tuple[str, SamplingParams]] = []
        self.aborted: list[str] = []
        self.leaders: dict[str, str | None] = {}     # request id -> the prefill_leader it named
        self.running: set[str] = set()

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       trace: bool = False, priority: int = 0,
                       prefill_leader: str | None = None) -> AsyncIterator[RequestOutput]:
        self.calls.append((request_id, params))
        self.leaders[request_id] = prefill_leader
        if self.fail_at_start is not None:
            raise self.fail_at_start
        self.running.add(request_id)
        try:
            for step in range(params.max_tokens or 1):
                await asyncio.sleep(0.001)
                if self.die_after is not None and step >= self.die_after:
                    raise EngineDeadError("fake engine died")
                tok = ord("a") + step % 26
                done = step + 1 == params.max_tokens
                lps = [TokenLogprobs(tok, -0.5, 1, [tok], [-0.5])] if params.logprobs is not None else None
                out = CompletionOutput(0, chr(tok), [tok], lps, "length" if done else None)
                yield RequestOutput(request_id, prompt_token_ids, [out], finished=done)
        finally:
            self.running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stalled_for(self) -> float | None:
        return None

    def fail_all(self, error: BaseException) -> None:
        self.healthy = False

    @property
    def is_dead(self) -> bool:
        return not self.healthy

    async def check_health(self) -> None:
        if not self.healthy:
            raise EngineDeadError("fake engine is unhealthy")

    async def get_stats(self) -> dict:
        return {"num_running": len(self.running), "num_waiting": 0, "kv_cache_usage": 0.0,
                "num_free_blocks": 16, "num_total_blocks": 16}

    async def shutdown(self) -> None:
        pass
