"""Runs -> results.json: per model setting, workload and engine, the median of every figure
over the repeats, and the v1/v0 ratio of each median."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from compare.runner import RunRecord

SCHEMA = "twinserve-compare/1"
Figures = dict[str, float | int | None]


def median_figures(runs: list[Figures]) -> dict[str, float | None]:
    """Per key, the median of the runs' numeric values; None where no run has one."""
    keys = list(dict.fromkeys(k for r in runs for k in r))
    out: dict[str, float | None] = {}
    for k in keys:
        vals = [float(r[k]) for r in runs if isinstance(r.get(k), (int, float))]  # type: ignore[arg-type]
        out[k] = statistics.median(vals) if vals else None
    return out


def ratio_figures(base: dict[str, float | None], other: dict[str, float | None]) -> dict[str, float | None]:
    """other / base for every key both have, None where undefined (missing or zero base)."""
    out: dict[str, float | None] = {}
    for k, b in base.items():
        o = other.get(k)
        out[k] = o / b if isinstance(o, (int, float)) and isinstance(b, (int, float)) and b else None
    return out


def build_results(records: list[RunRecord], config: dict[str, Any], machine: dict[str, Any],
                  model_paths: dict[str, str]) -> dict[str, Any]:
    grouped: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for rec in records:
        grouped[(rec.model, rec.workload, rec.engine)].append(rec)
    workloads = {w["name"]: w for w in config.get("workloads", [])}
    models: dict[str, Any] = {}
    for (model, wl, engine), recs in grouped.items():
        m = models.setdefault(model, {"model_path": model_paths.get(model), "workloads": {}})
        entry = m["workloads"].setdefault(wl, {"workload": workloads.get(wl), "engines": {}})
        entry["engines"][engine] = {
            "repeats": len(recs),
            "client": median_figures([r.client for r in recs]),
            "server": median_figures([r.server for r in recs]),
        }
    for m in models.values():
        for entry in m["workloads"].values():
            eng = entry["engines"]
            if "v0" in eng and "v1" in eng:
                entry["ratio_v1_over_v0"] = {
                    part: ratio_figures(eng["v0"][part], eng["v1"][part]) for part in ("client", "server")}
            for dp in (e for e in eng if e.startswith(("v1-dp", "v1-tp")) and "v1" in eng):
                entry[f"ratio_{dp}_over_v1"] = {
                    part: ratio_figures(eng["v1"][part], eng[dp][part]) for part in ("client", "server")}
    return {"schema": SCHEMA, "machine": machine, "config": config, "models": models}
