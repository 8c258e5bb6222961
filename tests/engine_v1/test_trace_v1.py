"""`twinserve trace --engine v1`: one request really spans two processes, and the Chrome
trace file holds a track per process and thread."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cli.main import main
from tests.shared.trace.lifecycle_map import assert_event_on_the_map


def test_trace_cli_json_and_chrome_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chrome = tmp_path / "trace.json"
    code = main(["trace", "--engine", "v1", "--max-tokens", "4", "--json",
                 "--chrome-trace", str(chrome), "Name a colour."])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "v1" and doc["request_id"].startswith("chatcmpl-")
    events = doc["events"]
    for e in events:
        assert {"step", "name", "t_ms", "pid", "process", "thread", "where"} <= set(e)
        assert_event_on_the_map(e)
    api_pid = events[0]["pid"]
    core = [e for e in events if e["pid"] != api_pid]
    assert {e["step"] for e in core} >= set(range(5, 12))
    assert {e["step"] for e in events if e["pid"] == api_pid} >= {1, 2, 3, 4, 12, 13}
    assert {e["process"] for e in core} == {"engine-core"}
    assert {"core-input", "MainThread"} <= {e["thread"] for e in core}

    trace = json.loads(chrome.read_text())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["pid"] for e in meta if e["name"] == "process_name"} == {api_pid, core[0]["pid"]}
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert {(api_pid, "MainThread"), (core[0]["pid"], "core-input")} <= threads
    timed = [e for e in trace["traceEvents"] if e["ph"] in ("i", "X")]
    assert timed and all(isinstance(e["ts"], float) and e["tid"] > 0 for e in timed)
