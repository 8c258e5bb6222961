"""The streaming client against a fake server: chunks, usage, failures, concurrency bound."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from compare.bench_serve import Target, request_body, run_workload, send_request
from compare.workload import SampleRequest, Workload


def _sse(chunks: list[dict[str, object]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _completion_stream(n_tokens: int, prompt_tokens: int = 7) -> bytes:
    chunks: list[dict[str, object]] = [{"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}]}
                                       for i in range(n_tokens)]
    chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})  # not content
    chunks.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens}})
    return _sse(chunks)


def _client(handler: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


TARGET = Target("http://fake", "m")


def test_request_body_asks_for_exact_length_and_usage() -> None:
    body = request_body(TARGET, [1, 2, 3], 9)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 9
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    chat = request_body(Target("http://fake", "m", endpoint="chat"), "hi", 3)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in chat


def test_stream_parsed_into_ttft_itl_and_usage() -> None:
    seen: list[dict[str, object]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        assert req.url.path == "/v1/completions"
        return httpx.Response(200, content=_completion_stream(5))

    async def go() -> None:
        async with _client(handler) as c:
            r = await send_request(c, TARGET, [1, 2], 5, 0.0)
        assert r.success, r.error
        assert (r.prompt_tokens, r.output_tokens) == (7, 5)
        assert len(r.itl) == 4          # 5 content chunks; the empty finish chunk is not one
        assert 0 < r.ttft <= r.latency
        assert seen[0]["max_tokens"] == 5

    asyncio.run(go())


@pytest.mark.parametrize("response", [
    httpx.Response(500, json={"error": {"message": "boom"}}),
    httpx.Response(200, content=b"data: [DONE]\n\n"),          # no content, no usage
])
def test_failures_are_reported(response: httpx.Response) -> None:
    async def go() -> None:
        async with _client(lambda req: response) as c:
            r = await send_request(c, TARGET, [1], 3, 0.0)
        assert not r.success and r.error

    asyncio.run(go())


def test_run_workload_respects_concurrency_bound() -> None:
    in_flight, peak = 0, 0

    class Stream(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[override]
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1
            yield _completion_stream(2)

    w = Workload("c3", 10, (1, 1), (2, 2), concurrency=3)
    reqs = [SampleRequest([1], 2) for _ in range(10)]
    transport = httpx.MockTransport(lambda req: httpx.Response(200, stream=Stream()))
    orig = httpx.AsyncClient.__init__

    def patched(self: httpx.AsyncClient, *a: object, **kw: object) -> None:
        kw["transport"] = transport
        orig(self, *a, **kw)  # type: ignore[arg-type]

    done: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(httpx.AsyncClient, "__init__", patched)
        results, duration = asyncio.run(run_workload(TARGET, w, reqs, [[1]] * 10, lambda: done.append(1)))
    assert peak == 3 and len(done) == 10
    assert all(r.success for r in results) and sum(r.output_tokens for r in results) == 20
    assert duration >= 0.02 * 4 * 0.9   # ceil(10 / 3) waves
