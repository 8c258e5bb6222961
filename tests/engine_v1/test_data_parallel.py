"""--data-parallel-size 2 on real servers: requests spread over both cores, greedy outputs
equal one core's, a killed core takes the server down cleanly, SIGTERM leaves no process."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.api.watchdog import DEATH_GRACE_S
from tests.engine_v1.test_faults import _stream_in_background, _wait_health
from tests.server_util import Server, start_server, stop_server
from tests.shared.api.api_helpers import CHAT, COMPLETIONS, HELLO, assert_error, sse_data
from tests.shared.api.test_trace_api import TRACE, _stream_id

EXACT = ("--dtype", "float32", "--quantization", "none")
PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


def _complete_all(server: Server) -> list[tuple[str, list[str]]]:
    """Eight concurrent greedy completions: (text, tokens) of each, in prompt order."""
    def one(prompt: str) -> tuple[str, list[str]]:
        with server.client() as c:
            resp = c.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                             "ignore_eos": True, "logprobs": 0})
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        return choice["text"], choice["logprobs"]["tokens"]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory, default_model_dir: str) -> Iterator[Server]:
    server = start_server("v1", tmp_path_factory.mktemp("dp2") / "server.log",
                          "--data-parallel-size", "2", *EXACT)
    yield server
    stop_server(server)


def test_requests_spread_over_both_cores_and_match_one_core(dp2: Server, tmp_path: Path) -> None:
    one = start_server("v1", tmp_path / "dp1.log", *EXACT)
    try:
        expected = _complete_all(one)
    finally:
        stop_server(one)
    assert _complete_all(dp2) == expected          # tokens and text, request by request
    with dp2.client() as c:
        stats = c.get("/debug/stats").json()
        metrics = c.get("/metrics").text
    cores = stats["engines"]
    assert [e["engine"] for e in cores] == [0, 1]
    assert all(e["prefix_cache_queries"] > 0 for e in cores), cores    # both did prefills
    assert stats["prefix_cache_queries"] == sum(e["prefix_cache_queries"] for e in cores)
    assert stats["num_total_blocks"] == sum(e["num_total_blocks"] for e in cores)
    assert len({e["pid"] for e in cores} | {stats["pids"]["api"]}) == 3
    assert stats["request_state"]["api_routes"] == 0
    queries = {s.labels["engine"]: s.value for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "twinserve:prefix_cache_queries_total"}
    assert queries == {"0": cores[0]["prefix_cache_queries"], "1": cores[1]["prefix_cache_queries"]}
    # Request series sit under the core that served each request: both cores, adding up to
    # the 8 x 12 tokens generated (this module's other test may have added a few more).
    generated, finished = {}, {}
    for f in text_string_to_metric_families(metrics):
        for s in f.samples:
            if s.name == "twinserve:generation_tokens_total":
                generated[s.labels["engine"]] = s.value
            elif s.name == "twinserve:e2e_request_latency_seconds_count":
                finished[s.labels["engine"]] = s.value
    assert set(generated) == set(finished) == {"0", "1"} and min(generated.values()) > 0
    assert sum(generated.values()) >= 8 * 12 and sum(finished.values()) >= 8


def test_trace_names_the_core_that_served(dp2: Server) -> None:
    with dp2.client() as c:
        engines = set()
        for _ in range(4):   # idle cores take turns, so two requests in a row use both
            rid = _stream_id(c, {"messages": HELLO, "max_tokens": 2}, TRACE)
            events = c.get(f"/debug/lifecycle/{rid}").json()["events"]
            tagged = {e["detail"]["engine"] for e in events if e["step"] == 4 and e.get("detail")
                      and "engine" in e["detail"]}
            assert len(tagged) == 1, events
            engines |= tagged
    assert engines == {0, 1}


def test_a_killed_core_fails_its_requests_and_the_server(tmp_path: Path) -> None:
    server = start_server("v1", tmp_path / "server.log", "--data-parallel-size", "2")
    try:
        lines: list[str] = []
        reader, first = _stream_in_background(server, lines)
        assert first.wait(60)
        with server.client() as c:
            cores = c.get("/debug/stats").json()["engines"]
        busy = [e for e in cores if e["in_flight"]]
        assert len(busy) == 1, cores
        os.kill(busy[0]["pid"], signal.SIGKILL)
        _wait_health(server, 503, timeout=5)
        reader.join(10)
        events = sse_data(lines)
        assert events[-1] == "[DONE]" and "error" in events[-2]
        with server.client() as c:
            assert_error(c.post(CHAT, json={"messages": HELLO, "max_tokens": 4}), 503)
        assert server.proc.wait(DEATH_GRACE_S + 10) == 1
        survivor = next(e["pid"] for e in cores if not e["in_flight"])
        _assert_gone([survivor])
    finally:
        stop_server(server)


def test_sigterm_stops_every_core_and_leaves_no_children(tmp_path: Path) -> None:
    server = start_server("v1", tmp_path / "server.log", "--data-parallel-size", "2")
    with server.client() as c:
        stats = c.get("/debug/stats").json()
    children = [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    assert {e["pid"] for e in stats["engines"]} <= set(children)
    assert stop_server(server) == 0
    _assert_gone(children)
    assert not any(Path(d).exists() for d in stats["ipc_dirs"])


def _assert_gone(pids: list[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if psutil.pid_exists(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"processes outlived the server: {alive}"


def test_data_parallel_needs_engine_v1() -> None:
    from shared.cli.main import main

    with pytest.raises(SystemExit, match="needs --engine v1"):
        main(["serve", "--engine", "v0", "--data-parallel-size", "2"])
