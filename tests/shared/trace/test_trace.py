"""Lifecycle tracing without a server: the Tracer, the scheduler's events, the store,
the wire format and the renderers."""
from __future__ import annotations

import json
import os
import threading
import time

import msgspec
import pytest

from engine_v1 import wire
from shared.api.errors import APIError
from shared.api.tracing import trace_mode
from shared.config import ServerConfig
from shared.messages import EngineCoreOutputs
from shared.trace.render import chrome_trace, mermaid, table
from shared.trace.steps import Step
from shared.trace.store import TraceStore
from shared.trace.tracer import SUMMARY_NAME, TraceEvent, Tracer
from tests.shared.factories import make_request, make_scheduler, run_until_done


def _record_here(tracer: Tracer) -> None:
    tracer.event("r1", Step.TOKENIZED, "tokenized", {"prompt_tokens": 4}, where=_record_here)


def _helper(tracer: Tracer) -> None:
    _record_here(tracer)    # one more frame: the reported location must not move


def test_event_has_clock_process_thread_and_code_location() -> None:
    tracer = Tracer("api-server")
    before = time.time_ns()
    _record_here(tracer)
    worker = threading.Thread(target=_record_here, args=(tracer,), name="worker-7")
    worker.start()
    worker.join()
    _helper(tracer)
    first, second, third = tracer.drain()
    assert before <= first.t_ns <= time.time_ns()    # wall clock, comparable across processes
    assert (first.pid, first.process, first.thread) == (os.getpid(), "api-server", "MainThread")
    assert first.where == f"{__name__}:_record_here"
    assert (first.step, first.name, first.detail) == (3, "tokenized", {"prompt_tokens": 4})
    assert second.thread == "worker-7"
    assert third.where == first.where
    assert tracer.drain() is None


def test_later_decode_steps_fold_into_one_summary() -> None:
    tracer = Tracer("engine-core")
    tracer.begin("r")
    tracer.event("r", Step.QUEUED, "queued", where=_record_here)
    for _ in range(5):   # one prefill-ish step (decode=False), then decode steps
        tracer.event("r", Step.FORWARD, "forward launched", decode=True, where=_record_here)
        tracer.event("r", Step.ATTENTION, "forward done", decode=True, where=_record_here)
    tracer.end("r")
    events = tracer.drain()
    names = [e.name for e in events]
    assert names == ["queued", "forward launched", "forward done", SUMMARY_NAME]
    summary = events[-1].detail
    assert summary["count"] == 4 and summary["steps"] == [9, 10]
    assert set(summary["phases"]) == {"forward launched", "forward done"}
    assert all(p["count"] == 4 and p["total_ms"] >= 0 for p in summary["phases"].values())
    assert tracer.num_active == 0


def test_keep_all_records_every_decode_step() -> None:
    tracer = Tracer("engine-core")
    tracer.begin("r", keep_all=True)
    for _ in range(4):
        tracer.event("r", Step.ATTENTION, "forward done", decode=True, where=_record_here)
    tracer.end("r")
    assert [e.name for e in tracer.drain()] == ["forward done"] * 4


def test_scheduler_records_steps_5_to_11_only_for_traced_requests() -> None:
    sched = make_scheduler()
    plain = make_request("plain", 9, max_tokens=6)
    traced = make_request("traced", 9, max_tokens=6)
    traced.trace = True
    sched.add_request(plain)
    sched.add_request(traced)
    run_until_done(sched)
    events = sched.tracer.drain()
    assert {e.request_id for e in events} == {"traced"}
    steps = [e.step for e in events]
    assert steps[:4] == [5, 6, 7, 11]                       # prefill, first token
    assert steps[4:7] == [6, 7, 11]                         # first decode step in full
    assert events[-2].name == SUMMARY_NAME and events[-2].detail["count"] == 4
    assert events[-1].name.startswith("finished") and events[-1].detail["blocks_freed"] == 4
    assert sched.tracer.num_active == 0


def test_untraced_traffic_records_and_allocates_nothing() -> None:
    sched = make_scheduler()
    for i in range(4):
        sched.add_request(make_request(f"r{i}", 7, max_tokens=5))
    log = run_until_done(sched)
    assert sched.tracer.drain() is None
    assert all(step.traced is None for step in log.steps)
    # array_like structs keep trailing defaults: an untraced frame pays one nil byte per step.
    untraced = msgspec.msgpack.encode(EngineCoreOutputs(outputs=[], timestamp=1.0))
    assert msgspec.msgpack.decode(untraced)[-1] is None and untraced.endswith(b"\xc0")


