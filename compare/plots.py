"""PNG plots of a comparison (matplotlib, Agg: no display needed).

One file per kind of plot, one row of panels per model setting:
throughput vs concurrency, TTFT/ITL distributions, stacked step-time breakdown, and the
forward-busy fraction beside the API loop's lag.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compare.runner import RunRecord  # noqa: E402
from compare.server_stats import PHASES  # noqa: E402

COLORS = {"v0": "tab:blue", "v1": "tab:orange", "url": "tab:green"}


def _engines(results: dict[str, Any]) -> list[str]:
    return list(results["config"]["engines"])


def _grid(n_rows: int, n_cols: int, title: str, width: float = 6) -> tuple[Any, Any]:
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, 3.8 * n_rows), squeeze=False)
    fig.suptitle(title)
    return fig, axes


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def plot_throughput(results: dict[str, Any], out: Path) -> str:
    models = results["models"]
    fig, axes = _grid(len(models), 1, "Output throughput vs concurrency (median over repeats)")
    for ax, (model, m) in zip(axes[:, 0], models.items()):
        sweep = [(e["workload"]["concurrency"], e) for e in m["workloads"].values()
                 if e["workload"] and e["workload"]["request_rate"] is None and e["workload"]["concurrency"]]
        sweep.sort(key=lambda t: t[0])
        for engine in _engines(results):
            ys = [e["engines"].get(engine, {}).get("client", {}).get("output_throughput") for _, e in sweep]
            ax.plot([c for c, _ in sweep], ys, "o-", label=engine, color=COLORS.get(engine))
        ax.set_xscale("log", base=2)
        ax.set(title=model, xlabel="concurrency", ylabel="output tok/s")
        ax.legend()
    return _save(fig, out / "throughput_vs_concurrency.png")


def plot_latency(results: dict[str, Any], records: list[RunRecord], out: Path) -> str:
    models = results["models"]
    fig, axes = _grid(len(models), 2, "TTFT and ITL distributions (all repeats pooled)")
    engines = _engines(results)
    for row, (model, m) in enumerate(models.items()):
        wls = list(m["workloads"])
        for col, (name, get) in enumerate((("TTFT", lambda r: [r.ttft]), ("ITL", lambda r: r.itl))):
            ax = axes[row, col]
            for k, engine in enumerate(engines):
                data = [[x * 1000 for rec in records if rec.model == model and rec.workload == wl
                         and rec.engine == engine for r in rec.requests if r.success for x in get(r)] or [0.0]
                        for wl in wls]
                pos = [i * (len(engines) + 1) + k for i in range(len(wls))]
                bp = ax.boxplot(data, positions=pos, widths=0.8, showfliers=False, patch_artist=True)
                for box in bp["boxes"]:
                    box.set_facecolor(COLORS.get(engine, "grey"))
                ax.plot([], [], color=COLORS.get(engine, "grey"), lw=6, label=engine)
            ax.set_xticks([i * (len(engines) + 1) + (len(engines) - 1) / 2 for i in range(len(wls))], wls)
            ax.set(title=f"{model}: {name}", ylabel="ms")
            ax.legend()
    return _save(fig, out / "latency_distributions.png")


def plot_steps(results: dict[str, Any], out: Path) -> str:
    models = results["models"]
    fig, axes = _grid(len(models), 1, "Engine step time by phase (ms per step, median)", width=9)
    for ax, (model, m) in zip(axes[:, 0], models.items()):
        labels, bottoms = [], []
        bars = [(wl, eng, e["engines"][eng]["server"]) for wl, e in m["workloads"].items()
                for eng in _engines(results) if eng in e["engines"]]
        labels = [f"{wl}\n{eng}" for wl, eng, _ in bars]
        bottoms = [0.0] * len(bars)
        for phase in PHASES:
            vals = [s.get(f"step_{phase}_ms_per_step") or 0.0 for _, _, s in bars]
            ax.bar(range(len(bars)), vals, bottom=bottoms, label=phase)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
        ax.set_xticks(range(len(bars)), labels, fontsize=7)
        ax.set(title=model, ylabel="ms / step")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out / "step_breakdown.png")


def plot_busy_lag(results: dict[str, Any], out: Path) -> str:
    models = results["models"]
    fig, axes = _grid(len(models), 2, "Forward-busy fraction and API event-loop lag (median)")
    engines = _engines(results)
    for row, (model, m) in enumerate(models.items()):
        wls = list(m["workloads"])
        for col, (key, ylabel) in enumerate((("forward_busy", "Δforward / wall"),
                                             ("loop_lag_mean_ms", "mean loop lag (ms)"))):
            ax = axes[row, col]
            width = 0.8 / len(engines)
            for k, engine in enumerate(engines):
                vals = [m["workloads"][wl]["engines"].get(engine, {}).get("server", {}).get(key) or 0.0
                        for wl in wls]
                ax.bar([i + k * width for i in range(len(wls))], vals, width, label=engine,
                       color=COLORS.get(engine))
            ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(wls))], wls)
            ax.set(title=f"{model}: {key}", ylabel=ylabel)
            ax.legend()
    return _save(fig, out / "busy_and_loop_lag.png")


def write_plots(results: dict[str, Any], records: list[RunRecord], out: Path) -> list[str]:
    """All plots into ``out``; returns their file names (relative to ``out``)."""
    return [plot_throughput(results, out), plot_latency(results, records, out),
            plot_steps(results, out), plot_busy_lag(results, out)]
