"""Client-side figures of one benchmark run, with ``vllm bench serve``'s definitions.

Per request: TTFT = first content chunk - send time; ITL = gaps between consecutive content
chunks; TPOT = (e2e - TTFT) / (output_tokens - 1), only for requests with more than one
output token; e2e = last byte - send time. Throughputs divide by the run's wall time.
Percentiles use numpy's linear interpolation. Times are reported in milliseconds.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)
LATENCY_FIGURES = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestResult:
    """What the client saw of one request (seconds, relative to its own send time)."""
    success: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0            # send time, relative to the start of the run
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RequestResult:
        return cls(**d)  # type: ignore[arg-type]


def tpot(r: RequestResult) -> float | None:
    """Mean time per output token after the first; None for one-token answers."""
    if r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


def distribution_ms(values_s: list[float], prefix: str) -> dict[str, float | None]:
    """mean, median, std and percentiles of ``values_s`` (seconds) in milliseconds."""
    keys = [f"mean_{prefix}_ms", f"median_{prefix}_ms", f"std_{prefix}_ms"]
    keys += [f"p{p}_{prefix}_ms" for p in PERCENTILES]
    if not values_s:
        return dict.fromkeys(keys, None)
    arr = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {keys[0]: float(arr.mean()), keys[1]: float(np.median(arr)), keys[2]: float(arr.std())}
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(arr, p))
    return out


def compute_metrics(results: list[RequestResult], duration_s: float) -> dict[str, float | int | None]:
    """All client-side figures of one run; failed requests count only as failures."""
    ok = [r for r in results if r.success]
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    dur = max(duration_s, 1e-9)
    figures: dict[str, float | int | None] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / dur,
        "output_throughput": output_tokens / dur,
        "total_token_throughput": (input_tokens + output_tokens) / dur,
    }
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    figures |= distribution_ms([r.ttft for r in ok], "ttft")
    figures |= distribution_ms(tpots, "tpot")
    figures |= distribution_ms([gap for r in ok for gap in r.itl], "itl")
    figures |= distribution_ms([r.latency for r in ok], "e2el")
    return figures
