"""The engine watchdog and the engine-death policy (vLLM's).

A stalled engine (alive but not stepping: a deadlock, a stuck native call, a SIGSTOPped core)
with requests in flight is declared dead after ``--engine-step-timeout`` seconds: in-flight
requests end with an error and /health answers 503. Once the engine is dead, for whatever
reason, the server keeps answering 503 for ``DEATH_GRACE_S`` seconds (so clients and probes
see why) and then exits non-zero for a supervisor to restart it, unless
``--keep-alive-on-engine-death``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from shared.errors import EngineDeadError
from shared.frontend.engine_client import EngineClient

logger = logging.getLogger(__name__)

DEATH_GRACE_S = 5.0
_POLL_S = 0.25


class EngineWatchdog:
    def __init__(self, engine: EngineClient, step_timeout_s: float, keep_alive_on_death: bool,
                 on_exit: Callable[[], None], grace_s: float = DEATH_GRACE_S) -> None:
        self.engine = engine
        self.step_timeout_s = step_timeout_s
        self.keep_alive_on_death = keep_alive_on_death
        self.on_exit = on_exit
        self.grace_s = grace_s
        self.exit_requested = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-watchdog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        dead_since: float | None = None
        while True:
            await asyncio.sleep(_POLL_S)
            if not self.engine.is_dead:
                self._check_stall()
                continue
            if self.keep_alive_on_death:
                continue
            if dead_since is None:
                dead_since = time.monotonic()
                logger.error("engine is dead; the server exits in %.0f s "
                             "(--keep-alive-on-engine-death keeps it up)", self.grace_s)
            elif time.monotonic() - dead_since >= self.grace_s:
                self.exit_requested = True
                self.on_exit()
                return

    def _check_stall(self) -> None:
        stalled = self.engine.stalled_for()
        if stalled is not None and stalled > self.step_timeout_s:
            logger.error("engine made no progress for %.1f s with requests in flight: "
                         "declaring it dead (--engine-step-timeout %.0f)", stalled, self.step_timeout_s)
            self.engine.fail_all(EngineDeadError(
                f"the engine made no progress for {stalled:.0f} s (--engine-step-timeout)"))
