"""v0 runs every forward pass on one dedicated thread (one OpenMP team for the whole run),
while the event loop keeps scheduling, sampling and streaming (tiny random model)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from compare.tiny_model import ensure_tiny_model
from engine_v0 import AsyncEngine
from shared import SamplingParams
from shared.config import EngineConfig, ModelConfig
from shared.engine_core import StepBatch


@pytest.fixture(scope="module")
def tiny_dir(default_model_dir: str) -> Path:
    return ensure_tiny_model(Path(default_model_dir))


async def _collect(engine: AsyncEngine, rid: str, prompt: list[int]) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(rid, prompt, SamplingParams(temperature=0, max_tokens=6,
                                                                 ignore_eos=True)):
        tokens += out.outputs[0].token_ids
    return tokens


def _record_forwards(engine: AsyncEngine) -> list[threading.Thread]:
    """The thread of every forward ``engine`` runs from now on."""
    threads: list[threading.Thread] = []
    run_forward = engine.core.run_forward

    def recording_forward(batch: StepBatch) -> torch.Tensor:
        threads.append(threading.current_thread())
        return run_forward(batch)

    engine.core.run_forward = recording_forward
    return threads


def test_every_forward_runs_on_the_same_non_loop_thread(tiny_dir: Path) -> None:
    config = EngineConfig(model=ModelConfig(model=str(tiny_dir), dtype="float32",
                                            quantization="none", num_threads=1))
    engine = AsyncEngine(config)
    threads = _record_forwards(engine)

    async def main() -> tuple[list[list[int]], threading.Thread]:
        # Other work on the default executor must not move the forward to another thread.
        busy = [asyncio.to_thread(lambda: None) for _ in range(8)]
        outs = await asyncio.gather(*busy, *(_collect(engine, f"r{i}", [5 + i, 6, 7, 8])
                                             for i in range(4)))
        await engine.shutdown()
        return outs[len(busy):], threading.current_thread()

    outputs, loop_thread = asyncio.run(main())
    assert [len(t) for t in outputs] == [6, 6, 6, 6]
    assert len(threads) >= 6
    assert len({t.ident for t in threads}) == 1
    assert threads[0] is not loop_thread and threads[0].name.startswith("v0-forward")


def test_the_core_is_built_on_the_forward_thread(tiny_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up runs native kernels (tuning, warm-up): on the loop's thread they would leave a
    second OpenMP team behind, and libgomp then throttles the forward's barriers."""
    import engine_v0.async_engine as v0

    built_on: list[threading.Thread] = []

    class RecordingCore(v0.EngineCore):
        def __init__(self, *args: object, **kwargs: object) -> None:
            built_on.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(v0, "EngineCore", RecordingCore)
    config = EngineConfig(model=ModelConfig(model=str(tiny_dir), dtype="float32",
                                            quantization="none", num_threads=1))
    engine = AsyncEngine(config)
    forward_threads = _record_forwards(engine)

    async def main() -> list[int]:
        try:
            return await _collect(engine, "r0", [5, 6, 7, 8])
        finally:
            await engine.shutdown()

    assert len(asyncio.run(main())) == 6
    assert built_on and built_on[0] is not threading.main_thread()
    assert {t.ident for t in forward_threads} == {built_on[0].ident}