def test_core_events_cross_the_wire() -> None:
    ev = TraceEvent("r-0", 6, "scheduled", 123, 42, "engine-core", "MainThread",
                    "shared.core.scheduler:_add_scheduled", {"new_tokens": 3})
    codec = wire.WireCodec()
    tag, out = codec.decode(codec.encode(wire.OUTPUTS, EngineCoreOutputs([], 1.0, trace_events=[ev])))
    assert tag == wire.OUTPUTS and out.trace_events == [ev]


def test_store_groups_children_and_keeps_a_bounded_ring() -> None:
    store = TraceStore(capacity=3)
    for i in range(5):
        store.begin(f"t{i}")
        store.link(f"t{i}-0", f"t{i}")
        store.add(TraceEvent(f"t{i}", 1, "HTTP request received", 10, 1, "api", "MainThread", "x:y"))
        store.add(TraceEvent(f"t{i}-0", 5, "queued", 2_000_010, 2, "core", "MainThread", "x:z"))
        store.finish(f"t{i}")
        store.finish(f"t{i}")                      # idempotent
    store.add(TraceEvent("t4-0", 11, "late", 30, 2, "core", "MainThread", "x:z"))   # dropped
    store.add(TraceEvent("nobody", 1, "x", 30, 2, "core", "MainThread", "x:z"))
    assert [t.request_id for t in store.finished()] == ["t2", "t3", "t4"]
    assert store.get("t0") is None
    doc = store.get("t4").to_json("v1")
    assert [e["step"] for e in doc["events"]] == [1, 5]
    assert [e["t_ms"] for e in doc["events"]] == [0.0, 2.0]
    assert doc["events"][1]["request_id"] == "t4-0"


@pytest.mark.parametrize("header,trace,decode,expected", [
    (None, False, False, None), ("1", False, False, "on"), ("all", False, False, "all"),
    (None, True, False, "on"), ("0", True, False, None), (None, True, True, "all"),
])
def test_trace_mode(header: str | None, trace: bool, decode: bool, expected: str | None) -> None:
    cfg = ServerConfig(trace=trace, trace_decode=decode, enable_debug_endpoints=True)
    assert trace_mode(header, cfg) == expected


def test_without_debug_endpoints_the_header_is_ignored() -> None:
    for header in ("1", "all", "maybe"):
        assert trace_mode(header, ServerConfig()) is None
    assert trace_mode(None, ServerConfig(trace=True)) == "on"      # --trace turns them on


def test_trace_mode_rejects_junk() -> None:
    with pytest.raises(APIError):
        trace_mode("maybe", ServerConfig(enable_debug_endpoints=True))


def _sample_trace() -> dict:
    store = TraceStore()
    store.begin("chatcmpl-1")
    store.link("chatcmpl-1-0", "chatcmpl-1")
    api, core = Tracer("api-server", sink=store.add), Tracer("engine-core")
    core.pid += 1     # as if in its own process
    api.event("chatcmpl-1", Step.HTTP_RECEIVED, "HTTP request received", where=_record_here)
    core.begin("chatcmpl-1-0")
    core.event("chatcmpl-1-0", Step.QUEUED, "queued", {"prompt_tokens": 3}, where=_record_here)
    core.event("chatcmpl-1-0", Step.ATTENTION, "forward done", {"forward_ms": 2.5}, where=_record_here)
    for _ in range(3):
        core.event("chatcmpl-1-0", Step.SAMPLED, "token sampled", decode=True, where=_record_here)
    core.end("chatcmpl-1-0")
    store.add_all(core.drain())
    api.event("chatcmpl-1", Step.STREAMED, "finished", {"text": "a|b;c"}, where=_record_here)
    store.finish("chatcmpl-1")
    return store.get("chatcmpl-1").to_json("v1")


def test_table_and_mermaid_show_every_event_and_lane() -> None:
    trace = _sample_trace()
    text = table(trace)
    assert text.count("\n| ") == len(trace["events"]) + 1 and "a\\|b" in text
    diagram = mermaid(trace)
    assert diagram.startswith("sequenceDiagram")
    assert diagram.count("participant ") == 2 and ";" not in diagram
    assert "Note over" in diagram     # the decode summary


def test_chrome_trace_format() -> None:
    doc = json.loads(json.dumps(chrome_trace([_sample_trace(), _sample_trace()])))
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["name"] for e in meta} == {"process_name", "thread_name"}
    assert len([e for e in meta if e["name"] == "process_name"]) == 2   # two pids
    for e in events:
        assert {"ph", "name", "pid", "tid"} <= set(e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and isinstance(e["args"], dict)
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] == "i":
            assert e["s"] == "t"
    assert any(e["ph"] == "X" and e["name"].startswith("request ") for e in events)
