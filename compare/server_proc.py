"""The server settings both engines get in a comparison, and the launcher they run under."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.cli.server_process import ServerProcess as _Launcher
from shared.cli.server_process import free_port

__all__ = ["ServerProcess", "ServerSettings", "free_port"]


@dataclass(frozen=True)
class ServerSettings:
    """What both engines get, identically."""
    model: str
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    kv_cache_size_gb: float = 0.5
    num_threads: int | None = None      # None: the server's own thread policy
    dtype: str = "auto"
    quantization: str | None = None     # None: the server's own default

    def flags(self) -> list[str]:
        quant = [] if self.quantization is None else ["--quantization", self.quantization]
        threads = [] if self.num_threads is None else ["--num-threads", str(self.num_threads)]
        return [*quant, *threads, "--model", self.model,
                "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--kv-cache-size", str(self.kv_cache_size_gb), "--dtype", self.dtype,
                "--max-waiting-requests", "100000",
                "--enable-debug-endpoints"]     # step phases and CPU come from /debug/stats


class ServerProcess(_Launcher):
    """A twinserve server started with ``settings`` (see shared/cli/server_process.py)."""

    def __init__(self, engine: str, settings: ServerSettings, log_path: Path) -> None:
        base, extra = engine_flags(engine)
        super().__init__(base, [*settings.flags(), *extra], log_path)
        self.settings = settings


_PARALLEL_FLAGS = {"dp": "--data-parallel-size", "tp": "--tensor-parallel-size"}


def engine_flags(label: str) -> tuple[str, list[str]]:
    """A harness engine label -> the --engine value and extra flags: "v1-dp2" is v1 with
    --data-parallel-size 2, "v1-tp3" v1 with --tensor-parallel-size 3."""
    base, _, suffix = label.partition("-")
    if not suffix:
        return base, []
    return base, [_PARALLEL_FLAGS[suffix[:2]], suffix[2:]]
