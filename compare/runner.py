"""The measurement loop: for each model setting, repeats alternating v0, v1, v0, v1, ...

One server start per (repeat, engine): warm-up requests (not counted), then every workload in
turn, each bracketed by two server-stats snapshots. Engines alternate so slow drift of a
shared machine falls on both alike. Every run is saved as raw JSON as soon as it ends.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from tqdm import tqdm

from compare.bench_serve import Target, fetch_model_name, run_workload
from compare.config import CompareConfig
from compare.metrics import RequestResult, compute_metrics
from compare.server_proc import ServerProcess, ServerSettings
from compare.server_stats import server_figures, take_snapshot
from compare.workload import SampleRequest, Workload, decode_prompts, ordinary_vocab, sample_requests

logger = logging.getLogger(__name__)


@dataclass
class RunRecord:
    model: str
    workload: str
    engine: str
    repeat: int
    client: dict[str, float | int | None]
    server: dict[str, float | None]
    requests: list[RequestResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "workload": self.workload, "engine": self.engine,
                "repeat": self.repeat, "client": self.client, "server": self.server,
                "requests": [r.to_dict() for r in self.requests]}


@dataclass
class Dataset:
    """One workload's requests and the prompts sent for them (token ids or text)."""
    workload: Workload
    requests: list[SampleRequest]
    prompts: list[list[int]] | list[str]


def model_folder(cfg: CompareConfig, setting: str) -> Path:
    from compare.tiny_model import ensure_tiny_model
    from shared.worker.model_fetch import resolve_model

    real = resolve_model(cfg.model_path if setting == "default" else None)
    return real if setting == "default" else ensure_tiny_model(real, seed=cfg.seed)


def build_datasets(cfg: CompareConfig, tokenizer_dir: Path) -> list[Dataset]:
    tok = str(tokenizer_dir / "tokenizer.json")
    vocab = ordinary_vocab(tok)
    out = []
    for w in [cfg.warmup(), *cfg.workloads()]:
        reqs = sample_requests(w, vocab)
        prompts = decode_prompts(tok, reqs) if cfg.endpoint == "chat" else [r.prompt_token_ids for r in reqs]
        out.append(Dataset(w, reqs, prompts))
    return out


class Runner:
    def __init__(self, cfg: CompareConfig) -> None:
        self.cfg = cfg
        self.model_paths: dict[str, str] = {}
        self.bar: tqdm | None = None
        self._warned = False       # about a server without /debug/stats, once

    def run(self) -> list[RunRecord]:
        cfg = self.cfg
        records: list[RunRecord] = []
        plan = [(m, self._datasets(m)) for m in cfg.models]
        total = sum(len(d.requests) for _, ds in plan for d in ds[1:])
        total *= cfg.repeats * len(cfg.engines)
        with tqdm(total=total, unit="req", disable=not cfg.progress, dynamic_ncols=True) as bar:
            self.bar = bar
            for model, datasets in plan:
                for rep in range(cfg.repeats):
                    for engine in cfg.engines:
                        records += self._server_run(model, engine, rep, datasets)
        return records

    def _datasets(self, model: str) -> list[Dataset]:
        if self.cfg.url is not None:
            folder = Path(self.cfg.tokenizer) if self.cfg.tokenizer else model_folder(self.cfg, "default")
            self.model_paths[model] = self.cfg.url
        else:
            folder = model_folder(self.cfg, model)
            self.model_paths[model] = str(folder)
        return build_datasets(self.cfg, folder)

    def _server_run(self, model: str, engine: str, rep: int, datasets: list[Dataset]) -> list[RunRecord]:
        cfg = self.cfg
        if cfg.url is not None:
            return self._measure(model, engine, rep, cfg.url.rstrip("/"), datasets)
        settings = ServerSettings(self.model_paths[model], cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                  cfg.kv_cache_size_gb, cfg.num_threads, cfg.dtype,
                                  cfg.quantization)
        log = cfg.out / "logs" / f"{model}-{engine}-r{rep}.log"
        assert self.bar is not None
        self.bar.set_description(f"{model} {engine} r{rep} starting")
        with ServerProcess(engine, settings, log) as server:
            server.start(cfg.health_timeout_s)
            return self._measure(model, engine, rep, server.base_url, datasets)

    def _measure(self, model: str, engine: str, rep: int, base_url: str,
                 datasets: list[Dataset]) -> list[RunRecord]:
        cfg = self.cfg
        name = asyncio.run(fetch_model_name(base_url, cfg.api_key))
        target = Target(base_url, name, cfg.endpoint, cfg.api_key, cfg.request_timeout_s)
        local = urlparse(base_url).hostname in ("127.0.0.1", "localhost", "::1")
        warm, *measured = datasets
        asyncio.run(run_workload(target, warm.workload, warm.requests, warm.prompts))
        out = []
        for ds in measured:
            assert self.bar is not None
            self.bar.set_description(f"{model} {engine} r{rep} {ds.workload.name}")
            before = take_snapshot(base_url, target.headers(), local)
            if before.stats is None and not self._warned:
                self._warned = True
                logger.warning("%s/debug/stats gave nothing: client figures only (a twinserve "
                               "server needs --enable-debug-endpoints for server figures)", base_url)
            results, duration = asyncio.run(run_workload(target, ds.workload, ds.requests, ds.prompts,
                                                         lambda: self.bar.update(1)))  # type: ignore[union-attr]
            after = take_snapshot(base_url, target.headers(), local)
            rec = RunRecord(model, ds.workload.name, engine, rep, compute_metrics(results, duration),
                            server_figures(before, after), results)
            save_raw(cfg.out, rec)
            out.append(rec)
        return out


def save_raw(out: Path, rec: RunRecord) -> Path:
    path = out / "raw" / rec.model / rec.workload / f"{rec.engine}-r{rec.repeat}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec.to_dict(), indent=1), encoding="utf-8")
    return path
