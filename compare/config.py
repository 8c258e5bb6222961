"""What one ``twinserve compare`` run does: model settings, workloads, server settings, repeats."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from compare.workload import Workload

MODEL_SETTINGS = ("tiny", "default")

# PERF.md's named workloads on the default model, streaming chat: (requests, concurrency,
# prompt tokens, output tokens). ``--workload`` applies one before the other flags.
WORKLOADS: dict[str, tuple[int, int, int, int]] = {
    "W1": (64, 16, 128, 128),
    "W2": (8, 1, 128, 128),
    "W3": (128, 64, 64, 64),
}


def apply_workload(cfg: CompareConfig, name: str) -> None:
    """Set ``cfg`` to the named workload (one closed-loop point, no open-loop run)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, not {name!r}")
    n, c, prompt, output = WORKLOADS[name]
    cfg.concurrencies, cfg.num_prompts, cfg.request_rate = [c], n, None
    cfg.input_len, cfg.output_len, cfg.endpoint = (prompt, prompt), (output, output), "chat"
    if cfg.url is None:
        cfg.models = ["default"]


@dataclass
class CompareConfig:
    out: Path
    models: list[str] = field(default_factory=lambda: ["tiny", "default"])
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    num_prompts: int | None = None          # None: max(8, 2 * concurrency) per workload
    input_len: tuple[int, int] = (64, 128)
    output_len: tuple[int, int] = (32, 32)
    request_rate: float | None = 4.0         # open-loop workload; None: none
    rate_num_prompts: int = 32
    burstiness: float = 1.0
    repeats: int = 2
    warmup_requests: int = 4
    seed: int = 0
    endpoint: str = "completions"           # completions (token-id prompts) | chat (text)
    # Server settings, identical for both engines.
    model_path: str | None = None           # the "default" setting's folder; None: SmolLM2
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    kv_cache_size_gb: float = 0.5
    # None: each server's own thread policy (what a user who passes nothing gets).
    num_threads: int | None = None
    dtype: str = "auto"
    quantization: str | None = None         # None: each server's default (--quantization)
    engines: tuple[str, ...] = ("v0", "v1")
    # > 1: one more server, "v1-dpN" (v1 with --data-parallel-size N), measured beside DP=1.
    data_parallel_size: int = 1
    # > 1: one more server, "v1-tpN" (v1 with --tensor-parallel-size N), beside TP=1.
    tensor_parallel_size: int = 1
    # --url: drive an already running server instead.
    url: str | None = None
    tokenizer: str | None = None            # folder with tokenizer.json (--url); None: default model
    api_key: str | None = None
    health_timeout_s: float = 180.0
    request_timeout_s: float = 300.0
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.url is not None:  # one server, one "engine", no model settings to pick
            self.engines, self.models = ("url",), ["url"]
        for m in self.models:
            if m not in MODEL_SETTINGS and self.url is None:
                raise ValueError(f"model setting must be one of {MODEL_SETTINGS}, not {m!r}")
        if self.endpoint not in ("completions", "chat"):
            raise ValueError("endpoint must be completions or chat")
        if self.repeats < 1 or not self.concurrencies and self.request_rate is None:
            raise ValueError("need at least one repeat and one workload")
        for e in self.engines:
            if e not in ("v0", "v1", "url") and not e.startswith(("v1-dp", "v1-tp")):
                raise ValueError(f"engine must be v0, v1, v1-dpN or v1-tpN, not {e!r}")
        for kind, size in (("dp", self.data_parallel_size), ("tp", self.tensor_parallel_size)):
            label = f"v1-{kind}{size}"
            if size > 1 and self.url is None and label not in self.engines:
                self.engines = (*self.engines, label)

    def workloads(self) -> list[Workload]:
        """The concurrency sweep, then the open-loop workload; each has its own seed so a
        server's prefix cache never holds an earlier workload's prompts."""
        out: list[Workload] = []
        for i, c in enumerate(self.concurrencies):
            n = self.num_prompts or max(8, 2 * c)
            out.append(Workload(f"c{c}", n, self.input_len, self.output_len, concurrency=c,
                                seed=self.seed * 1000 + i))
        if self.request_rate is not None:
            out.append(Workload(f"rate{self.request_rate:g}", self.rate_num_prompts, self.input_len,
                                self.output_len, concurrency=None, request_rate=self.request_rate,
                                burstiness=self.burstiness, seed=self.seed * 1000 + 999))
        return out

    def warmup(self) -> Workload:
        return Workload("warmup", self.warmup_requests, self.input_len, (8, 8),
                        concurrency=self.warmup_requests, seed=self.seed * 1000 + 998)

    def describe(self) -> dict[str, object]:
        d = asdict(self)
        d["out"] = str(self.out)
        d["api_key"] = "***" if self.api_key else None
        d["workloads"] = [w.describe() for w in self.workloads()]
        return d


def quick_config(out: Path) -> CompareConfig:
    """The smoke version: tiny model, one repeat, ~32 short requests per engine, about a minute."""
    return CompareConfig(out=out, models=["tiny"], concurrencies=[4, 16], num_prompts=12,
                         input_len=(16, 48), output_len=(16, 16), request_rate=16.0,
                         rate_num_prompts=8, repeats=1, warmup_requests=2)
