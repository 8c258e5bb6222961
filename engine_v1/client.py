"""v1's API-process side: an EngineClient that talks to the core process over ZMQ.

Requests go out on a PUSH socket (lifecycle step 4); an output-handler task receives
EngineCoreOutputs, runs the shared OutputProcessor and feeds each request's stream.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq
import zmq.asyncio

from engine_v1 import wire
from engine_v1.launcher import CoreLauncher
from shared.config import EngineConfig
from shared.errors import EngineDeadError, ParamError
from shared.frontend.base import EngineFrontend
from shared.frontend.tasks import cancel_and_wait
from shared.frontend.tokenizer import Tokenizer
from shared.messages import EngineCoreOutputs, EngineCoreRequest
from shared.trace.steps import Step
from shared.worker.model_fetch import resolve_model

log = logging.getLogger("twinserve.v1")
_POLL_MS = 250  # how often the output handler checks that the core is alive


class AsyncLLM(EngineFrontend):
    """EngineClient whose EngineCore runs in a separate process."""

    def __init__(self, config: EngineConfig, max_waiting_requests: int = 256,
                 ready_timeout_s: float = 300.0) -> None:
        path = resolve_model(config.model.model)
        self.launcher = CoreLauncher(config, path)
        self.launcher.spawn()
        tokenizer = Tokenizer(path)  # loads while the core process loads the model
        ready = self.launcher.wait_ready(ready_timeout_s)
        super().__init__(tokenizer, ready.model_info, max_waiting_requests)
        self.core_pid = ready.pid  # shown in /debug/stats for per-process CPU accounting
        self.codec = wire.WireCodec()
        self._out_sock = zmq.asyncio.Socket.from_socket(self.launcher.out_sock)
        self._handler: asyncio.Task[None] | None = None

    def _submit(self, request: EngineCoreRequest) -> None:
        self._ensure_handler()
        self._send(wire.ADD, request)
        if request.trace:
            self.tracer.event(request.request_id, Step.SUBMITTED, "handed to the engine",
                              {"link": "ZMQ PUSH over IPC, msgpack"}, where=self._submit)

    def _abort_in_core(self, request_ids: list[str]) -> None:
        self._send(wire.ABORT, request_ids)

    def _send(self, tag: bytes, payload: object) -> None:
        try:
            self.launcher.send(self.codec.encode(tag, payload))
        except zmq.ZMQError as e:
            self.fail_all(e)
            raise EngineDeadError(f"engine core unreachable: {e}") from e

    def _ensure_handler(self) -> None:
        if self._handler is None:
            self._handler = asyncio.get_running_loop().create_task(self._output_handler(),
                                                                   name="v1-output-handler")

    async def get_stats(self) -> dict[str, Any]:
        return {**await super().get_stats(), "ipc_dir": str(self.launcher.ipc_dir)}

    async def check_health(self) -> None:
        self._ensure_handler()
        if self._dead is None and not self.launcher.is_alive():
            self.fail_all(RuntimeError(f"engine core process {self.core_pid} exited"))
        self._check_alive()

    async def _output_handler(self) -> None:
        try:
            while self._dead is None:
                if not await self._out_sock.poll(_POLL_MS):
                    if not self.launcher.is_alive():
                        self.fail_all(RuntimeError(f"engine core process {self.core_pid} exited"))
                    continue
                frames = await self._out_sock.recv_multipart()
                self._dispatch(*self.codec.decode(frames))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a broken handler means a dead engine
            log.exception("output handler died")
            self.fail_all(e)

    def _dispatch(self, tag: bytes, payload: object) -> None:
        if tag == wire.OUTPUTS:
            assert isinstance(payload, EngineCoreOutputs)
            self.process_engine_outputs(payload)
        elif tag == wire.REJECT:
            assert isinstance(payload, wire.CoreReject)
            self.fail_request(payload.request_id, ParamError(payload.message, payload.param))
        elif tag == wire.FAILED:
            assert isinstance(payload, wire.CoreFailure)
            log.error("engine core failed: %s", payload.message)
            self.fail_all(RuntimeError(payload.message))

    async def shutdown(self) -> None:
        await cancel_and_wait(self._handler)
        if self._dead is None:
            self.fail_all(RuntimeError("server shutting down"))
        await asyncio.to_thread(self.launcher.stop)
