"""Lifecycle traces (the JSON of ``/debug/lifecycle``) as a table, a Mermaid sequence
diagram, and Chrome trace events (open the file in https://ui.perfetto.dev).
"""
from __future__ import annotations

from typing import Any

from shared.trace.tracer import SUMMARY_NAME

Trace = dict[str, Any]   # {"request_id", "engine", "events": [...]}, as TraceStore.to_json


def lane(e: dict[str, Any]) -> str:
    """One lane per process and thread."""
    return f"{e['process']} ({e['pid']}) {e['thread']}"


def step_label(e: dict[str, Any]) -> str:
    if e["name"] == SUMMARY_NAME:
        lo, hi = e["detail"]["steps"]
        return f"{lo}-{hi}" if lo != hi else str(lo)
    return str(e["step"])


def what(e: dict[str, Any], max_len: int = 90) -> str:
    """The event's name with its details, short enough for a table cell."""
    detail = e.get("detail") or {}
    if e["name"] == SUMMARY_NAME:
        phases = ", ".join(f"{name} {p['total_ms']:.2f} ms" for name, p in detail["phases"].items())
        text = f"{detail['count']} more decode steps over {detail['span_ms']:.1f} ms: {phases}"
        return text if len(text) <= 2 * max_len else text[: 2 * max_len - 3] + "..."
    parts = [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
             for k, v in detail.items() if v is not None]
    text = e["name"] + (f" ({', '.join(parts)})" if parts else "")
    return text if len(text) <= max_len else text[: max_len - 3] + "..."


def table(trace: Trace) -> str:
    """Markdown: step, what happened, where, process, thread, time since arrival."""
    rows = [f"Request `{trace['request_id']}` on engine {trace['engine']}", "",
            "| step | what happened | where | process (pid) | thread | t (ms) |",
            "|---|---|---|---|---|---|"]
    for e in trace["events"]:
        cell = what(e).replace("|", "\\|")
        rows.append(f"| {step_label(e)} | {cell} | `{e['where']}` | {e['process']} ({e['pid']}) "
                    f"| {e['thread']} | {e['t_ms']:.2f} |")
    return "\n".join(rows)


def _mermaid_text(text: str) -> str:
    # ';' and '#' have meanings in Mermaid; keep messages plain.
    return text.replace(";", ",").replace("#", "no.").replace("\n", " ")


def mermaid(trace: Trace) -> str:
    """A sequence diagram: one participant per process/thread, one arrow per event."""
    lanes: dict[str, str] = {}
    for e in trace["events"]:
        lanes.setdefault(lane(e), f"L{len(lanes)}")
    lines = ["sequenceDiagram"]
    lines += [f"    participant {alias} as {_mermaid_text(name)}" for name, alias in lanes.items()]
    last_at_step: dict[int, str] = {}     # lane of the latest event of each step
    for e in trace["events"]:
        here = lanes[lane(e)]
        label = _mermaid_text(f"{step_label(e)}. {what(e, 60)} +{e['t_ms']:.1f} ms")
        if e["name"] == SUMMARY_NAME:
            lines.append(f"    Note over {here}: {label}")
            continue
        # The arrow starts where the previous step happened last, not at whatever event came
        # just before: in v1 the core runs the next step while the API streams this token.
        earlier = [s for s in last_at_step if s < e["step"]]
        source = last_at_step[max(earlier)] if earlier else here
        lines.append(f"    {source}->>{here}: {label}")
        last_at_step[e["step"]] = here
    return "\n".join(lines)


def chrome_trace(traces: list[Trace]) -> dict[str, Any]:
    """Chrome trace event format: "M" names each process/thread track, "i" marks each event,
    "X" spans the whole request and each summary; ``ts`` in microseconds."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    for trace in traces:
        for e in trace["events"]:
            key = (e["pid"], e["thread"])
            if key not in tids:
                if all(pid != e["pid"] for pid, _ in tids):
                    events.append({"ph": "M", "name": "process_name", "pid": e["pid"], "tid": 0,
                                   "args": {"name": f"{e['process']} ({e['pid']})"}})
                tids[key] = len(tids) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": e["pid"], "tid": tids[key],
                               "args": {"name": e["thread"]}})
            events.append(_chrome_event(trace, e, tids[key]))
        events.extend(_request_span(trace, tids))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _chrome_event(trace: Trace, e: dict[str, Any], tid: int) -> dict[str, Any]:
    args = {"request_id": e.get("request_id", trace["request_id"]), "trace_id": trace["request_id"],
            "where": e["where"], "t_ms": e["t_ms"], **(e.get("detail") or {})}
    out = {"name": f"{step_label(e)}. {e['name']}", "cat": "lifecycle", "pid": e["pid"],
           "tid": tid, "ts": e["t_ns"] / 1e3, "args": args}
    detail = e.get("detail") or {}
    if e["name"] == SUMMARY_NAME:
        return {**out, "ph": "X", "dur": detail["span_ms"] * 1e3}
    if "forward_ms" in detail:     # "forward done": draw the forward pass as a span
        dur = detail["forward_ms"] * 1e3
        return {**out, "ph": "X", "ts": out["ts"] - dur, "dur": dur}
    return {**out, "ph": "i", "s": "t"}


def _request_span(trace: Trace, tids: dict[tuple[int, str], int]) -> list[dict[str, Any]]:
    """One "X" event from HTTP received to finished, on the first event's track."""
    events = trace["events"]
    if not events:
        return []
    first, last = events[0], events[-1]
    return [{"ph": "X", "name": f"request {trace['request_id']}", "cat": "request",
             "pid": first["pid"], "tid": tids[(first["pid"], first["thread"])],
             "ts": first["t_ns"] / 1e3, "dur": (last["t_ns"] - first["t_ns"]) / 1e3,
             "args": {"engine": trace["engine"], "events": len(events)}}]
