"""Measures how late a periodic timer fires on the API event loop.

A loop shared with the engine (v0) fires late whenever a step's CPU work holds it; this lag
is the direct signature of that contention. Cost: one wake-up per interval.
"""
from __future__ import annotations

import asyncio
import time

from shared.frontend.tasks import cancel_and_wait


class LoopLagProbe:
    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.samples = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - t0 - self.interval_s)
            self.samples += 1
            self.sum_s += lag
            self.max_s = max(self.max_s, lag)

    def snapshot(self) -> dict[str, float | int]:
        return {"samples": self.samples, "sum_s": self.sum_s, "max_s": self.max_s,
                "interval_s": self.interval_s}
