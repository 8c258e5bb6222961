"""results.json -> report.md: the machine, the settings, and per workload a table of every
figure for v0 and v1 with their ratio."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# (key, label, section); client keys first, then server keys.
CLIENT_ROWS = [
    ("completed", "completed requests"), ("failed", "failed requests"),
    ("request_throughput", "request throughput (req/s)"),
    ("output_throughput", "output throughput (tok/s)"),
    ("total_token_throughput", "total token throughput (tok/s)"),
] + [(f"{s}_{f}_ms", f"{f.upper()} {s} (ms)") for f in ("ttft", "tpot", "itl", "e2el")
     for s in ("mean", "median", "p90", "p99")]
SERVER_ROWS = [
    ("cpu_api_s", "CPU, API process (s)"), ("cpu_core_s", "CPU, core process (s)"),
    ("cpu_cores_used", "cores kept busy"), ("steps", "engine steps"),
    ("tokens_per_step", "tokens per step"), ("forward_busy", "forward-busy fraction"),
] + [(f"step_{p}_ms_per_step", f"step {p} (ms/step)")
     for p in ("schedule", "prepare", "forward", "sample", "update", "output")] + [
    ("loop_lag_mean_ms", "API loop lag, mean (ms)"), ("loop_lag_max_ms", "API loop lag, max in window (ms)"),
]
HEADLINE = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")


def fmt(x: float | None, ratio: bool = False) -> str:
    if x is None:
        return "—"
    if ratio:
        return f"{x:.2f}x"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _machine_section(machine: dict[str, Any]) -> list[str]:
    lines = ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    return lines + [""]


def _settings_section(cfg: dict[str, Any]) -> list[str]:
    keys = ("engines", "models", "repeats", "warmup_requests", "endpoint", "input_len", "output_len",
            "max_num_seqs", "max_num_batched_tokens", "kv_cache_size_gb", "num_threads", "data_parallel_size",
            "tensor_parallel_size",
            "dtype", "url")
    lines = ["## Settings", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {cfg.get(k)} |" for k in keys]
    lines += ["", "| workload | requests | concurrency | rate (req/s) | burstiness | seed |",
              "|---|---|---|---|---|---|"]
    for w in cfg.get("workloads", []):
        lines.append(f"| {w['name']} | {w['num_prompts']} | {w['concurrency'] or '∞'} | "
                     f"{w['request_rate'] or '∞'} | {w['burstiness']} | {w['seed']} |")
    return lines + [""]


def _figure_table(entry: dict[str, Any], part: str, rows: list[tuple[str, str]]) -> list[str]:
    engines = list(entry["engines"])
    # v1/v0, then each v1-dpN/v1 and v1-tpN/v1 (beside one core), where both were measured.
    ratios = [("v1/v0", (entry.get("ratio_v1_over_v0") or {}).get(part))]
    ratios += [(f"{e}/v1", (entry.get(f"ratio_{e}_over_v1") or {}).get(part)) for e in engines]
    ratios = [(name, r) for name, r in ratios if r]
    head = "| figure | " + " | ".join(engines + [name for name, _ in ratios]) + " |"
    lines = [head, "|---" * (len(engines) + 1 + len(ratios)) + "|"]
    for key, label in rows:
        vals = [entry["engines"][e][part].get(key) for e in engines]
        if all(v is None for v in vals):
            continue
        cells = [fmt(v) for v in vals] + [fmt(r.get(key), ratio=True) for _, r in ratios]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def _summary(m: dict[str, Any]) -> list[str]:
    lines = ["Headline figures (medians over repeats; ratio = v1/v0):", "",
             "| workload | " + " | ".join(f"{k} v0 | v1 | ratio" for k in HEADLINE) + " |",
             "|---" * (1 + 3 * len(HEADLINE)) + "|"]
    for wl, entry in m["workloads"].items():
        eng, ratio = entry["engines"], (entry.get("ratio_v1_over_v0") or {}).get("client", {})
        cells = []
        for k in HEADLINE:
            cells += [fmt(eng.get("v0", {}).get("client", {}).get(k)),
                      fmt(eng.get("v1", {}).get("client", {}).get(k)), fmt(ratio.get(k), ratio=True)]
        lines.append(f"| {wl} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_report(results: dict[str, Any], out: Path, plots: list[str]) -> Path:
    lines = ["# twinserve compare: v0 (one process) vs v1 (API + engine core)", "",
             "Client figures follow `vllm bench serve`'s definitions; server figures are the change "
             "in /debug/stats and per-process CPU time over each measured window. Every number is "
             "the median over repeats run alternately on one machine; compare ratios, not absolute "
             "numbers across machines.", ""]
    lines += _machine_section(results["machine"]) + _settings_section(results["config"])
    for model, m in results["models"].items():
        lines += [f"## Model setting: {model}", "", f"Model folder: `{m['model_path']}`", ""]
        if not results["config"].get("url"):
            lines += _summary(m)
        for wl, entry in m["workloads"].items():
            lines += [f"### {model} / {wl}", "", "Client side:", ""]
            lines += _figure_table(entry, "client", CLIENT_ROWS)
            lines += ["Server side:", ""] + _figure_table(entry, "server", SERVER_ROWS)
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
