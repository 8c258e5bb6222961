"""Server-side figures over a measured window: CPU per process, step phases, loop lag.

Two snapshots (before and after a workload) of GET /debug/stats and of each process's CPU
time; the figures are their differences. A server without /debug/stats yields none of these.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

PHASES = ("schedule", "prepare", "forward", "sample", "update", "output")


@dataclass
class Snapshot:
    wall: float
    stats: dict[str, Any] | None
    cpu_s: dict[str, float] = field(default_factory=dict)   # role (api, core) -> user+system s


def _cpu_seconds(pid: int, with_children: bool = False) -> float | None:
    """User + system seconds of ``pid`` (and its live children: tensor-parallel workers)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if with_children else [])]
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def take_snapshot(base_url: str, headers: dict[str, str] | None = None,
                  local: bool = True) -> Snapshot:
    """Read /debug/stats, then the CPU time of the pids it names (only for a local server)."""
    try:
        resp = httpx.get(base_url + "/debug/stats", headers=headers, timeout=10.0)
        stats = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        stats = None
    snap = Snapshot(time.perf_counter(), stats)
    pids = (stats or {}).get("pids") or {}
    for role, pid in pids.items():
        if local and isinstance(pid, int):
            cpu = _cpu_seconds(pid, with_children=role.startswith("core"))
            if cpu is not None:
                snap.cpu_s[role] = cpu
    return snap


def _delta(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    if isinstance(a.get(key), (int, float)) and isinstance(b.get(key), (int, float)):
        return float(b[key]) - float(a[key])
    return None


def server_figures(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Flat figures for the window between two snapshots (absent data gives None)."""
    wall = after.wall - before.wall
    out: dict[str, float | None] = {"window_s": wall}
    out |= _cpu_figures(before, after, wall)
    if before.stats is None or after.stats is None:
        return out
    out |= _step_figures(before.stats.get("step_totals") or {},
                         after.stats.get("step_totals") or {}, wall)
    out |= _lag_figures(before.stats.get("loop_lag") or {}, after.stats.get("loop_lag") or {})
    return out


def _cpu_figures(before: Snapshot, after: Snapshot, wall: float) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    total = 0.0
    for role in ("api", "core"):
        # Data parallel: "core", "core1", ... are the cores; their CPU time adds up.
        roles = [r for r in after.cpu_s if r in before.cpu_s and r.rstrip("0123456789") == role]
        if roles:
            out[f"cpu_{role}_s"] = sum(after.cpu_s[r] - before.cpu_s[r] for r in roles)
            total += out[f"cpu_{role}_s"]  # type: ignore[operator]
        else:
            out[f"cpu_{role}_s"] = None
    out["cpu_total_s"] = total if after.cpu_s else None
    # Cores kept busy on average; 1.0 = one core fully used.
    out["cpu_cores_used"] = total / wall if after.cpu_s and wall > 0 else None
    return out


def _step_figures(a: dict[str, Any], b: dict[str, Any], wall: float) -> dict[str, float | None]:
    steps = _delta(a, b, "steps")
    out: dict[str, float | None] = {"steps": steps, "step_tokens": _delta(a, b, "tokens")}
    for phase in PHASES:
        d = _delta(a, b, phase)
        out[f"step_{phase}_s"] = d
        out[f"step_{phase}_ms_per_step"] = d * 1000.0 / steps if d is not None and steps else None
    fwd = out["step_forward_s"]
    out["forward_busy"] = fwd / wall if fwd is not None and wall > 0 else None
    out["tokens_per_step"] = (out["step_tokens"] / steps  # type: ignore[operator]
                              if steps and out["step_tokens"] is not None else None)
    return out


def _lag_figures(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    samples, total = _delta(a, b, "samples"), _delta(a, b, "sum_s")
    mean = total * 1000.0 / samples if samples and total is not None else None
    # The probe keeps only a running max, so a window's max is known only if it rose in it.
    mx = b.get("max_s")
    rose = isinstance(mx, (int, float)) and mx > (a.get("max_s") or 0.0)
    return {"loop_lag_mean_ms": mean, "loop_lag_max_ms": mx * 1000.0 if rose else None,
            "loop_lag_max_since_start_ms": mx * 1000.0 if isinstance(mx, (int, float)) else None}
