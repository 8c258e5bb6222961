"""The load generator: drives any OpenAI-compatible server over streaming HTTP.

Used both for the servers the harness starts and for ``--url``. Each request streams with
``stream_options.include_usage`` so output token counts come from the server's usage chunk,
and sets ``ignore_eos`` so every answer is exactly as long as asked.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from compare.metrics import RequestResult
from compare.workload import SampleRequest, Workload, arrival_times


@dataclass(frozen=True)
class Target:
    base_url: str                 # e.g. http://127.0.0.1:8000
    model: str                    # the "model" field sent in each request
    endpoint: str = "completions" # completions | chat
    api_key: str | None = None
    request_timeout_s: float = 300.0

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def request_body(target: Target, prompt: list[int] | str, output_len: int) -> dict[str, object]:
    body: dict[str, object] = {
        "model": target.model, "max_tokens": output_len, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_text(chunk: dict[str, object], endpoint: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]  # type: ignore[index]
    if endpoint == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def send_request(client: httpx.AsyncClient, target: Target, prompt: list[int] | str,
                       output_len: int, run_t0: float) -> RequestResult:
    """Stream one request; a chunk carrying text is a content chunk (TTFT, ITL)."""
    path = "/v1/chat/completions" if target.endpoint == "chat" else "/v1/completions"
    res = RequestResult(success=False)
    st = time.perf_counter()
    res.start = st - run_t0
    last = st
    try:
        async with client.stream("POST", target.base_url + path, headers=target.headers(),
                                 json=request_body(target, prompt, output_len)) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if _chunk_text(chunk, target.endpoint):
                    if res.ttft == 0.0:
                        res.ttft = now - st
                    else:
                        res.itl.append(now - last)
                    last = now
                if usage := chunk.get("usage"):
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.output_tokens = int(usage.get("completion_tokens") or 0)
        res.latency = time.perf_counter() - st
        res.success = res.output_tokens > 0 and res.ttft > 0.0
        if not res.success:
            res.error = "stream ended without content or usage"
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_workload(target: Target, workload: Workload, requests: list[SampleRequest],
                       prompts: list[list[int]] | list[str],
                       on_done: Callable[[], None] | None = None) -> tuple[list[RequestResult], float]:
    """Send every request at its arrival time, at most ``concurrency`` in flight.

    Returns the per-request results (in dataset order) and the run's wall time.
    """
    offsets = arrival_times(workload)
    limit = workload.concurrency or len(requests)
    sem = asyncio.Semaphore(limit)
    conns = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    timeout = httpx.Timeout(target.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=conns, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> RequestResult:
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
            async with sem:
                r = await send_request(client, target, prompts[i], requests[i].output_len, t0)
            if on_done is not None:
                on_done()
            return r

        results = await asyncio.gather(*(one(i) for i in range(len(requests))))
        duration = time.perf_counter() - t0
    return list(results), duration


async def fetch_model_name(base_url: str, api_key: str | None = None) -> str:
    """The first model a server lists at /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=10.0) as client:
        resp = await client.get(base_url + "/v1/models", headers=headers)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])


async def warm_up(target: Target, requests: int = 2) -> None:
    """A few short requests, so first-request costs stay out of what is measured."""
    async with httpx.AsyncClient(timeout=target.request_timeout_s) as client:
        await asyncio.gather(*(send_request(client, target, "Hello there", 8, 0.0)
                               for _ in range(requests)))
