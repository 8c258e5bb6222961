"""Concurrency and client disconnects against the real server: every request ends, every
KV block comes back."""
from __future__ import annotations

import asyncio

import httpx

from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, sse_data, wait_engine_idle


async def _stream_count(client: httpx.AsyncClient, i: int, max_tokens: int) -> tuple[int, str | None]:
    """Stream one completion; return (completion tokens from usage, finish reason)."""
    body = {"prompt": f"Story number {i}:", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.8, "seed": i, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", COMPLETIONS, json=body) as resp:
        assert resp.status_code == 200
        events = sse_data([line async for line in resp.aiter_lines()])
    assert events[-1] == "[DONE]"
    reasons = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
    return events[-2]["usage"]["completion_tokens"], reasons[-1]


def test_32_concurrent_streams(server, client):
    async def main() -> list[tuple[int, str | None]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=120,
                                     limits=limits) as c:
            return await asyncio.gather(*(_stream_count(c, i, 8 + i % 5) for i in range(32)))

    results = asyncio.run(main())
    assert results == [(8 + i % 5, "length") for i in range(32)]
    wait_engine_idle(client)


async def _drop_after_first_chunk(client: httpx.AsyncClient, path: str, body: dict) -> None:
    async with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                return   # leaving the block closes the connection mid-stream


async def _drop_before_any_chunk(client: httpx.AsyncClient, path: str, body: dict) -> None:
    task = asyncio.ensure_future(client.post(path, json=body))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def test_disconnects_free_everything(server, client):
    long_chat = {"messages": HELLO, "max_tokens": 400, "ignore_eos": True}
    long_completion = {"prompt": "Count to a thousand:", "max_tokens": 400, "ignore_eos": True, "n": 2}

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=60,
                                     limits=httpx.Limits(max_connections=64)) as c:
            jobs = [_drop_after_first_chunk(c, CHAT, long_chat) for _ in range(8)]
            jobs += [_drop_after_first_chunk(c, COMPLETIONS, long_completion) for _ in range(4)]
            jobs += [_drop_before_any_chunk(c, CHAT, {**long_chat, "stream": True}) for _ in range(4)]
            jobs += [_drop_before_any_chunk(c, COMPLETIONS, long_completion) for _ in range(4)]
            await asyncio.gather(*jobs)

    asyncio.run(main())
    wait_engine_idle(client, timeout=10)
    r = client.post(CHAT, json={"messages": HELLO, "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
