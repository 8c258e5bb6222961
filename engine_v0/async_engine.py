"""v0: the API server's own event loop drives the engine core.

Scheduling, input preparation, sampling and detokenization run on the loop thread; only
the forward pass leaves it, for one dedicated thread, and is awaited so HTTP keeps being served.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shared.config import EngineConfig
from shared.engine_core import EngineCore
from shared.frontend.base import EngineFrontend
from shared.frontend.tasks import cancel_and_wait
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreRequest
from shared.trace.steps import Step
from shared.trace.tracer import Tracer
from shared.worker.model_fetch import resolve_model

log = logging.getLogger("twinserve.v0")


class AsyncEngine(EngineFrontend):
    """EngineClient whose EngineCore lives in this process, stepped by one asyncio task."""

    def __init__(self, config: EngineConfig, max_waiting_requests: int = 256) -> None:
        path = resolve_model(config.model.model)
        # Always the same thread: OpenMP keeps a thread team per calling thread, and the idle
        # team of a second caller spins beside the team doing the forward.
        self._forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="v0-forward")
        # The core is built there too: its start-up runs the native kernels (tuning, warm-up),
        # and a team left on the loop's thread makes libgomp count more threads than cores and
        # throttle every barrier's spin (a batch-1 decode step measured 3x slower).
        # One process: the core's trace events carry this process's name too.
        self.core = self._forward_thread.submit(
            EngineCore, config, path, tracer=Tracer(self.process_name)).result()
        super().__init__(Tokenizer(path), self.core.model_info, max_waiting_requests)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _submit(self, request: EngineCoreRequest) -> None:
        if request.trace:
            self.tracer.event(request.request_id, Step.SUBMITTED, "handed to the engine",
                              {"link": "direct call"}, where=self._submit)
        self.core.add_request(request)
        self._ensure_running()
        self._wake.set()

    def _abort_in_core(self, request_ids: list[str]) -> None:
        # Safe during a forward pass: freed blocks are handed out only by the next schedule().
        self.core.abort_requests(request_ids)

    def _ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run_loop(), name="v0-engine-loop")

    async def _run_loop(self) -> None:
        try:
            while True:
                if not self.core.has_unfinished_requests():
                    # Idle means idle: sleep until a request arrives.
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._step()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - any failure kills the engine
            log.exception("engine loop died")
            self.fail_all(e)

    async def _step(self) -> None:
        batch = self.core.begin_step()                              # schedule, prepare inputs
        if batch is None:  # nothing fits (or grammars compile); let others run, do not spin
            outputs = self.core.outputs_without_step()
            if outputs.outputs:
                self.process_engine_outputs(outputs)
            await asyncio.sleep(0.001)
            return
        logits = await asyncio.get_running_loop().run_in_executor(   # forward, off the loop
            self._forward_thread, self.core.run_forward, batch)
        outputs = self.core.finish_step(batch, logits)               # sample, update scheduler
        self.process_engine_outputs(outputs)                         # detokenize, feed streams

    async def get_stats(self) -> dict[str, Any]:
        # Same process: read the scheduler directly, fresh even when the engine is idle.
        self._update_stats(self.core.scheduler.get_stats())
        return await super().get_stats()

    async def shutdown(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.fail_all(RuntimeError("server shutting down"))
        self._forward_thread.shutdown(wait=False)
        self.core.close()
